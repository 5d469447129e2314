//! Secrets: the webhook token, the approvers' tokens and the model's API key.
//!
//! They are read from files only when nobody but the file's owner can read
//! them, as OpenSSH insists for private keys (a token every local account can
//! read is not a secret), and anything that comes back from outside (a model
//! endpoint echoing the `Authorization` header in an error body, a tool's
//! output that quotes a log line holding a token) has them cut out before
//! it is logged, audited, shown to a model or an MCP client, or printed:
//! every secret read here is [`held`], and [`redact_held`] cuts each one out.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a secret becomes wherever it would have been shown.
pub(crate) const REDACTED: &str = "[redacted]";

/// Why a secret file was not read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// It could not be opened or read (missing, not a regular file, unreadable).
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// Which secret (the setting that names it).
        what: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: crate::files::OpenError,
    },
    /// Its group or others can read or write it: not a secret any more.
    #[error("{what} {} is readable or writable by others (mode {mode:03o}); it holds a secret: `chmod 600 {}`", path.display(), path.display())]
    Exposed {
        /// Which secret.
        what: String,
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A bearer token shorter than 16 characters: guessable.
    #[error("the token in {what} {} is shorter than 16 characters", path.display())]
    Short {
        /// Which secret.
        what: String,
        /// The file.
        path: PathBuf,
    },
    /// The environment variable that should hold a key is not set.
    #[error("{setting}: the environment variable {var} is not set")]
    Unset {
        /// The setting that names the variable.
        setting: &'static str,
        /// The variable.
        var: String,
    },
    /// A key that is empty or more than one line (where it came from: the
    /// setting and the variable or file).
    #[error("{0}: empty or not one line")]
    NotOneLine(String),
}

/// Read a secret file, refusing one that its group or others can read or write.
pub(crate) fn read_file(path: &Path, what: &str) -> Result<String, SecretError> {
    let text = read_private(path, what)?;
    hold_text(&text);
    Ok(text)
}

/// Read a file only its owner may read, as [`read_file`] does, without
/// holding what it says as a secret: for a file whose secrets are hashes
/// (the principals file), where holding every line would cut ordinary
/// words (`principals:`) out of every output.
pub(crate) fn read_private(path: &Path, what: &str) -> Result<String, SecretError> {
    let read = |source: crate::files::OpenError| SecretError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        source,
    };
    let file = crate::files::open_regular(path, true).map_err(read)?;
    let meta = file.metadata().map_err(|e| read(e.into()))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::Exposed {
            what: what.to_string(),
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 64 << 10), &mut text)
        .map_err(|e| read(e.into()))?;
    Ok(text)
}

/// The shortest value held as a secret: shorter ones are too common to
/// cut out of every output (every token runwarden takes is 16 or more).
const SHORTEST_HELD: usize = 8;

/// Every secret value this process has read.
static HELD: std::sync::RwLock<std::collections::BTreeSet<String>> =
    std::sync::RwLock::new(std::collections::BTreeSet::new());

/// Hold `value` as a secret from now on: [`redact_held`] cuts it out.
pub(crate) fn hold(value: &str) {
    let value = value.trim();
    if value.len() < SHORTEST_HELD {
        return;
    }
    let mut held = HELD.write().unwrap_or_else(|p| p.into_inner());
    if !held.contains(value) {
        held.insert(value.to_string());
    }
}

/// Hold what a secret file says: each line, each word of 16 characters or
/// more (an approvers file's `NAME TOKEN`), a URL's password.
fn hold_text(text: &str) {
    for line in text.lines() {
        hold(line);
        for word in line.split_whitespace().filter(|w| w.len() >= 16) {
            hold(word);
        }
        if let Ok(url) = url::Url::parse(line.trim())
            && let Some(password) = url.password()
        {
            hold(password);
        }
    }
}

/// The shortest piece of a secret cut out where a text begins or ends:
/// what a cut of a tool's output (its size cap, the tail it keeps) leaves
/// of a secret that straddled it. Shorter pieces are too likely to be
/// ordinary text, and too short to be worth much.
const CUT_PIECE: usize = 8;

/// `text` with every secret this process holds replaced by [`REDACTED`]
/// (`None`: there was none in it), and a piece of one where the text
/// begins or ends (after a `…` that marks a cut): output cut through a
/// secret gives away neither half.
pub(crate) fn redact_held(text: &str) -> Option<String> {
    let held = HELD.read().unwrap_or_else(|p| p.into_inner());
    let whole = held.iter().any(|s| text.contains(s.as_str()));
    let edges = held.iter().any(|s| cut_piece(text, s).is_some());
    if !whole && !edges {
        return None;
    }
    // The longest first: a secret that contains another is cut whole.
    let mut secrets: Vec<&String> = held.iter().collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for s in &secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), REDACTED);
        }
    }
    for s in &secrets {
        if let Some((start, end)) = cut_piece(&out, s) {
            out = if start {
                let (mark, rest) = split_mark(&out, true);
                format!("{mark}{REDACTED}{}", &rest[end..])
            } else {
                let (mark, rest) = split_mark(&out, false);
                format!("{}{REDACTED}{mark}", &rest[..rest.len() - end])
            };
        }
    }
    Some(out)
}

/// `text` split at a `…` cut mark at its start (or end): (the mark, the rest).
fn split_mark(text: &str, start: bool) -> (&str, &str) {
    const MARK: &str = "…";
    match start {
        true => match text.strip_prefix(MARK) {
            Some(rest) => (MARK, rest),
            None => ("", text),
        },
        false => match text.strip_suffix(MARK) {
            Some(rest) => (MARK, rest),
            None => ("", text),
        },
    }
}

/// Where `text` begins with the end of `secret` (true, and the piece's
/// length) or ends with its beginning (false, and the length): the
/// longest such piece of at least [`CUT_PIECE`] bytes, shorter than the
/// secret (a whole one is cut already).
fn cut_piece(text: &str, secret: &str) -> Option<(bool, usize)> {
    let n = secret.len();
    if n <= CUT_PIECE {
        return None;
    }
    let (_, head) = split_mark(text, true);
    let (_, tail) = split_mark(text, false);
    let begins = (CUT_PIECE..n)
        .rev()
        .filter(|&k| secret.is_char_boundary(n - k))
        .find(|&k| head.starts_with(&secret[n - k..]));
    if let Some(k) = begins {
        return Some((true, k));
    }
    (CUT_PIECE..n)
        .rev()
        .filter(|&k| secret.is_char_boundary(k))
        .find(|&k| tail.ends_with(&secret[..k]))
        .map(|k| (false, k))
}

/// Every string in `value` (keys too) with the secrets held cut out;
/// whether any was.
pub(crate) fn redact_value(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => match redact_held(s) {
            Some(r) => {
                *s = r;
                true
            }
            None => false,
        },
        Value::Array(items) => items.iter_mut().fold(false, |any, v| redact_value(v) | any),
        Value::Object(map) => {
            let mut any = false;
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if let Some(mut v) = map.remove(&k) {
                    any |= redact_value(&mut v);
                    let key = redact_held(&k).inspect(|_| any = true).unwrap_or(k);
                    map.insert(key, v);
                }
            }
            any
        }
        _ => false,
    }
}

/// A bearer token from `path` (the setting `what` names it): an owner-only
/// file of at least 16 characters, surrounding whitespace aside.
pub(crate) fn read_token(path: &Path, what: &str) -> Result<String, SecretError> {
    let text = read_file(path, what)?;
    let token = text.trim();
    if token.len() < 16 {
        return Err(SecretError::Short {
            what: what.to_string(),
            path: path.to_path_buf(),
        });
    }
    Ok(token.to_string())
}

/// `bytes` with every occurrence of `secret` replaced by [`REDACTED`].
pub(crate) fn redact(bytes: &[u8], secret: &str) -> Vec<u8> {
    let needle = secret.as_bytes();
    if needle.len() < 4 {
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(i) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(REDACTED.as_bytes());
        rest = &rest[i + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A token read from a file, a URL's password and an approver's token
    /// are cut out of any text and JSON, keys included; other text stays.
    #[test]
    fn every_secret_read_is_cut_out_of_what_is_shown() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let f = dir.path().join(name);
            std::fs::write(&f, text).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            f
        };
        read_token(&write("token", "tok-AAAA-BBBB-CCCC-1111\n"), "t").unwrap();
        read_file(&write("url", "postgres://rw:pa55-w0rd-xyz@db/rw\n"), "u").unwrap();
        hold("appr-ZZZZ-YYYY-XXXX-2222");
        let said = "Authorization: Bearer tok-AAAA-BBBB-CCCC-1111 from db pa55-w0rd-xyz, appr-ZZZZ-YYYY-XXXX-2222";
        let cut = redact_held(said).expect("secrets in it");
        assert_eq!(
            cut,
            "Authorization: Bearer [redacted] from db [redacted], [redacted]"
        );
        assert_eq!(redact_held("nothing held here"), None);
        let mut v = serde_json::json!({
            "lines": ["ok", "token=tok-AAAA-BBBB-CCCC-1111"],
            "tok-AAAA-BBBB-CCCC-1111": 1,
        });
        assert!(redact_value(&mut v));
        assert_eq!(
            v,
            serde_json::json!({ "lines": ["ok", "token=[redacted]"], "[redacted]": 1 })
        );
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "s3cret-token-000000").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o666] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = read_file(&f, "webhook_token_file").unwrap_err();
            assert!(
                matches!(e, SecretError::Exposed { .. })
                    && e.to_string().contains("chmod 600")
                    && e.to_string().contains(&format!("{mode:03o}")),
                "{e}"
            );
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(read_file(&f, "t").unwrap(), "s3cret-token-000000");
        }
    }

    #[test]
    fn every_occurrence_is_cut_out() {
        let out = redact(
            b"Authorization: Bearer sk-123456 and again sk-123456.",
            "sk-123456",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Authorization: Bearer [redacted] and again [redacted]."
        );
        assert_eq!(redact(b"abc", "sk-123456"), b"abc");
    }

    /// A secret cut by a tool's size cap, or by the tail its output keeps,
    /// gives away neither half.
    #[test]
    fn a_piece_of_a_held_secret_at_a_cut_is_redacted_too() {
        let secret = "Zq7vB1mK9xPw4TtY2sLr8NcE5hGd3JaU";
        hold(secret);
        let head = format!("AAAA{}", &secret[..20]);
        assert_eq!(redact_held(&head).unwrap(), format!("AAAA{REDACTED}"));
        let tail = format!("…{}YYYY", &secret[12..]);
        assert_eq!(redact_held(&tail).unwrap(), format!("…{REDACTED}YYYY"));
        let marked = format!("AAAA{}…", &secret[..9]);
        assert_eq!(redact_held(&marked).unwrap(), format!("AAAA{REDACTED}…"));
        // Too short a piece is ordinary text; the middle of a text is not a cut.
        assert_eq!(redact_held(&format!("AAAA{}", &secret[..7])), None);
        assert_eq!(redact_held(&format!("{}AAAA", &secret[..20])), None);
    }
}

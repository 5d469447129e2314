//! Secrets: the webhook token, the approvers' tokens and the model's API key.
//!
//! They are read from files only when nobody but the file's owner can read
//! them, as OpenSSH insists for private keys (a token every local account can
//! read is not a secret), and anything that comes back from outside (a model
//! endpoint echoing the `Authorization` header in an error body) has them
//! cut out before it is logged, audited or printed.

use std::collections::HashMap;
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
    /// The approvers file says something that is not `NAME TOKEN` lines
    /// with tokens of at least 16 characters, or names nobody.
    #[error("{}{}: {why}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Approvers {
        /// The file.
        path: PathBuf,
        /// The line, when one is at fault.
        line: Option<usize>,
        /// What is wrong.
        why: String,
    },
}

/// Read a secret file, refusing one that its group or others can read or write.
pub(crate) fn read_file(path: &Path, what: &str) -> Result<String, SecretError> {
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

/// The approvers file: `NAME TOKEN` lines (`#` comments), each token at
/// least 16 characters, keyed by token. Read by the gate and checked by the
/// configuration loader.
pub(crate) fn read_approvers(file: &Path) -> Result<HashMap<Vec<u8>, String>, SecretError> {
    let text = read_file(file, "approvers file")?;
    let wrong = |line: Option<usize>, why: String| SecretError::Approvers {
        path: file.to_path_buf(),
        line,
        why,
    };
    let mut approvers = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(wrong(Some(i + 1), "expected `NAME TOKEN`".into()));
        };
        if token.len() < 16 {
            let why = format!("the token of {name} is shorter than 16 characters");
            return Err(wrong(Some(i + 1), why));
        }
        approvers.insert(token.as_bytes().to_vec(), name.to_string());
    }
    if approvers.is_empty() {
        return Err(wrong(None, "names no approver".into()));
    }
    Ok(approvers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
}

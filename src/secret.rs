//! Secrets: the webhook token, the approvers' tokens and the model's API key.
//!
//! They are read from files only when nobody but the file's owner can read
//! them, as OpenSSH insists for private keys (a token every local account can
//! read is not a secret), and anything that comes back from outside (a model
//! endpoint echoing the `Authorization` header in an error body) has them
//! cut out before it is logged, audited or printed.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What a secret becomes wherever it would have been shown.
pub const REDACTED: &str = "[redacted]";

/// Read a secret file, refusing one that its group or others can read or write.
pub fn read_file(path: &Path, what: &str) -> Result<String, String> {
    let file = crate::files::open_regular(path, true)
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{what} {} is readable or writable by others (mode {mode:03o}); it holds a secret: `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 64 << 10), &mut text)
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    Ok(text)
}

/// `bytes` with every occurrence of `secret` replaced by [`REDACTED`].
pub fn redact(bytes: &[u8], secret: &str) -> Vec<u8> {
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
pub fn read_approvers(file: &Path) -> Result<HashMap<Vec<u8>, String>, String> {
    let text = read_file(file, "approvers file")?;
    let mut approvers = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "{}:{}: expected `NAME TOKEN`",
                file.display(),
                i + 1
            ));
        };
        if token.len() < 16 {
            return Err(format!(
                "{}:{}: the token of {name} is shorter than 16 characters",
                file.display(),
                i + 1
            ));
        }
        approvers.insert(token.as_bytes().to_vec(), name.to_string());
    }
    if approvers.is_empty() {
        return Err(format!(
            "approvers file {} names no approver",
            file.display()
        ));
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
                e.contains("chmod 600") && e.contains(&format!("{mode:03o}")),
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

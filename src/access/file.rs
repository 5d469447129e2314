//! The principals file: who may do what, read only when nobody but its
//! owner can read it, whole or not at all.
//!
//! ```yaml
//! principals:
//!   alice:
//!     tokens:
//!       - { id: alice-laptop, sha256: 9f86d081…, expires: 2027-06-01 }
//!     scopes:
//!       approve: { runbooks: ["staging-*"] }
//!       kill:engage: {}
//!     chat: ["slack:T0123ABCD/U0456EFGH"]
//!   alertmanager:
//!     tokens: [{ id: am-1, sha256: 2c26b46b… }]
//!     scopes:
//!       run:trigger: { runbooks: [staging-disk-full, worker-pool-recycle] }
//! ```
//!
//! A token is known only by its sha256 (`runwarden token new` makes one):
//! the file holds nothing that lets its reader act. A file of `NAME TOKEN`
//! lines (the older approvers file) is read as one principal a line, each
//! may approve anything and do nothing else, its token held as a secret.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;
use sha2::{Digest, Sha256};

use super::{Grant, Principal, Principals, Scope, Token};

/// Why the file was refused: where, and what to write instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    /// It could not be read, or others may read it.
    #[error(transparent)]
    Read(#[from] crate::secret::SecretError),
    /// What it says cannot be taken.
    #[error("{}:{line}:{column}: {why}", path.display())]
    At {
        path: PathBuf,
        line: u64,
        column: u64,
        why: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    principals: BTreeMap<String, Spanned<RawPrincipal>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    #[serde(default)]
    tokens: Vec<RawToken>,
    /// Who the principal is in chat: `slack:TEAM/USER`.
    #[serde(default)]
    chat: Vec<Spanned<String>>,
    #[serde(default)]
    scopes: BTreeMap<String, Spanned<Option<RawGrant>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    id: Spanned<String>,
    sha256: Spanned<String>,
    #[serde(default)]
    expires: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    #[serde(default)]
    runbooks: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    tiers: Option<Vec<Spanned<u8>>>,
}

/// Read the principals (or approvers) file at `path`.
pub(crate) fn read(path: &Path) -> Result<Principals, FileError> {
    let text = crate::secret::read_private(path, "principals file")?;
    parse(path, &text)
}

/// What `text`, the file at `path`, says.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Principals, FileError> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'));
    match first {
        Some(l) if l.starts_with("principals:") => yaml(path, text),
        _ => lines(path, text),
    }
}

fn at(path: &Path, loc: serde_saphyr::Location, why: impl Into<String>) -> FileError {
    FileError::At {
        path: path.to_path_buf(),
        line: loc.line().max(1),
        column: loc.column().max(1),
        why: why.into(),
    }
}

/// A name the audit log and the API show: letters, digits, `.`, `_`, `-`.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

fn yaml(path: &Path, text: &str) -> Result<Principals, FileError> {
    let raw: RawFile = serde_saphyr::from_str(text).map_err(|e| {
        let loc = e.location().unwrap_or(serde_saphyr::Location::UNKNOWN);
        at(path, loc, e.without_snippet().to_string())
    })?;
    let mut hashes = HashSet::new();
    let mut ids = HashSet::new();
    let mut identities = HashSet::new();
    let mut list = Vec::new();
    for (name, p) in raw.principals {
        let here = p.referenced;
        if !plain(&name) {
            return Err(at(
                path,
                here,
                format!(
                    "principal {name:?}: a name is letters, digits, '.', '_' and '-' (64 at most)"
                ),
            ));
        }
        let p = p.value;
        let mut chat = Vec::new();
        for c in &p.chat {
            if !chat_identity(&c.value) {
                return Err(at(
                    path,
                    c.referenced,
                    format!(
                        "chat identity {:?} of {name}: write slack:TEAM/USER (the workspace's and the member's ids, e.g. slack:T0123ABCD/U0456EFGH)",
                        c.value
                    ),
                ));
            }
            if !identities.insert(c.value.clone()) {
                return Err(at(
                    path,
                    c.referenced,
                    format!(
                        "chat identity {} is another principal's too: one person is one principal",
                        c.value
                    ),
                ));
            }
            chat.push(c.value.clone());
        }
        if p.tokens.is_empty() && chat.is_empty() {
            return Err(at(
                path,
                here,
                format!(
                    "principal {name} has no token and no chat identity: nothing can act as it (add tokens: or chat:, or remove it)"
                ),
            ));
        }
        let mut tokens = Vec::new();
        for t in p.tokens {
            let id = t.id.value.trim().to_string();
            if !plain(&id) {
                return Err(at(
                    path,
                    t.id.referenced,
                    "a token's id is letters, digits, '.', '_' and '-' (64 at most): the audit log names it",
                ));
            }
            if !ids.insert(id.clone()) {
                return Err(at(
                    path,
                    t.id.referenced,
                    format!(
                        "token id {id} is given twice: each token's id names it alone in the audit log"
                    ),
                ));
            }
            let sha256 = hex32(t.sha256.value.trim()).ok_or_else(|| {
                at(path, t.sha256.referenced, "sha256 is the token's SHA-256, 64 hex digits (`runwarden token new` prints one; never the token itself)")
            })?;
            if !hashes.insert(sha256) {
                return Err(at(
                    path,
                    t.sha256.referenced,
                    format!(
                        "token {id} has the hash of another token in this file: one token is one principal's"
                    ),
                ));
            }
            let expires = match t.expires {
                None => None,
                Some(e) => Some(timestamp(e.value.trim()).ok_or_else(|| {
                    at(path, e.referenced, format!("expires {:?} is neither an RFC 3339 time (2027-06-01T00:00:00Z) nor a date (2027-06-01)", e.value))
                })?),
            };
            tokens.push(Token {
                id,
                sha256,
                expires,
            });
        }
        let mut grants = Vec::new();
        for (scope_name, g) in p.scopes {
            let Some(scope) = Scope::parse(&scope_name) else {
                return Err(at(
                    path,
                    g.referenced,
                    format!(
                        "unknown scope {scope_name:?}{}; the scopes are {}",
                        crate::text::did_you_mean(&scope_name, Scope::ALL.iter().map(|s| s.name())),
                        Scope::ALL.map(Scope::name).join(", ")
                    ),
                ));
            };
            let raw = g.value.unwrap_or_default();
            let runbooks = match raw.runbooks {
                None => vec!["*".to_string()],
                Some(list) if list.is_empty() => {
                    return Err(at(
                        path,
                        g.referenced,
                        format!(
                            "{scope}: runbooks: [] grants nothing; leave runbooks out for every runbook, or remove the scope"
                        ),
                    ));
                }
                Some(list) => {
                    let mut out = Vec::new();
                    for r in list {
                        let ok = !r.value.is_empty()
                            && r.value.bytes().all(|b| {
                                b.is_ascii_alphanumeric()
                                    || matches!(b, b'.' | b'_' | b'-' | b'*' | b'?')
                            });
                        if !ok {
                            return Err(at(
                                path,
                                r.referenced,
                                format!(
                                    "{:?} is not a runbook name or glob (letters, digits, '.', '_', '-', '*' and '?')",
                                    r.value
                                ),
                            ));
                        }
                        out.push(r.value);
                    }
                    out
                }
            };
            let tiers = match raw.tiers {
                None => vec![2],
                Some(_) if scope != Scope::Approve => {
                    return Err(at(
                        path,
                        g.referenced,
                        format!("{scope} takes no tiers: only approve is limited by tier"),
                    ));
                }
                Some(list) => {
                    let mut out = Vec::new();
                    for t in list {
                        if t.value != 2 {
                            return Err(at(
                                path,
                                t.referenced,
                                format!(
                                    "tier {}: only tier-2 calls wait for a person (tier 1 runs freely; tier 3 is never a tool)",
                                    t.value
                                ),
                            ));
                        }
                        out.push(t.value);
                    }
                    out
                }
            };
            grants.push(Grant {
                scope,
                runbooks,
                tiers,
            });
        }
        list.push(Principal {
            name,
            tokens,
            chat,
            grants,
        });
    }
    if list.is_empty() {
        return Err(at(
            path,
            serde_saphyr::Location::UNKNOWN,
            "names no principal",
        ));
    }
    Ok(Principals::new(list))
}

/// The older approvers file: `NAME TOKEN` lines, each token 16
/// characters or more; each name may approve anything, nothing else.
fn lines(path: &Path, text: &str) -> Result<Principals, FileError> {
    let wrong = |line: usize, why: String| FileError::At {
        path: path.to_path_buf(),
        line: line as u64,
        column: 1,
        why,
    };
    let mut list = Vec::new();
    let mut hashes = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(wrong(
                i + 1,
                "expected `NAME TOKEN` (or a principals file: `principals:` first)".into(),
            ));
        };
        if token.len() < 16 {
            return Err(wrong(
                i + 1,
                format!("the token of {name} is shorter than 16 characters"),
            ));
        }
        crate::secret::hold(token);
        let sha256: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if !hashes.insert(sha256) {
            return Err(wrong(
                i + 1,
                format!("the token of {name} is another line's too: one token is one approver's"),
            ));
        }
        list.push(Principal {
            name: name.to_string(),
            tokens: vec![Token {
                id: format!("{name}@line{}", i + 1),
                sha256,
                expires: None,
            }],
            chat: Vec::new(),
            grants: vec![Grant::everywhere(Scope::Approve)],
        });
    }
    if list.is_empty() {
        return Err(wrong(1, "names no approver".into()));
    }
    Ok(Principals::new(list))
}

/// `slack:TEAM/USER`: two Slack ids (capital letters and digits).
fn chat_identity(s: &str) -> bool {
    let id = |s: &str| {
        (2..=32).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    };
    s.strip_prefix("slack:")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(team, user)| id(team) && id(user))
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

fn timestamp(s: &str) -> Option<jiff::Timestamp> {
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Some(t);
    }
    let date = s.parse::<jiff::civil::Date>().ok()?;
    date.to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn refused(text: &str) -> String {
        parse(Path::new("/etc/runwarden/principals.yaml"), text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_principals_file_is_read_with_its_grants() {
        let text = format!(
            "principals:\n  alice:\n    tokens:\n      - {{ id: alice-laptop, sha256: {}, expires: 2999-01-01 }}\n    scopes:\n      approve: {{ runbooks: [\"staging-*\"] }}\n      kill:engage: {{}}\n      run:read:\n",
            sha("alice-token-0123456789")
        );
        let ps = parse(Path::new("p.yaml"), &text).unwrap();
        let alice = ps
            .authenticate(b"alice-token-0123456789", jiff::Timestamp::now())
            .unwrap();
        assert_eq!(
            (alice.name(), alice.token_id.as_str()),
            ("alice", "alice-laptop")
        );
        assert!(alice.may(Scope::Approve, "staging-disk"));
        assert!(!alice.may(Scope::Approve, "prod-disk"));
        assert!(alice.may(Scope::KillEngage, "prod-disk"));
        assert!(alice.may(Scope::RunRead, "prod-disk"));
        assert!(!alice.holds(Scope::KillRelease));
    }

    #[test]
    fn an_approvers_file_of_lines_still_approves_anything_and_nothing_else() {
        let ps = parse(
            Path::new("a"),
            "# who\nalice alice-token-0123456789\nbob bob-token-0123456789abc\n",
        )
        .unwrap();
        let bob = ps
            .authenticate(b"bob-token-0123456789abc", jiff::Timestamp::now())
            .unwrap();
        assert_eq!(bob.token_id, "bob@line3");
        assert!(bob.may(Scope::Approve, "anything"));
        // The file holds tokens in clear: each is cut out of what is shown.
        assert_eq!(
            crate::secret::redact_held("Bearer bob-token-0123456789abc").as_deref(),
            Some("Bearer [redacted]")
        );
        for other in [Scope::RunTrigger, Scope::KillEngage, Scope::RolloutControl] {
            assert!(!bob.holds(other), "{other}");
        }
        assert!(refused("alice short\n").contains(":1:1: the token of alice is shorter than 16"));
        assert!(refused("# nobody\n").contains("names no approver"));
    }

    #[test]
    fn what_cannot_be_taken_is_refused_at_its_line() {
        let h = sha("x-token-0123456789abcdef");
        for (text, line, says) in [
            (
                format!(
                    "principals:\n  a:\n    tokens: [{{ id: t, sha256: {h} }}]\n    scopes:\n      kill:engaeg: {{}}\n"
                ),
                5,
                "unknown scope \"kill:engaeg\" (did you mean \"kill:engage\"?)",
            ),
            (
                "principals:\n  a:\n    tokens: [{ id: t, sha256: nothex }]\n".to_string(),
                3,
                "64 hex digits",
            ),
            (
                format!(
                    "principals:\n  a:\n    tokens: [{{ id: t, sha256: {h} }}]\n  b:\n    tokens: [{{ id: u, sha256: {h} }}]\n"
                ),
                5,
                "hash of another token",
            ),
            (
                format!(
                    "principals:\n  a:\n    tokens: [{{ id: t, sha256: {h}, expires: soon }}]\n"
                ),
                3,
                "neither an RFC 3339",
            ),
            (
                format!(
                    "principals:\n  a:\n    tokens: [{{ id: t, sha256: {h} }}]\n    scopes:\n      approve: {{ tiers: [3] }}\n"
                ),
                5,
                "tier 3",
            ),
            (
                format!(
                    "principals:\n  a:\n    tokens: [{{ id: t, sha256: {h} }}]\n    scopes:\n      kill:engage: {{ tiers: [2] }}\n"
                ),
                5,
                "takes no tiers",
            ),
            (
                format!(
                    "principals:\n  a:\n    tokens: [{{ id: t, sha256: {h} }}]\n    scopes:\n      approve: {{ runbooks: [] }}\n"
                ),
                5,
                "grants nothing",
            ),
            (
                "principals:\n  a:\n    scopes: { approve: {} }\n".to_string(),
                3,
                "has no token",
            ),
            (
                format!("principals:\n  a:\n    tokens: [{{ id: t, sha256: {h}, secret: x }}]\n"),
                3,
                "unknown field `secret`",
            ),
        ] {
            let got = refused(&text);
            assert!(
                got.starts_with(&format!("/etc/runwarden/principals.yaml:{line}:"))
                    && got.contains(says),
                "{text}\n=> {got}"
            );
        }
    }
}

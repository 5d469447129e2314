//! The chain's head, kept where the runwarden user cannot rewrite it.
//!
//! A hash chain shows an edited line only while a later line still points
//! at the original: the last line (usually a verdict) can be edited freely,
//! and whoever can write the file can rewrite the whole chain. So as each
//! run ends its writer sends the head (the last line's hash and the line
//! count) to the system journal, which the runwarden user can add to but
//! neither edit nor delete from. `runwarden audit verify` then checks the
//! file against every head the journal holds for it, or against one pinned
//! by hand (`--head HASH:LINES`).
//!
//! Detected: an edit to any line at or before a recorded head (the last
//! line included), lines cut off before a recorded head, a chain rewritten
//! whole. Not detected: changes to lines after the newest head (a run still
//! in progress), or anything by someone who can also rewrite the journal
//! (root). A forged newer record cannot hide a rewrite: every record is
//! checked, and the older ones still describe the original lines.

use crate::text::NotOfForm;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// journald's native socket.
pub(crate) use crate::logging::JOURNAL_SOCKET;
const JOURNALCTL: &str = "/usr/bin/journalctl";

/// One recorded head: the log had `lines` lines and the last one hashed to `hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// How many lines the log had.
    pub(crate) lines: u64,
    /// The last line's sha256, in hex.
    pub(crate) hash: String,
}

impl std::str::FromStr for Head {
    type Err = NotOfForm;

    /// `HASH:LINES`, as `audit verify` prints it.
    fn from_str(s: &str) -> Result<Head, NotOfForm> {
        let (hash, lines) = s
            .split_once(':')
            .ok_or_else(|| NotOfForm::new(s, "expected HASH:LINES, as `audit verify` prints it"))?;
        let lines = lines
            .parse()
            .map_err(|_| NotOfForm::new(s, "LINES is not a number"))?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NotOfForm::new(s, "HASH is not a sha256 in hex"));
        }
        Ok(Head {
            lines,
            hash: hash.to_ascii_lowercase(),
        })
    }
}

impl std::fmt::Display for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.hash, self.lines)
    }
}

/// Whether this machine has a journal to send heads to.
pub(crate) fn journal_available() -> bool {
    crate::logging::journal_socket_exists()
}

/// Send `head` of the log at `log` to the journal (one datagram, journald's
/// native protocol: `KEY=value` lines).
pub(crate) fn ship(log: &Path, head: &Head, run_id: &str) -> std::io::Result<()> {
    let log = std::fs::canonicalize(log).unwrap_or_else(|_| log.to_path_buf());
    let mut msg = Vec::new();
    let _ = writeln!(
        msg,
        "MESSAGE=runwarden audit head {head} of {} (run {run_id})",
        log.display()
    );
    let _ = writeln!(msg, "SYSLOG_IDENTIFIER=runwarden");
    let _ = writeln!(msg, "PRIORITY=6");
    let _ = writeln!(msg, "RUNWARDEN_AUDIT_LOG={}", log.display());
    let _ = writeln!(msg, "RUNWARDEN_AUDIT_HEAD={}", head.hash);
    let _ = writeln!(msg, "RUNWARDEN_AUDIT_LINES={}", head.lines);
    let _ = writeln!(msg, "RUNWARDEN_RUN_ID={run_id}");
    UnixDatagram::unbound()?.send_to(&msg, JOURNAL_SOCKET)?;
    Ok(())
}

/// What the journal holds for one log: the heads trusted, and the records
/// ignored because a user other than the log's writer sent them.
#[derive(Debug, Default)]
pub(crate) struct JournalHeads {
    /// Heads sent by the log's owner (the daemon's user) or root, oldest first.
    pub(crate) trusted: Vec<Head>,
    /// Records from anyone else: (their uid, how many).
    pub(crate) ignored: Vec<(u32, usize)>,
}

/// Why the journal's heads could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    /// The log itself could not be looked at.
    #[error("cannot read {}: {source}", path.display())]
    Log {
        /// The log.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// journalctl could not be run.
    #[error("cannot read the journal ({JOURNALCTL}): {0}")]
    Journalctl(#[source] std::io::Error),
    /// This account may not read the records runwarden wrote.
    #[error(
        "cannot read the journal as {0}: no head runwarden recorded there is visible to this account; run `audit verify` as root or as a member of the systemd-journal group"
    )]
    NotVisible(String),
    /// journalctl failed, and said why.
    #[error("{JOURNALCTL} failed: {0}")]
    Failed(String),
}

/// Every head the journal holds for the log at `log`, oldest first. Any
/// local user can send a record that names the log (journald takes
/// datagrams from everyone), so only records whose `_UID` (set by journald,
/// not by the sender) is the log file's owner or root count: a head from
/// anyone else could only make `verify` fail for good or bury a real edit
/// in noise.
pub(crate) fn journal_heads(log: &Path) -> Result<JournalHeads, JournalError> {
    use std::os::unix::fs::MetadataExt;
    let log = std::fs::canonicalize(log).unwrap_or_else(|_| log.to_path_buf());
    let owner = std::fs::metadata(&log)
        .map_err(|source| JournalError::Log {
            path: log.clone(),
            source,
        })?
        .uid();
    let out = std::process::Command::new(JOURNALCTL)
        .args([
            "--no-pager",
            "-o",
            "json",
            "--output-fields=RUNWARDEN_AUDIT_HEAD,RUNWARDEN_AUDIT_LINES,_UID",
        ])
        .arg("SYSLOG_IDENTIFIER=runwarden")
        .arg(format!("RUNWARDEN_AUDIT_LOG={}", log.display()))
        .output()
        .map_err(JournalError::Journalctl)?;
    let said = String::from_utf8_lossy(&out.stderr);
    // journalctl run by a user who may read only their own part of the
    // journal says so on stderr and still exits 0.
    let partial = said.contains("insufficient permissions")
        || said.contains("not seeing messages from other users");
    let unreadable = || JournalError::NotVisible(crate::gate::killswitch::who());
    if !out.status.success() {
        return Err(match partial {
            true => unreadable(),
            false => JournalError::Failed(said.trim().to_string()),
        });
    }
    let mut found = JournalHeads::default();
    for v in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let Some(head) = v["RUNWARDEN_AUDIT_HEAD"]
            .as_str()
            .zip(v["RUNWARDEN_AUDIT_LINES"].as_str())
            .and_then(|(hash, lines)| format!("{hash}:{lines}").parse::<Head>().ok())
        else {
            continue;
        };
        let uid = v["_UID"].as_str().and_then(|u| u.parse::<u32>().ok());
        match uid {
            Some(uid) if uid == owner || uid == 0 => found.trusted.push(head),
            other => {
                let uid = other.unwrap_or(u32::MAX);
                match found.ignored.iter_mut().find(|(u, _)| *u == uid) {
                    Some((_, n)) => *n += 1,
                    None => found.ignored.push((uid, 1)),
                }
            }
        }
    }
    if partial && found.trusted.is_empty() {
        return Err(unreadable());
    }
    Ok(found)
}

//! Which runwarden's history this is: a downgrade refuses it instead of
//! misreading it.
//!
//! A newer release may add lines and fields an older one does not know; an
//! older binary reading them counts runs wrongly and reports a chain broken
//! where it is not. So beside each audit log a small file
//! (`audit.jsonl.format`) says the history's format and which runwarden
//! wrote it last. Every writer and reader looks at it first: a format newer
//! than this build's refuses, naming the version that wrote it and what to
//! do; an older or missing one is this build's once it writes (an upgrade).
//! Builds before the marker (0.2.0 and older) cannot refuse: they do not
//! look.

use std::path::{Path, PathBuf};

/// The history format this build writes and reads. Raise it when a change
/// to lines or segments would make this build's readers misread the new
/// history; a reader of a lower format then refuses it.
///
/// 2 (0.6.0): `evidence` and `recurred` lines, and the `unresolved`
/// verdict (`done_when`), which a format-1 reader cannot parse.
pub(crate) const FORMAT: u32 = 2;

/// Where the format of the history at `log` is recorded.
pub(crate) fn marker(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".format");
    PathBuf::from(p)
}

/// A history this build cannot read: a newer runwarden wrote it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the audit history {log} is in format {format}, written by runwarden {writer}; this is runwarden {this}, which reads format {FORMAT} and would misread it: run runwarden {writer} or later (there is no way back once a newer version wrote the history; restore the backup of the state directory taken before the upgrade to go back)",
    log = log.display(),
    this = crate::VERSION
)]
pub struct TooNew {
    log: PathBuf,
    format: u32,
    writer: String,
}

/// The format and writer a marker records (`None`: no marker).
fn read(log: &Path) -> std::io::Result<Option<(u32, String)>> {
    let Some(bytes) = crate::files::read_state(&marker(log))? else {
        return Ok(None);
    };
    if bytes.is_empty() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut format = None;
    let mut writer = String::from("unknown");
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("format ") {
            format = n.trim().parse::<u32>().ok();
        } else if let Some(w) = line.strip_prefix("written by runwarden ") {
            writer = crate::text::one_line(&w.trim().chars().take(80).collect::<String>());
        }
    }
    // A marker that says no format is no history this build knows.
    Ok(Some((format.unwrap_or(u32::MAX), writer)))
}

/// Refuse a history a newer runwarden wrote; an I/O error is one too.
pub(crate) fn check(log: &Path) -> std::io::Result<()> {
    match read(log)? {
        Some((format, writer)) if format > FORMAT => Err(std::io::Error::other(TooNew {
            log: log.to_path_buf(),
            format,
            writer,
        })),
        _ => Ok(()),
    }
}

/// Before this build writes to the history at `log`: refuse a newer one,
/// and record this build as its writer (once per version). Called under
/// the log's lock, so writers opening it at once take turns.
pub(crate) fn claim(log: &Path) -> std::io::Result<()> {
    check(log)?;
    let text = format!("format {FORMAT}\nwritten by runwarden {}\n", crate::VERSION);
    if crate::files::read_state(&marker(log))?.as_deref() == Some(text.as_bytes()) {
        return Ok(());
    }
    // A writer that may append to the log but not make files beside it (a
    // host agent's account, given its log by root), or one on a full disk
    // (which must still start, unhealthy, and say so), leaves the record to
    // the next: refusing a newer history is what matters.
    if let Err(e) = crate::files::replace(&marker(log), text.as_bytes(), 0o640) {
        tracing::debug!("{} not written: {e}", marker(log).display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history a newer runwarden wrote is refused by the writer and by
    /// every reader, naming the version that wrote it; this build's own or
    /// an older one (no marker) is written and read.
    #[test]
    fn a_history_a_newer_runwarden_wrote_is_refused_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        // No marker yet: a history of 0.2.0 or older. This build takes it.
        std::fs::write(&log, "").unwrap();
        let audit = crate::audit::AuditLog::open(&log).unwrap();
        drop(audit);
        let said = std::fs::read_to_string(marker(&log)).unwrap();
        assert!(said.starts_with(&format!("format {FORMAT}\n")), "{said}");
        assert!(said.contains(crate::VERSION), "{said}");
        assert!(crate::audit::runs::list(&log, &Default::default()).is_ok());

        // A newer runwarden wrote it since.
        std::fs::write(
            marker(&log),
            format!("format {}\nwritten by runwarden 9.1.0 (abc)\n", FORMAT + 1),
        )
        .unwrap();
        let open = crate::audit::AuditLog::open(&log)
            .err()
            .expect("refused")
            .to_string();
        assert!(open.contains("written by runwarden 9.1.0 (abc)"), "{open}");
        assert!(
            open.contains("run runwarden 9.1.0 (abc) or later"),
            "{open}"
        );
        let read = crate::audit::runs::list(&log, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(read.contains("would misread it"), "{read}");
        let verify = crate::audit::verify(&log).unwrap_err().to_string();
        assert!(
            verify.contains(&format!("format {}", FORMAT + 1)),
            "{verify}"
        );
        // And the marker is left as the newer one wrote it.
        assert!(
            std::fs::read_to_string(marker(&log))
                .unwrap()
                .contains("9.1.0")
        );

        // A marker that says nothing readable is no format this build knows.
        std::fs::write(marker(&log), "garbage\n").unwrap();
        assert!(
            crate::audit::AuditLog::open(&log).is_err(),
            "garbage is refused"
        );
    }
}

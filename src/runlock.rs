//! One run per (runbook, host) on this machine, whatever process starts it.
//!
//! The daemon keeps its own runs apart in memory, but a person's
//! `runwarden run` is another process. Both take an exclusive `flock` on
//! `STATE_DIR/locks/RUNBOOK@HOST.lock` for the run's whole life. The file is
//! opened close-on-exec, so no tool process inherits the lock and a run that
//! dies (even by SIGKILL) releases it at once, while an orphaned tool it
//! started may still be running. The holder writes who it is into the file,
//! so the second comer can say who holds it.
//!
//! The command line refuses to start while the lock is held (exit 75); the
//! daemon's run waits for it, shown as `queued`, until its `max_duration`.
//!
//! The daemon makes the files of its alert-triggered runs ahead of their
//! first alert ([`make_ahead`]): a file created at a run's start is a new
//! inode, and on ext4 that rides on the run's first intent sync, which the
//! tool waits for.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The exclusive right to run one runbook on one host; released on drop.
#[derive(Debug)]
pub(crate) struct RunLock {
    _file: File,
}

/// The lock is held by another run.
#[derive(Debug)]
pub(crate) struct Busy {
    /// The lock file.
    pub(crate) path: PathBuf,
    /// What the holder wrote: its run id, pid and since when.
    pub(crate) holder: String,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "another run of this runbook on this host is in progress ({}; lock {})",
            self.holder,
            self.path.display()
        )
    }
}

/// The holder's line is padded to this width (a run id, a pid and a time fit).
const HOLDER_WIDTH: usize = 160;

/// The lock file of one (runbook, host); both names are checked safe names.
pub(crate) fn path(state_dir: &Path, runbook: &str, host: &str) -> PathBuf {
    state_dir
        .join("locks")
        .join(format!("{runbook}@{host}.lock"))
}

/// Take the lock now, or say who holds it.
pub(crate) fn try_acquire(
    state_dir: &Path,
    runbook: &str,
    host: &str,
    run_id: &str,
) -> std::io::Result<Result<RunLock, Busy>> {
    let path = path(state_dir, runbook, host);
    if let Some(dir) = path.parent() {
        crate::files::make_dir(dir)?;
    }
    // Opened O_CLOEXEC: tool processes never hold the lock. Never through
    // a link planted in the state directory (root's `runwarden run` would
    // write its holder line into whatever it points at).
    let file = crate::files::open_state(&path, crate::files::Create::IfMissing, 0o640)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = (&file).take(512).read_to_string(&mut holder);
            // Written by whoever could write the file: shown escaped.
            let holder = crate::text::one_line(holder.trim());
            return Ok(Err(Busy {
                path,
                holder: if holder.is_empty() {
                    "holder unknown".into()
                } else {
                    holder
                },
            }));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    // One write at offset 0, padded to a fixed width so it covers whatever
    // an earlier holder wrote: no truncation, no seek, no partial line.
    let mut text = format!(
        "run {run_id}, pid {}, since {}",
        std::process::id(),
        jiff::Timestamp::now()
    );
    let width = HOLDER_WIDTH.max(text.len() + 1);
    text.extend(std::iter::repeat_n(' ', width - 1 - text.len()));
    text.push('\n');
    file.write_all_at(text.as_bytes(), 0)?;
    Ok(Ok(RunLock { _file: file }))
}

/// [`make_ahead`] makes no file once the lock directory holds this many: a
/// fleet's alert-triggered pairs fit, and a config of tens of thousands of
/// them does not fill the state directory with files no run may ever take
/// (the rest are made at their first run, as without it).
pub(crate) const AHEAD_LIMIT: usize = 10_000;

/// Create the lock files of these (runbook, host) pairs that do not exist
/// yet, empty and unsynced (the filesystem's own commit makes them durable
/// within seconds; one lost to a crash is made again at its first run),
/// until the directory holds [`AHEAD_LIMIT`]. Returns how many were made.
pub(crate) fn make_ahead<'a>(
    state_dir: &Path,
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> std::io::Result<usize> {
    let dir = state_dir.join("locks");
    crate::files::make_dir(&dir)?;
    let present: std::collections::HashSet<std::ffi::OsString> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    let room = AHEAD_LIMIT.saturating_sub(present.len());
    let mut made = 0;
    for (runbook, host) in pairs {
        if made == room {
            break;
        }
        let path = path(state_dir, runbook, host);
        if path.file_name().is_some_and(|n| present.contains(n)) {
            continue;
        }
        match crate::files::open_state(&path, crate::files::Create::New, 0o640) {
            Ok(_) => made += 1,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_files_made_ahead_leave_a_holders_file_alone_and_still_lock() {
        let dir = tempfile::tempdir().unwrap();
        let held = try_acquire(dir.path(), "rb", "web", "r1").unwrap().unwrap();
        let made = make_ahead(dir.path(), [("rb", "web"), ("rb", "db"), ("other", "db")]).unwrap();
        assert_eq!(made, 2, "web's file was there already");
        let web = std::fs::read_to_string(path(dir.path(), "rb", "web")).unwrap();
        assert!(
            web.starts_with("run r1, pid "),
            "the holder's line is kept: {web:?}"
        );
        assert_eq!(
            std::fs::metadata(path(dir.path(), "rb", "db"))
                .unwrap()
                .len(),
            0
        );
        // A made file locks like any other, and says who holds it.
        let db = try_acquire(dir.path(), "rb", "db", "r2").unwrap().unwrap();
        let busy = try_acquire(dir.path(), "rb", "db", "r3")
            .unwrap()
            .unwrap_err();
        assert!(busy.holder.contains("run r2"), "{busy}");
        assert!(try_acquire(dir.path(), "rb", "web", "r4").unwrap().is_err());
        drop((held, db));
        assert_eq!(
            make_ahead(dir.path(), [("rb", "web"), ("rb", "db")]).unwrap(),
            0
        );
    }

    #[test]
    fn making_lock_files_ahead_stops_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let hosts: Vec<String> = (0..AHEAD_LIMIT + 5).map(|i| format!("h{i}")).collect();
        let made = make_ahead(dir.path(), hosts.iter().map(|h| ("rb", h.as_str()))).unwrap();
        assert_eq!(made, AHEAD_LIMIT);
        let files = || std::fs::read_dir(dir.path().join("locks")).unwrap().count();
        assert_eq!(files(), AHEAD_LIMIT);
        // The limit is the directory's, not one load's: a restart makes none.
        let made = make_ahead(dir.path(), hosts.iter().map(|h| ("rb", h.as_str()))).unwrap();
        assert_eq!((made, files()), (0, AHEAD_LIMIT));
        // The rest are made at their first run.
        assert!(
            try_acquire(dir.path(), "rb", &hosts[AHEAD_LIMIT + 4], "r1")
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_acquire(dir.path(), "rb", "web", "r1").unwrap().unwrap();
        let busy = try_acquire(dir.path(), "rb", "web", "r2")
            .unwrap()
            .unwrap_err();
        assert!(busy.holder.contains("run r1"), "{busy}");
        assert!(
            try_acquire(dir.path(), "rb", "db", "r3").unwrap().is_ok(),
            "another host is free"
        );
        drop(first);
        assert!(try_acquire(dir.path(), "rb", "web", "r4").unwrap().is_ok());
    }

    /// The holder line is never written through a link planted where the
    /// lock file goes (root's `runwarden run` would overwrite its target).
    #[test]
    fn the_lock_is_never_taken_through_a_planted_link() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let lock = path(dir.path(), "rb", "web");
        std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        let e = try_acquire(dir.path(), "rb", "web", "r1").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        // Making ahead leaves the planted name alone, and writes nothing.
        assert_eq!(make_ahead(dir.path(), [("rb", "web")]).unwrap(), 0);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }

    /// What the holder wrote is shown escaped: whoever can write the lock
    /// file cannot move on-call's cursor or start a line of its own.
    #[test]
    fn a_holders_text_is_shown_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let held = try_acquire(dir.path(), "rb", "web", "r1").unwrap().unwrap();
        std::fs::write(
            path(dir.path(), "rb", "web"),
            "run x\n<0>EMERGENCY \u{1b}[2J\u{202e}gnp.exe",
        )
        .unwrap();
        let busy = try_acquire(dir.path(), "rb", "web", "r2")
            .unwrap()
            .unwrap_err();
        let said = busy.to_string();
        assert!(!said.chars().any(|c| c.is_control()), "{said:?}");
        assert!(
            said.contains("run x\\u{a}<0>EMERGENCY \\u{1b}[2J\\u{202e}gnp.exe"),
            "{said}"
        );
        drop(held);
    }
}

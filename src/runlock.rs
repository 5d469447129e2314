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

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
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
        std::fs::create_dir_all(dir)?;
    }
    // std opens with O_CLOEXEC: tool processes never hold the lock.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o640)
        .open(&path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = (&file).take(512).read_to_string(&mut holder);
            let holder = holder.trim().to_string();
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

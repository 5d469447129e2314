//! Opening files that someone else put in place: configuration, secrets,
//! kill-switch files.
//!
//! Whoever can write into `/etc/runwarden` (or the kill-switch directory)
//! can leave something there that is not a file: a FIFO, whose `open`
//! blocks until a writer appears (forever: `check` hangs, a reload wedges a
//! runtime worker); a device (`/dev/zero` never ends); a directory or a
//! socket with a `.yaml` name. Every such file is opened here with
//! `O_NONBLOCK` (a FIFO then opens at once), checked with `fstat` on the
//! open descriptor (so a file swapped after a check cannot slip by), and
//! refused unless it is a regular file, with the kind of thing it is.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Replace the state file `path` with `bytes`: written beside it, synced,
/// renamed into place and the directory synced, so a crash leaves the old
/// file or the new one, never half of one (and a reader without a lock
/// sees one or the other).
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Hold an exclusive `flock` of the lock file `path` (made if missing)
/// until the returned file drops: the daemon's runs and a person's
/// `runwarden run` read and replace one state file in turn.
pub(crate) fn locked(path: &Path) -> std::io::Result<File> {
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o640)
        .open(path)?;
    lock.lock()?;
    Ok(lock)
}

/// Why a file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The OS refused (missing, no permission, a symlink where none is followed).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Something that is not a regular file.
    #[error("is {0}, not a regular file")]
    NotRegular(&'static str),
}

/// Open `path` for reading if it is a regular file, without ever blocking.
/// `follow`: whether a symlink as the last component is followed (a secret
/// file may be one, as orchestrators mount them); without it a symlink is
/// refused.
pub(crate) fn open_regular(path: &Path, follow: bool) -> Result<File, OpenError> {
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY;
    if !follow {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => f,
        // A socket cannot be opened at all: say what it is, not ENXIO.
        Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {
            return Err(match std::fs::metadata(path) {
                Ok(m) => OpenError::NotRegular(kind(&m.file_type())),
                Err(_) => OpenError::Io(e),
            });
        }
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) && !follow => {
            return Err(OpenError::NotRegular("a symbolic link"));
        }
        Err(e) => return Err(OpenError::Io(e)),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(OpenError::NotRegular(kind(&meta.file_type())));
    }
    Ok(file)
}

/// What a file that is not a regular file is, in words.
fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of non-file is refused at once, by name; a regular file
    /// and (when followed) a symlink to one open.
    #[test]
    fn only_regular_files_open_and_nothing_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let sock = dir.path().join("sock.yaml");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let sub = dir.path().join("dir.yaml");
        std::fs::create_dir(&sub).unwrap();
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let file = dir.path().join("ok.yaml");
        std::fs::write(&file, "a: 1\n").unwrap();
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let said = |p: &Path, follow| open_regular(p, follow).unwrap_err().to_string();
        assert_eq!(
            said(&fifo, true),
            "is a FIFO (named pipe), not a regular file"
        );
        assert_eq!(said(&sock, true), "is a socket, not a regular file");
        assert_eq!(said(&sub, true), "is a directory, not a regular file");
        assert_eq!(
            said(&zero, true),
            "is a character device, not a regular file"
        );
        assert_eq!(said(&zero, false), "is a symbolic link, not a regular file");
        assert_eq!(said(&link, false), "is a symbolic link, not a regular file");
        assert!(open_regular(&file, false).is_ok());
        assert!(open_regular(&link, true).is_ok());
        assert!(matches!(
            open_regular(&dir.path().join("none"), true),
            Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound
        ));
    }
}

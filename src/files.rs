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
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// How [`open_state`] treats a file that is not there yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Create {
    /// Made if missing, opened if present.
    IfMissing,
    /// Made now; an existing file (or link) of that name is an error
    /// (`AlreadyExists`).
    New,
}

/// A state file's directory, opened without following a link as its last
/// component, with its owner: every file runwarden writes under its state
/// and configuration directories is opened relative to it.
struct StateDir {
    fd: std::os::fd::OwnedFd,
    uid: u32,
    gid: u32,
}

impl StateDir {
    /// The directory `path` is in.
    fn of(path: &Path) -> std::io::Result<StateDir> {
        StateDir::open(parent(path))
    }

    fn open(dir: &Path) -> std::io::Result<StateDir> {
        use nix::fcntl::OFlag;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let open = |at: &Path| nix::fcntl::open(at, flags, nix::sys::stat::Mode::empty());
        let fd = match open(dir) {
            Ok(fd) => fd,
            // A link that only root (or, for a daemon that is not root, its
            // own account) could have made is where the directory was put
            // (a state directory on a bigger disk): followed. One another
            // account made (the daemon's, planting it for root's command)
            // is refused.
            // (O_DIRECTORY with O_NOFOLLOW says ENOTDIR of a link.)
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) if trusted_link(dir) => {
                open(&std::fs::canonicalize(dir)?).map_err(std::io::Error::from)?
            }
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                return Err(refused(
                    dir,
                    "is a symbolic link another account made, or not a directory; runwarden writes its state only into a real directory (replace it with one)",
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let st = nix::sys::stat::fstat(&fd)?;
        Ok(StateDir {
            fd,
            uid: st.st_uid,
            gid: st.st_gid,
        })
    }

    /// Open `path` (a name in this directory) for reading and writing:
    /// never through a symlink, only a regular file with one link (a hard
    /// link to another file is refused), owned by this process or by the
    /// directory's owner. A file root opens or makes there becomes the
    /// directory owner's, so the daemon's account can still take it after
    /// a person's root command.
    fn open_file(&self, path: &Path, create: Create, mode: u32) -> std::io::Result<File> {
        self.open_with(path, create, mode, false)
    }

    /// [`StateDir::open_file`], or with `log`: in append mode, and a second
    /// link allowed when the directory's owner owns the file (the audit
    /// log has one while a rotation gives its closed segment a name).
    fn open_with(
        &self,
        path: &Path,
        create: Create,
        mode: u32,
        log: bool,
    ) -> std::io::Result<File> {
        use nix::fcntl::OFlag;
        use std::os::fd::AsFd;
        let name = path
            .file_name()
            .ok_or_else(|| refused(path, "names no file"))?;
        let mut flags = OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        if log {
            flags |= OFlag::O_APPEND;
        }
        if create == Create::New {
            flags |= OFlag::O_EXCL;
        }
        let fd = nix::fcntl::openat(
            self.fd.as_fd(),
            name,
            flags,
            nix::sys::stat::Mode::from_bits_truncate(mode),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ELOOP => refused(
                path,
                "is a symbolic link; state files are never written through a link (remove it)",
            ),
            nix::errno::Errno::ENXIO => refused(path, "is not a regular file (remove it)"),
            e => std::io::Error::from(e),
        })?;
        let file = File::from(fd);
        let st = nix::sys::stat::fstat(&file)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(refused(
                path,
                &format!(
                    "is {}, not a regular file (remove it)",
                    kind(&meta.file_type())
                ),
            ));
        }
        if st.st_nlink != 1 && !(log && st.st_nlink == 2 && st.st_uid == self.uid) {
            return Err(refused(
                path,
                &format!(
                    "has {} hard links; a state file has one (remove it)",
                    st.st_nlink
                ),
            ));
        }
        let euid = nix::unistd::geteuid();
        if st.st_uid != self.uid && st.st_uid != euid.as_raw() {
            return Err(refused(
                path,
                &format!(
                    "is owned by uid {}, neither this process's ({euid}) nor its directory's owner ({}) (remove it)",
                    st.st_uid, self.uid
                ),
            ));
        }
        if euid.is_root() && st.st_uid != self.uid {
            nix::unistd::fchown(
                &file,
                Some(nix::unistd::Uid::from_raw(self.uid)),
                Some(nix::unistd::Gid::from_raw(self.gid)),
            )?;
        }
        Ok(file)
    }
}

/// Whether the link at `path` was made by root, or by this process's own
/// account when it is not root: no other account could have planted it.
fn trusted_link(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid();
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        m.file_type().is_symlink()
            && (m.uid() == 0 || (!euid.is_root() && m.uid() == euid.as_raw()))
    })
}

/// The directory `path` names a file in (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// An error that names the file and says what to do.
fn refused(path: &Path, why: &str) -> std::io::Error {
    std::io::Error::other(format!("{} {why}", path.display()))
}

/// Open the state file `path` for reading and writing (see
/// [`StateDir::open_file`]: never through a link, a regular file with one
/// link owned by its directory's owner). Whoever can write the state
/// directory (the daemon's account) can plant a link there; root's
/// `runwarden run` must not then write through it.
pub(crate) fn open_state(path: &Path, create: Create, mode: u32) -> std::io::Result<File> {
    StateDir::of(path)?.open_file(path, create, mode)
}

/// [`open_state`] in append mode: the audit log and the files beside it.
pub(crate) fn open_append(path: &Path, mode: u32) -> std::io::Result<File> {
    StateDir::of(path)?.open_with(path, Create::IfMissing, mode, true)
}

/// Create the state directory `dir` (and its parents) if missing; one that
/// root makes inside a directory of another owner becomes that owner's.
pub(crate) fn make_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        make_dir(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o750).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    if nix::unistd::geteuid().is_root() {
        let parent = std::fs::metadata(parent(dir))?;
        std::os::unix::fs::lchown(
            dir,
            Some(std::os::unix::fs::MetadataExt::uid(&parent)),
            Some(std::os::unix::fs::MetadataExt::gid(&parent)),
        )?;
    }
    Ok(())
}

/// Replace the state file `path` with `bytes`: written beside it (a new
/// file, never through a link), synced, renamed into place and the
/// directory synced, so a crash leaves the old file or the new one, never
/// half of one (and a reader without a lock sees one or the other).
pub(crate) fn replace(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::AsFd;
    let dir = StateDir::of(path)?;
    let name = path
        .file_name()
        .ok_or_else(|| refused(path, "names no file"))?;
    let mut tmp_name = name.to_owned();
    tmp_name.push(".new");
    let tmp = path.with_file_name(&tmp_name);
    let mut f = match dir.open_file(&tmp, Create::New, mode) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Left by a write cut short, or planted: removing a name
            // (even a link's) touches nothing it points at.
            nix::unistd::unlinkat(
                dir.fd.as_fd(),
                tmp_name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            )?;
            dir.open_file(&tmp, Create::New, mode)?
        }
        other => other?,
    };
    f.write_all(bytes)?;
    f.sync_all()?;
    nix::fcntl::renameat(dir.fd.as_fd(), tmp_name.as_os_str(), dir.fd.as_fd(), name)?;
    nix::unistd::fsync(&dir.fd)?;
    Ok(())
}

/// Hold an exclusive `flock` of the lock file `path` (made if missing, as
/// [`open_state`] opens it) until the returned file drops: the daemon's
/// runs and a person's `runwarden run` read and replace one state file in
/// turn.
pub(crate) fn locked(path: &Path) -> std::io::Result<File> {
    let lock = open_state(path, Create::IfMissing, 0o640)?;
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

/// A state file is never larger than this when runwarden reads it whole.
const STATE_LIMIT: u64 = 64 << 20;

/// The whole of the state file `path` (`None`: there is none), read as
/// [`open_regular`] opens it: never through a symlink, never blocking (a
/// FIFO planted there is refused at once, not waited on), and no more
/// than 64 MiB.
pub(crate) fn read_state(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let file = match open_regular(path, false) {
        Ok(f) => f,
        Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(OpenError::Io(e)) => return Err(e),
        Err(e) => return Err(refused(path, &e.to_string())),
    };
    let mut bytes = Vec::new();
    file.take(STATE_LIMIT + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > STATE_LIMIT {
        return Err(refused(
            path,
            "is larger than 64 MiB; not a state file runwarden wrote",
        ));
    }
    Ok(Some(bytes))
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

    /// What whoever can write the state directory may plant where a state
    /// file goes: a symlink to a file of root's, a dangling symlink (an
    /// O_CREAT through it would make the file it names), a hard link to a
    /// file of root's, a FIFO. Each way a state file is written (opened or
    /// made, made new, replaced whole, locked, appended to) refuses each,
    /// at once, and the victim is untouched.
    #[test]
    fn no_state_file_is_written_through_a_planted_link_or_special_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let dangling = dir.path().join("made-through-a-link");
        type Writer<'a> = &'a dyn Fn(&Path) -> std::io::Result<()>;
        let writers: [(&str, Writer); 5] = [
            ("open_state", &|p| {
                open_state(p, Create::IfMissing, 0o640).map(drop)
            }),
            ("open_state new", &|p| {
                open_state(p, Create::New, 0o640).map(drop)
            }),
            ("replace", &|p| replace(p, b"{}", 0o640)),
            ("locked", &|p| locked(p).map(drop)),
            ("open_append", &|p| open_append(p, 0o640).map(drop)),
        ];
        for (what, write) in writers {
            let at = state.join("file");
            // `replace` gives the name a new file of its own; every other
            // writer refuses. Either way the victim is untouched.
            let check = |e: std::io::Result<()>, said: &str| {
                match (what, e) {
                    ("replace", Ok(())) => {
                        assert!(std::fs::symlink_metadata(&at).unwrap().is_file(), "{what}");
                    }
                    ("open_state new", Err(e)) => {
                        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{what}: {e}")
                    }
                    (_, Err(e)) => assert!(e.to_string().contains(said), "{what}: {e}"),
                    (_, Ok(())) => panic!("{what} wrote through a planted {said}"),
                }
                std::fs::remove_file(&at).unwrap();
                assert_eq!(
                    std::fs::read_to_string(&victim).unwrap(),
                    "precious\n",
                    "{what}"
                );
            };
            std::os::unix::fs::symlink(&victim, &at).unwrap();
            check(write(&at), "symbolic link");
            std::os::unix::fs::symlink(&dangling, &at).unwrap();
            check(write(&at), "symbolic link");
            assert!(
                !dangling.exists(),
                "{what} made a file through a dangling link"
            );
            // A hard link to the victim (as one to root's /etc/shadow would
            // be). The audit log may have a second link of the directory
            // owner's own (a rotation's closed segment, for a moment): the
            // root-only test below plants one to another owner's file.
            std::fs::hard_link(&victim, &at).unwrap();
            if what == "open_append" {
                std::fs::remove_file(&at).unwrap();
            } else {
                check(write(&at), "hard links");
            }
            // A FIFO: refused at once, never waited on.
            nix::unistd::mkfifo(&at, nix::sys::stat::Mode::S_IRWXU).unwrap();
            check(write(&at), "not a regular file");
        }
        // `replace` swaps a planted name for a file of its own: the link
        // is gone, the victim untouched, and so is a planted `.new`.
        let at = state.join("ledger.json");
        std::os::unix::fs::symlink(&victim, &at).unwrap();
        std::os::unix::fs::symlink(&victim, state.join("ledger.json.new")).unwrap();
        replace(&at, b"{}", 0o640).unwrap();
        assert_eq!(std::fs::read_to_string(&at).unwrap(), "{}");
        assert!(
            !std::fs::symlink_metadata(&at)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        // A state directory that is a link of this account's own (or
        // root's) is where the directory was put: followed. (One another
        // account made is refused: the root-only test below.)
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(dir.path(), &linked).unwrap();
        open_state(&linked.join("x.lock"), Create::IfMissing, 0o640).unwrap();
        assert!(dir.path().join("x.lock").is_file());
        // Reading: a FIFO is refused at once, a link is not followed.
        nix::unistd::mkfifo(&state.join("fifo.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(read_state(&state.join("fifo.json")).is_err());
        std::os::unix::fs::symlink(&victim, state.join("link.json")).unwrap();
        assert!(read_state(&state.join("link.json")).is_err());
        assert_eq!(read_state(&state.join("none.json")).unwrap(), None);
    }

    /// A state file root makes or opens in a directory of another owner
    /// (the daemon's) becomes that owner's, so the daemon can still take
    /// it; a file of a third owner is refused.
    #[test]
    fn a_state_file_root_writes_stays_the_directory_owners() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (tests/run.sh runs it)");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let (daemon, other) = (65534, 65533);
        std::os::unix::fs::chown(&state, Some(daemon), Some(daemon)).unwrap();
        let made = state.join("locks/rb@web.lock");
        make_dir(made.parent().unwrap()).unwrap();
        open_state(&made, Create::IfMissing, 0o640).unwrap();
        replace(&state.join("ledger.json"), b"{}", 0o640).unwrap();
        for p in [made.parent().unwrap(), &made, &state.join("ledger.json")] {
            assert_eq!(
                std::fs::metadata(p).unwrap().uid(),
                daemon,
                "{}",
                p.display()
            );
        }
        // Left by an older version's root run: taken back for the daemon.
        let old = state.join("old.lock");
        std::fs::write(&old, "").unwrap();
        open_state(&old, Create::IfMissing, 0o640).unwrap();
        assert_eq!(std::fs::metadata(&old).unwrap().uid(), daemon);
        // A hard link to another owner's file, even one the daemon's
        // account may link (its own would be harmless), for every writer.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let at = state.join("audit.jsonl");
        std::fs::hard_link(&victim, &at).unwrap();
        let e = open_append(&at, 0o640).unwrap_err();
        assert!(e.to_string().contains("hard links"), "{e}");
        assert!(open_state(&at, Create::IfMissing, 0o640).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(
            std::fs::metadata(&victim).unwrap().uid(),
            0,
            "not taken for the daemon"
        );
        // A directory link the daemon's account planted (as `locks`) is
        // refused: root's command writes nothing where it leads.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let planted = state.join("planted");
        std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
        std::os::unix::fs::lchown(&planted, Some(daemon), Some(daemon)).unwrap();
        let e = open_state(&planted.join("rb@web.lock"), Create::IfMissing, 0o640).unwrap_err();
        assert!(e.to_string().contains("another account made"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        let third = state.join("third.lock");
        std::fs::write(&third, "").unwrap();
        std::os::unix::fs::chown(&third, Some(other), Some(other)).unwrap();
        let e = open_state(&third, Create::IfMissing, 0o640).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65533"), "{e}");
    }
}

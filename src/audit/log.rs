//! The writer: each append holds the file's `flock`, continues the chain
//! from the file's real end (another process may have written since), and
//! cuts a half-written line off again when a write fails, so the log is
//! always a chain of whole lines.
//!
//! A writer killed inside a write larger than a page (SIGKILL, the OOM
//! killer) leaves part of a line behind: the kernel stops a multi-page
//! write at the fatal signal. That fragment was never acknowledged (its
//! writer died before the write returned, so before its fsync and before
//! anything was dispatched or answered on it), and refusing to write after
//! it would stop every later run and trigger on the machine. The next
//! writer, holding the `flock` (so no live writer is mid-write), moves the
//! fragment to `FILE.torn` beside the log and goes on from the last whole
//! line; `audit verify` names that file. Whole lines are never cut: a last
//! line that parses and chains but lost its newline gets the newline back.
//! The `.torn` file is opened owner-only and never through a symlink.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Entry, GENESIS, head};

/// Why a line could not be written or the log not opened.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "audit log {path}: {source} (no call runs without its audit line; fix the file or its filesystem)"
    )]
    /// The file or its filesystem failed.
    Io {
        /// The log.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// Where a torn fragment of the log at `path` is set aside.
pub fn torn_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".torn");
    PathBuf::from(p)
}

struct Tail {
    file: File,
    /// Hash of the last line, the file length it was read at, and the
    /// number of lines up to there.
    hash: String,
    len: u64,
    lines: u64,
}

/// The append-only, hash-chained log, shared by every run of this process
/// and, under `flock`, with other processes writing the same file.
pub struct AuditLog {
    path: PathBuf,
    head: Mutex<Tail>,
    /// Appends that failed, ever (exported as a metric).
    failures: std::sync::atomic::AtomicU64,
    /// Whether the last append failed (the daemon's health check).
    failing: std::sync::atomic::AtomicBool,
}

impl AuditLog {
    /// Open (creating it and its directory if needed) for appending.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let io = |source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .read(true)
            .mode(0o640)
            .open(path)
            .map_err(io)?;
        let (hash, len, lines) = (|| {
            file.lock()?;
            let tail = mend(&file, path);
            let _ = file.unlock();
            let (hash, len) = tail?;
            Ok((hash, len, count_lines(&file, 0, len)?))
        })()
        .map_err(io)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            head: Mutex::new(Tail {
                file,
                hash,
                len,
                lines,
            }),
            failures: Default::default(),
            failing: Default::default(),
        })
    }

    /// The log's file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Append one line (chained to the previous one); fsync it when `sync`.
    pub(super) fn append(&self, entry: Entry, sync: bool) -> Result<(), AuditError> {
        self.append_all(vec![entry], sync)
    }

    /// Append lines in order with one write (and one fsync when `sync`).
    pub(super) fn append_all(&self, entries: Vec<Entry>, sync: bool) -> Result<(), AuditError> {
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let mut head = self.head.lock().unwrap_or_else(|p| p.into_inner());
        head.file.lock().map_err(io)?;
        let written = (|| {
            let len = head.file.metadata()?.len();
            if len != head.len {
                // Another process appended since our last write: continue its chain.
                let (hash, len) = mend(&head.file, &self.path)?;
                head.lines = if len >= head.len {
                    head.lines + count_lines(&head.file, head.len, len)?
                } else {
                    count_lines(&head.file, 0, len)?
                };
                head.hash = hash;
                head.len = len;
            }
            let mut hash = head.hash.clone();
            let mut bytes = Vec::new();
            let added = entries.len() as u64;
            for mut entry in entries {
                entry.prev = hash;
                // Whatever a planner, an alert or a tool produced, the line
                // stays one that `verify`, `show` and `transcript` can read.
                if let Some(v) = entry.args.as_mut() {
                    crate::text::fit(v, crate::text::MAX_VALUE_DEPTH);
                }
                if let Some(v) = entry.detail.as_mut() {
                    crate::text::fit(v, crate::text::MAX_VALUE_DEPTH);
                }
                let line = serde_json::to_vec(&entry).map_err(std::io::Error::other)?;
                hash = hex(&Sha256::digest(&line));
                bytes.extend_from_slice(&line);
                bytes.push(b'\n');
            }
            let wrote = head
                .file
                .write_all(&bytes)
                .and_then(|()| if sync { head.file.sync_data() } else { Ok(()) });
            if let Err(e) = wrote {
                // A full disk can take half a line: cut it off, so the log
                // stays a chain of whole lines and works again when space returns.
                let _ = head.file.set_len(head.len);
                return Err(e);
            }
            head.hash = hash;
            head.len += bytes.len() as u64;
            head.lines += added;
            Ok(())
        })();
        let _ = head.file.unlock();
        self.failing
            .store(written.is_err(), std::sync::atomic::Ordering::Relaxed);
        if written.is_err() {
            self.failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        written.map_err(io)
    }

    /// The last line this process knows of: its hash and its line number.
    pub(crate) fn head(&self) -> head::Head {
        let t = self.head.lock().unwrap_or_else(|p| p.into_inner());
        head::Head {
            lines: t.lines,
            hash: t.hash.clone(),
        }
    }

    /// How many appends have failed since the log was opened.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the most recent append failed.
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Newlines between byte offsets `from` and `to` of `file`.
fn count_lines(file: &File, from: u64, to: u64) -> std::io::Result<u64> {
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(from))?;
    let mut reader = BufReader::with_capacity(64 << 10, f.take(to - from));
    let mut n = 0;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(n);
        }
        n += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        let len = buf.len();
        reader.consume(len);
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hash of the file's last whole line and the file's length, after mending
/// the tail (see the module doc). The caller holds the file's `flock`.
///
/// What follows the last newline is one of two things. A line that parses
/// and chains to the line before it is whole: it lost only its newline (a
/// person's editor, a truncation by one byte), and gets it back. Anything
/// else is a fragment a killed writer left: it is set aside.
fn mend(file: &File, path: &Path) -> std::io::Result<(String, u64)> {
    if let Some(tail) = last_hash(file)? {
        return Ok(tail);
    }
    let len = file.metadata()?.len();
    let cut = last_newline(file, len)?.map_or(0, |i| i + 1);
    if chains(file, cut, len)? {
        // Appended (the file is opened for appending), then synced: the
        // line was synced before, now its newline is too.
        (&mut &*file).write_all(b"\n")?;
        file.sync_data()?;
        tracing::warn!(
            "audit log {}: its last line had lost its newline; the newline is back and the chain goes on",
            path.display()
        );
        return last_hash(file)?
            .ok_or_else(|| std::io::Error::other("the log changed while it was mended"));
    }
    let aside = torn_path(path);
    let mut out = open_aside(&aside)?;
    // Streamed, not held: whatever its size, the fragment is kept whole.
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(cut))?;
    std::io::copy(&mut f.take(len - cut), &mut out)?;
    out.write_all(b"\n")?;
    out.sync_data()?;
    file.set_len(cut)?;
    file.sync_data()?;
    tracing::warn!(
        "audit log {}: a writer was killed mid-write; its unacknowledged fragment ({} bytes) is set aside in {} and the chain goes on from line {}",
        path.display(),
        len - cut,
        aside.display(),
        count_lines(file, 0, cut)?
    );
    last_hash(file)?.ok_or_else(|| std::io::Error::other("the log changed while it was mended"))
}

/// The longest tail that is read to see whether it is a whole line.
const MAX_WHOLE_TAIL: u64 = 16 << 20;

/// Whether the bytes from `cut` to `len` are one whole line that chains to
/// the line before `cut` (or starts the chain).
fn chains(file: &File, cut: u64, len: u64) -> std::io::Result<bool> {
    if len - cut > MAX_WHOLE_TAIL {
        return Ok(false);
    }
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(cut))?;
    let mut tail = Vec::with_capacity((len - cut) as usize);
    (&mut f).take(len - cut).read_to_end(&mut tail)?;
    let Ok(line) = serde_json::from_slice::<Value>(&tail) else {
        return Ok(false);
    };
    let before = match cut {
        0 => GENESIS.to_string(),
        _ => {
            let start = last_newline(file, cut - 1)?.map_or(0, |i| i + 1);
            let mut prev = Vec::with_capacity((cut - 1 - start) as usize);
            f.seek(SeekFrom::Start(start))?;
            (&mut f).take(cut - 1 - start).read_to_end(&mut prev)?;
            hex(&Sha256::digest(&prev))
        }
    };
    Ok(line.get("prev").and_then(Value::as_str) == Some(before.as_str()))
}

/// The file fragments are set aside in: appended to, owner-only, never
/// through a symlink, and only if it is a regular file.
fn open_aside(aside: &Path) -> std::io::Result<File> {
    let out = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(aside)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => std::io::Error::other(format!(
                "{} is a symlink; refused (move it away: fragments are never written through a link)",
                aside.display()
            )),
            Some(nix::libc::ENXIO) => std::io::Error::other(format!(
                "{} is not a regular file; refused (move it away)",
                aside.display()
            )),
            _ => std::io::Error::new(e.kind(), format!("{}: {e}", aside.display())),
        })?;
    if !out.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file; refused (move it away)",
            aside.display()
        )));
    }
    Ok(out)
}

/// The offset of the last `\n` before `len`, if any.
fn last_newline(file: &File, len: u64) -> std::io::Result<Option<u64>> {
    let mut f = file.try_clone()?;
    let mut end = len;
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
    }
    Ok(None)
}

/// Hash of the file's last line and the file's length; `None` when the last line is incomplete.
fn last_hash(file: &File) -> std::io::Result<Option<(String, u64)>> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Some((GENESIS.to_string(), 0)));
    }
    let mut f = file.try_clone()?;
    let mut window: u64 = 64 * 1024;
    loop {
        let start = len.saturating_sub(window);
        f.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::with_capacity((len - start) as usize);
        (&mut f).take(len - start).read_to_end(&mut buf)?;
        if buf.last() != Some(&b'\n') {
            return Ok(None);
        }
        let body = &buf[..buf.len() - 1];
        match body.iter().rposition(|&b| b == b'\n') {
            Some(i) => return Ok(Some((hex(&Sha256::digest(&body[i + 1..])), len))),
            None if start == 0 => return Ok(Some((hex(&Sha256::digest(body)), len))),
            None => window *= 4,
        }
    }
}

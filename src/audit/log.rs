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
//!
//! A line that must be durable before anything acts on it (a call's intent,
//! a trigger before its 2xx) is written under the locks and synced after
//! them, by group commit: runs that write while a sync is under way share
//! the next one. What a sync costs was measured before this shape was
//! kept: on ext4 on a VM, overwriting preallocated blocks in place synced
//! no faster than an append (`cargo bench --bench daemon` prints both), so
//! the log stays a plain file that grows, readable by `tail -f` and `jq`.
//!
//! One file: the flock, the chain's head, the torn tail, rotation and group
//! commit all guard one `Tail` under one lock; apart, each would have to be
//! right about the others' state.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::segments::{self, Rotation, segment_path};
use super::{Entry, GENESIS, Phase, head};

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
    /// The file's device and inode: whether it is still the log's current
    /// file is one `stat` of the path against these.
    id: (u64, u64),
    /// Hash of the last line, the file length it was read at, and that
    /// line's number in the whole chain.
    hash: String,
    len: u64,
    lines: u64,
    /// When the file's first line was written (for rotation by age).
    since: Option<jiff::Timestamp>,
    /// How much of the file this process knows to be on disk.
    synced: u64,
    /// Whether a thread of this process is syncing the file now (without
    /// the lock: see [`AuditLog::group_sync`]).
    syncing: bool,
}

/// Where an unsynced append ended: what [`AuditLog::sync_through_within`] makes durable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    file: (u64, u64),
    end: u64,
}

/// The append-only, hash-chained log, shared by every run of this process
/// and, under `flock`, with other processes writing the same file.
pub struct AuditLog {
    path: PathBuf,
    rotation: Rotation,
    head: Mutex<Tail>,
    /// Notified whenever a sync made more of the file durable.
    synced: std::sync::Condvar,
    /// Appends that failed, ever (exported as a metric).
    failures: std::sync::atomic::AtomicU64,
    /// Device flushes made to make lines durable, ever (a metric: against
    /// the calls made, what group commit saved).
    syncs: std::sync::atomic::AtomicU64,
    /// Whether the last append failed (the daemon's health check).
    failing: std::sync::atomic::AtomicBool,
}

impl AuditLog {
    /// Open (creating it and its directory if needed) for appending, with
    /// the default [`Rotation`].
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        AuditLog::open_with(path, Rotation::default())
    }

    /// Open for appending; segments close and go as `rotation` says.
    pub fn open_with(path: &Path, rotation: Rotation) -> Result<AuditLog, AuditError> {
        let io = |source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::files::make_dir(parent).map_err(io)?;
        }
        super::format::check(path).map_err(io)?;
        let file = open_current(path).map_err(io)?;
        let mut tail = Tail {
            id: file_id(&file).map_err(io)?,
            file,
            hash: GENESIS.to_string(),
            len: 0,
            lines: 0,
            since: None,
            synced: 0,
            syncing: false,
        };
        (|| {
            tail.file.lock()?;
            // Under the log's lock: writers opening it at once record
            // their version one after the other.
            let read = super::format::claim(path).and_then(|()| tail.refresh(path));
            let _ = tail.file.unlock();
            read
        })()
        .map_err(io)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            rotation,
            head: Mutex::new(tail),
            synced: Default::default(),
            failures: Default::default(),
            syncs: Default::default(),
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
        self.append_at(entries, sync).map(|_| ())
    }

    /// Make everything up to `written` durable, unless a later sync (a
    /// run's intent line, a rotation) already did; first wait up to `grace`
    /// for a sync already on its way (a run's intent line, written just
    /// after) to cover it: then one device flush makes both durable, not
    /// two in a row on the run's way to its first call.
    pub(crate) fn sync_through_within(
        &self,
        written: Written,
        grace: Duration,
    ) -> Result<(), AuditError> {
        let head = self.head.lock().unwrap_or_else(|p| p.into_inner());
        let (head, _) = self
            .synced
            .wait_timeout_while(head, grace, |h| !h.covers(written))
            .unwrap_or_else(|p| p.into_inner());
        self.group_sync(head, written)
    }

    /// Group commit: make `written` durable with one `fdatasync` shared
    /// by every writer waiting at the time. The sync runs without the
    /// log's lock, so other runs write their lines meanwhile; a writer
    /// that finds a sync under way waits for it, and then either it was
    /// covered or it leads the next sync, which covers everyone who wrote
    /// meanwhile. Concurrent runs pay one device flush per round, not one
    /// each in a row.
    fn group_sync(
        &self,
        mut head: std::sync::MutexGuard<'_, Tail>,
        written: Written,
    ) -> Result<(), AuditError> {
        loop {
            if head.covers(written) {
                return Ok(());
            }
            if !head.syncing {
                break;
            }
            head = self.synced.wait(head).unwrap_or_else(|p| p.into_inner());
        }
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        head.syncing = true;
        let (file, id, end) = match head.file.try_clone() {
            Ok(file) => (file, head.id, head.len),
            Err(e) => {
                head.syncing = false;
                drop(head);
                self.synced.notify_all();
                return Err(io(e));
            }
        };
        drop(head);
        let synced = file.sync_data();
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut head = self.head.lock().unwrap_or_else(|p| p.into_inner());
        head.syncing = false;
        if synced.is_ok() && head.id == id {
            head.synced = head.synced.max(end);
        }
        drop(head);
        self.synced.notify_all();
        synced.map_err(io)
    }

    /// [`append_all`](Self::append_all), saying where the lines ended.
    /// The lines are written under the log's locks; a sync is then a
    /// [group commit](Self::group_sync), after the locks are given back.
    pub(super) fn append_at(&self, entries: Vec<Entry>, sync: bool) -> Result<Written, AuditError> {
        let mut head = self.head.lock().unwrap_or_else(|p| p.into_inner());
        let written = self.lock_current(&mut head).and_then(|()| {
            if head.due(&self.rotation) {
                self.rotate(&mut head)?;
            }
            write_lines(&mut head, entries)
        });
        let written = self.release(head, written)?;
        if sync {
            let head = self.head.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = self.group_sync(head, written) {
                self.failing
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                self.failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(written)
    }

    /// Append `entries`, unsynced, only if that cannot wait on anything:
    /// no thread of this process holds the log (a writer's fsync), no
    /// other process holds its `flock`, no rotation is due and no other
    /// process appended since. For an async worker, which must never
    /// block; `Err(entries)`: write them from a thread that may wait.
    pub(crate) fn try_append_at(
        &self,
        entries: Vec<Entry>,
    ) -> Result<Result<Written, AuditError>, Vec<Entry>> {
        let mut head = match self.head.try_lock() {
            Ok(head) => head,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(entries),
        };
        if !self.lock_current_if_free(&mut head) {
            return Err(entries);
        }
        let written = write_lines(&mut head, entries);
        Ok(self.release(head, written))
    }

    /// After an append: give the `flock` back and count a failure.
    fn release(
        &self,
        head: std::sync::MutexGuard<'_, Tail>,
        written: std::io::Result<Written>,
    ) -> Result<Written, AuditError> {
        let _ = head.file.unlock();
        drop(head);
        self.failing
            .store(written.is_err(), std::sync::atomic::Ordering::Relaxed);
        if written.is_err() {
            self.failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        written.map_err(|source| AuditError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// [`lock_current`](Self::lock_current) only if nothing is to wait for
    /// or do first: the `flock` is free, the file is still the log, nobody
    /// else appended, no rotation is due. `false` (nothing held, whatever
    /// went wrong is left to a write that may wait): not now.
    fn lock_current_if_free(&self, head: &mut Tail) -> bool {
        if head.file.try_lock().is_err() {
            return false;
        }
        let free = path_id(&self.path).is_ok_and(|id| id == Some(head.id))
            && head.file.metadata().is_ok_and(|m| m.len() == head.len)
            && !head.due(&self.rotation);
        if !free {
            let _ = head.file.unlock();
        }
        free
    }

    /// Take the `flock` of the file that is the log now (another writer may
    /// have closed the one this process holds as a segment), and read its
    /// head again if another process appended since.
    fn lock_current(&self, head: &mut Tail) -> std::io::Result<()> {
        loop {
            head.file.lock()?;
            if path_id(&self.path)? == Some(head.id) {
                break;
            }
            let _ = head.file.unlock();
            head.file = open_current(&self.path)?;
            head.id = file_id(&head.file)?;
            head.len = u64::MAX;
        }
        if head.file.metadata()?.len() != head.len {
            head.refresh(&self.path)?;
        }
        Ok(())
    }

    /// Close the current file as a segment and start it again with a
    /// `segment` line (see [`super::segments`]). The caller holds
    /// the current file's `flock`; on return it holds the new file's.
    /// In order: what retention removes ([`Self::retiring`]), the new
    /// file's first line, the swap ([`Self::swap_in`]), then the retired
    /// segments' removal.
    fn rotate(&self, head: &mut Tail) -> std::io::Result<()> {
        let first = first_number(&head.file)?.unwrap_or(1);
        let closed = segment_path(&self.path, first);
        let carried = super::runs::recovery(&self.path)?;
        let now = jiff::Timestamp::now();
        let retired = self.retiring(head, now)?;
        let mut line = Entry {
            ts: now.to_string(),
            run_id: "-".into(),
            phase: Some(Phase::Segment),
            runbook: "-".into(),
            host: "-".into(),
            planner: "-".into(),
            detail: Some(serde_json::json!({
                "previous": {
                    "segment": file_name(&closed),
                    "first": first,
                    "last": head.lines,
                    "head": head.hash,
                },
                "retired": retired,
                "retired_total": retired_total(
                    first_line(&head.file)?.and_then(|s| s.detail?.retired_total),
                    &retired,
                ),
                "carried": carried.to_json(),
            })),
            ..Entry::default()
        };
        line.prev = head.hash.clone();
        line.n = Some(head.lines + 1);
        let mut bytes = encode(line)?;
        let hash = hex(&Sha256::digest(&bytes));
        bytes.push(b'\n');
        let out = self.swap_in(head, &closed, &bytes)?;
        for r in &retired {
            if let Some(name) = r["segment"].as_str() {
                let _ = std::fs::remove_file(self.path.with_file_name(name));
            }
        }
        tracing::info!(
            "audit log {}: lines {first}-{} closed as {}{}",
            self.path.display(),
            head.lines,
            closed.display(),
            match retired.len() {
                0 => String::new(),
                n => format!("; {n} segment(s) older than the retention removed"),
            }
        );
        let _ = head.file.unlock();
        head.id = file_id(&out)?;
        head.file = out;
        head.hash = hash;
        head.lines += 1;
        head.len = bytes.len() as u64;
        head.synced = head.len;
        head.since = Some(now);
        Ok(())
    }

    /// The closed segments retention removes at this rotation, as the
    /// `segment` line records them. Oldest first, each decided on the
    /// segment's own last line (a file's mtime is anyone's to set: `touch
    /// -d 2020` is no retention; a segment whose last line names no time
    /// is kept), then by size: the oldest go while the history (the
    /// segments, the file closing now and the next one's first line) holds
    /// more than `max_total`.
    fn retiring(&self, head: &Tail, now: jiff::Timestamp) -> std::io::Result<Vec<Value>> {
        let (keep, max_total) = (self.rotation.keep, self.rotation.max_total);
        if keep.is_none() && max_total.is_none() {
            return Ok(Vec::new());
        }
        let cutoff = keep.map(|k| now - jiff::SignedDuration::try_from(k).unwrap_or_default());
        let closed = segments::closed(&self.path)?;
        let mut total: u64 = head.file.metadata()?.len();
        for s in &closed {
            total += std::fs::metadata(&s.path)?.len();
        }
        let mut out = Vec::new();
        for s in closed {
            let f = File::open(&s.path)?;
            let Some(last) = last_time(&f)? else { break };
            let too_old = cutoff.is_some_and(|c| last < c);
            let too_much = max_total.is_some_and(|m| total > m);
            if !too_old && !too_much {
                break;
            }
            total = total.saturating_sub(f.metadata()?.len());
            let (hash, _) = last_hash(&f)?.unwrap_or_default();
            out.push(serde_json::json!({
                "segment": file_name(&s.path),
                "first": s.first,
                "last": last_number(&f)?,
                "head": hash,
                "from": first_stamp(&f)?.map(|t| t.to_string()),
                "to": last.to_string(),
                "why": if too_old { "keep" } else { "max_total" },
            }));
        }
        Ok(out)
    }

    /// Give the log's name to a new file whose first line is `first_line`,
    /// and the closing file the name `closed`: the new file, locked. The
    /// new file is whole before it takes the log's name, so the name always
    /// points at a chain: its content first, then a second name for the
    /// closed one, then the swap, then the directory synced.
    fn swap_in(&self, head: &Tail, closed: &Path, first_line: &[u8]) -> std::io::Result<File> {
        let next = {
            let mut p = self.path.as_os_str().to_owned();
            p.push(".next");
            PathBuf::from(p)
        };
        let _ = std::fs::remove_file(&next);
        let mut out = OpenOptions::new()
            .append(true)
            .read(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&next)?;
        // Locked before it takes the log's name: a writer that finds the new
        // file waits until this one's append is written, and never finds the
        // new file free, filling and closing it while this writer still
        // takes it for the log.
        out.lock()?;
        // What the closing file holds is on disk before it closes: a writer
        // that wrote to it without a sync relies on this (see `sync_through_within`).
        head.file.sync_data()?;
        let meta = head.file.metadata()?;
        if nix::unistd::geteuid().is_root() {
            // root (a person's `runwarden run`) rotating the daemon's log
            // leaves it the daemon's.
            std::os::unix::fs::fchown(&out, Some(meta.uid()), Some(meta.gid()))?;
        }
        out.set_permissions(meta.permissions())?;
        out.write_all(first_line)?;
        out.sync_data()?;
        match std::fs::hard_link(&self.path, closed) {
            Ok(()) => {}
            // A rotation cut short after this step: the name is already there.
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && path_id(closed)? == Some(head.id) => {}
            Err(e) => return Err(e),
        }
        std::fs::rename(&next, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            })?
            .sync_all()?;
        }
        Ok(out)
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

    /// How many group syncs this process has made (see [`Self::group_sync`]).
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the most recent append failed.
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Tail {
    /// Whether what `written` ended at is durable: this process synced that
    /// far, or the file was closed as a segment since (a rotation syncs
    /// the file it closes).
    fn covers(&self, written: Written) -> bool {
        self.id != written.file || self.synced >= written.end
    }

    /// Whether the file is due to close as a segment before the next line.
    fn due(&self, rotation: &Rotation) -> bool {
        self.len > 0
            && (self.len >= rotation.max_bytes
                || rotation
                    .max_age
                    .zip(self.since)
                    .is_some_and(|(age, since)| {
                        jiff::SignedDuration::try_from(age)
                            .ok()
                            .and_then(|age| since.checked_add(age).ok())
                            .is_some_and(|due| due <= jiff::Timestamp::now())
                    }))
    }

    /// Read the head from the file (the caller holds its `flock`): mend its
    /// tail, then its last line's hash and number. An empty file continues
    /// the newest closed segment.
    fn refresh(&mut self, path: &Path) -> std::io::Result<()> {
        let (hash, len) = mend(&self.file, path)?;
        if len == 0 {
            let newest = segments::closed(path)?.pop();
            let (hash, lines) = match newest {
                None => (GENESIS.to_string(), 0),
                Some(s) => {
                    let f = File::open(&s.path)?;
                    let (hash, _) = last_hash(&f)?.ok_or_else(|| {
                        std::io::Error::other(format!(
                            "{}: its last line is incomplete (a closed segment never changes: restore it from an archive)",
                            s.path.display()
                        ))
                    })?;
                    (hash, last_number(&f)?.unwrap_or(0))
                }
            };
            (self.hash, self.len, self.lines, self.since) = (hash, 0, lines, None);
            self.synced = 0;
            return Ok(());
        }
        let lines = match last_number(&self.file)? {
            Some(n) => n,
            // Written before lines were numbered: counted once, then every
            // new line carries its number.
            None => count_lines(&self.file, 0, len)?,
        };
        (self.hash, self.len, self.lines) = (hash, len, lines);
        self.since = first_stamp(&self.file)?;
        self.synced = self.synced.min(len);
        Ok(())
    }
}

/// Chain `entries` to the head and write them in one write (not synced:
/// see [`AuditLog::group_sync`]); the caller holds the head and the file's
/// `flock`. A write that fails is cut off: a full disk can take half a
/// line, and the log stays a chain of whole lines that works again when
/// space returns.
fn write_lines(head: &mut Tail, entries: Vec<Entry>) -> std::io::Result<Written> {
    let mut hash = head.hash.clone();
    let mut bytes = Vec::new();
    let added = entries.len() as u64;
    for (i, mut entry) in entries.into_iter().enumerate() {
        entry.prev = hash;
        entry.n = Some(head.lines + 1 + i as u64);
        let line = encode(entry)?;
        hash = hex(&Sha256::digest(&line));
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    if let Err(e) = head.file.write_all(&bytes) {
        let _ = head.file.set_len(head.len);
        return Err(e);
    }
    if head.len == 0 {
        head.since = Some(jiff::Timestamp::now());
    }
    head.hash = hash;
    head.len += bytes.len() as u64;
    head.lines += added;
    Ok(Written {
        file: head.id,
        end: head.len,
    })
}

/// Serialised as a line (without its newline), its values bounded so that
/// whatever a planner, an alert or a tool produced, the line stays one that
/// `verify`, `show` and `transcript` can read.
fn encode(mut entry: Entry) -> std::io::Result<Vec<u8>> {
    if let Some(v) = entry.args.as_mut() {
        crate::text::fit(v, crate::text::MAX_VALUE_DEPTH);
    }
    if let Some(v) = entry.detail.as_mut() {
        crate::text::fit(v, crate::text::MAX_VALUE_DEPTH);
    }
    serde_json::to_vec(&entry).map_err(std::io::Error::other)
}

fn open_current(path: &Path) -> std::io::Result<File> {
    // Never through a link planted where the log should be: root's
    // `runwarden run` would append its lines to whatever it points at.
    crate::files::open_append(path, 0o640)
}

/// Every segment retention removed so far: what the file closing now says
/// it removed before it (`prior`), and what this rotation removes.
fn retired_total(prior: Option<Value>, now: &[Value]) -> Value {
    let mut t = prior.unwrap_or_else(|| serde_json::json!({ "segments": 0 }));
    for r in now {
        t["segments"] = (t["segments"].as_u64().unwrap_or(0) + 1).into();
        if t["first"].is_null() {
            t["first"] = r["first"].clone();
            t["from"] = r["from"].clone();
        }
        t["last"] = r["last"].clone();
        t["to"] = r["to"].clone();
    }
    t
}

/// A file's device and inode.
fn file_id(file: &File) -> std::io::Result<(u64, u64)> {
    let m = file.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// The device and inode of the file at `path` now, if there is one.
fn path_id(path: &Path) -> std::io::Result<Option<(u64, u64)>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some((m.dev(), m.ino()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What retention removed before a file, as its first (`segment`) line
/// carries it: every segment retention ever removed, so the record of the
/// oldest removals survives their own segment lines' removal.
#[derive(serde::Deserialize, Default)]
struct StampDetail {
    #[serde(default)]
    retired_total: Option<Value>,
}

/// The first line's fields a reader of a segment wants without reading it all.
#[derive(serde::Deserialize)]
struct Stamp {
    #[serde(default)]
    detail: Option<StampDetail>,
    ts: Option<String>,
    n: Option<u64>,
}

fn first_line(file: &File) -> std::io::Result<Option<Stamp>> {
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(0))?;
    let mut line = Vec::new();
    BufReader::new(f.take(MAX_WHOLE_TAIL)).read_until(b'\n', &mut line)?;
    Ok(serde_json::from_slice(&line).ok())
}

/// The number of the file's first line (`None`: numbered lines start later, or none).
fn first_number(file: &File) -> std::io::Result<Option<u64>> {
    Ok(first_line(file)?.and_then(|s| s.n))
}

fn first_stamp(file: &File) -> std::io::Result<Option<jiff::Timestamp>> {
    Ok(first_line(file)?
        .and_then(|s| s.ts)
        .and_then(|t| t.parse().ok()))
}

/// The number of the file's last whole line, when it has one.
pub(super) fn last_number(file: &File) -> std::io::Result<Option<u64>> {
    Ok(last_stamp(file)?.and_then(|s| s.n))
}

/// When the file's last line was written, as the line says (its `ts`).
pub(super) fn last_time(file: &File) -> std::io::Result<Option<jiff::Timestamp>> {
    Ok(last_stamp(file)?
        .and_then(|s| s.ts)
        .and_then(|t| t.parse().ok()))
}

/// The last line's number and time.
fn last_stamp(file: &File) -> std::io::Result<Option<Stamp>> {
    let len = file.metadata()?.len();
    let Some(end) = len.checked_sub(1) else {
        return Ok(None);
    };
    let start = last_newline(file, end)?.map_or(0, |i| i + 1);
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(start))?;
    let mut line = Vec::with_capacity((end - start) as usize);
    (&mut f).take(end - start).read_to_end(&mut line)?;
    Ok(serde_json::from_slice::<Stamp>(&line).ok())
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

/// The file fragments are set aside in: appended to, owner-only, and
/// opened as every state file is (never through a link, a regular file).
fn open_aside(aside: &Path) -> std::io::Result<File> {
    crate::files::open_append(aside, 0o600)
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
pub(super) fn last_hash(file: &File) -> std::io::Result<Option<(String, u64)>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn synced(log: &AuditLog) -> (u64, u64) {
        let t = log.head.lock().unwrap();
        (t.synced, t.len)
    }

    /// An async worker writes queued lines itself only when nothing is to
    /// wait for: not while a thread holds the log (a writer's fsync), not
    /// while another process holds its `flock`, not when a rotation is due.
    /// Lines it could not write come back, and the chain stays whole.
    #[test]
    fn a_write_that_would_wait_is_handed_back_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open_with(
            &path,
            Rotation {
                max_bytes: 2048,
                max_age: None,
                keep: None,
                max_total: None,
            },
        )
        .unwrap();
        let line = || crate::audit::tests::info().entry(Phase::Queued, None);
        log.append(line(), true).unwrap();
        // Free: written at once.
        assert!(matches!(log.try_append_queued(vec![line()]), Ok(Ok(_))));
        // A thread holds the log.
        let held = log.head.lock().unwrap();
        let back = log.try_append_queued(vec![line(), line()]).unwrap_err();
        assert_eq!(back.len(), 2);
        drop(held);
        // Another process (another open file description) holds its flock.
        let other = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        other.lock().unwrap();
        assert!(log.try_append_queued(vec![line()]).is_err());
        other.unlock().unwrap();
        // Another process appended: its head must be read first, by a
        // write that may wait; after that the log is free again.
        let another = AuditLog::open(&path).unwrap();
        another.append(line(), false).unwrap();
        assert!(log.try_append_queued(vec![line()]).is_err());
        log.append_queued(vec![line()]).unwrap();
        assert!(matches!(log.try_append_queued(vec![line()]), Ok(Ok(_))));
        // A rotation is due: that is a waiting thread's to do.
        while log.head.lock().unwrap().len < 2048 {
            assert!(matches!(log.try_append_queued(vec![line()]), Ok(Ok(_))));
        }
        assert!(log.try_append_queued(vec![line()]).is_err());
        log.append_queued(vec![line()]).unwrap();
        let v = crate::audit::verify::verify(&path).unwrap();
        assert!(v.broken().is_none(), "{:?}", v.problems);
        assert_eq!(
            segments::closed(&path).unwrap().len(),
            1,
            "one rotation, by the waiting write ({} files verified)",
            v.segments
        );
    }

    /// The queued lines' write leaves them to a sync: the caller's own, or
    /// an intent line's that came first, or the rotation that closed their file.
    #[test]
    fn an_unsynced_append_is_synced_once_by_whichever_sync_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open_with(
            &path,
            Rotation {
                max_bytes: 4096,
                max_age: None,
                keep: None,
                max_total: None,
            },
        )
        .unwrap();
        let line = || crate::audit::tests::info().entry(Phase::Queued, None);
        let w = log.append_queued(vec![line()]).unwrap();
        let (done, len) = synced(&log);
        assert!(done < w.end && w.end == len);
        log.sync_through_within(w, Duration::ZERO).unwrap();
        assert_eq!(synced(&log), (len, len));

        // An intent line's sync covers an earlier unsynced write.
        let w = log.append_queued(vec![line()]).unwrap();
        log.append(line(), true).unwrap();
        let (done, len) = synced(&log);
        assert!(done == len && done > w.end);

        // A rotation syncs the file it closes: nothing is left to sync.
        let w = log.append_queued(vec![line()]).unwrap();
        while segments::closed(&path).unwrap().is_empty() {
            log.append(line(), false).unwrap();
        }
        log.sync_through_within(w, Duration::ZERO).unwrap();
        let (done, _) = synced(&log);
        assert!(
            done > 0,
            "the new file's first line was synced as it was made"
        );
    }

    /// Waiting for a sync on its way: the answer comes once another
    /// thread's synced line (a run's intent) covered the queued one, with
    /// that line already in the file; with none coming, it syncs alone
    /// when the grace is over.
    #[test]
    fn a_queued_line_waits_for_the_intent_sync_that_covers_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = std::sync::Arc::new(AuditLog::open(&path).unwrap());
        let line = |id: &str| crate::audit::RunInfo {
            run_id: id.into(),
            ..crate::audit::tests::info()
        };
        let w = log
            .append_queued(vec![line("queued").entry(Phase::Queued, None)])
            .unwrap();
        let runner = log.clone();
        let run = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            runner
                .append(line("intent").entry(Phase::Intent, Some(1)), true)
                .unwrap();
        });
        log.sync_through_within(w, Duration::from_secs(30)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\"intent\""),
            "answered before the intent's sync covered the queued line"
        );
        run.join().unwrap();

        let w = log
            .append_queued(vec![line("alone").entry(Phase::Queued, None)])
            .unwrap();
        log.sync_through_within(w, Duration::from_millis(20))
            .unwrap();
        let (done, len) = synced(&log);
        assert_eq!((done, len), (w.end, w.end), "synced alone after the grace");
    }

    /// Group commit: writers that come while a sync is under way write
    /// their lines at once and then share one device flush; none returns
    /// before a sync that began after its line was written.
    #[test]
    fn writers_that_wait_on_a_sync_share_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = std::sync::Arc::new(AuditLog::open(&path).unwrap());
        let line = || crate::audit::tests::info().entry(Phase::Intent, Some(1));
        log.append(line(), true).unwrap();
        let before = log.syncs();
        // A sync under way (as a leader's, between its snapshot and its end).
        log.head.lock().unwrap().syncing = true;
        let writers: Vec<_> = (0..5)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || log.append(line(), true))
            })
            .collect();
        let t = std::time::Instant::now();
        while log.head.lock().unwrap().lines < 6 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the writers did not write"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            writers.iter().all(|w| !w.is_finished()),
            "a writer returned before a sync covered its line"
        );
        assert_eq!(log.syncs(), before);
        // The sync under way ends (it covered none of them).
        log.head.lock().unwrap().syncing = false;
        log.synced.notify_all();
        for w in writers {
            w.join().unwrap().unwrap();
        }
        assert_eq!(log.syncs(), before + 1, "one flush for the five lines");
        let (done, len) = synced(&log);
        assert_eq!(done, len);
        let v = crate::audit::verify::verify(&path).unwrap();
        assert!(v.broken().is_none(), "{:?}", v.problems);
    }

    /// A writer killed at any byte of its write: the next writer keeps
    /// every whole line, sets the fragment aside byte for byte, and goes
    /// on with an unbroken chain; a line that lost only its newline is
    /// whole and kept.
    #[test]
    fn a_write_cut_at_any_byte_loses_no_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let whole = dir.path().join("whole.jsonl");
        let log = AuditLog::open(&whole).unwrap();
        let line = |phase| crate::audit::tests::info().entry(phase, Some(1));
        log.append(line(Phase::Queued), true).unwrap();
        log.append(line(Phase::Intent), true).unwrap();
        let kept = std::fs::metadata(&whole).unwrap().len() as usize;
        log.append(line(Phase::Result), true).unwrap();
        let bytes = std::fs::read(&whole).unwrap();
        let path = dir.path().join("audit.jsonl");
        for cut in kept + 1..bytes.len() {
            let _ = std::fs::remove_file(torn_path(&path));
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let log = AuditLog::open(&path).unwrap();
            log.append(line(Phase::Verdict), true).unwrap();
            let v = crate::audit::verify::verify(&path).unwrap();
            assert!(v.broken().is_none(), "cut at {cut}: {:?}", v.problems);
            let text = std::fs::read(&path).unwrap();
            let lines = text
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count();
            let aside = std::fs::read(torn_path(&path)).ok();
            if cut == bytes.len() - 1 {
                assert_eq!(lines, 4, "cut at {cut}: the whole line is kept");
                assert!(aside.is_none());
            } else {
                assert_eq!(lines, 3, "cut at {cut}");
                assert_eq!(&text[..kept], &bytes[..kept], "cut at {cut}");
                let aside = aside.unwrap_or_else(|| panic!("cut at {cut}: nothing set aside"));
                assert_eq!(&aside[..aside.len() - 1], &bytes[kept..cut], "cut at {cut}");
            }
        }
    }
}

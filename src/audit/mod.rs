//! The audit log: append-only, hash-chained JSONL.
//!
//! Every line carries `prev`, the sha256 of the previous line's bytes, so an
//! edited, deleted or reordered line breaks the chain and `runwarden audit
//! verify` names the first line where it breaks. (Cutting lines off the end
//! cannot be seen from inside the file; `verify` prints the head hash so it
//! can be pinned elsewhere.)
//!
//! Where the write sits relative to the side effect: the `intent` line is on
//! disk (written and fsynced) *before* a call is dispatched, and
//! [`AuditLog::intent`] returns the [`AuditTicket`] the executor demands. If
//! the intent cannot be persisted, nothing runs. Result lines of tier-1 calls
//! are written but not fsynced on their own; the next synced line (the next
//! intent, or the verdict) carries them to disk. A crash in between leaves an
//! intent without a result, which `audit show` and the daemon report as
//! interrupted. A run's `start` line is not synced on its own either: nothing
//! has run yet, and the first synced line carries it. Everything else
//! (tier-2 results, denials, proposals, suggestions, verdicts) is fsynced.
//!
//! Several processes may append to one log (the daemon and a person running
//! `runwarden run`): each append holds an exclusive `flock` and re-reads the
//! chain's head when the file grew under it.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub mod head;
pub mod runs;

use crate::gate::{Denial, Permit, Proposal};
use crate::tools::ToolResult;

/// `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The daemon accepted a trigger: the run exists before it starts.
    Queued,
    Start,
    Intent,
    Result,
    Denied,
    Proposal,
    /// L2: the call waits for a person's decision.
    Pending,
    DryRun,
    Suggestion,
    /// The model planner's request and the model's answer.
    Model,
    Verdict,
}

/// One line of the log.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Entry {
    pub ts: String,
    pub run_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    pub phase: Option<Phase>,
    pub runbook: String,
    pub runbook_version: String,
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    pub planner: String,
    /// Model-planned runs: the model's name and the system prompt's version and hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Phase-specific detail: the parsed result, the denial, the argv of a dry run, the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
    pub prev: String,
}

/// What every line of one run carries.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub run_id: String,
    pub runbook: String,
    pub runbook_version: String,
    pub host: String,
    pub planner: String,
    pub model: Option<String>,
    pub prompt: Option<String>,
}

impl RunInfo {
    pub fn entry(&self, phase: Phase, step: Option<u32>) -> Entry {
        Entry {
            ts: jiff::Timestamp::now().to_string(),
            run_id: self.run_id.clone(),
            step,
            phase: Some(phase),
            runbook: self.runbook.clone(),
            runbook_version: self.runbook_version.clone(),
            host: self.host.clone(),
            planner: self.planner.clone(),
            model: self.model.clone(),
            prompt: self.prompt.clone(),
            ..Entry::default()
        }
    }
}

/// A permitted call whose intent line is on disk: the one value the
/// executor dispatches. Only [`AuditLog::intent`] makes one, from the
/// [`Permit`] it consumes, and dispatch consumes it in turn, so a call
/// cannot run without its line, nor twice on one line.
#[derive(Debug)]
pub struct AuditTicket {
    permit: Permit,
}

impl AuditTicket {
    pub fn step(&self) -> u32 {
        self.permit.step()
    }

    /// The call it allows.
    pub fn permit(&self) -> &Permit {
        &self.permit
    }

    /// The ticket spent by a dispatch; what the result line takes.
    pub(crate) fn dispatched(self) -> Dispatched {
        let action = self.permit.action();
        Dispatched {
            step: self.permit.step(),
            tool: action.tool().name().into(),
            tier: action.tier().number(),
        }
    }
}

/// A dispatched call, waiting for its result line ([`AuditLog::result`]).
#[derive(Debug)]
pub struct Dispatched {
    step: u32,
    tool: String,
    tier: u8,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "audit log {path}: {source} (no call runs without its audit line; fix the file or its filesystem)"
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "audit log {path} ends with an incomplete line (a write was cut short); run `runwarden audit verify {path}` and move the file aside"
    )]
    Torn { path: PathBuf },
}

struct Tail {
    file: File,
    /// Hash of the last line, the file length it was read at, and the
    /// number of lines up to there.
    hash: String,
    len: u64,
    lines: u64,
}

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
        let (hash, len) = last_hash(&file)
            .map_err(io)?
            .ok_or_else(|| AuditError::Torn {
                path: path.to_path_buf(),
            })?;
        let lines = count_lines(&file, 0, len).map_err(io)?;
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

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one line (chained to the previous one); fsync it when `sync`.
    pub fn append(&self, entry: Entry, sync: bool) -> Result<(), AuditError> {
        self.append_all(vec![entry], sync)
    }

    /// Append lines in order with one write (and one fsync when `sync`).
    pub fn append_all(&self, entries: Vec<Entry>, sync: bool) -> Result<(), AuditError> {
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
                match last_hash(&head.file)? {
                    Some((hash, len)) => {
                        let more = count_lines(&head.file, head.len.min(len), len)?;
                        head.lines = if len >= head.len {
                            head.lines + more
                        } else {
                            count_lines(&head.file, 0, len)?
                        };
                        head.hash = hash;
                        head.len = len;
                    }
                    None => {
                        return Err(std::io::Error::other(
                            "the log ends with an incomplete line",
                        ));
                    }
                }
            }
            let mut hash = head.hash.clone();
            let mut bytes = Vec::new();
            let added = entries.len() as u64;
            for mut entry in entries {
                entry.prev = hash;
                // Whatever a planner, an alert or a tool produced, the line
                // stays one that `verify`, `show` and `transcript` can read.
                if let Some(v) = entry.args.as_mut() {
                    fit(v, MAX_VALUE_DEPTH);
                }
                if let Some(v) = entry.detail.as_mut() {
                    fit(v, MAX_VALUE_DEPTH);
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
    pub fn head(&self) -> head::Head {
        let t = self.head.lock().unwrap_or_else(|p| p.into_inner());
        head::Head {
            lines: t.lines,
            hash: t.hash.clone(),
        }
    }

    /// How many appends have failed since the log was opened.
    pub fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the most recent append failed.
    pub fn failing(&self) -> bool {
        self.failing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Write and sync the intent of a permitted call; the ticket lets the
    /// executor run it, once. The permit is spent either way.
    pub fn intent(&self, run: &RunInfo, permit: Permit) -> Result<AuditTicket, AuditError> {
        let action = permit.action();
        let mut e = run.entry(Phase::Intent, Some(permit.step()));
        e.tool = Some(action.tool().name().into());
        e.args = Some(action.args_json());
        e.tier = Some(action.tier().number());
        e.approved_by = Some(permit.approved_by().to_string());
        e.reason = action.reason().map(str::to_string);
        self.append(e, true)?;
        Ok(AuditTicket { permit })
    }

    /// Close a dispatched call with its result.
    pub fn result(
        &self,
        run: &RunInfo,
        ticket: Dispatched,
        result: &ToolResult,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Result, Some(ticket.step));
        e.tool = Some(ticket.tool);
        e.tier = Some(ticket.tier);
        e.outcome = Some(
            serde_json::to_value(result.outcome)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
        );
        e.exit_code = result.exit_code;
        e.duration_ms = Some(result.duration_ms);
        e.detail = Some(serde_json::json!({
            "data": result.data,
            "error": result.error,
            "truncated": result.truncated,
            "verified": result.verified,
            "argv": result.argv,
        }));
        self.append(e, ticket.tier > 1)
    }

    pub fn denied(
        &self,
        run: &RunInfo,
        tool: &str,
        args: &Value,
        denial: &Denial,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Denied, Some(denial.step));
        e.tool = Some(tool.chars().take(200).collect());
        e.args = Some(bounded(args));
        e.tier = denial.tool.map(|t| t.tier().number());
        e.outcome = Some("denied".into());
        e.detail =
            Some(serde_json::json!({ "reason": denial.reason.as_str(), "message": denial.detail }));
        self.append(e, true)
    }

    pub fn proposal(&self, run: &RunInfo, p: &Proposal, argv: &[String]) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Proposal, Some(p.step()));
        e.tool = Some(p.action().tool().name().into());
        e.args = Some(p.action().args_json());
        e.tier = Some(p.action().tier().number());
        e.reason = p.action().reason().map(str::to_string);
        e.outcome = Some("proposed".into());
        e.detail = Some(serde_json::json!({ "argv": argv }));
        self.append(e, true)
    }
}

/// How deep a value inside a line may nest. serde_json reads at most 128
/// levels; a line keeps well inside that whatever it carries.
pub const MAX_VALUE_DEPTH: usize = 32;

/// Replace whatever nests deeper than `depth` levels by a note saying so.
fn fit(v: &mut Value, depth: usize) {
    if !(v.is_array() || v.is_object()) {
        return;
    }
    if depth == 0 {
        *v = Value::String(format!(
            "(a value nested deeper than {MAX_VALUE_DEPTH} levels, not kept)"
        ));
        return;
    }
    match v {
        Value::Array(a) => a.iter_mut().for_each(|c| fit(c, depth - 1)),
        Value::Object(o) => o.values_mut().for_each(|c| fit(c, depth - 1)),
        _ => {}
    }
}

/// Untrusted arguments of a denied call, kept but bounded in size and depth
/// (the audit line and the report both show this form).
pub fn bounded(args: &Value) -> Value {
    let text = args.to_string();
    if text.len() <= 4096 {
        let mut v = args.clone();
        fit(&mut v, MAX_VALUE_DEPTH);
        v
    } else {
        Value::String(format!(
            "{}… ({} bytes)",
            text.chars().take(512).collect::<String>(),
            text.len()
        ))
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

/// What `audit verify` found.
#[derive(Debug)]
pub struct Verification {
    pub lines: usize,
    /// The hash of the last line (what `--head` pins).
    pub head: String,
    /// Every problem, in order: (line number, what is wrong). After a bad
    /// line the chain is picked up again from that line's own hash, so one
    /// edit shows once and every later tampering still shows.
    pub problems: Vec<(usize, String)>,
}

impl Verification {
    /// The first problem, if any.
    pub fn broken(&self) -> Option<&(usize, String)> {
        self.problems.first()
    }
}

/// Walk the whole chain, reporting every line where it breaks.
pub fn verify(path: &Path) -> std::io::Result<Verification> {
    verify_against(path, &[])
}

/// [`verify`], and check the file against heads recorded elsewhere (the
/// journal, or one pinned by hand): line `lines` must hash to `hash`.
pub fn verify_against(path: &Path, heads: &[head::Head]) -> std::io::Result<Verification> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut prev = GENESIS.to_string();
    let mut n = 0;
    let mut line = Vec::new();
    let mut problems = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        n += 1;
        if line.last() != Some(&b'\n') {
            problems.push((n, "incomplete line (a write was cut short)".into()));
            break;
        }
        let body = &line[..line.len() - 1];
        let claimed = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["prev"].as_str().map(String::from));
        match claimed {
            None => problems.push((n, "not a JSON audit line".into())),
            Some(p) if p != prev => {
                let what = if n == 1 {
                    "the first line does not start the chain (lines before it were deleted)"
                        .to_string()
                } else {
                    format!(
                        "`prev` does not match line {}: a line was edited, deleted or reordered here",
                        n - 1
                    )
                };
                problems.push((n, what));
            }
            Some(_) => {}
        }
        prev = hex(&Sha256::digest(body));
        for h in heads.iter().filter(|h| h.lines == n as u64) {
            if h.hash != prev {
                problems.push((
                    n,
                    format!(
                        "does not match the head recorded for line {n} ({}…): the log was rewritten at or before this line",
                        &h.hash[..12]
                    ),
                ));
            }
        }
    }
    if let Some(h) = heads
        .iter()
        .filter(|h| h.lines > n as u64)
        .max_by_key(|h| h.lines)
    {
        problems.push((
            n + 1,
            format!(
                "the log ends at line {n}, but a head was recorded at line {}: lines were cut off the end",
                h.lines
            ),
        ));
    }
    Ok(Verification {
        lines: n,
        head: prev,
        problems,
    })
}

/// Who is writing a run: this process's pid, its start time (in clock
/// ticks since boot) and the boot's id, recorded on `queued` and `start`
/// lines so that a reader can tell a run in progress from one whose process
/// died, even once the pid is reused.
pub fn this_process() -> Value {
    let pid = std::process::id();
    serde_json::json!({ "pid": pid, "start": process_start(pid), "boot": boot_id() })
}

/// Whether the process recorded on `e` (see [`this_process`]) still runs.
/// A line without the record (older logs) counts as gone.
pub fn process_alive(e: &Entry) -> bool {
    let Some(p) = e.detail.as_ref().map(|d| &d["process"]) else {
        return false;
    };
    let Some(pid) = p["pid"].as_u64().and_then(|p| u32::try_from(p).ok()) else {
        return false;
    };
    p["boot"].as_str() == boot_id().as_deref()
        && p["start"].as_u64().is_some()
        && p["start"].as_u64() == process_start(pid)
}

fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 (starttime) is the 20th after the command name.
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The `start` lines of runs that have no `verdict` line: runs the process
/// was killed in the middle of.
/// Runs with a `queued` or `start` line and no verdict: the last line of each
/// (a `queued` line means it was accepted and never started).
pub fn unfinished_runs(path: &Path) -> std::io::Result<Vec<Entry>> {
    let reader = match File::open(path) {
        Ok(f) => BufReader::new(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut open: std::collections::HashMap<String, Entry> = Default::default();
    for line in reader.lines() {
        let Ok(e) = serde_json::from_str::<Entry>(&line?) else {
            continue;
        };
        match e.phase {
            Some(Phase::Queued) => {
                open.insert(e.run_id.clone(), e);
            }
            Some(Phase::Start) => {
                open.insert(e.run_id.clone(), e);
            }
            Some(Phase::Verdict) => {
                open.remove(&e.run_id);
            }
            _ => {}
        }
    }
    let mut runs: Vec<Entry> = open.into_values().collect();
    runs.sort_by(|a, b| a.ts.cmp(&b.ts));
    Ok(runs)
}

/// What the audit log says about one runbook since a time: the evidence a
/// person reads before raising its autonomy (L1 -> L2 -> L3).
#[derive(Debug, Default)]
pub struct Promotion {
    pub runs: usize,
    pub verdicts: std::collections::BTreeMap<String, usize>,
    /// tool -> (proposed, approved by a person, denied by a person, expired, run under standing approval)
    pub tools: std::collections::BTreeMap<String, [usize; 5]>,
    /// Calls a person denied: (ts, tool, args, message).
    pub denied: Vec<(String, String, String, String)>,
    /// Tier-2 results whose own verification failed: (ts, tool, evidence).
    pub unverified: Vec<(String, String, String)>,
}

impl std::fmt::Display for Promotion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "runs: {}  verdicts: {:?}", self.runs, self.verdicts)?;
        writeln!(
            f,
            "tier-2 calls by tool: proposed (L1) / approved / denied / expired (L2) / standing (L3)"
        )?;
        for (tool, [p, a, d, x, s]) in &self.tools {
            writeln!(f, "  {tool:<22} {p:>4} {a:>4} {d:>4} {x:>4} {s:>4}")?;
        }
        writeln!(f, "calls a person denied: {}", self.denied.len())?;
        for (ts, tool, args, why) in &self.denied {
            writeln!(f, "  {ts} {tool} {args}: {why}")?;
        }
        writeln!(f, "changes that did not verify: {}", self.unverified.len())?;
        for (ts, tool, evidence) in &self.unverified {
            writeln!(f, "  {ts} {tool}: {evidence}")?;
        }
        Ok(())
    }
}

pub fn promotion(path: &Path, runbook: &str, since: jiff::Timestamp) -> std::io::Result<Promotion> {
    let mut p = Promotion::default();
    let reader = match File::open(path) {
        Ok(f) => BufReader::new(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(p),
        Err(e) => return Err(e),
    };
    for line in reader.lines() {
        let Ok(e) = serde_json::from_str::<Entry>(&line?) else {
            continue;
        };
        if e.runbook != runbook || e.ts.parse::<jiff::Timestamp>().is_ok_and(|t| t < since) {
            continue;
        }
        let tool = e.tool.clone().unwrap_or_default();
        let reason = e
            .detail
            .as_ref()
            .and_then(|d| d["reason"].as_str())
            .unwrap_or("");
        match e.phase {
            Some(Phase::Start) => p.runs += 1,
            Some(Phase::Verdict) => {
                *p.verdicts
                    .entry(e.outcome.clone().unwrap_or_default())
                    .or_default() += 1
            }
            Some(Phase::Proposal) => p.tools.entry(tool).or_default()[0] += 1,
            Some(Phase::Intent) if e.tier == Some(2) => {
                let by = e.approved_by.as_deref().unwrap_or("");
                let slot = if by.starts_with("person:") { 1 } else { 4 };
                p.tools.entry(tool).or_default()[slot] += 1;
            }
            Some(Phase::Denied) if reason == "approval_denied" => {
                p.tools.entry(tool.clone()).or_default()[2] += 1;
                let msg = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["message"].as_str())
                    .unwrap_or("")
                    .to_string();
                p.denied.push((
                    e.ts.clone(),
                    tool,
                    e.args.map(|a| a.to_string()).unwrap_or_default(),
                    msg,
                ));
            }
            Some(Phase::Denied) if reason == "approval_expired" => {
                p.tools.entry(tool).or_default()[3] += 1
            }
            Some(Phase::Result) if e.detail.as_ref().is_some_and(|d| d["verified"] == false) => {
                let evidence = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["data"]["evidence"].as_str())
                    .unwrap_or("")
                    .to_string();
                p.unverified.push((e.ts.clone(), tool, evidence));
            }
            _ => {}
        }
    }
    Ok(p)
}

/// Every line of one run, in order.
pub fn run_lines(path: &Path, run_id: &str) -> std::io::Result<Vec<Entry>> {
    let reader = BufReader::new(File::open(path)?);
    let mut out = Vec::new();
    for line in reader.lines() {
        let line = line?;
        if !line.contains(run_id) {
            continue;
        }
        if let Ok(e) = serde_json::from_str::<Entry>(&line)
            && e.run_id == run_id
        {
            out.push(e);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RunInfo {
        RunInfo {
            run_id: "r1".into(),
            runbook: "rb".into(),
            runbook_version: "v".into(),
            host: "local".into(),
            planner: "steps".into(),
            model: None,
            prompt: None,
        }
    }

    fn write_lines(path: &Path, n: u32) {
        let log = AuditLog::open(path).unwrap();
        for i in 0..n {
            log.append(info().entry(Phase::Start, Some(i)), false)
                .unwrap();
        }
    }

    #[test]
    fn chain_verifies_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/audit.jsonl");
        write_lines(&path, 3);
        write_lines(&path, 2);
        let v = verify(&path).unwrap();
        assert_eq!(v.lines, 5);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
    }

    #[test]
    fn edit_delete_and_reorder_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        write_lines(&path, 4);
        let original = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = original.lines().collect();

        let edited = original.replacen("\"step\":1", "\"step\":7", 1);
        std::fs::write(&path, edited).unwrap();
        assert_eq!(
            verify(&path).unwrap().broken().unwrap().0,
            3,
            "the line after the edited one breaks"
        );

        let deleted = [lines[0], lines[2], lines[3]].join("\n") + "\n";
        std::fs::write(&path, deleted).unwrap();
        assert_eq!(verify(&path).unwrap().broken().unwrap().0, 2);

        let reordered = [lines[0], lines[2], lines[1], lines[3]].join("\n") + "\n";
        std::fs::write(&path, reordered).unwrap();
        assert_eq!(verify(&path).unwrap().broken().unwrap().0, 2);

        let headless = lines[1..].join("\n") + "\n";
        std::fs::write(&path, headless).unwrap();
        assert_eq!(verify(&path).unwrap().broken().unwrap().0, 1);
    }

    #[test]
    fn a_recorded_process_is_alive_only_while_that_very_process_runs() {
        let mut e = info().entry(Phase::Start, None);
        e.detail = Some(serde_json::json!({ "process": this_process() }));
        assert!(process_alive(&e));
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        e.detail =
            Some(serde_json::json!({ "process": { "pid": pid, "start": 1, "boot": boot_id() } }));
        assert!(!process_alive(&e), "gone");
        let mut me = this_process();
        me["start"] = serde_json::json!(me["start"].as_u64().unwrap() + 1);
        e.detail = Some(serde_json::json!({ "process": me }));
        assert!(!process_alive(&e), "the pid reused by another process");
        e.detail = None;
        assert!(!process_alive(&e), "no record");
    }

    #[test]
    fn torn_tail_refuses_to_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        write_lines(&path, 1);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"half")
            .unwrap();
        assert!(matches!(
            AuditLog::open(&path),
            Err(AuditError::Torn { .. })
        ));
    }

    #[test]
    fn two_writers_keep_one_chain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let a = AuditLog::open(&path).unwrap();
        let b = AuditLog::open(&path).unwrap();
        for i in 0..5 {
            a.append(info().entry(Phase::Start, Some(i)), false)
                .unwrap();
            b.append(info().entry(Phase::Start, Some(i)), false)
                .unwrap();
        }
        let v = verify(&path).unwrap();
        assert_eq!(v.lines, 10);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
    }
}

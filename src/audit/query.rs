//! Reading lines back: whether a run's process still lives, one run's lines,
//! and the evidence for promoting a runbook.
//! Readers go through [`Entry`]'s typed accessors, never the raw strings.

use std::path::Path;

use serde_json::Value;

use super::{Entry, Phase, segments};
use crate::gate::{ApprovedBy, DenyReason};

/// Who is writing a run: this process's pid, its start time (in clock
/// ticks since boot) and the boot's id, recorded on `queued` and `start`
/// lines so that a reader can tell a run in progress from one whose process
/// died, even once the pid is reused.
pub(crate) fn this_process() -> Value {
    // Read once: neither changes while the process lives.
    static ME: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id();
        serde_json::json!({ "pid": pid, "start": process_start(pid), "boot": boot_id() })
    })
    .clone()
}

/// Whether the process recorded on `e` (see [`this_process`]) still runs.
/// A line without the record (older logs) counts as gone.
pub(crate) fn process_alive(e: &Entry) -> bool {
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

pub(super) fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// What the audit log says about one runbook since a time: the evidence a
/// person reads before raising its autonomy (L1 -> L2 -> L3).
#[derive(Debug, Default)]
pub(crate) struct Promotion {
    /// Runs in the window.
    pub(crate) runs: usize,
    /// How many ended with each verdict.
    pub(crate) verdicts: std::collections::BTreeMap<String, usize>,
    /// tool -> (proposed, approved by a person, denied by a person, expired, run under standing approval)
    pub(crate) tools: std::collections::BTreeMap<String, [usize; 5]>,
    /// Calls a person denied: (ts, tool, args, message).
    pub(crate) denied: Vec<(String, String, String, String)>,
    /// Tier-2 results whose own verification failed: (ts, tool, evidence).
    pub(crate) unverified: Vec<(String, String, String)>,
}

impl Promotion {
    /// The same evidence as the text, for scripts (`promote-report --json`).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let tools: serde_json::Map<String, serde_json::Value> = self
            .tools
            .iter()
            .map(|(tool, [p, a, d, x, s])| {
                (
                    tool.clone(),
                    serde_json::json!({
                        "proposed": p, "approved": a, "denied": d, "expired": x, "standing": s,
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "runs": self.runs,
            "verdicts": self.verdicts,
            "tier2_calls": tools,
            "denied": self.denied.iter().map(|(ts, tool, args, why)| serde_json::json!({
                "ts": ts, "tool": tool, "args": args, "why": why,
            })).collect::<Vec<_>>(),
            "unverified": self.unverified.iter().map(|(ts, tool, evidence)| serde_json::json!({
                "ts": ts, "tool": tool, "evidence": evidence,
            })).collect::<Vec<_>>(),
        })
    }
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

/// What the log at `path` says about `runbook` since `since`.
pub(crate) fn promotion(
    path: &Path,
    runbook: &str,
    since: jiff::Timestamp,
) -> std::io::Result<Promotion> {
    let mut p = Promotion::default();
    for line in segments::read(path, Some(since))? {
        let Ok(e) = serde_json::from_str::<Entry>(&line?) else {
            continue;
        };
        if e.runbook != runbook || e.ts.parse::<jiff::Timestamp>().is_ok_and(|t| t < since) {
            continue;
        }
        let tool = e.tool.clone().unwrap_or_default();
        let reason = e.denial_reason();
        match e.phase {
            Some(Phase::Start) => p.runs += 1,
            Some(Phase::Verdict) => {
                *p.verdicts
                    .entry(e.outcome.clone().unwrap_or_default())
                    .or_default() += 1
            }
            Some(Phase::Proposal) => p.tools.entry(tool).or_default()[0] += 1,
            Some(Phase::Intent) if e.tier == Some(2) => {
                let slot = match e.approver() {
                    Some(ApprovedBy::Person(_)) => 1,
                    _ => 4,
                };
                p.tools.entry(tool).or_default()[slot] += 1;
            }
            Some(Phase::Denied) if reason == Some(DenyReason::ApprovalDenied) => {
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
            Some(Phase::Denied) if reason == Some(DenyReason::ApprovalExpired) => {
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

/// Every line of one run, in order. A run id says when it was made (a
/// UUIDv7): the read starts there and ends at the run's verdict.
pub(crate) fn run_lines(path: &Path, run_id: &str) -> std::io::Result<Vec<Entry>> {
    if !path.exists() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let from = segments::id_time(run_id).map(|(made, _)| made);
    let mut out = Vec::new();
    for line in segments::read(path, from)? {
        let line = line?;
        if !line.contains(run_id) {
            continue;
        }
        if let Ok(e) = serde_json::from_str::<Entry>(&line)
            && e.run_id == run_id
        {
            let last = e.phase == Some(Phase::Verdict);
            out.push(e);
            if last {
                break;
            }
        }
    }
    Ok(out)
}

/// Every line of the history of `path` stamped since about `since` (all
/// of it when `None`) that `wanted` keeps by its text, parsed, in order:
/// a reader that needs a few kinds of line parses only those.
pub(crate) fn entries(
    path: &Path,
    since: Option<jiff::Timestamp>,
    wanted: impl Fn(&str) -> bool,
) -> std::io::Result<Vec<Entry>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for line in segments::read(path, since)? {
        let line = line?;
        if wanted(&line)
            && let Ok(e) = serde_json::from_str::<Entry>(&line)
        {
            out.push(e);
        }
    }
    Ok(out)
}

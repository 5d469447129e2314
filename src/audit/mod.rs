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

//!
//! Its parts: `log` is the writer, one chained, locked append, and
//! `segments` closes and removes the files it rotates. `lines` has one
//! typed constructor per kind of line, and is the only code that builds
//! one: a run, the scheduler or the host agent says what happened (a
//! [`Permit`](crate::gate::Permit) spent, a denial, an alert's evidence, a
//! verdict) and never writes a field by hand. [`verify`](verify()) checks
//! the chain; `format` keeps an older build from misreading a newer
//! history; `head` sends each run's head where the log's writer cannot
//! rewrite it. The readers (`query`, [`runs`], `follow`) read lines back
//! into typed values: a restarted daemon's state, and the runs other
//! processes record while it runs.

pub(crate) mod format;
mod lines;
mod log;
mod query;
mod segments;
mod verify;

pub(crate) mod follow;
pub(crate) mod head;
pub(crate) mod runs;

pub(crate) use follow::demotions;
pub(crate) use lines::permitted;
pub(crate) use lines::{
    AccessDecision, Dispatched, ModelTurn, Origin, QueueNote, Queued, RolloutEvent, RunEnd,
    alert_of_record, handed,
};
pub use lines::{AuditTicket, Permitted, RunInfo};
pub(crate) use log::Written;
pub use log::{AuditError, AuditLog, torn_path};
pub(crate) use query::{entries, process_alive, promotion, run_lines, this_process};
pub use segments::Rotation;
pub use verify::{Retired, Verification, verify, verify_against};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gate::{ApprovedBy, DenyReason};

/// `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The daemon accepted a trigger: the run exists before it starts.
    Queued,
    /// A run started: its trigger, autonomy and process.
    Start,
    /// A permitted call, written and synced before it runs.
    Intent,
    /// What the call returned.
    Result,
    /// The gate (or the host's agent) refused a call.
    Denied,
    /// L1: a tier-2 call recorded for a person, never run.
    Proposal,
    /// L2: the call waits for a person's decision.
    Pending,
    /// A dry run's tier-2 call: the argv it would run.
    DryRun,
    /// A tier-3 command for a person to run.
    Suggestion,
    /// The model planner's request and the model's answer.
    Model,
    /// What a run saw of its alert after its last call (`done_when`):
    /// cleared, still firing, or could not tell, with the query.
    Evidence,
    /// An alert a run saw clear came back within its runbook's
    /// `recurrence`: written for that earlier run, naming the new one.
    Recurred,
    /// The run's one verdict.
    Verdict,
    /// A timed kill switch released itself (no run: `run_id` is `-`).
    KillSwitch,
    /// A runbook lost its standing approval (`demoted`, with the failed
    /// runs that took it) or a person gave it back (`promoted`); no run:
    /// `run_id` is `-`.
    Autonomy,
    /// The first line of the file after a rotation: the segment it follows,
    /// the segments retention removed, and the state a daemon starts from.
    Segment,
    /// A fan-out's staged rollout: started with its frozen waves, each
    /// host's outcome, halted, resumed, aborted, finished (no run:
    /// `run_id` is `-`, the rollout's id is in `detail.rollout`).
    Rollout,
    /// An Alertmanager silence a run held over its changes: `created`
    /// (with its id, before the first change), `expired`, or why there was
    /// none (`unsilenced`) or it could not be expired (`not_expired`).
    Silence,
    /// A principal's decision on a scope that changes who may act
    /// (`approve`, `kill:*`, `rollout:control`): `allowed` or `refused`,
    /// with the principal and its token's id (no run: `run_id` is `-`).
    Access,
}

/// One line of the log.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Entry {
    /// When it was written (RFC 3339, UTC).
    pub ts: String,
    /// The run it belongs to.
    pub run_id: String,
    /// The step, for lines about one call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// What the line records.
    pub phase: Option<Phase>,
    /// The runbook.
    pub runbook: String,
    /// sha256 of the runbook file.
    pub runbook_version: String,
    /// The host.
    pub host: String,
    /// The tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call's arguments (bounded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    /// The tool's tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<u8>,
    /// A declared tool's call: the sha256 of the file that declared it
    /// (which version of the tool ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declaration: Option<String>,
    /// Who allowed the call (`auto`, `standing:RUNBOOK`, `person:NAME`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// A tier-2 call's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How the call or run ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The last process's exit status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How long the call or run took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// `steps`, `model`, or `agent` (a host's own log).
    pub planner: String,
    /// Model-planned runs: the model's name and the system prompt's version and hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The system prompt's version and hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Phase-specific detail: the parsed result, the denial, the argv of a dry run, the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
    /// The line's number in the whole chain, across segments (set as it is
    /// written; lines written before segments existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) n: Option<u64>,
    /// Private: a line is made only by this module's constructors, which
    /// chain it as they write it.
    prev: String,
}

impl Entry {
    /// Who allowed the call (intent and dry-run lines).
    pub(crate) fn approver(&self) -> Option<ApprovedBy> {
        self.approved_by.as_deref()?.parse().ok()
    }

    /// Why the gate refused the call (denied lines written by the gate).
    pub(crate) fn denial_reason(&self) -> Option<DenyReason> {
        serde_json::from_value(self.detail.as_ref()?.get("reason")?.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::Path;

    pub(super) fn info() -> RunInfo {
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

    /// A restarted daemon keeps no trigger keys of a run that saw its alert
    /// clear (so the alert firing again is not taken for a repeat), and
    /// keeps those of any other run.
    #[test]
    fn a_run_that_saw_its_alert_clear_leaves_no_keys_to_deduplicate_against() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        for (host, cleared) in [("cleared", true), ("firing", false)] {
            let run = RunInfo {
                run_id: host.into(),
                host: host.into(),
                ..info()
            };
            let mut queued = run.entry(Phase::Queued, None);
            queued.detail = Some(serde_json::json!({ "keys": ["fp:1"] }));
            log.append(queued, true).unwrap();
            let end = RunEnd {
                alert_cleared: cleared,
                ..Default::default()
            };
            log.verdict(&run, crate::verdict::Verdict::Ok, "done", Some(&end))
                .unwrap();
        }
        let r = runs::recovery(&path).unwrap();
        let keys = |h: &str| r.ends[&("rb".to_string(), h.to_string())].1.clone();
        assert!(keys("cleared").is_empty());
        assert_eq!(keys("firing"), ["fp:1"]);
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
        e.detail = Some(
            serde_json::json!({ "process": { "pid": pid, "start": 1, "boot": query::boot_id() } }),
        );
        assert!(!process_alive(&e), "gone");
        let mut me = this_process();
        me["start"] = serde_json::json!(me["start"].as_u64().unwrap() + 1);
        e.detail = Some(serde_json::json!({ "process": me }));
        assert!(!process_alive(&e), "the pid reused by another process");
        e.detail = None;
        assert!(!process_alive(&e), "no record");
    }

    /// A fragment a killed writer left is set aside, whole lines are never
    /// cut, and the chain goes on, whether the fragment follows whole lines
    /// or is all the file holds.
    #[test]
    fn a_torn_tail_is_set_aside_and_the_chain_goes_on() {
        for whole in [3, 0] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("audit.jsonl");
            write_lines(&path, whole);
            let before = std::fs::read(&path).unwrap_or_default();
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)
                .unwrap()
                .write_all(b"{\"half")
                .unwrap();
            write_lines(&path, 2);
            let after = std::fs::read(&path).unwrap();
            assert!(after.starts_with(&before), "whole lines are kept");
            assert_eq!(std::fs::read(torn_path(&path)).unwrap(), b"{\"half\n");
            let v = verify(&path).unwrap();
            assert_eq!(v.lines, whole as usize + 2);
            assert!(v.problems.is_empty(), "{:?}", v.problems);
        }
    }

    /// A whole, chained line that lost only its newline is not a fragment:
    /// it gets its newline back, nothing is set aside, and the chain goes
    /// on from it (one line or several before it). A tail that parses but
    /// does not chain (an earlier line pasted again) is still set aside.
    #[test]
    fn a_whole_last_line_missing_its_newline_gets_it_back() {
        for whole in [3, 1] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("audit.jsonl");
            write_lines(&path, whole);
            let before = std::fs::read(&path).unwrap();
            std::fs::write(&path, &before[..before.len() - 1]).unwrap();
            write_lines(&path, 2);
            let after = std::fs::read(&path).unwrap();
            assert!(
                after.starts_with(&before),
                "the line is kept, with its newline"
            );
            assert!(!torn_path(&path).exists(), "nothing set aside");
            let v = verify(&path).unwrap();
            assert_eq!(v.lines, whole as usize + 2);
            assert!(v.problems.is_empty(), "{:?}", v.problems);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        write_lines(&path, 2);
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap().to_string();
        std::fs::write(&path, format!("{text}{first}")).unwrap();
        write_lines(&path, 1);
        assert_eq!(
            std::fs::read_to_string(torn_path(&path)).unwrap(),
            format!("{first}\n")
        );
        assert!(verify(&path).unwrap().problems.is_empty());
    }

    /// The file fragments go to is never a planted symlink or FIFO: the
    /// writer refuses it (the append fails, naming it), writes nothing
    /// through it, and does not block.
    #[test]
    fn a_planted_torn_file_is_refused() {
        for planted in ["symlink", "fifo"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("audit.jsonl");
            let target = dir.path().join("elsewhere");
            std::fs::write(&target, "theirs\n").unwrap();
            match planted {
                "symlink" => std::os::unix::fs::symlink(&target, torn_path(&path)).unwrap(),
                _ => nix::unistd::mkfifo(&torn_path(&path), nix::sys::stat::Mode::S_IRWXU).unwrap(),
            }
            write_lines(&path, 2);
            std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap()
                .write_all(b"{\"half")
                .unwrap();
            let err = match AuditLog::open(&path) {
                Err(e) => e.to_string(),
                Ok(log) => log
                    .append(info().entry(Phase::Start, Some(9)), true)
                    .unwrap_err()
                    .to_string(),
            };
            assert!(err.contains("audit.jsonl.torn"), "{planted}: {err}");
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs\n");
        }
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

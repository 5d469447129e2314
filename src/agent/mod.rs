//! The host agent: `runwarden agent --stdio`, started by an
//! `authorized_keys` forced command under a dedicated account (SSH hosts),
//! or by systemd for each connection to this machine's own agent socket.
//!
//! It is the last line of defence, the one place that refuses a call even
//! when the runner is wrong, so it trusts nothing it is sent. It loads its
//! own policy (a host file: the same allowlists), checks every call again
//! against it (`policy`), spends a tier-2 permit once across every agent
//! process on the host (`replay`), writes its own append-only audit line
//! before dispatch, runs the call with the same tools as a local host, and
//! answers one JSON line per request ([`wire`]). Whatever command the SSH
//! client asked for is ignored. When the runner's host file and the host's
//! policy disagree, the host wins.
//!
//! A connection that sends nothing is not kept: the first request line must
//! arrive within the request timeout, and (when set) every later one within
//! the idle timeout, so idle connections cannot hold the privileged path.

pub(crate) mod policy;
pub(crate) mod replay;
pub(crate) mod wire;

use std::io::{BufRead, Read};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::audit::{AuditLog, AuditTicket, Dispatched, Phase, RunInfo};
use crate::config::Host;
use crate::tools::ToolResult;
pub use policy::Policy;
use policy::{HostCall, HostPermit, Refusal};
use replay::Spent;
use wire::{Call, Reply, Request};

/// Longest request line the agent reads.
const MAX_REQUEST: usize = 256 * 1024;

/// Longest run id the agent takes: the runner's own are 36 characters.
const MAX_RUN_ID: usize = 64;

/// How long the agent waits for request lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// For the first request line, from the start.
    pub(crate) first_request: Duration,
    /// For each later line, from the previous reply; `None`: no limit (an
    /// SSH session multiplexed for a whole run is idle between its calls).
    pub(crate) idle: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            first_request: Duration::from_secs(10),
            idle: None,
        }
    }
}

/// What the reader thread hands the agent: a line, or the stream's end.
enum Input {
    Line(Vec<u8>),
    TooLong,
    End,
    Failed(std::io::Error),
}

/// Serve requests from stdin until EOF (or a timeout), one reply line per
/// request line, whatever the line holds (an over-long line is skipped to
/// its end and refused once, so replies never fall out of step). Returns
/// the exit code.
pub(crate) async fn serve_stdio(policy: &Policy, audit: &AuditLog, timeouts: Timeouts) -> i32 {
    // No tier-1 process this agent starts reads its record of spent
    // permits or its audit log.
    crate::sandbox::protect(&policy.spent_permits);
    if let Some(dir) = audit.path().parent() {
        crate::sandbox::protect(dir);
    }
    use std::io::Write;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    // Blocking reads of stdin on a thread of their own, so a timeout can end
    // the wait (the thread dies with the process).
    std::thread::spawn(move || read_lines(tx));
    let mut out = std::io::stdout();
    // How long the next line may take; `None`: no limit.
    let mut wait = Some(timeouts.first_request);
    loop {
        let next = match wait {
            Some(wait) => tokio::time::timeout(wait, rx.recv())
                .await
                .map_err(|_| wait),
            None => Ok(rx.recv().await),
        };
        let reply = match next {
            Err(wait) => {
                tracing::warn!(
                    "no request within {}: connection closed",
                    humantime::format_duration(wait)
                );
                let _ = writeln!(
                    out,
                    "{}",
                    json!({ "refused": format!("no request within {}", humantime::format_duration(wait)) })
                );
                return 0;
            }
            Ok(None | Some(Input::End)) => return 0,
            Ok(Some(Input::Failed(e))) => {
                let _ = writeln!(
                    out,
                    "{}",
                    json!({ "refused": format!("cannot read the request: {e}") })
                );
                return 1;
            }
            Ok(Some(Input::TooLong)) => unparsed(
                policy,
                audit,
                Refusal::Malformed(format!("request longer than {MAX_REQUEST} bytes")),
            ),
            Ok(Some(Input::Line(line))) => match std::str::from_utf8(&line) {
                Ok(text) => handle(policy, audit, text.trim_end()).await,
                Err(e) => unparsed(
                    policy,
                    audit,
                    Refusal::Malformed(format!("request is not UTF-8: {e}")),
                ),
            },
        };
        let _ = writeln!(out, "{}", serde_json::to_string(&reply).unwrap_or_default());
        let _ = out.flush();
        wait = timeouts.idle;
    }
}

/// The reader thread: request lines off stdin, bounded in length.
fn read_lines(tx: tokio::sync::mpsc::Sender<Input>) {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    loop {
        let mut line = Vec::new();
        let read = (&mut input)
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut line);
        let item = match read {
            Ok(0) => Input::End,
            Err(e) => Input::Failed(e),
            Ok(_) if line.len() > MAX_REQUEST => {
                // Drop the rest of this line.
                let mut rest = Vec::new();
                while !line.ends_with(b"\n") && !rest.ends_with(b"\n") {
                    rest.clear();
                    match (&mut input).take(64 << 10).read_until(b'\n', &mut rest) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                Input::TooLong
            }
            Ok(_) => Input::Line(line),
        };
        let last = matches!(item, Input::End | Input::Failed(_));
        if tx.blocking_send(item).is_err() || last {
            return;
        }
    }
}

/// Answer one request line (what `serve_stdio` does with each line).
pub async fn handle(policy: &Policy, audit: &AuditLog, line: &str) -> Reply {
    let req: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => {
            return unparsed(
                policy,
                audit,
                Refusal::Malformed(format!("malformed request: {e}")),
            );
        }
    };
    match req {
        Request::Hello => Reply::Result(ToolResult::observed(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "policy": allowlists(policy),
            "policy_digest": policy_digest(policy),
            "declared_tools": policy
                .tools
                .declared()
                .map(|d| (d.name.clone(), json!(d.sha256)))
                .collect::<serde_json::Map<String, Value>>(),
        }))),
        Request::Status { run_id, step } => match run_id_refused(&run_id) {
            Some(refusal) => unparsed(policy, audit, refusal),
            None => status(audit, &run_id, step),
        },
        Request::Call(call) => match run_id_refused(&call.run_id) {
            Some(refusal) => unparsed(policy, audit, refusal),
            None => run_call(policy, audit, *call).await,
        },
    }
}

/// A run id that is not of the runner's making is refused: audit lines and
/// the status question find a call by its run id, exactly.
fn run_id_refused(run_id: &str) -> Option<Refusal> {
    let fits = !run_id.is_empty()
        && run_id.len() <= MAX_RUN_ID
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    (!fits).then(|| {
        Refusal::Malformed(format!(
            "run id {} is not one a runner makes (1 to {MAX_RUN_ID} of A-Z a-z 0-9 - _ . :)",
            crate::tools::args::shown(run_id)
        ))
    })
}

/// Check, record, run and record one call.
async fn run_call(policy: &Policy, audit: &AuditLog, req: Call) -> Reply {
    let info = run_info(policy, &req.run_id, &req.runbook);
    let call = HostCall {
        run_id: &req.run_id,
        step: req.step,
        tool: &req.tool,
        args: &req.args,
        signed: req.permit.as_ref(),
        declaration: req.declaration.as_deref(),
    };
    let spent = Spent::at(&policy.spent_permits);
    let permit = match policy::check(policy, &call, &spent) {
        Ok(p) => p,
        Err(refusal) => {
            let tool = Some(req.tool.as_str());
            let why = refusal.to_string();
            let written = audit.refused(&info, Some(req.step), tool, refusal.kind(), &why);
            return Reply::Refused(unrecorded(why, written));
        }
    };
    let ticket = match audit.intent(&info, permit) {
        Ok(t) => t,
        Err(e) => {
            return Reply::Refused(format!(
                "the host's audit log cannot be written, nothing ran: {e}"
            ));
        }
    };
    let deadline = tokio::time::Instant::now() + policy.tool_timeout;
    let (dispatched, mut result) = dispatch(ticket, policy, deadline).await;
    if let Err(e) = audit.result(&info, dispatched, &result) {
        // The call ran: the runner's own result line records it; the reply
        // says the host's record of it is missing.
        let note = format!("the host's audit log did not record this result: {e}");
        result.error = Some(match result.error.take() {
            Some(err) => format!("{err}; {note}"),
            None => note,
        });
    }
    Reply::Result(result)
}

/// Run the call a host ticket allows, on this machine: the only dispatch a
/// [`HostPermit`] reaches, and it takes nothing else.
async fn dispatch(
    ticket: AuditTicket<HostPermit>,
    policy: &Host,
    deadline: tokio::time::Instant,
) -> (Dispatched, ToolResult) {
    use crate::audit::Permitted;
    let result = crate::tools::execute_here(ticket.permit().action(), policy, deadline).await;
    (ticket.dispatched(), result)
}

/// What every line of one request carries in the host's audit log.
fn run_info(policy: &Host, run_id: &str, runbook: &str) -> RunInfo {
    RunInfo {
        run_id: run_id.into(),
        runbook: runbook.chars().take(64).collect(),
        runbook_version: String::new(),
        host: policy.name.clone(),
        planner: "agent".into(),
        model: None,
        prompt: None,
    }
}

/// What this host's audit log says about one call: `done` (with the result
/// as recorded, its verification included), `in_progress` (an intent and no
/// result yet), `refused` (by this host's policy) or `never_received`.
fn status(audit: &AuditLog, run_id: &str, step: u32) -> Reply {
    let lines = match crate::audit::run_lines(audit.path(), run_id) {
        Ok(l) => l,
        Err(e) => return Reply::Refused(format!("cannot read the host's audit log: {e}")),
    };
    let of_step = |phase| {
        lines
            .iter()
            .rev()
            .find(|e| e.step == Some(step) && e.phase == Some(phase))
    };
    let answer = if let Some(done) = of_step(Phase::Result) {
        status_answer("done", done.detail.clone())
    } else if of_step(Phase::Denied).is_some() {
        status_answer("refused", None)
    } else if of_step(Phase::Intent).is_some() {
        status_answer("in_progress", None)
    } else {
        status_answer("never_received", None)
    };
    Reply::Result(answer)
}

/// Refuse a line that is not a request the agent takes, and say so in the
/// host's audit log (it names no run: whoever holds the key sent something
/// else).
fn unparsed(policy: &Host, audit: &AuditLog, refusal: Refusal) -> Reply {
    let info = run_info(policy, "-", "");
    let why = refusal.to_string();
    let written = audit.refused(&info, None, None, refusal.kind(), &why);
    Reply::Refused(unrecorded(why, written))
}

/// A refusal stands whether or not its line was written (nothing ran); the
/// runner is told when the host's record of it is missing.
fn unrecorded(why: String, written: Result<(), crate::audit::AuditError>) -> String {
    match written {
        Ok(()) => why,
        Err(e) => format!("{why}; the host's audit log did not record this refusal: {e}"),
    }
}

/// The recorded state of one call, as the status answer carries it
/// (the runner's SSH transport reads `state` and `result` after a lost connection).
fn status_answer(state: &str, result: Option<Value>) -> ToolResult {
    ToolResult::observed(json!({ "state": state, "result": result }))
}

/// The allowlists of a host, as comparable lists (see
/// [`crate::host::ALLOWLISTS`]): one key per list, a declared tool's as
/// `allow.NAME`.
pub(crate) fn allowlists(h: &Host) -> Value {
    Value::Object(
        h.allowlists()
            .into_iter()
            .map(|l| (l.list, json!(l.entries)))
            .collect(),
    )
}

/// Where a host file and a host's policy disagree: (field, entry, whether
/// the entry is in the host file only; else in the policy only).
pub(crate) fn policy_differences(ours: &Value, theirs: &Value) -> Vec<(String, String, bool)> {
    let set = |v: &Value| -> std::collections::BTreeSet<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(String::from))
            .collect()
    };
    // A list only one side has is empty on the other.
    let lists: std::collections::BTreeSet<&String> = [ours, theirs]
        .iter()
        .flat_map(|side| side.as_object().into_iter().flatten().map(|(k, _)| k))
        .collect();
    let mut out = Vec::new();
    for field in lists {
        let (mine, host_side) = (set(&ours[field]), set(&theirs[field]));
        out.extend(
            mine.difference(&host_side)
                .map(|e| (field.clone(), e.clone(), true)),
        );
        out.extend(
            host_side
                .difference(&mine)
                .map(|e| (field.clone(), e.clone(), false)),
        );
    }
    out
}

/// sha256 of the allowlists: equal digests mean the two sides agree.
pub(crate) fn policy_digest(h: &Host) -> String {
    use sha2::Digest;
    let bytes = serde_json::to_vec(&allowlists(h)).unwrap_or_default();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Load the host's own policy: a host file, validated by the same loader,
/// and the tools declared in `tools/` beside it.
pub fn load_policy(file: &Path) -> Result<Policy, crate::config::ConfigError> {
    let dir = file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "/".into());
    let host = crate::config::load_host_file(file, &dir)?;
    let tools = crate::config::load_tools(&dir)?;
    Ok(Policy { host, tools })
}

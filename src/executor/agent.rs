//! The host side of SSH: `runwarden agent --stdio`, started only by an
//! `authorized_keys` forced command under a dedicated account.
//!
//! The agent does not trust the runner. It loads its own policy (a host file:
//! the same allowlists), checks every call again against it, writes its own
//! append-only audit line before dispatch, runs the call with the same
//! executor as a local host, and answers one JSON line per request. Whatever
//! command the SSH client asked for is ignored. When the runner's host file
//! and the host's policy disagree, the host wins.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::audit::{AuditLog, HostRefusal, Phase, RunInfo};
use crate::config::Host;
use crate::executor::Executor;
use crate::gate::host::HostCall;
use crate::tools::ToolResult;

/// Longest request line the agent reads.
const MAX_REQUEST: usize = 256 * 1024;

/// One call, as the runner sends it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRequest {
    /// The run the call belongs to.
    pub run_id: String,
    /// Its step.
    pub step: u32,
    /// The runbook (for the host's audit line).
    pub runbook: String,
    /// The tool's name.
    pub tool: String,
    /// Its arguments.
    pub args: Value,
    /// Tier-2 calls: the runner's signed permit for exactly this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permit: Option<crate::gate::signed::SignedPermit>,
}

/// The answer: a result, or why the host refused.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentReply {
    /// The call ran (or failed) on the host: its result.
    Result(ToolResult),
    /// The host refused the call: why.
    Refused(String),
}

/// Why an agent's reply line could not be read.
pub(super) enum ReplyError {
    /// The stream ended or failed first (what the OS said).
    Closed(String),
    /// No end of line within the cap (the bytes read).
    TooLong(usize),
}

/// One reply line from an agent, the runner's side of every transport:
/// blank lines are not replies, and a line over `cap` bytes is not read on.
pub(super) async fn read_reply<R>(reader: &mut R, cap: usize) -> Result<Vec<u8>, ReplyError>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::AsyncBufReadExt;
    let mut reply = Vec::new();
    loop {
        let buf = reader
            .fill_buf()
            .await
            .map_err(|e| ReplyError::Closed(e.to_string()))?;
        if buf.is_empty() {
            return Err(ReplyError::Closed("the connection closed".into()));
        }
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            reply.extend_from_slice(&buf[..i]);
            reader.consume(i + 1);
            if reply.iter().all(u8::is_ascii_whitespace) {
                reply.clear();
                continue;
            }
            return Ok(reply);
        }
        let n = buf.len();
        reply.extend_from_slice(buf);
        reader.consume(n);
        if reply.len() > cap {
            return Err(ReplyError::TooLong(reply.len()));
        }
    }
}

impl AgentReply {
    /// What the run reports for this reply from `host`'s agent: its result,
    /// or its refusal as a failed call the host refused.
    pub fn into_result(self, host: &Host) -> ToolResult {
        match self {
            AgentReply::Result(r) => r,
            AgentReply::Refused(why) => ToolResult {
                data: json!({ "refused_by_host": true, "host": host.name }),
                failure: Some(crate::tools::Failure::RefusedByHost),
                ..ToolResult::failed(format!("host {} refused the call: {why}", host.name))
            },
        }
    }
}

/// Serve requests from stdin until EOF, one reply line per request line,
/// whatever the line holds (an over-long line is skipped to its end and
/// refused once, so replies never fall out of step). Returns the exit code.
pub async fn serve_stdio(policy: &Host, audit: &AuditLog) -> i32 {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut input = stdin.lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut input)
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut line);
        match read {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(e) => {
                let _ = writeln!(
                    out,
                    "{}",
                    json!({ "refused": format!("cannot read the request: {e}") })
                );
                return 1;
            }
        }
        let reply = if line.len() > MAX_REQUEST {
            // Drop the rest of this line.
            let mut rest = Vec::new();
            while !line.ends_with(b"\n") && !rest.ends_with(b"\n") {
                rest.clear();
                match (&mut input).take(64 << 10).read_until(b'\n', &mut rest) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            unparsed(
                policy,
                audit,
                format!("request longer than {MAX_REQUEST} bytes"),
            )
        } else {
            match std::str::from_utf8(&line) {
                Ok(text) => handle(policy, audit, text.trim_end()).await,
                Err(e) => unparsed(policy, audit, format!("request is not UTF-8: {e}")),
            }
        };
        let _ = writeln!(out, "{}", serde_json::to_string(&reply).unwrap_or_default());
        let _ = out.flush();
    }
}

use std::io::Read;

/// Answer one request line (what `serve_stdio` does with each line).
pub async fn handle(policy: &Host, audit: &AuditLog, line: &str) -> AgentReply {
    let req: AgentRequest = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return unparsed(policy, audit, format!("malformed request: {e}")),
    };
    let info = RunInfo {
        run_id: req.run_id.chars().take(64).collect(),
        runbook: req.runbook.chars().take(64).collect(),
        runbook_version: String::new(),
        host: policy.name.clone(),
        planner: "agent".into(),
        model: None,
        prompt: None,
    };
    if req.tool == STATUS {
        return status(audit, &info.run_id, req.step);
    }
    if req.tool == HELLO {
        return AgentReply::Result(ToolResult::observed(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "policy": allowlists(policy),
            "policy_digest": policy_digest(policy),
        })));
    }
    let call = HostCall {
        run_id: &req.run_id,
        step: req.step,
        tool: &req.tool,
        args: &req.args,
        signed: req.permit.as_ref(),
    };
    let permit = match crate::gate::host::check(policy, &call, || used_before(audit, &req)) {
        Ok(p) => p,
        Err(refusal) => {
            let tool = Some(req.tool.as_str());
            let why = refusal.to_string();
            let written = audit.refused(&info, Some(req.step), tool, refusal.reason(), &why);
            return AgentReply::Refused(unrecorded(why, written));
        }
    };
    let ticket = match audit.intent(&info, permit) {
        Ok(t) => t,
        Err(e) => {
            return AgentReply::Refused(format!(
                "the host's audit log cannot be written, nothing ran: {e}"
            ));
        }
    };
    let deadline = tokio::time::Instant::now() + policy.tool_timeout;
    let (dispatched, mut result) = Executor::Local
        .dispatch(ticket, &info, policy, deadline)
        .await;
    if let Err(e) = audit.result(&info, dispatched, &result) {
        // The call ran: the runner's own result line records it; the reply
        // says the host's record of it is missing.
        let note = format!("the host's audit log did not record this result: {e}");
        result.error = Some(match result.error.take() {
            Some(err) => format!("{err}; {note}"),
            None => note,
        });
    }
    AgentReply::Result(result)
}

/// Whether this host's audit log already has an intent for the call.
fn used_before(audit: &AuditLog, req: &AgentRequest) -> Result<bool, String> {
    Ok(crate::audit::run_lines(audit.path(), &req.run_id)
        .map_err(|e| format!("cannot read the host's audit log: {e}"))?
        .iter()
        .any(|e| e.step == Some(req.step) && e.phase == Some(Phase::Intent)))
}

/// What this host's audit log says about one call: `done` (with the result
/// as recorded, its verification included), `in_progress` (an intent and no
/// result yet), `refused` (by this host's policy) or `never_received`.
fn status(audit: &AuditLog, run_id: &str, step: u32) -> AgentReply {
    let lines = match crate::audit::run_lines(audit.path(), run_id) {
        Ok(l) => l,
        Err(e) => return AgentReply::Refused(format!("cannot read the host's audit log: {e}")),
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
    AgentReply::Result(answer)
}

/// Refuse a line that is not a request, and say so in the host's audit log
/// (it names no run: whoever holds the key sent something else).
fn unparsed(policy: &Host, audit: &AuditLog, why: String) -> AgentReply {
    let info = RunInfo {
        run_id: "-".into(),
        runbook: String::new(),
        runbook_version: String::new(),
        host: policy.name.clone(),
        planner: "agent".into(),
        model: None,
        prompt: None,
    };
    let written = audit.refused(&info, None, None, HostRefusal::MalformedRequest, &why);
    AgentReply::Refused(unrecorded(why, written))
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
/// (the runner reads `state` and `result`, see [`super::ssh`]).
fn status_answer(state: &str, result: Option<Value>) -> ToolResult {
    ToolResult::observed(json!({ "state": state, "result": result }))
}

/// Not a tool: the runner asks what became of a call after losing the connection.
pub const STATUS: &str = "status";

/// The agent's greeting: not a tool; `runwarden host check` asks for it.
pub const HELLO: &str = "hello";

/// The allowlists of a host, as comparable lists.
pub fn allowlists(h: &Host) -> Value {
    json!({
        "paths": h.paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "units": h.units,
        "journals": h.journals,
        "logrotate_configs": h.logrotate_configs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "certificates": h.certificates.keys().collect::<Vec<_>>(),
        "health_checks": h.health_checks.keys().collect::<Vec<_>>(),
        "worker_pools": h.worker_pools.keys().collect::<Vec<_>>(),
    })
}

/// sha256 of the allowlists: equal digests mean the two sides agree.
pub fn policy_digest(h: &Host) -> String {
    use sha2::Digest;
    let bytes = serde_json::to_vec(&allowlists(h)).unwrap_or_default();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Load the host's own policy: a host file, validated by the same loader.
pub fn load_policy(file: &Path) -> Result<Host, String> {
    let dir = tempfile_dir_of(file);
    crate::config::load_host_file(file, &dir).map_err(|e| e.to_string())
}

fn tempfile_dir_of(file: &Path) -> std::path::PathBuf {
    file.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "/".into())
}

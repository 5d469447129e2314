//! What travels between a runner and a host's agent: one JSON request line,
//! one JSON reply line. Both transports (SSH and this machine's unix socket)
//! speak it, and both sides use these types.
//!
//! On the wire a request is one object with a `tool` field; `status` and
//! `hello` are not tools but questions about the agent itself. In Rust they
//! are [`Request`]'s own variants, so no code matches on those names but the
//! conversion here, and the wire stays what agents of earlier versions read.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::Host;
use crate::signing::SignedPermit;
use crate::tools::ToolResult;

/// One tool call, as the runner sends it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// The run the call belongs to.
    pub(crate) run_id: String,
    /// Its step.
    pub(crate) step: u32,
    /// The runbook (for the host's audit line).
    pub(crate) runbook: String,
    /// The tool's name.
    pub(crate) tool: String,
    /// Its arguments.
    pub(crate) args: Value,
    /// Tier-2 calls: the runner's signed permit for exactly this call.
    pub(crate) permit: Option<SignedPermit>,
    /// A declared tool's call: the sha256 of the declaration the runner
    /// checked it against (the host runs only its own copy of that file).
    pub(crate) declaration: Option<String>,
}

/// What a runner asks a host's agent.
#[derive(Debug, Clone)]
pub(crate) enum Request {
    /// Run a tool.
    Call(Box<Call>),
    /// What became of one call (the runner lost the connection during it).
    Status {
        /// The run.
        run_id: String,
        /// Its step.
        step: u32,
    },
    /// The agent's version and allowlists (`runwarden host check`).
    Hello,
}

/// Not a tool, on the wire: the runner asks what became of a call.
const STATUS: &str = "status";
/// Not a tool, on the wire: the agent's greeting.
const HELLO: &str = "hello";

/// The request line's one shape on the wire.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    run_id: String,
    step: u32,
    runbook: String,
    tool: String,
    args: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    permit: Option<SignedPermit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    declaration: Option<String>,
}

impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let wire = match self {
            Request::Call(c) => Wire {
                run_id: c.run_id.clone(),
                step: c.step,
                runbook: c.runbook.clone(),
                tool: c.tool.clone(),
                args: c.args.clone(),
                permit: c.permit.clone(),
                declaration: c.declaration.clone(),
            },
            Request::Status { run_id, step } => Wire {
                run_id: run_id.clone(),
                step: *step,
                runbook: String::new(),
                tool: STATUS.into(),
                args: Value::Null,
                permit: None,
                declaration: None,
            },
            Request::Hello => Wire {
                run_id: "host-check".into(),
                step: 0,
                runbook: String::new(),
                tool: HELLO.into(),
                args: Value::Null,
                permit: None,
                declaration: None,
            },
        };
        wire.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Request, D::Error> {
        let w = Wire::deserialize(d)?;
        Ok(match w.tool.as_str() {
            STATUS => Request::Status {
                run_id: w.run_id,
                step: w.step,
            },
            HELLO => Request::Hello,
            _ => Request::Call(Box::new(Call {
                run_id: w.run_id,
                step: w.step,
                runbook: w.runbook,
                tool: w.tool,
                args: w.args,
                permit: w.permit,
                declaration: w.declaration,
            })),
        })
    }
}

/// The answer: a result, or why the host refused.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// The call ran (or failed) on the host: its result.
    Result(ToolResult),
    /// The host refused the call: why.
    Refused(String),
}

impl Reply {
    /// What the run reports for this reply from `host`'s agent: its result,
    /// or its refusal as a failed call the host refused.
    pub(crate) fn into_result(self, host: &Host) -> ToolResult {
        match self {
            Reply::Result(r) => r,
            Reply::Refused(why) => ToolResult {
                data: json!({ "refused_by_host": true, "host": host.name }),
                failure: Some(crate::tools::Failure::RefusedByHost),
                ..ToolResult::failed(format!("host {} refused the call: {why}", host.name))
            },
        }
    }
}

/// Why an agent's reply line could not be read.
pub(crate) enum ReplyError {
    /// The stream ended or failed first (what the OS said).
    Closed(String),
    /// No end of line within the cap (the bytes read).
    TooLong(usize),
}

/// One reply line from an agent, the runner's side of every transport:
/// blank lines are not replies, and a line over `cap` bytes is not read on.
pub(crate) async fn read_reply<R>(reader: &mut R, cap: usize) -> Result<Vec<u8>, ReplyError>
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire keeps the shape agents of earlier versions read: status and
    /// hello are requests with those tool names, and they read back as
    /// their own variants.
    #[test]
    fn status_and_hello_keep_their_wire_names() {
        let status = serde_json::to_value(Request::Status {
            run_id: "r1".into(),
            step: 3,
        })
        .unwrap();
        assert_eq!(status["tool"], "status");
        assert_eq!(status["step"], 3);
        let back: Request = serde_json::from_value(status).unwrap();
        assert!(matches!(back, Request::Status { ref run_id, step: 3 } if run_id == "r1"));
        let hello: Request =
            serde_json::from_value(serde_json::to_value(Request::Hello).unwrap()).unwrap();
        assert!(matches!(hello, Request::Hello));
        let call: Request = serde_json::from_str(
            r#"{"run_id":"r","step":1,"runbook":"x","tool":"disk_usage","args":{"path":"/tmp"}}"#,
        )
        .unwrap();
        assert!(matches!(call, Request::Call(ref c) if c.tool == "disk_usage"));
    }
}

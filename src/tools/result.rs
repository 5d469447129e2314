//! What a tool reports: an [`Outcome`] and parsed fields, never raw text alone.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::process::ProcessOutput;

/// How a call ended, as far as the tool is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// The tool ran and did what it does.
    Ok,
    /// The tool failed, or its call never ran (see `error`).
    Error,
    /// The call ran out of time.
    Timeout,
}

impl Outcome {
    /// As written in audit lines and metric labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
        }
    }
}

/// Why a call failed outside the tool itself: what the run branches on (two
/// transport failures in a row end it). Set only by this process's
/// transport; never read from the wire or the log, so no answer from a
/// host can claim it. The same facts stay in `data` for people to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The call never reached the host, or its answer never came back.
    Transport(Unreachable),
    /// The connection failed during a change that could not be verified
    /// afterwards: it may or may not have happened.
    OutcomeUnknown,
    /// The host's agent refused the call (the host's policy wins).
    RefusedByHost,
}

impl Failure {
    /// Whether the connection, not the host or the tool, failed.
    pub(crate) fn is_transport(self) -> bool {
        matches!(self, Failure::Transport(_) | Failure::OutcomeUnknown)
    }
}

/// How a host could not be reached, decided where the failure happened
/// (`host check` says it in these words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreachable {
    /// The connection was refused.
    Refused,
    /// The connection timed out.
    TimedOut,
    /// The host's key is not the one in the host file's known_hosts.
    HostKeyMismatch,
    /// The host refused the identity.
    AuthenticationRefused,
    /// Something answered that is not runwarden's agent.
    AnsweredGarbage,
    /// Any other transport failure.
    Other,
}

impl Unreachable {
    /// As `host check` and results say it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unreachable::Refused => "refused",
            Unreachable::TimedOut => "timed out",
            Unreachable::HostKeyMismatch => "host key mismatch",
            Unreachable::AuthenticationRefused => "authentication refused",
            Unreachable::AnsweredGarbage => "answered garbage",
            Unreachable::Other => "unreachable",
        }
    }
}

/// What a tool reports: parsed fields, never raw text alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolResult {
    /// How the call ended.
    pub(crate) outcome: Outcome,
    /// The last process's exit status, when there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exit_code: Option<i32>,
    /// The tool's parsed findings.
    pub(crate) data: Value,
    /// Why it failed, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Some output was cut to fit the caps.
    pub(crate) truncated: bool,
    /// Tier-2 only: the tool's own check of its effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) verified: Option<bool>,
    /// How long the call took.
    pub(crate) duration_ms: u64,
    /// The commands the call ran, program first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) argv: Vec<Vec<String>>,
    /// Set by the transport only (see [`Failure`]).
    #[serde(skip)]
    pub(crate) failure: Option<Failure>,
}

impl ToolResult {
    /// The result with every secret this process holds cut out of its
    /// findings and its error ([`crate::secret::redact_held`]): what a
    /// report, the audit log, a model and an MCP client see of it.
    pub(crate) fn without_secrets(mut self) -> ToolResult {
        crate::secret::redact_value(&mut self.data);
        if let Some(e) = &self.error
            && let Some(cut) = crate::secret::redact_held(e)
        {
            self.error = Some(cut);
        }
        self
    }

    /// A result for a call that failed before or outside its tool.
    pub(crate) fn failed(error: impl std::fmt::Display) -> ToolResult {
        ToolResult {
            outcome: Outcome::Error,
            exit_code: None,
            data: Value::Null,
            error: Some(error.to_string()),
            truncated: false,
            verified: None,
            duration_ms: 0,
            argv: Vec::new(),
            failure: None,
        }
    }

    /// A successful observation.
    pub(crate) fn observed(data: Value) -> ToolResult {
        ToolResult {
            outcome: Outcome::Ok,
            data,
            error: None,
            ..ToolResult::failed("")
        }
    }

    /// The view a `when` condition or a later step sees: the data fields plus the outcome.
    /// The call did what it was asked, and a change verified.
    pub(crate) fn succeeded(&self) -> bool {
        self.outcome == Outcome::Ok && self.verified != Some(false)
    }

    /// The result as a planner and templates see it: the data's fields, with `outcome`, `ok` and `error` beside them.
    pub(crate) fn view(&self) -> Value {
        let mut m = match &self.data {
            Value::Object(m) => m.clone(),
            Value::Null => serde_json::Map::new(),
            other => serde_json::Map::from_iter([("value".to_string(), other.clone())]),
        };
        m.insert("outcome".into(), json!(self.outcome));
        m.insert("ok".into(), json!(self.outcome == Outcome::Ok));
        m.insert("truncated".into(), json!(self.truncated));
        if let Some(e) = &self.error {
            m.insert("error".into(), json!(e));
        }
        if let Some(v) = self.verified {
            m.insert("verified".into(), json!(v));
        }
        Value::Object(m)
    }
}

/// A result from one finished process: outcome from its exit, data from `parse`.
pub(crate) fn from_process(out: &ProcessOutput, data: Value) -> ToolResult {
    crate::fault::point(crate::fault::Stage::ToolResult);
    let outcome = if out.timed_out {
        Outcome::Timeout
    } else if out.exit_code == Some(0) {
        Outcome::Ok
    } else {
        Outcome::Error
    };
    let error = match outcome {
        Outcome::Ok => None,
        Outcome::Timeout => Some(format!(
            "timed out after {} ms; process group killed{}",
            out.duration.as_millis(),
            out.limit_hit()
        )),
        Outcome::Error => Some(out.failure_text()),
    };
    ToolResult {
        outcome,
        exit_code: out.exit_code,
        data,
        error,
        truncated: out.stdout_truncated || out.stderr_truncated,
        verified: None,
        duration_ms: 0,
        argv: Vec::new(),
        failure: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's answer (or a line read back from the log) cannot claim a
    /// transport failure: only this process's transport sets it.
    #[test]
    fn no_answer_from_the_wire_carries_a_failure_kind() {
        let wire = json!({
            "outcome": "error", "data": { "transport": true, "outcome_unknown": true },
            "truncated": false, "duration_ms": 1, "failure": "Transport"
        });
        let r: ToolResult = serde_json::from_value(wire).unwrap();
        assert_eq!(r.failure, None);
        let written = serde_json::to_value(ToolResult {
            failure: Some(Failure::Transport(Unreachable::Other)),
            ..ToolResult::failed("x")
        })
        .unwrap();
        assert!(written.get("failure").is_none(), "{written}");
    }
}

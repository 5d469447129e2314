//! The runner side of this machine's own agent, on a unix socket: the
//! privileged path of a daemon that runs unprivileged.
//!
//! Why: the daemon's unit is hardened (`NoNewPrivileges=yes`, no
//! capabilities), so it cannot `sudo`; and it should not run as root, since
//! it parses webhooks and model output. Root's side is the same agent SSH
//! hosts run (`runwarden agent --stdio`), started by systemd for each
//! connection (`runwarden-agent.socket`, `Accept=yes`, socket mode 0660,
//! group `runwarden`): it loads its own policy, checks every call again,
//! writes its own audit line before dispatch and takes a tier-2 call only
//! with a permit the runner signed. Nothing here needs sudo or a shell.
//!
//! One connection per call: a request line out, one reply line back, by the
//! call's deadline and under the reply cap. A call that never reached the
//! agent (no socket, refused) is a transport failure and safe to retry; a
//! tier-1 call is retried once. A tier-2 call whose connection broke after
//! the request was sent is never retried: its outcome is unknown, and the
//! agent's own audit log says whether it ran.

use std::path::Path;

use tokio::io::AsyncWriteExt;

use crate::agent::wire::{Call, Reply, ReplyError, Request, read_reply};
use crate::config::Host;
use crate::tools::{Failure, Outcome, Tier, ToolResult, Unreachable};

/// How a call on the socket went wrong.
enum Broken {
    /// Before the request was sent: the call did not happen.
    NotSent(Unreachable, String),
    /// After: it may have.
    AfterSend(String),
    Timeout,
}

/// Send one call to the agent on `socket`, with the retry rules above.
pub(crate) async fn dispatch(
    socket: &Path,
    host: &Host,
    request: &Call,
    tier: Tier,
    deadline: tokio::time::Instant,
) -> ToolResult {
    let mut attempt = exchange(socket, request, deadline).await;
    if tier == Tier::Observe && matches!(attempt, Err(Broken::NotSent(..) | Broken::AfterSend(_))) {
        attempt = exchange(socket, request, deadline).await;
    }
    let line = match attempt {
        Ok(line) => line,
        Err(broken) => return failure(socket, host, tier, broken),
    };
    match serde_json::from_slice::<Reply>(&line) {
        Ok(reply) => reply.into_result(host),
        Err(e) => failure(
            socket,
            host,
            tier,
            Broken::AfterSend(format!("malformed reply ({e}, {} bytes)", line.len())),
        ),
    }
}

async fn exchange(
    socket: &Path,
    request: &Call,
    deadline: tokio::time::Instant,
) -> Result<Vec<u8>, Broken> {
    let mut line = serde_json::to_vec(&Request::Call(Box::new(request.clone())))
        .map_err(|e| Broken::NotSent(Unreachable::Other, e.to_string()))?;
    line.push(b'\n');
    let cap = crate::tools::OUTPUT_CAP * 2;
    let io = async {
        let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
            let kind = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => Unreachable::Refused,
                std::io::ErrorKind::PermissionDenied => Unreachable::AuthenticationRefused,
                std::io::ErrorKind::TimedOut => Unreachable::TimedOut,
                _ => Unreachable::Other,
            };
            Broken::NotSent(kind, e.to_string())
        })?;
        let (read, mut write) = stream.into_split();
        write
            .write_all(&line)
            .await
            .map_err(|e| Broken::NotSent(Unreachable::Other, e.to_string()))?;
        write
            .shutdown()
            .await
            .map_err(|e| Broken::AfterSend(e.to_string()))?;
        let mut reader = tokio::io::BufReader::new(read);
        read_reply(&mut reader, cap).await.map_err(|e| {
            Broken::AfterSend(match e {
                ReplyError::Closed(why) => {
                    format!("the agent ended the connection without an answer ({why})")
                }
                ReplyError::TooLong(n) => format!("no end of line in {n} bytes, cut at the cap"),
            })
        })
    };
    tokio::time::timeout_at(deadline, io)
        .await
        .unwrap_or(Err(Broken::Timeout))
}

fn failure(socket: &Path, host: &Host, tier: Tier, broken: Broken) -> ToolResult {
    let at = format!("the agent of host {} at {}", host.name, socket.display());
    let (failure, outcome, error) = match broken {
        Broken::NotSent(kind, e) => (
            Failure::Transport(kind),
            Outcome::Error,
            format!(
                "not sent: {at} is not reachable: {e} (is runwarden-agent.socket running, and is this account in its group?)"
            ),
        ),
        Broken::AfterSend(e) if tier == Tier::Change => (
            Failure::OutcomeUnknown,
            Outcome::Error,
            format!(
                "outcome unknown: {at} failed during this change ({e}); its own audit log says whether it ran"
            ),
        ),
        Broken::AfterSend(e) => (
            Failure::Transport(Unreachable::AnsweredGarbage),
            Outcome::Error,
            format!("{at}: {e}"),
        ),
        Broken::Timeout if tier == Tier::Change => (
            Failure::OutcomeUnknown,
            Outcome::Timeout,
            format!(
                "outcome unknown: {at} did not answer in time; its own audit log says whether it ran"
            ),
        ),
        Broken::Timeout => (
            Failure::Transport(Unreachable::TimedOut),
            Outcome::Timeout,
            format!("{at} did not answer in time"),
        ),
    };
    ToolResult {
        outcome,
        verified: (tier == Tier::Change).then_some(false),
        data: serde_json::json!({
            "transport": true,
            "host": host.name,
            "outcome_unknown": failure == Failure::OutcomeUnknown,
        }),
        failure: Some(failure),
        ..ToolResult::failed(error)
    }
}

//! Running a permitted, audited call on its host.
//!
//! [`Executor::dispatch`] takes an [`AuditTicket`]: only the audit log makes
//! one, from a [`Permit`] (only the gate makes one), once the intent line is
//! on disk, and dispatch spends it. A call that skipped the gate or its line
//! does not compile, and none runs twice on one ticket.

pub(crate) mod socket;
pub(crate) mod ssh;

use crate::agent::wire;
use crate::audit::{AuditTicket, Dispatched, RunInfo};
use crate::config::{Connection, Host};
use std::path::Path;

use crate::gate::Permit;
use crate::signing::{CallId, KeyError, PermitKey};
use crate::tools::{self, Tier, ToolResult};

/// How calls reach a host, for one run.
pub enum Executor {
    /// Tools run on this machine, as this process's children.
    Local,
    /// Tools run on the host, through its forced-command agent over SSH,
    /// on one multiplexed connection per run; tier-2 calls carry a permit
    /// signed with the runner's key (or the reason there is no key).
    Ssh {
        /// The run's connection to the host.
        session: Box<ssh::Session>,
        /// The key that signs tier-2 permits, or why it cannot be loaded.
        permit_key: Box<Result<PermitKey, NoPermitKey>>,
    },
    /// Tools run on this machine through its own agent on a unix socket
    /// (root's side of an unprivileged daemon), with the same requests and
    /// signed permits as over SSH.
    Agent {
        /// The agent's socket.
        socket: std::path::PathBuf,
        /// The key that signs tier-2 permits, or why it cannot be loaded.
        permit_key: Box<Result<PermitKey, NoPermitKey>>,
    },
}

impl Executor {
    /// `permit_key` is the file of the key that signs tier-2 permits for
    /// managed hosts (`permit_key_file`).
    pub(crate) fn for_host(host: &Host, run_id: &str, permit_key: &Path) -> Executor {
        match &host.connection {
            Connection::Local => Executor::Local,
            Connection::Ssh(ssh) => Executor::Ssh {
                session: Box::new(ssh::Session::new(ssh.clone(), run_id)),
                permit_key: Box::new(load_permit_key(host, permit_key)),
            },
            Connection::Agent(socket) => Executor::Agent {
                socket: socket.clone(),
                permit_key: Box::new(load_permit_key(host, permit_key)),
            },
        }
    }

    /// Run the call a ticket allows; the ticket is spent, and what comes back
    /// is what its result line takes.
    pub async fn dispatch(
        &self,
        ticket: AuditTicket,
        run: &RunInfo,
        host: &Host,
        deadline: tokio::time::Instant,
    ) -> (Dispatched, ToolResult) {
        // Whatever it ran on, a secret this runner holds never leaves it.
        let result = self
            .run(ticket.permit(), run, host, deadline)
            .await
            .without_secrets();
        (ticket.dispatched(), result)
    }

    async fn run(
        &self,
        permit: &Permit,
        run: &RunInfo,
        host: &Host,
        deadline: tokio::time::Instant,
    ) -> ToolResult {
        let key = match self {
            Executor::Ssh { permit_key, .. } | Executor::Agent { permit_key, .. } => permit_key,
            Executor::Local => return tools::execute_here(permit.action(), host, deadline).await,
        };
        // A host's agent: the same request and signed permit on either transport.
        let request = match request(permit, run, host, key) {
            Ok(r) => r,
            Err(not_sent) => return not_sent,
        };
        let tier = permit.action().tier();
        let started = std::time::Instant::now();
        let mut result = match self {
            Executor::Ssh { session, .. } => session.dispatch(host, &request, tier, deadline).await,
            Executor::Agent { socket, .. } => {
                socket::dispatch(socket, host, &request, tier, deadline).await
            }
            Executor::Local => return ToolResult::failed("no agent to send the call to"),
        };
        if result.duration_ms == 0 {
            result.duration_ms = started.elapsed().as_millis() as u64;
        }
        result
    }
}

/// Why tier-2 calls to a host cannot be signed (tier-1 calls still go).
#[derive(Debug, thiserror::Error)]
#[error(
    "{source}; `runwarden install print --host {host}` makes the key and prints the line the host's policy needs"
)]
pub struct NoPermitKey {
    /// The host.
    host: String,
    /// Why the key could not be loaded.
    source: KeyError,
}

fn load_permit_key(host: &Host, permit_key: &Path) -> Result<PermitKey, NoPermitKey> {
    PermitKey::load(permit_key).map_err(|source| NoPermitKey {
        host: host.name.clone(),
        source,
    })
}

/// The request a host's agent gets for a permitted call: the resolved
/// arguments and, for tier 2, the runner's signed permit for exactly this
/// call (or, without a key, the result that says why nothing was sent).
fn request(
    permit: &Permit,
    run: &RunInfo,
    host: &Host,
    key: &Result<PermitKey, NoPermitKey>,
) -> Result<wire::Call, ToolResult> {
    let action = permit.action();
    let mut args = action.args_json();
    if let Some(reason) = action.reason() {
        args["reason"] = reason.into();
    }
    let tool_id = action.tool();
    let tool = tool_id.name();
    let signed = match (action.tier(), key) {
        (Tier::Observe, _) => None,
        (Tier::Change, Ok(key)) => Some(key.sign(
            &CallId {
                run_id: &run.run_id,
                step: permit.step(),
                host: &host.name,
                tool: &tool_id.signed_name(),
                args: &args,
            },
            &permit.approved_by().to_string(),
        )),
        (Tier::Change, Err(e)) => {
            return Err(ToolResult::failed(format!(
                "not sent: a managed host takes a tier-2 call only with a signed permit, and {e}"
            )));
        }
    };
    Ok(wire::Call {
        run_id: run.run_id.clone(),
        step: permit.step(),
        runbook: run.runbook.clone(),
        tool: tool.into(),
        args,
        permit: signed,
        declaration: tool_id.declaration().map(str::to_string),
    })
}

//! Running a permitted, audited call on its host.
//!
//! [`Executor::dispatch`] takes a [`Permit`] (only the gate makes one) and an
//! [`AuditTicket`] (only the audit log makes one, after the intent line is on
//! disk): a call that skipped either does not compile.

pub mod agent;
pub mod process;
pub mod ssh;

use crate::audit::{AuditTicket, RunInfo};
use crate::config::{Connection, Host};
use crate::gate::Permit;
use crate::tools::{self, Ctx, ToolResult};

/// How calls reach a host, for one run.
pub enum Executor {
    /// Tools run on this machine, as this process's children.
    Local,
    /// Tools run on the host, through its forced-command agent over SSH,
    /// on one multiplexed connection per run.
    Ssh(Box<ssh::Session>),
}

impl Executor {
    pub fn for_host(host: &Host, run_id: &str) -> Result<Executor, String> {
        match &host.connection {
            Connection::Local => Ok(Executor::Local),
            Connection::Ssh(ssh) => Ok(Executor::Ssh(Box::new(ssh::Session::new(
                ssh.clone(),
                run_id,
            )))),
        }
    }

    pub async fn dispatch(
        &self,
        permit: &Permit,
        ticket: &AuditTicket,
        run: &RunInfo,
        host: &Host,
        deadline: tokio::time::Instant,
    ) -> ToolResult {
        debug_assert_eq!(permit.step(), ticket.step(), "ticket of another call");
        match self {
            Executor::Ssh(session) => {
                let action = permit.action();
                let mut args = action.args_json();
                if let Some(reason) = action.reason() {
                    args["reason"] = reason.into();
                }
                let request = agent::AgentRequest {
                    run_id: run.run_id.clone(),
                    step: permit.step(),
                    runbook: run.runbook.clone(),
                    tool: action.tool().name().into(),
                    args,
                };
                let started = std::time::Instant::now();
                let mut result = session
                    .dispatch(host, &request, action.tier(), deadline)
                    .await;
                if result.duration_ms == 0 {
                    result.duration_ms = started.elapsed().as_millis() as u64;
                }
                result
            }
            Executor::Local => {
                if let Err(e) = std::fs::create_dir_all(&host.jail) {
                    return ToolResult::failed(format!(
                        "cannot create the jail directory {}: {e}",
                        host.jail.display()
                    ));
                }
                tools::execute(permit.action(), &Ctx::new(host, deadline)).await
            }
        }
    }
}

//! Running a permitted, audited call on its host.
//!
//! [`Executor::dispatch`] takes a [`Permit`] (only the gate makes one) and an
//! [`AuditTicket`] (only the audit log makes one, after the intent line is on
//! disk): a call that skipped either does not compile.

pub mod process;

use crate::audit::AuditTicket;
use crate::config::{Connection, Host};
use crate::gate::Permit;
use crate::tools::{self, Ctx, ToolResult};

/// How calls reach a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// Tools run on this machine, as this process's children.
    Local,
}

impl Executor {
    pub fn for_host(host: &Host) -> Result<Executor, String> {
        match host.connection {
            Connection::Local => Ok(Executor::Local),
            Connection::Ssh(_) => Err(format!(
                "host \"{}\" uses `connection: ssh`, which this version of runwarden cannot reach yet; use a local host",
                host.name
            )),
        }
    }

    pub async fn dispatch(
        &self,
        permit: &Permit,
        ticket: &AuditTicket,
        host: &Host,
        deadline: tokio::time::Instant,
    ) -> ToolResult {
        debug_assert_eq!(permit.step(), ticket.step(), "ticket of another call");
        match self {
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

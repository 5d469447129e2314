//! From untrusted arguments to an [`Action`]: [`resolve`] checks every value
//! against the host's allowlists, and only it makes an action.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::args::*;
use super::*;
use crate::host::Host;
use crate::process::Argv;

/// How paths are checked: on the machine that will run the call, or by their text only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMode {
    /// Resolve symlinks and `..` on this machine, then check what they point to.
    Resolve,
    /// Check the text only (the call runs elsewhere; that side resolves again).
    Lexical,
}

/// A call whose every argument was checked against the host: the only input
/// `tools::execute` accepts. Opaque: only [`resolve`] makes one, so no code
/// outside this module can hand-build a call the allowlists never saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Action(pub(in crate::tools) Resolved);

/// What an [`Action`] holds; private to the tools.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Resolved {
    DiskUsage {
        path: PathBuf,
    },
    ServiceStatus {
        unit: String,
    },
    ReadJournal {
        unit: String,
        since: Since,
        priority: Priority,
    },
    ListProcesses {
        sort: ProcessSort,
        limit: usize,
    },
    CertExpiry {
        name: String,
    },
    HttpCheck {
        name: String,
    },
    RestartService {
        unit: String,
        reason: String,
    },
    ReloadService {
        unit: String,
        reason: String,
    },
    RotateLogs {
        config: PathBuf,
        reason: String,
    },
    RecycleWorkerPool {
        pool: String,
        reason: String,
    },
    RenewCertificate {
        name: String,
        reason: String,
    },
}

impl Action {
    /// The tool it runs.
    pub fn tool(&self) -> ToolId {
        match &self.0 {
            Resolved::DiskUsage { .. } => ToolId::DiskUsage,
            Resolved::ServiceStatus { .. } => ToolId::ServiceStatus,
            Resolved::ReadJournal { .. } => ToolId::ReadJournal,
            Resolved::ListProcesses { .. } => ToolId::ListProcesses,
            Resolved::CertExpiry { .. } => ToolId::CertExpiry,
            Resolved::HttpCheck { .. } => ToolId::HttpCheck,
            Resolved::RestartService { .. } => ToolId::RestartService,
            Resolved::ReloadService { .. } => ToolId::ReloadService,
            Resolved::RotateLogs { .. } => ToolId::RotateLogs,
            Resolved::RecycleWorkerPool { .. } => ToolId::RecycleWorkerPool,
            Resolved::RenewCertificate { .. } => ToolId::RenewCertificate,
        }
    }

    /// The tool's tier.
    pub fn tier(&self) -> Tier {
        self.tool().tier()
    }

    /// A tier-2 call's reason.
    pub fn reason(&self) -> Option<&str> {
        match &self.0 {
            Resolved::RestartService { reason, .. }
            | Resolved::ReloadService { reason, .. }
            | Resolved::RotateLogs { reason, .. }
            | Resolved::RecycleWorkerPool { reason, .. }
            | Resolved::RenewCertificate { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The resolved arguments, as recorded in the audit log (the reason has its own field).
    pub fn args_json(&self) -> Value {
        match &self.0 {
            Resolved::DiskUsage { path } => json!({ "path": path }),
            Resolved::ServiceStatus { unit } => json!({ "unit": unit }),
            Resolved::ReadJournal {
                unit,
                since,
                priority,
            } => {
                json!({ "unit": unit, "since": since, "priority": priority })
            }
            Resolved::ListProcesses { sort, limit } => json!({ "sort": sort, "limit": limit }),
            Resolved::CertExpiry { name } | Resolved::HttpCheck { name } => json!({ "name": name }),
            Resolved::RestartService { unit, .. } | Resolved::ReloadService { unit, .. } => {
                json!({ "unit": unit })
            }
            Resolved::RotateLogs { config, .. } => json!({ "config": config }),
            Resolved::RecycleWorkerPool { pool, .. } => json!({ "pool": pool }),
            Resolved::RenewCertificate { name, .. } => json!({ "name": name }),
        }
    }

    /// The commands a tier-2 action runs, exactly as it would spawn them (for `--dry-run`).
    pub fn planned_argv(&self, host: &Host) -> Vec<Argv> {
        match &self.0 {
            Resolved::RestartService { unit, .. } => {
                vec![service::change_argv(host, "restart", unit)]
            }
            Resolved::ReloadService { unit, .. } => {
                vec![service::change_argv(host, "reload", unit)]
            }
            Resolved::RotateLogs { config, .. } => vec![logs::argv(host, config)],
            Resolved::RecycleWorkerPool { pool, .. } => pool::planned_argv(host, pool),
            Resolved::RenewCertificate { name, .. } => {
                cert::renew_argv(host, name).into_iter().collect()
            }
            Resolved::DiskUsage { path } => disk::argv(host, path).into(),
            Resolved::ServiceStatus { unit } => vec![service::show_argv(host, unit)],
            Resolved::ReadJournal {
                unit,
                since,
                priority,
            } => vec![journal::argv(host, unit, *since, *priority)],
            Resolved::ListProcesses { sort, .. } => vec![process::argv(host, *sort)],
            Resolved::CertExpiry { .. } | Resolved::HttpCheck { .. } => Vec::new(),
        }
    }
}

impl ToolId {
    /// The argument a tier-2 tool acts on, and every value `host` allows for
    /// it; `None` for a tier-1 tool.
    pub fn targets(self, host: &Host) -> Option<(&'static str, Vec<String>)> {
        Some(match self {
            ToolId::RestartService | ToolId::ReloadService => {
                ("unit", host.units.iter().cloned().collect())
            }
            ToolId::RotateLogs => (
                "config",
                host.logrotate_configs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            ),
            ToolId::RecycleWorkerPool => ("pool", host.worker_pools.keys().cloned().collect()),
            ToolId::RenewCertificate => (
                "name",
                host.certificates
                    .iter()
                    .filter(|(_, c)| c.renew.is_some())
                    .map(|(n, _)| n.clone())
                    .collect(),
            ),
            ToolId::DiskUsage
            | ToolId::ServiceStatus
            | ToolId::ReadJournal
            | ToolId::ListProcesses
            | ToolId::CertExpiry
            | ToolId::HttpCheck => return None,
        })
    }
}

/// The commands a tier-2 call of `tool` on `target` runs as root on
/// `host` (after `sudo -n --`), built by the tool's own resolve and argv
/// builders: what a sudoers file must allow, and nothing else. A command
/// whose arguments are only known at run time (a signal to a master's pid)
/// cannot be listed and is left out.
pub fn privileged_commands(tool: ToolId, host: &Host, target: &str) -> Vec<Argv> {
    let Some((field, _)) = tool.targets(host) else {
        return Vec::new();
    };
    let args = json!({ field: target, "reason": "install print" });
    let Ok(action) = resolve(tool, &args, host, PathMode::Lexical) else {
        return Vec::new();
    };
    action
        .planned_argv(host)
        .into_iter()
        .filter(|a| !a.to_vec().iter().any(|s| s == pool::MASTER_PID))
        .map(|a| super::context::unprivileged(host, a))
        .collect()
}

/// Check untrusted arguments for `tool` against `host`'s allowlists.
///
/// The error is a sentence a planner (or a model) can act on; it quotes
/// untrusted values only escaped and cut short.
pub fn resolve(tool: ToolId, args: &Value, host: &Host, mode: PathMode) -> Result<Action, String> {
    Ok(Action(match tool {
        ToolId::DiskUsage => {
            let a: DiskUsageArgs = parse(args)?;
            Resolved::DiskUsage {
                path: allowed_path(a.path.as_str(), &host.paths, mode, "paths")?,
            }
        }
        ToolId::ServiceStatus => {
            let a: UnitArgs = parse(args)?;
            Resolved::ServiceStatus {
                unit: allowed_unit(&a.unit, host, false)?,
            }
        }
        ToolId::ReadJournal => {
            let a: JournalArgs = parse(args)?;
            Resolved::ReadJournal {
                unit: allowed_unit(&a.unit, host, true)?,
                since: a.since,
                priority: a.priority,
            }
        }
        ToolId::ListProcesses => {
            let a: ProcessArgs = parse(args)?;
            Resolved::ListProcesses {
                sort: a.sort,
                limit: a.limit.get(),
            }
        }
        ToolId::CertExpiry => {
            let a: NameArgs = parse(args)?;
            Resolved::CertExpiry {
                name: allowed_key(&a.name, &host.certificates, "certificates")?,
            }
        }
        ToolId::HttpCheck => {
            let a: NameArgs = parse(args)?;
            Resolved::HttpCheck {
                name: allowed_key(&a.name, &host.health_checks, "health_checks")?,
            }
        }
        ToolId::RestartService | ToolId::ReloadService => {
            let a: UnitChangeArgs = parse(args)?;
            let unit = allowed_unit(&a.unit, host, false)?;
            let reason = a.reason.as_str().trim().to_string();
            if tool == ToolId::RestartService {
                Resolved::RestartService { unit, reason }
            } else {
                Resolved::ReloadService { unit, reason }
            }
        }
        ToolId::RotateLogs => {
            let a: RotateArgs = parse(args)?;
            Resolved::RotateLogs {
                config: allowed_file(
                    a.config.as_str(),
                    &host.logrotate_configs,
                    mode,
                    "logrotate_configs",
                )?,
                reason: a.reason.as_str().trim().to_string(),
            }
        }
        ToolId::RecycleWorkerPool => {
            let a: PoolArgs = parse(args)?;
            Resolved::RecycleWorkerPool {
                pool: allowed_key(&a.pool, &host.worker_pools, "worker_pools")?,
                reason: a.reason.as_str().trim().to_string(),
            }
        }
        ToolId::RenewCertificate => {
            let a: RenewArgs = parse(args)?;
            let name = allowed_key(&a.name, &host.certificates, "certificates")?;
            if host.certificates[&name].renew.is_none() {
                return Err(format!(
                    "certificate \"{name}\" has no `renew` command in the host file"
                ));
            }
            Resolved::RenewCertificate {
                name,
                reason: a.reason.as_str().trim().to_string(),
            }
        }
    }))
}

//! Why a run starts: a person on the command line, a cron schedule, or an
//! Alertmanager notification. A trigger is pure data ([`RunRequest`]); the
//! scheduler decides what becomes of it.

pub mod alerts;
pub(crate) mod cron;

use serde::Serialize;
use serde_json::Value;

/// Where a worker that fires triggers sends them (the scheduler, in the
/// daemon): the worker needs only this handle, not what decides.
pub(crate) trait Submit: Send + Sync + 'static {
    /// Why a trigger could not be recorded.
    type Error: std::fmt::Display;

    /// Record `req` and have it decided; an error means it was not recorded.
    fn submit(&self, req: RunRequest) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// `runwarden run` on the command line.
    Cli,
    /// The runbook's cron schedule.
    Schedule,
    /// An Alertmanager notification.
    Alert,
    /// `POST /api/v1/runs`: a person or a tool asked the daemon.
    Api,
}

impl Trigger {
    /// As reports, audit lines and metric labels write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Trigger::Cli => "cli",
            Trigger::Schedule => "schedule",
            Trigger::Alert => "alert",
            Trigger::Api => "api",
        }
    }
}

/// A request to run one runbook on one host.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The runbook, by name.
    pub(crate) runbook: String,
    /// The host, by name.
    pub(crate) host: String,
    /// Show tier-2 calls instead of running them.
    pub(crate) dry_run: bool,
    /// What started it.
    pub(crate) trigger: Trigger,
    /// For alert triggers: the alert's labels and annotations, as `alert.*` in templates.
    /// Untrusted text: whatever a template makes of it still passes the gate.
    pub(crate) alert: Option<Value>,
    /// What identifies a repeat of this trigger (alert fingerprint, group key).
    pub(crate) keys: Vec<String>,
    /// Who picks the calls.
    pub(crate) planner: crate::planner::PlannerChoice,
}

impl RunRequest {
    /// A run from the command line.
    pub fn cli(runbook: String, host: String, dry_run: bool) -> RunRequest {
        RunRequest {
            runbook,
            host,
            dry_run,
            trigger: Trigger::Cli,
            alert: None,
            keys: Vec::new(),
            planner: Default::default(),
        }
    }
}

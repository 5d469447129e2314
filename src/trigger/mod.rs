//! Why a run starts: a person on the command line, a cron schedule, or an
//! Alertmanager notification. A trigger is pure data ([`RunRequest`]); the
//! [`crate::scheduler`] decides what becomes of it.

pub mod alerts;
pub mod cron;
pub mod matchers;

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Cli,
    Schedule,
    Alert,
    /// `POST /api/v1/runs`: a person or a tool asked the daemon.
    Api,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
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
    pub runbook: String,
    pub host: String,
    pub dry_run: bool,
    pub trigger: Trigger,
    /// For alert triggers: the alert's labels and annotations, as `alert.*` in templates.
    /// Untrusted text: whatever a template makes of it still passes the gate.
    pub alert: Option<Value>,
    /// What identifies a repeat of this trigger (alert fingerprint, group key).
    pub keys: Vec<String>,
    pub planner: crate::planner::PlannerChoice,
}

impl RunRequest {
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

//! What started a run, as a name: the kind of trigger that audit lines,
//! reports, metric labels and the fleet's trigger records all write.
//!
//! A leaf, so that the record of a run (the audit log, the report) can name
//! its trigger without depending on the `trigger` module
//! that builds requests (which sits above the planners a request chooses).

use serde::Serialize;

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
    /// An agent over MCP: each of its tool calls is a step of the run.
    Mcp,
}

impl Trigger {
    /// As reports, audit lines and metric labels write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Trigger::Cli => "cli",
            Trigger::Schedule => "schedule",
            Trigger::Alert => "alert",
            Trigger::Api => "api",
            Trigger::Mcp => "mcp",
        }
    }
}

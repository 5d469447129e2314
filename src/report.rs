//! What a run reports: one line per step and the verdict, as `runwarden
//! run` prints it, the API serves it and the daemon keeps the recent ones.

use serde::Serialize;
use serde_json::Value;

use crate::run::Verdict;
use crate::tools::ToolResult;
use crate::trigger::Trigger;

/// One line of the report: what was asked, what the gate said, what happened.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub step: u32,
    pub id: String,
    /// `ok`, `error`, `timeout`, `denied`, `proposed`, `dry_run`, `skipped`, `suggested`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<u8>,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub args: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<Vec<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResult>,
}

impl StepReport {
    pub(crate) fn new(step: u32, id: &str, status: &str) -> StepReport {
        StepReport {
            step,
            id: id.to_string(),
            status: status.to_string(),
            tool: None,
            tier: None,
            args: Value::Null,
            approved_by: None,
            reason: None,
            detail: None,
            argv: None,
            result: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub run_id: String,
    pub runbook: String,
    pub runbook_version: String,
    pub host: String,
    pub autonomy: &'static str,
    pub planner: &'static str,
    /// The model that planned the run, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub trigger: Trigger,
    pub dry_run: bool,
    pub started_at: String,
    pub duration_ms: u64,
    pub steps: Vec<StepReport>,
    pub suggestions: Vec<String>,
    /// The model's final answer (model-planned runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_answer: Option<String>,
    /// Requests the model answered.
    #[serde(skip_serializing_if = "is_zero")]
    pub model_turns: u32,
    pub mutations: u32,
    pub verdict: Verdict,
    pub verdict_detail: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

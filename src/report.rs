//! What a run reports: one line per step and the verdict, as `runwarden
//! run` prints it, the API serves it and the daemon keeps the recent ones.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::origin::Trigger;
use crate::tools::{Outcome, ToolResult};
use crate::verdict::Verdict;

/// What became of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StepStatus {
    /// The call ran and did what it does.
    Ok,
    /// The call failed, or never ran (see its result's `error`).
    Error,
    /// The call ran out of time.
    Timeout,
    /// The gate refused it.
    Denied,
    /// L1: recorded for a person, never run.
    Proposed,
    /// A dry run: shown, not run.
    DryRun,
    /// Its `when` was false.
    Skipped,
    /// A tier-3 command for a person to run, never run here.
    Suggested,
}

impl StepStatus {
    /// As reports, the API and metric labels write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StepStatus::Ok => "ok",
            StepStatus::Error => "error",
            StepStatus::Timeout => "timeout",
            StepStatus::Denied => "denied",
            StepStatus::Proposed => "proposed",
            StepStatus::DryRun => "dry_run",
            StepStatus::Skipped => "skipped",
            StepStatus::Suggested => "suggested",
        }
    }
}

impl From<Outcome> for StepStatus {
    fn from(o: Outcome) -> StepStatus {
        match o {
            Outcome::Ok => StepStatus::Ok,
            Outcome::Error => StepStatus::Error,
            Outcome::Timeout => StepStatus::Timeout,
        }
    }
}

/// One line of the report: what was asked, what the gate said, what happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepReport {
    /// The step's number in the run (1-based).
    pub(crate) step: u32,
    /// Its id (`steps.ID` in templates).
    pub(crate) id: String,
    /// What became of it.
    pub(crate) status: StepStatus,
    /// The tool proposed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tool: Option<String>,
    /// Its tier, when the tool exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tier: Option<u8>,
    /// The arguments (bounded).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub(crate) args: Value,
    /// Who allowed the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approved_by: Option<String>,
    /// A tier-2 call's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Why it was denied, proposed, skipped, or what it suggests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
    /// The commands it ran or would run, program first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) argv: Option<Vec<Vec<String>>>,
    /// What the tool reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<ToolResult>,
    /// A dry run's tier-2 call: how it would check its own effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) would_verify: Option<String>,
}

impl StepReport {
    pub(crate) fn new(step: u32, id: &str, status: StepStatus) -> StepReport {
        StepReport {
            step,
            id: id.to_string(),
            status,
            tool: None,
            tier: None,
            args: Value::Null,
            approved_by: None,
            reason: None,
            detail: None,
            argv: None,
            result: None,
            would_verify: None,
        }
    }
}

/// What one run came to: the report `run` prints and the API serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// The run's id (a UUIDv7).
    pub(crate) run_id: String,
    /// The runbook.
    pub(crate) runbook: String,
    /// sha256 of the runbook file it ran.
    pub(crate) runbook_version: String,
    /// The host.
    pub(crate) host: String,
    /// `L1`, `L2` or `L3`.
    pub(crate) autonomy: std::borrow::Cow<'static, str>,
    /// `steps` or `model`.
    pub(crate) planner: std::borrow::Cow<'static, str>,
    /// The model that planned the run, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    /// What started it.
    pub(crate) trigger: Trigger,
    /// Whether tier-2 calls were only shown.
    pub(crate) dry_run: bool,
    /// When it started (RFC 3339).
    pub(crate) started_at: String,
    /// How long it took.
    pub(crate) duration_ms: u64,
    /// Each step, in order.
    pub steps: Vec<StepReport>,
    /// Tier-3 commands for a person to run.
    pub(crate) suggestions: Vec<String>,
    /// Those of `suggestions` the model wrote: its own words, unverified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) model_suggestions: Vec<String>,
    /// A model-planned run: each checkable claim of its final answer,
    /// marked supported by the run's record or not, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) claims: Vec<crate::claims::Claim>,
    /// The model's final answer (model-planned runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) final_answer: Option<String>,
    /// Requests the model answered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) model_turns: u32,
    /// Tier-2 calls made.
    pub(crate) mutations: u32,
    /// `done_when.alert_clears`: whether the alert that started the run
    /// cleared, and the query and evaluations that say so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) alert_check: Option<AlertCheck>,
    /// The earlier run whose cleared alert came back and started this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) recurred_from: Option<String>,
    /// The one verdict.
    pub verdict: Verdict,
    /// Why that verdict.
    pub(crate) verdict_detail: String,
}

/// What a run saw of its alert after its last call (`done_when`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AlertCheck {
    /// `cleared`, `firing`, `unknown` or `stopped`.
    pub(crate) outcome: String,
    /// In words, with the evidence.
    pub(crate) said: String,
    /// The rule, the query, the series looked for and each evaluation.
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub(crate) detail: serde_json::Value,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The report as a person reads it.
pub(crate) fn render(r: &RunReport) -> String {
    let mut s = format!(
        "run {}  runbook {} ({}, {}{})  host {}\n",
        r.run_id,
        r.runbook,
        r.autonomy,
        r.planner,
        if r.dry_run { ", dry run" } else { "" },
        r.host
    );
    for step in &r.steps {
        s += &render_step(step);
    }
    if r.model.is_some() {
        s += &changed(r);
    }
    if let Some(answer) = &r.final_answer {
        let unsupported = r.claims.iter().filter(|c| !c.supported).count();
        s += &format!(
            "  the account of {} (its own words, not evidence; {unsupported} of {} checkable claim(s) unsupported by the run's record):\n",
            r.model.as_deref().unwrap_or("the model"),
            r.claims.len()
        );
        for line in answer.lines() {
            s += &format!("     | {line}\n");
        }
        for c in r.claims.iter().filter(|c| !c.supported && !c.suggestion) {
            s += &format!("     unsupported: \"{}\": {}\n", c.text, c.why);
        }
    }
    for sug in &r.suggestions {
        if r.model_suggestions.contains(sug) {
            let mark = r
                .claims
                .iter()
                .find(|c| {
                    c.suggestion && !c.supported && sug.contains(c.text.trim_end_matches("..."))
                })
                .map_or(String::new(), |c| format!(" [unsupported: {}]", c.why));
            s += &format!(
                "  suggested by the model (its own, unverified; tier 3, not run): {sug}{mark}\n"
            );
        } else {
            s += &format!("  suggestion for a person (tier 3, not run): {sug}\n");
        }
    }
    if let Some(earlier) = &r.recurred_from {
        s += &format!(
            "  this alert came back after run {earlier} saw it clear: that fix did not hold\n"
        );
    }
    if let Some(check) = &r.alert_check {
        s += &format!("  alert ({}): {}\n", check.outcome, check.said);
        let queries = check.detail["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|a| a["queries"].as_array().into_iter().flatten())
            .filter_map(|q| q.as_str());
        for q in queries {
            s += &format!("     query: {}\n", crate::text::one_line(q));
        }
    }
    s += &format!(
        "verdict: {} ({}) in {} ms, {} mutation(s)\n",
        r.verdict.as_str(),
        r.verdict_detail,
        r.duration_ms,
        r.mutations
    );
    s
}

/// What the run changed, from its own record (each tier-2 call, its
/// outcome and verification), never from a model's words.
fn changed(r: &RunReport) -> String {
    let calls: Vec<&StepReport> = r
        .steps
        .iter()
        .filter(|s| s.tier == Some(2) && s.result.is_some())
        .collect();
    if calls.is_empty() {
        return "  changed (the run's record): nothing; no tier-2 call ran\n".into();
    }
    let mut s = String::from("  changed (the run's record):\n");
    for step in calls {
        let result =
            step.result
                .as_ref()
                .map_or("?".to_string(), |res| match (res.outcome, res.verified) {
                    (Outcome::Ok, Some(true)) => "done and verified".to_string(),
                    (_, Some(false)) => "NOT verified".to_string(),
                    (o, _) => o.as_str().to_string(),
                });
        s += &format!(
            "     step {} {} {}: {result}\n",
            step.step,
            step.tool.as_deref().unwrap_or("?"),
            args_text(&step.args)
        );
    }
    s
}

fn render_step(step: &StepReport) -> String {
    let mut s = format!("{:>3}. {:<12} ", step.step, step.id);
    match &step.tool {
        Some(tool) => {
            s += &format!("{tool} {}", args_text(&step.args));
            if let Some(t) = step.tier {
                s += &format!("  tier {t}");
            }
            if let Some(a) = &step.approved_by {
                s += &format!("  approved_by {a}");
            }
        }
        None => s += "-",
    }
    let duration = step
        .result
        .as_ref()
        .map(|r| format!("  {} ms", r.duration_ms))
        .unwrap_or_default();
    let verified = match step.result.as_ref().and_then(|r| r.verified) {
        Some(true) => " (verified)",
        Some(false) => " (NOT verified)",
        None => "",
    };
    let status = match step.status {
        StepStatus::DryRun => "would run (dry run: not run)",
        other => other.as_str(),
    };
    s += &format!("  => {status}{verified}{duration}\n");
    if let Some(reason) = &step.reason {
        s += &format!("       reason: {reason}\n");
    }
    if let Some(d) = &step.detail {
        s += &format!("       {d}\n");
    }
    for argv in step.argv.iter().flatten() {
        let label = if step.status == StepStatus::DryRun {
            "would run"
        } else {
            "argv"
        };
        s += &format!(
            "       {label}: {}\n",
            serde_json::to_string(argv).unwrap_or_default()
        );
    }
    if step.status == StepStatus::DryRun
        && let Some(check) = &step.would_verify
    {
        s += &format!("       would verify: {check}\n");
    }
    if let Some(res) = &step.result {
        if let Some(e) = &res.error {
            s += &format!("       error: {e}\n");
        }
        let tool = step.tool.as_deref().unwrap_or("");
        match crate::tools::output_block(tool, &res.data, "       ") {
            Some(block) => s += &block,
            None => {
                if let Some(said) = crate::tools::said(tool, &res.data) {
                    s += &format!("       said: {said}\n");
                }
            }
        }
    }
    s
}

/// A call's arguments as `key=value` pairs (a string as it is unless it
/// needs quotes; anything else as JSON), escaped for a terminal.
pub(crate) fn args_text(args: &Value) -> String {
    let Some(map) = args.as_object() else {
        return crate::text::printable(&compact(args));
    };
    let pairs: Vec<String> = map
        .iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) if !s.is_empty() && !s.contains(char::is_whitespace) && !s.contains('"') => {
                format!("{k}={s}")
            }
            _ => format!("{k}={}", compact(v)),
        })
        .collect();
    crate::text::printable(&pairs.join(" "))
}

pub(crate) fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

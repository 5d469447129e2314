//! A notification replayed through the real gate, starting nothing:
//! `runwarden alerts test [--plan]` and `POST /api/v1/alerts?plan=1`.
//!
//! For each alert: the runbook and host it would start, or why not (no
//! runbook, out of scope, the kill switch, and the cooldown, duplicate and
//! `max_runs` as the audit log leaves them). With a plan, each run it would
//! start goes step by step through the gate a run would build: the exact
//! argv of every call the gate allows, and its first decision for each
//! (allowed, needs a person, proposed, denied and why, over budget). A
//! step whose `when` or arguments read an earlier step's results
//! (`steps.ID`) cannot be known before that step runs, and says so. A
//! model runbook shows the scope its model would get.
//!
//! Nothing here starts a process, takes a lock or writes a line: the gate's
//! checks read files (the kill switch, a local host's paths) and count in
//! memory; no call is dispatched, so nothing reaches a host.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::audit::runs::Recovery;
use crate::config::Config;
use crate::config::runbook::StepAction;
use crate::gate::{Decision, Demotions, Gate, KillSwitch};
use crate::planner::{Next, StepsPlanner, Transcript};
use crate::rules::TriggerResult;
use crate::rules::admission::DUPLICATE_WINDOW;
use crate::state::Slot;
use crate::trigger::RunRequest;
use crate::trigger::alerts::{Candidate, Notification, candidates, resolved};

/// What `notification` would do, alert by alert, as the audit log at
/// `record` and the kill switch stand now; with `plans`, each run it would
/// start planned through the gate. `{"alerts": [...]}`.
pub(crate) fn notification(
    n: &Notification,
    config: &Config,
    killswitch: &KillSwitch,
    demotions: &Demotions,
    record: &Recovery,
    plans: bool,
) -> Value {
    // One run per runbook and host: a later alert of the same notification
    // joins the run an earlier one starts (it sees it in `alerts`).
    let mut starting: HashMap<(String, String), usize> = Default::default();
    // A run sees every alert of its notification for its runbook and host
    // (`alerts`): it is planned with the request the whole notification makes.
    let mut whole: HashMap<(String, String), RunRequest> = Default::default();
    for c in candidates(n, config) {
        if let Candidate::Run(req) = c {
            whole
                .entry((req.runbook.clone(), req.host.clone()))
                .or_insert(req);
        }
    }
    let alerts: Vec<Value> = n
        .alerts
        .iter()
        .enumerate()
        .map(|(i, alert)| {
            let one = Notification {
                alerts: vec![alert.clone()],
                ..n.clone()
            };
            let outcomes: Vec<Value> = if alert.status != "firing" {
                let withdraws = resolved(&one, config);
                let why = match withdraws.first() {
                    Some(r) => format!(
                        "a resolved alert starts nothing; it withdraws the approval requests its run of {} on {} waits on (on_resolved: withdraw_approvals)",
                        r.runbook, r.host
                    ),
                    None => "a resolved alert starts nothing".to_string(),
                };
                vec![json!({ "result": "resolved", "why": why })]
            } else {
                candidates(&one, config)
                    .into_iter()
                    .map(|c| {
                        let req = match &c {
                            Candidate::Run(req) => whole
                                .get(&(req.runbook.clone(), req.host.clone()))
                                .cloned(),
                            _ => None,
                        };
                        let mut o = outcome(c, config, killswitch, record);
                        if o["result"] == "would_start" {
                            let key = (
                                o["runbook"].as_str().unwrap_or("").to_string(),
                                o["host"].as_str().unwrap_or("").to_string(),
                            );
                            if let Some(first) = starting.get(&key) {
                                o["result"] = "joins".into();
                                o["why"] = format!(
                                    "the run alert {} starts on {} sees this alert too (in `alerts`); the webhook records it as deduplicated",
                                    first + 1,
                                    key.1
                                )
                                .into();
                            } else {
                                starting.insert(key, i);
                                if let (true, Some(req)) = (plans, req) {
                                    o["plan"] = run(config, &req, killswitch.clone(), demotions.clone());
                                }
                            }
                        }
                        o
                    })
                    .collect()
            };
            json!({ "labels": alert.labels, "fingerprint": alert.fingerprint, "outcomes": outcomes })
        })
        .collect();
    json!({ "alerts": alerts })
}

/// One candidate: the kill switch, then the scheduler's own rule for the
/// (runbook, host) as the audit log leaves it.
fn outcome(c: Candidate, config: &Config, killswitch: &KillSwitch, record: &Recovery) -> Value {
    match c {
        Candidate::NoMatch { why, .. } => json!({ "result": "no_match", "why": why }),
        Candidate::Invalid { why, .. } => json!({ "result": "invalid", "why": why }),
        Candidate::OutOfScope { runbook, why, .. } => {
            json!({ "result": "out_of_scope", "runbook": runbook, "why": why })
        }
        Candidate::Run(req) => {
            if let Err(engaged) = killswitch.check(&req.runbook) {
                return json!({ "result": "kill_switch", "runbook": req.runbook, "host": req.host, "why": engaged.to_string() });
            }
            let runbook = config.runbooks.get(&req.runbook);
            let cooldown = runbook.and_then(|r| r.cooldown);
            let cap = runbook.and_then(|r| r.max_runs);
            let refused = Slot::from_record(record, &(req.runbook.clone(), req.host.clone()))
                .refuses(&req.keys, cooldown, cap, DUPLICATE_WINDOW);
            let Some((result, ago)) = refused else {
                return json!({ "result": "would_start", "runbook": req.runbook, "host": req.host });
            };
            let ago = humantime::format_duration(std::time::Duration::from_secs(
                ago.unwrap_or_default().as_secs(),
            ));
            let why = match result {
                TriggerResult::Deduplicated => format!(
                    "this alert started the last run on {}, {ago} ago, within the cooldown",
                    req.host
                ),
                TriggerResult::Capped => match cap {
                    Some(cap) => format!(
                        "{} already ran {} time(s) on {} within {} (max_runs): a fix that keeps being needed is for a person to look at",
                        req.runbook,
                        cap.count,
                        req.host,
                        humantime::format_duration(cap.per)
                    ),
                    None => String::new(),
                },
                _ => format!(
                    "its last run on {} ended {ago} ago, within the cooldown of {}",
                    req.host,
                    humantime::format_duration(cooldown.unwrap_or_default())
                ),
            };
            json!({ "result": result.as_str(), "runbook": req.runbook, "host": req.host, "why": why })
        }
    }
}

/// The run `req` would be, planned through the gate: its steps, each with
/// the gate's first decision and the argv it would spawn; with a model, the
/// scope the model would get.
pub(crate) fn run(
    config: &Config,
    req: &RunRequest,
    killswitch: KillSwitch,
    demotions: Demotions,
) -> Value {
    let (Some(runbook), Some(host)) = (
        config.runbooks.get(&req.runbook),
        config.hosts.get(&req.host),
    ) else {
        return json!({ "error": format!("no runbook {} or no host {}", req.runbook, req.host) });
    };
    let mut out = json!({ "autonomy": runbook.autonomy.as_str() });
    let model = runbook
        .agent
        .as_ref()
        .filter(|_| config.settings.model.is_some());
    if let Some(agent) = model {
        let tools: Vec<&str> = runbook
            .observe
            .iter()
            .chain(runbook.approve.iter())
            .map(|t| t.name())
            .collect();
        out["model"] = json!({
            "goal": agent.goal,
            "tools": tools,
            "host": host.name,
            "max_steps": agent.max_steps.min(runbook.budget.max_steps),
            "after_steps": agent.after_steps,
            "what": "the model picks its calls at run time, inside this scope; each goes through the same gate",
        });
        if !agent.after_steps {
            return out;
        }
    }
    let mut planner = StepsPlanner::new(runbook.clone(), req.template_context("planned"));
    let mut gate = Gate::new(runbook.clone(), host.clone(), killswitch, demotions);
    let transcript = Transcript::default();
    let mut steps = Vec::new();
    for step in &runbook.steps {
        let reads = reads_results(step);
        let next = planner.next(&transcript);
        if !reads.is_empty() {
            let tool = match &step.action {
                StepAction::Call { tool, .. } => Some(tool.name()),
                StepAction::Suggest(_) => None,
            };
            steps.push(json!({
                "id": step.id,
                "tool": tool,
                "decision": "depends",
                "why": format!("reads the results of step(s) {}: known only once they ran", reads.join(", ")),
            }));
            continue;
        }
        steps.push(match next {
            Next::Call { id, call } => {
                let tool = call.tool.clone();
                let (decision, action, why) = match gate.check(&call) {
                    Decision::Allow(p) => ("allowed", Some(p.action().clone()), None),
                    Decision::Hold(h) => ("needs_approval", Some(h.action().clone()), h.demoted().map(String::from)),
                    Decision::Propose(p) => ("proposed", Some(p.action().clone()), None),
                    Decision::Deny(d) => ("denied", None, Some(format!("{}: {}", d.reason.as_str(), d.detail))),
                };
                let argv: Option<Vec<Vec<String>>> = action.as_ref().map(|a| {
                    a.planned_argv(host)
                        .iter()
                        .map(|argv| argv.to_vec())
                        .collect()
                });
                json!({
                    "id": id,
                    "tool": tool,
                    "tier": action.as_ref().map(|a| a.tier().number()),
                    "args": call.args,
                    "decision": decision,
                    "argv": argv,
                    "why": why,
                })
            }
            Next::Skip { id, when } => json!({ "id": id, "decision": "skipped", "why": format!("when: {when} is false") }),
            Next::Suggest { id, text, .. } => json!({ "id": id, "decision": "suggested", "why": format!("for a person to run: {text}") }),
            Next::Fail(why) => json!({ "id": step.id, "decision": "broken", "why": why }),
            _ => break,
        });
    }
    out["steps"] = Value::Array(steps);
    out
}

/// The earlier steps whose results `step` reads (`steps.ID` in its `when`,
/// arguments or reason).
fn reads_results(step: &crate::config::runbook::Step) -> Vec<String> {
    let mut texts: Vec<&str> = step.when.as_deref().into_iter().collect();
    match &step.action {
        StepAction::Call { args, reason, .. } => {
            texts.extend(args.values().filter_map(|v| v.as_str()));
            texts.extend(reason.as_deref());
        }
        StepAction::Suggest(text) => texts.push(text),
    }
    let mut ids: Vec<String> = Vec::new();
    for id in texts
        .into_iter()
        .flat_map(crate::planner::steps::references)
    {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

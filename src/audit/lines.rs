//! One constructor per kind of line. Everything a line says comes from a
//! typed value (a spent [`Permit`], a [`Denial`], a [`Verdict`]), so a line
//! cannot claim what did not happen, and the call paths (run, scheduler,
//! host agent) never set a field by hand.
//!
//! One file: one constructor per kind of line, side by side, so a new kind
//! of line is written like the others and none sets a field by hand.

use serde_json::{Value, json};

use super::log::Written;
use super::{AuditError, AuditLog, Entry, Phase, this_process};
use crate::config::Autonomy;
use crate::gate::{ApprovedBy, Denial, Hold, Permit, Proposal};
use crate::origin::Trigger;
use crate::text::bounded;
use crate::tools::{Action, ToolResult};
use crate::verdict::Verdict;

/// What every line of one run carries.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunInfo {
    /// The run's id.
    pub(crate) run_id: String,
    /// The runbook.
    pub(crate) runbook: String,
    /// sha256 of the runbook file.
    pub(crate) runbook_version: String,
    /// The host.
    pub(crate) host: String,
    /// `steps`, `model`, or `agent`.
    pub(crate) planner: String,
    /// The model, for model-planned runs.
    pub(crate) model: Option<String>,
    /// The system prompt's version and hash.
    pub(crate) prompt: Option<String>,
}

impl RunInfo {
    /// The run a recorded line belongs to (to close it with a verdict).
    pub(crate) fn of(e: &Entry) -> RunInfo {
        RunInfo {
            run_id: e.run_id.clone(),
            runbook: e.runbook.clone(),
            runbook_version: e.runbook_version.clone(),
            host: e.host.clone(),
            planner: e.planner.clone(),
            model: e.model.clone(),
            prompt: e.prompt.clone(),
        }
    }

    pub(super) fn entry(&self, phase: Phase, step: Option<u32>) -> Entry {
        Entry {
            ts: jiff::Timestamp::now().to_string(),
            run_id: self.run_id.clone(),
            step,
            phase: Some(phase),
            runbook: self.runbook.clone(),
            runbook_version: self.runbook_version.clone(),
            host: self.host.clone(),
            planner: self.planner.clone(),
            model: self.model.clone(),
            prompt: self.prompt.clone(),
            ..Entry::default()
        }
    }

    fn call(&self, phase: Phase, step: u32, action: &Action) -> Entry {
        let mut e = self.entry(phase, Some(step));
        e.tool = Some(action.tool().name().into());
        e.args = Some(action.args_json());
        e.tier = Some(action.tier().number());
        e.declaration = action.declaration();
        e.reason = action.reason().map(str::to_string);
        e
    }
}

/// A call some check allowed: what an intent line records and a ticket
/// carries. Sealed: the runner's [`Permit`] (only its gate makes one) and
/// the host agent's own permit (only the agent's policy check makes one)
/// are the only kinds, and neither can stand in for the other.
pub trait Permitted: permitted::Sealed {
    /// The step it was checked for.
    fn step(&self) -> u32;
    /// The call it allows, resolved against the host.
    fn action(&self) -> &Action;
    /// Who allowed it.
    fn approved_by(&self) -> &ApprovedBy;
}

/// The seal of [`Permitted`]: implemented only inside this crate.
pub(crate) mod permitted {
    /// Only the crate's permit types carry it.
    pub trait Sealed {}
}

impl Permitted for Permit {
    fn step(&self) -> u32 {
        Permit::step(self)
    }
    fn action(&self) -> &Action {
        Permit::action(self)
    }
    fn approved_by(&self) -> &ApprovedBy {
        Permit::approved_by(self)
    }
}
impl permitted::Sealed for Permit {}

/// A permitted call whose intent line is on disk: the one value a dispatch
/// takes. Only [`AuditLog::intent`] makes one, from the permit it consumes,
/// and dispatch consumes it in turn, so a call cannot run without its line,
/// nor twice on one line. The runner's executor takes a ticket for the
/// runner's [`Permit`] only.
#[derive(Debug)]
pub struct AuditTicket<P: Permitted = Permit> {
    permit: P,
}

impl<P: Permitted> AuditTicket<P> {
    /// The step the call is.
    pub(crate) fn step(&self) -> u32 {
        self.permit.step()
    }

    /// The call it allows.
    pub(crate) fn permit(&self) -> &P {
        &self.permit
    }

    /// The ticket spent without a dispatch (once the intent line was on
    /// disk, the kill switch was found engaged or the run's lease could no
    /// longer be shown to be current): its result line says the call was
    /// not sent.
    pub(crate) fn unsent(self) -> Dispatched {
        self.dispatched()
    }

    /// The ticket spent by a dispatch; what the result line takes.
    pub(crate) fn dispatched(self) -> Dispatched {
        let action = self.permit.action();
        Dispatched {
            step: self.permit.step(),
            tool: action.tool().name().into(),
            tier: action.tier().number(),
        }
    }
}

/// A dispatched call, waiting for its result line ([`AuditLog::result`]).
#[derive(Debug)]
pub struct Dispatched {
    step: u32,
    tool: String,
    tier: u8,
}

/// An accepted trigger, recorded before its run can start.
pub(crate) struct Queued<'a> {
    /// The run, as its lines will name it.
    pub(crate) run: RunInfo,
    /// What started it.
    pub(crate) trigger: Trigger,
    /// Its deduplication keys (read back at start-up).
    pub(crate) keys: &'a [String],
    /// Who or what asked, for the alert that started it, if an alert did.
    pub(crate) origin: Origin<'a>,
    /// Where the run waits and runs.
    pub(crate) queue: QueueNote<'a>,
}

/// What the record keeps of who or what asked for a run, beyond the kind
/// of its trigger.
#[derive(Debug, Default)]
pub(crate) struct Origin<'a> {
    /// The alert that started it, and the alerts its run sees together
    /// (its own first).
    pub(crate) alert: Option<(&'a Value, Vec<Value>)>,
    /// The agent's client, for a run an agent drives over MCP.
    pub(crate) client: Option<&'a str>,
}

/// Where an accepted trigger's run runs (with shared state, it may be
/// another replica's).
#[derive(Debug, Clone, Copy)]
pub(crate) enum QueueNote<'a> {
    /// On this machine.
    Here,
    /// Handed to the fleet's queue: whichever replica takes it records its
    /// run in its own log (`"queue": "fleet"`), and this log holds no end
    /// for it.
    Handed,
    /// Taken here from the fleet's queue, admitted by this replica
    /// (`"taken_from"`).
    TakenFrom(&'a str),
}

/// Whether a `queued` line handed its run to the fleet's queue: the run is
/// another log's from there on.
pub(crate) fn handed(e: &super::Entry) -> bool {
    e.phase == Some(Phase::Queued)
        && e.detail
            .as_ref()
            .is_some_and(|d| d["queue"].as_str() == Some("fleet"))
}

/// What the history keeps of the alert that started a run: its labels and
/// its `summary` and `description` annotations (every alert of the
/// notification's labels for this run, when there were several), bounded
/// and with control characters escaped, so a line stays readable whatever
/// Alertmanager was sent.
pub(crate) fn alert_record(alert: &Value, together: &[Value]) -> Value {
    fn clean(s: &str, max: usize) -> String {
        let mut out: String = s
            .chars()
            .flat_map(|c| match c {
                c if c.is_control() => c.escape_default().collect::<Vec<_>>(),
                c => vec![c],
            })
            .take(max)
            .collect();
        if s.chars().count() > max {
            out.push('…');
        }
        out
    }
    let labels = |a: &Value| -> Value {
        a["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .take(32)
                    .map(|(k, v)| {
                        (
                            clean(k, 64),
                            Value::String(clean(v.as_str().unwrap_or(""), 200)),
                        )
                    })
                    .collect::<serde_json::Map<_, _>>()
            })
            .map_or(Value::Null, Value::Object)
    };
    let mut out = json!({ "labels": labels(alert) });
    for key in ["summary", "description"] {
        if let Some(text) = alert["annotations"][key].as_str() {
            out[key] = clean(text, 500).into();
        }
    }
    // What `done_when` needs of a run handed back and run again.
    for key in ["fingerprint", "generator_url"] {
        if let Some(text) = alert[key].as_str().filter(|t| !t.is_empty()) {
            out[key] = clean(text, 2000).into();
        }
    }
    if together.len() > 1 {
        out["alerts"] = together.iter().take(10).map(labels).collect();
    }
    out
}

/// The alert an [`alert_record`] kept, in the shape a run's templates
/// read (`labels`, `annotations.summary`, `annotations.description`): what
/// a run handed back by a stop gets when it runs again.
pub(crate) fn alert_of_record(record: &Value) -> Option<Value> {
    let labels = record.get("labels").filter(|l| l.is_object())?;
    let mut annotations = serde_json::Map::new();
    for key in ["summary", "description"] {
        if let Some(text) = record.get(key) {
            annotations.insert(key.into(), text.clone());
        }
    }
    let mut alert = json!({ "labels": labels, "annotations": annotations });
    for key in ["fingerprint", "generator_url"] {
        if let Some(text) = record.get(key) {
            alert[key] = text.clone();
        }
    }
    Some(alert)
}

/// How a run ended, beyond its verdict: what its verdict line tallies.
#[derive(Debug, Default)]
pub(crate) struct RunEnd {
    /// How long the run took.
    pub(crate) duration_ms: u64,
    /// The model's final answer.
    pub(crate) final_answer: Option<String>,
    /// Calls proposed.
    pub(crate) steps: u32,
    /// Tier-2 calls made.
    pub(crate) mutations: u32,
    /// Tier-3 commands suggested.
    pub(crate) suggestions: Vec<String>,
    /// Stopped by the daemon's shutdown before it proposed anything: the
    /// next start runs its trigger again.
    pub(crate) handed_back: bool,
    /// With shared state: the queued run of the fleet's its trigger went to
    /// (no start of this machine runs it again).
    pub(crate) handed_to: Option<String>,
    /// A model-planned run: its final answer's claims, each marked
    /// supported by the run's record or not.
    pub(crate) claims: Vec<crate::claims::Claim>,
    /// Those of `suggestions` a model wrote (its own words, unverified).
    pub(crate) model_suggestions: Vec<String>,
    /// Why the run itself ended it, when that is not its steps: a panic
    /// (`internal_error`).
    pub(crate) reason: Option<&'static str>,
    /// `done_when`: the run saw its alert clear. A firing of that alert
    /// now is the alert back, not a repeat of the trigger that started it.
    pub(crate) alert_cleared: bool,
}

impl AuditLog {
    /// The lines of accepted triggers, made where their borrowed parts live
    /// and written by [`AuditLog::append_queued`] wherever a sync may block.
    pub(crate) fn queued_lines(runs: &[Queued<'_>]) -> Vec<Entry> {
        runs.iter()
            .map(|q| {
                let mut e = q.run.entry(Phase::Queued, None);
                let mut detail =
                    json!({ "trigger": q.trigger, "keys": q.keys, "process": this_process() });
                if let Some((alert, seen)) = &q.origin.alert {
                    detail["alert"] = alert_record(alert, seen);
                }
                match q.queue {
                    QueueNote::Here => {}
                    QueueNote::Handed => detail["queue"] = "fleet".into(),
                    QueueNote::TakenFrom(replica) => detail["taken_from"] = replica.into(),
                }
                e.detail = Some(detail);
                e
            })
            .collect()
    }

    /// Accepted triggers' lines in one write, not synced: the caller makes
    /// them durable with [`AuditLog::sync_through_within`] before it answers, while
    /// their runs start (a run's intent sync covers them too, as it covers
    /// every earlier byte of the file).
    pub(crate) fn append_queued(&self, lines: Vec<Entry>) -> Result<Written, AuditError> {
        self.append_at(lines, false)
    }

    /// [`append_queued`](Self::append_queued) from an async worker: only
    /// if nothing is to wait for (see [`AuditLog::try_append_at`]);
    /// `Err(lines)` to write from a thread that may wait.
    pub(crate) fn try_append_queued(
        &self,
        lines: Vec<Entry>,
    ) -> Result<Result<Written, AuditError>, Vec<Entry>> {
        self.try_append_at(lines)
    }

    /// A run begins. Not synced on its own: nothing has run yet, and the
    /// first synced line carries it to disk.
    pub(crate) fn start(
        &self,
        run: &RunInfo,
        trigger: Trigger,
        dry_run: bool,
        autonomy: Autonomy,
        origin: &Origin<'_>,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Start, None);
        let mut detail = json!({
            "trigger": trigger,
            "dry_run": dry_run,
            "autonomy": autonomy.as_str(),
            "process": this_process(),
        });
        if let Some((alert, seen)) = &origin.alert {
            detail["alert"] = alert_record(alert, seen);
        }
        if let Some(client) = origin.client {
            detail["client"] = crate::text::one_line(client).into();
        }
        if trigger == Trigger::Cli {
            // A person's run says whose it was (and, under sudo, who asked).
            detail["user"] = crate::gate::killswitch::who().into();
            if let Some(by) = std::env::var("SUDO_USER").ok().filter(|u| !u.is_empty()) {
                detail["sudo_user"] = crate::text::one_line(&by).into();
            }
        }
        e.detail = Some(detail);
        self.append(e, false)
    }

    /// Write and sync the intent of a permitted call; the ticket lets the
    /// executor run it, once. The permit is spent either way.
    pub fn intent<P: Permitted>(
        &self,
        run: &RunInfo,
        permit: P,
    ) -> Result<AuditTicket<P>, AuditError> {
        let mut e = run.call(Phase::Intent, permit.step(), permit.action());
        e.approved_by = Some(permit.approved_by().to_string());
        self.append(e, true)?;
        Ok(AuditTicket { permit })
    }

    /// Close a dispatched call with its whole result (a runner that lost
    /// the connection asks the host for it). Synced for tier 2.
    pub(crate) fn result(
        &self,
        run: &RunInfo,
        ticket: Dispatched,
        result: &ToolResult,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Result, Some(ticket.step));
        e.tool = Some(ticket.tool);
        e.tier = Some(ticket.tier);
        e.outcome = Some(result.outcome.as_str().into());
        e.exit_code = result.exit_code;
        e.duration_ms = Some(result.duration_ms);
        e.detail = serde_json::to_value(result).ok();
        self.append(e, ticket.tier > 1)
    }

    /// The gate refused a call: what was asked (bounded) and why.
    pub(crate) fn denied(
        &self,
        run: &RunInfo,
        tool: &str,
        args: &Value,
        denial: &Denial,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Denied, Some(denial.step));
        e.tool = Some(tool.chars().take(200).collect());
        e.args = Some(bounded(args));
        e.tier = denial.tool.as_ref().map(|t| t.tier().number());
        e.outcome = Some("denied".into());
        e.detail = Some(json!({ "reason": denial.reason, "message": denial.detail }));
        self.append(e, true)
    }

    /// The host agent refused a request (its policy, or not a request).
    pub(crate) fn refused(
        &self,
        run: &RunInfo,
        step: Option<u32>,
        tool: Option<&str>,
        reason: &str,
        message: &str,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Denied, step);
        e.tool = tool.map(|t| t.chars().take(64).collect());
        e.outcome = Some("denied".into());
        e.detail = Some(json!({ "reason": reason, "message": message }));
        self.append(e, true)
    }

    /// A runbook lost its standing approval (`demote_after`): the runs and
    /// the calls that failed, which a person reads before promoting it.
    pub(crate) fn demoted(&self, d: &crate::gate::demotion::Demotion) -> Result<(), AuditError> {
        let mut e = no_run(&d.runbook, Phase::Autonomy);
        e.outcome = Some("demoted".into());
        e.detail = Some(json!({
            "autonomy": "L2",
            "by": d.by,
            "demote_after": { "failures": d.failures, "per_secs": d.per_secs },
            "evidence": d.evidence,
            "message": d.summary(),
        }));
        self.append(e, true)
    }

    /// A person gave a demoted runbook its standing approval back
    /// (`runwarden promote`): who, why, whether they forced it, and the
    /// demotion it lifted.
    pub(crate) fn promoted(
        &self,
        d: &crate::gate::demotion::Demotion,
        by: &str,
        reason: &str,
        forced: bool,
    ) -> Result<(), AuditError> {
        let mut e = no_run(&d.runbook, Phase::Autonomy);
        e.outcome = Some("promoted".into());
        e.detail = Some(json!({
            "autonomy": "L3",
            "by": by,
            "reason": reason,
            "forced": forced,
            "demoted_since": d.since,
            "demoted_by": d.by,
            "evidence_runs": d.evidence.iter().map(|f| &f.run_id).collect::<Vec<_>>(),
        }));
        self.append(e, true)
    }

    /// A caller's decision on a scope that changes who may act (see
    /// [`crate::access::Scope::audited`]): allowed or refused, with the
    /// principal and the token's id, never the token. `what` is what was
    /// asked (`approve 0193…`, `engage`); `via` the way in (`api`, `slack`).
    pub(crate) fn access(&self, d: &AccessDecision<'_>) -> Result<(), AuditError> {
        let mut e = no_run(d.runbook.unwrap_or("-"), Phase::Access);
        e.outcome = Some(
            if d.refused.is_none() {
                "allowed"
            } else {
                "refused"
            }
            .into(),
        );
        e.detail = Some(json!({
            "principal": d.caller.name(),
            "token_id": d.caller.token_id,
            "scope": d.scope.name(),
            "what": d.what,
            "via": d.via,
            "why": d.refused,
        }));
        self.append(e, true)
    }

    /// A timed kill switch released itself at its time (`source`: `file`
    /// or `fleet`): who engaged it, why, and until when.
    pub(crate) fn kill_switch_ended(
        &self,
        ended: &crate::gate::killswitch::Expired,
        source: &str,
    ) -> Result<(), AuditError> {
        let mut e = no_run(&ended.scope, Phase::KillSwitch);
        e.outcome = Some("released".into());
        e.detail = Some(json!({
            "scope": ended.scope,
            "source": source,
            "engaged_by": ended.engaged_by,
            "reason": ended.reason,
            "until": ended.until.to_string(),
            "message": "the timed kill switch released itself at its time",
        }));
        self.append(e, true)
    }

    /// A schedule's fire the kill switch kept from starting on `hosts`: a
    /// weekly job that did not run leaves a trace of why.
    pub(crate) fn schedule_refused(
        &self,
        runbook: &str,
        hosts: &[String],
    ) -> Result<(), AuditError> {
        let mut e = no_run(runbook, Phase::KillSwitch);
        e.outcome = Some("refused".into());
        e.detail = Some(json!({
            "trigger": Trigger::Schedule,
            "hosts": hosts,
            "message": "the kill switch was engaged when the schedule fired: no run started on these hosts",
        }));
        self.append(e, true)
    }

    /// L1: a tier-2 call recorded for a person, with the argv it would run.
    pub(crate) fn proposal(
        &self,
        run: &RunInfo,
        p: &Proposal,
        argv: &[String],
    ) -> Result<(), AuditError> {
        let mut e = run.call(Phase::Proposal, p.step(), p.action());
        e.outcome = Some("proposed".into());
        e.detail = Some(json!({ "argv": argv }));
        self.append(e, true)
    }

    /// L2: a held call is put to a person, under this request id and digest.
    pub(crate) fn pending(
        &self,
        run: &RunInfo,
        hold: &Hold,
        approval_id: &str,
        digest: &str,
    ) -> Result<(), AuditError> {
        let mut e = run.call(Phase::Pending, hold.step(), hold.action());
        e.outcome = Some("pending".into());
        e.detail = Some(json!({ "approval_id": approval_id, "digest": digest }));
        self.append(e, true)
    }

    /// A dry run's tier-2 call: the argv it would run, and who would allow
    /// it (`None`: a person would be asked).
    pub(crate) fn dry_run(
        &self,
        run: &RunInfo,
        step: u32,
        action: &Action,
        approved_by: Option<&ApprovedBy>,
        argv: &[Vec<String>],
    ) -> Result<(), AuditError> {
        let mut e = run.call(Phase::DryRun, step, action);
        e.approved_by = approved_by.map(|a| a.to_string());
        e.outcome = Some("dry_run".into());
        e.detail = Some(json!({ "argv": argv, "would_ask": approved_by.is_none() }));
        self.append(e, true)
    }

    /// One model request and its answer. Not a side effect: the next synced
    /// line carries it to disk.
    pub(crate) fn model_turn(&self, run: &RunInfo, turn: &ModelTurn) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Model, None);
        e.duration_ms = Some(turn.duration_ms);
        e.detail = serde_json::to_value(turn).ok();
        self.append(e, false)
    }

    /// A tier-3 command for a person to run: never a tool.
    pub(crate) fn suggestion(
        &self,
        run: &RunInfo,
        step: u32,
        text: &str,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Suggestion, Some(step));
        e.detail = Some(json!({ "suggestion": text, "tier": 3 }));
        self.append(e, true)
    }

    /// What the run saw of its alert after its last call: `outcome` is
    /// `cleared`, `firing` or `unknown`; `detail` the rule, the query, the
    /// series and each evaluation.
    pub(crate) fn evidence(
        &self,
        run: &RunInfo,
        outcome: &str,
        said: &str,
        detail: &Value,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Evidence, None);
        e.outcome = Some(outcome.into());
        let mut d = detail.clone();
        if !d.is_object() {
            d = json!({});
        }
        d["said"] = said.into();
        e.detail = Some(d);
        self.append(e, true)
    }

    /// A line about run `run`'s Alertmanager silence (see [`Phase::Silence`]), synced.
    pub(crate) fn silence(
        &self,
        run: &RunInfo,
        outcome: &str,
        detail: Value,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Silence, None);
        e.outcome = Some(outcome.into());
        e.detail = Some(detail);
        self.append(e, true)
    }

    /// The alert `earlier` saw clear is back, and started `run`: a line of
    /// the earlier run (its fix did not hold), naming the new one.
    pub(crate) fn recurred(
        &self,
        earlier: &str,
        run: &RunInfo,
        fingerprint: &str,
        after: std::time::Duration,
    ) -> Result<(), AuditError> {
        let mut e = run.entry(Phase::Recurred, None);
        e.run_id = earlier.to_string();
        e.outcome = Some("recurred".into());
        e.detail = Some(json!({
            "fingerprint": fingerprint,
            "back_in": run.run_id,
            "after_s": after.as_secs(),
        }));
        self.append(e, true)
    }

    /// The run's one verdict, with its tally when the run itself ended it
    /// (`None`: closed from outside, e.g. interrupted or never started).
    pub(crate) fn verdict(
        &self,
        run: &RunInfo,
        verdict: Verdict,
        detail: &str,
        end: Option<&RunEnd>,
    ) -> Result<(), AuditError> {
        crate::fault::point(crate::fault::Stage::Audit);
        let mut e = run.entry(Phase::Verdict, None);
        e.outcome = Some(verdict.as_str().into());
        e.detail = Some(match end {
            Some(end) => {
                e.duration_ms = Some(end.duration_ms);
                let mut d = json!({
                    "detail": detail,
                    "final_answer": end.final_answer,
                    "steps": end.steps,
                    "mutations": end.mutations,
                    "suggestions": end.suggestions,
                });
                if end.handed_back {
                    d["handed_back"] = true.into();
                }
                if let Some(next) = &end.handed_to {
                    d["handed_to"] = next.as_str().into();
                }
                if !end.claims.is_empty() {
                    d["claims"] = serde_json::to_value(&end.claims).unwrap_or_default();
                }
                if !end.model_suggestions.is_empty() {
                    d["model_suggestions"] = end.model_suggestions.clone().into();
                }
                if let Some(reason) = end.reason {
                    d["reason"] = reason.into();
                }
                if end.alert_cleared {
                    d["alert_cleared"] = true.into();
                }
                d
            }
            None => json!({ "detail": detail }),
        });
        self.append(e, true)
    }
}

/// The trigger keys a verdict line leaves as its run's for deduplication:
/// none when the run saw its alert clear (the same alert firing after
/// that is back, not repeated), else `keys`.
pub(crate) fn keys_after(verdict: &super::Entry, keys: Vec<String>) -> Vec<String> {
    match verdict
        .detail
        .as_ref()
        .is_some_and(|d| d["alert_cleared"] == true)
    {
        true => Vec::new(),
        false => keys,
    }
}

/// A line of no run (`run_id` is `-`) about `runbook` (or a switch's scope).
/// What one line of a rollout records (`phase: rollout`, in `detail`
/// beside `rollout`, its id); read back by the daemon that resumes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum RolloutEvent {
    /// The host list frozen into waves, and what holds them.
    Started {
        waves: Vec<Vec<String>>,
        trigger: Trigger,
        max_failures: u32,
        pause_secs: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        guard: Option<String>,
    },
    /// A host's run ended (or could not start): `outcome` is its verdict,
    /// or `not_started`.
    Host {
        wave: usize,
        host: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_id: Option<String>,
        outcome: String,
        detail: String,
    },
    /// Nothing new is dispatched: why, which hosts ran (or run still), which never started.
    Halted {
        reason: String,
        ran: Vec<String>,
        never_started: Vec<String>,
    },
    /// A person let a halted rollout go on.
    Resumed { by: String, reason: String },
    /// A person ended it: the hosts it never started stay so.
    Aborted {
        by: String,
        reason: String,
        never_started: Vec<String>,
    },
    /// Every wave ran: the worst verdict and the failures.
    Finished { worst: Verdict, failures: u32 },
    /// With shared state: this replica goes on with it, its driver `from`
    /// having stopped renewing it; `token` fences out that one's writes.
    TakenOver { from: String, token: i64 },
}

impl RolloutEvent {
    /// The line's `outcome`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            RolloutEvent::Started { .. } => "started",
            RolloutEvent::Host { .. } => "host",
            RolloutEvent::Halted { .. } => "halted",
            RolloutEvent::Resumed { .. } => "resumed",
            RolloutEvent::Aborted { .. } => "aborted",
            RolloutEvent::Finished { .. } => "finished",
            RolloutEvent::TakenOver { .. } => "taken_over",
        }
    }
}

impl AuditLog {
    /// One line of rollout `id` of `runbook`, synced.
    pub(crate) fn rollout(
        &self,
        id: &str,
        runbook: &str,
        event: &RolloutEvent,
    ) -> Result<(), AuditError> {
        self.append(rollout_line(id, runbook, event), true)
    }

    /// Several lines of rollout `id` (the hosts of a batch that ended
    /// together), appended and synced at once.
    pub(crate) fn rollout_all(
        &self,
        id: &str,
        runbook: &str,
        events: &[RolloutEvent],
    ) -> Result<(), AuditError> {
        let lines = events
            .iter()
            .map(|e| rollout_line(id, runbook, e))
            .collect();
        self.append_all(lines, true)
    }
}

/// The line of one event of rollout `id`.
fn rollout_line(id: &str, runbook: &str, event: &RolloutEvent) -> Entry {
    let mut e = no_run(runbook, Phase::Rollout);
    if let RolloutEvent::Host { host, .. } = event {
        e.host = host.clone();
    }
    e.outcome = Some(event.name().into());
    let mut detail = serde_json::to_value(event).unwrap_or_default();
    detail["rollout"] = Value::String(id.to_string());
    e.detail = Some(detail);
    e
}

fn no_run(runbook: &str, phase: Phase) -> Entry {
    let run = RunInfo {
        run_id: "-".into(),
        runbook: runbook.to_string(),
        runbook_version: String::new(),
        host: String::new(),
        planner: String::new(),
        model: None,
        prompt: None,
    };
    run.entry(phase, None)
}

/// One request to the model and its answer, as the audit log keeps it
/// (the model planner makes it; the record defines it).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ModelTurn {
    /// Which request of the run (1-based).
    pub(crate) turn: u32,
    /// The model asked.
    pub(crate) model: String,
    /// The messages this request added: the task on the first turn, then
    /// each tool result exactly as the model saw it.
    pub(crate) input: Vec<String>,
    /// What the model wrote besides its calls.
    pub(crate) content: String,
    /// `{id, tool, arguments}` as the model wrote them.
    pub(crate) tool_calls: Vec<Value>,
    /// Calls past the step limit in one reply that were not proposed.
    pub(crate) dropped: usize,
    /// Tokens of the request, as the endpoint counted them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_tokens: Option<u64>,
    /// Tokens of the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) completion_tokens: Option<u64>,
    /// How long the answer took (retries included).
    pub(crate) duration_ms: u64,
    /// How many tries it took.
    pub(crate) attempts: u32,
    /// The model gave its final answer (no more calls).
    pub(crate) final_answer: bool,
    /// The endpoint stopped the answer at `model.max_tokens` (this many):
    /// a turn without a call, whatever it began to write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cut_off_at: Option<u32>,
}

/// What [`AuditLog::access`] records.
pub(crate) struct AccessDecision<'a> {
    pub(crate) caller: &'a crate::access::Caller,
    pub(crate) scope: crate::access::Scope,
    /// The runbook it concerns (`None`: every runbook).
    pub(crate) runbook: Option<&'a str>,
    pub(crate) what: &'a str,
    pub(crate) via: &'static str,
    /// Why it was refused; `None`: allowed.
    pub(crate) refused: Option<String>,
}

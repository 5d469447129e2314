//! The run loop: ask the planner for the next step, take it through the
//! gate, and let one method handle each decision (deny, propose, hold,
//! allow and dispatch). Each method says what its step came to in a
//! [`Tally`]; the verdict is folded from those, never from an exit code.
//!
//! One file: one method per gate decision, in the order a run meets them,
//! read top to bottom.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::Runner;
use crate::audit::{AuditError, RunEnd, RunInfo};
use crate::config::{Host, Runbook};
use crate::executor::Executor;
use crate::gate::{ApprovedBy, Decision, Denial, Gate, Permit, Proposal, ProposedCall};
use crate::planner::{ModelTurn, Next, Planner, Transcript};
use crate::report::{RunReport, StepReport, StepStatus};
use crate::tools::{Action, Tier, ToolId, ToolResult};
use crate::trigger::RunRequest;
use crate::verdict::Verdict;

/// Transport failures in a row to one host after which a run gives up on it.
const MAX_UNREACHABLE: u32 = 2;

/// The argv of each process a call would run, as a report shows them.
type Argvs = Vec<Vec<String>>;

/// What the steps so far make of the verdict.
#[derive(Default)]
struct Tally {
    /// The worst thing that happened, and why.
    worst: Verdict,
    worst_detail: String,
    /// Set when the run must end here (the first cause is kept).
    stop: Option<(Verdict, String)>,
    /// `done_when`: the evidence that the alert cleared.
    cleared: Option<String>,
}

impl Tally {
    /// Something went wrong, and the run goes on.
    fn note(&mut self, v: Verdict, why: String) {
        if v > self.worst {
            self.worst = v;
            self.worst_detail = why;
        }
    }

    /// The run ends after this step.
    fn stop(&mut self, v: Verdict, why: String) {
        self.stop.get_or_insert((v, why));
    }

    /// A line that could not be written ends the run: no record, no run.
    fn written(&mut self, r: Result<(), AuditError>) {
        if let Err(err) = r {
            self.stop(Verdict::Broken, err.to_string());
        }
    }

    fn verdict(self, dry_run: bool, would_change: u32) -> (Verdict, String) {
        match self.stop {
            Some((v, why)) => (v.max(self.worst), why),
            None if self.worst == Verdict::Ok && dry_run => (
                Verdict::Ok,
                format!(
                    "dry run: {would_change} change(s) would run, each shown with its argv; nothing was changed"
                ),
            ),
            None if self.worst == Verdict::Ok => (
                Verdict::Ok,
                match self.cleared {
                    Some(evidence) => {
                        format!("every call succeeded and every change verified; {evidence}")
                    }
                    None => "every call succeeded and every change verified".into(),
                },
            ),
            None => (self.worst, self.worst_detail),
        }
    }
}

pub(super) struct RunLoop<'a> {
    /// Held for the run's whole life: one run per (runbook, host) on this machine.
    pub(super) _lock: Option<crate::runlock::RunLock>,
    pub(super) runner: &'a Runner,
    pub(super) runbook: Arc<Runbook>,
    pub(super) host: Arc<Host>,
    pub(super) executor: Executor,
    pub(super) info: RunInfo,
    pub(super) planner: Planner,
    pub(super) req: &'a RunRequest,
    /// The run's claim in the shared state (PostgreSQL), proved before every call.
    pub(super) lease: Option<&'a dyn super::Holding>,
    /// The earlier run that saw this run's alert clear, when it came back.
    pub(super) recurred: Option<crate::done_when::Recurred>,
}

/// The state one run accumulates.
pub(super) struct RunState {
    pub(super) gate: Gate,
    pub(super) transcript: Transcript,
    reports: Vec<StepReport>,
    suggestions: Vec<String>,
    /// Those of `suggestions` a model wrote (its own words, unverified).
    model_suggestions: Vec<String>,
    tally: Tally,
    final_answer: Option<String>,
    model_turns: u32,
    /// Calls in a row that never reached the host (SSH transport errors).
    unreachable: u32,
    /// Dry runs: the tier-2 calls shown instead of run.
    would_change: u32,
    /// With shared state: the fleet budgets each call's fence counts against.
    budgets: crate::store::Budgets,
    /// The daemon stopped before the run proposed anything: the next start
    /// runs its trigger again (one machine; see `audit::runs::recovery`).
    handed_back: bool,
    /// With shared state: the queued run its trigger was handed to.
    handed_back_to: Option<String>,
    /// `done_when`: what the run saw of its alert after its last call.
    alert_check: Option<crate::report::AlertCheck>,
    /// `done_when`: which of its alerts were seen firing before its first
    /// change (`None`: no change made yet).
    sighted: Option<Vec<bool>>,
    /// `silence:`: asked for before its first change (`None`: not yet;
    /// `Some(None)`: none held), expired when it ends.
    silence: Option<Option<crate::silence::Held>>,
    /// The silence's create was sent and its answer lost.
    silence_lost: bool,
}

impl RunLoop<'_> {
    pub(super) async fn go(mut self) -> RunReport {
        let started = Instant::now();
        let started_at = jiff::Timestamp::now().to_string();
        let mut s = RunState {
            gate: Gate::new(
                self.runbook.clone(),
                self.host.clone(),
                self.runner.killswitch.clone(),
                self.runner.demotions.clone(),
            )
            .with_fleet(self.fleet(), !self.req.dry_run),
            transcript: Transcript::default(),
            reports: Vec::new(),
            suggestions: Vec::new(),
            model_suggestions: Vec::new(),
            tally: Tally::default(),
            final_answer: None,
            model_turns: 0,
            unreachable: 0,
            would_change: 0,
            handed_back: false,
            handed_back_to: None,
            alert_check: None,
            sighted: None,
            silence: None,
            silence_lost: false,
            budgets: crate::store::Budgets::new(
                self.runner.config.settings.fleet_budget,
                &self.runbook.name,
                self.runbook.fleet_budget,
            ),
        };
        while s.tally.stop.is_none() {
            if self.shutting_down() {
                self.stop_for_shutdown(&mut s).await;
                break;
            }
            let n = s.reports.len() as u32 + 1;
            // A model request still in flight when max_duration ends is
            // cancelled there (dropped), not waited for.
            let budget_ends = s.gate.budget().deadline();
            let max_duration = s.gate.budget().max_duration();
            let mut admit = || s.gate.admit_model_request();
            // A stop does not wait on the planner: a model's answer or an
            // agent's next call may be minutes away.
            let waited = tokio::select! {
                next = tokio::time::timeout_at(budget_ends, self.planner.next(&s.transcript, &mut admit)) => Some(next),
                () = until_shutdown(self.runner.shutdown.clone()) => None,
            };
            let Some(waited) = waited else {
                self.stop_for_shutdown(&mut s).await;
                break;
            };
            let Ok(next) = waited else {
                let waiting = match self.planner.name() {
                    "mcp" => "waiting for the agent's next call",
                    _ => "the model was being asked; its request was cancelled",
                };
                s.tally.stop(
                    Verdict::BudgetExhausted,
                    format!(
                        "max_duration {} spent while {waiting}",
                        humantime::format_duration(max_duration)
                    ),
                );
                break;
            };
            if let Some(more) = self.planner.take_step_limit() {
                s.gate.limit_steps(more);
            }
            match next {
                Next::Finish => break,
                Next::Turn(turn) => self.turn(&mut s, &turn),
                Next::Fail(msg) => s.tally.stop(Verdict::Broken, msg),
                Next::Stopped(denial) => self.stopped(&mut s, &denial),
                Next::Skip { id, when } => {
                    let mut r = StepReport::new(n, &id, StepStatus::Skipped);
                    r.detail = Some(format!("when: {when}"));
                    s.transcript.steps.insert(
                        id,
                        json!({ "outcome": "skipped", "ok": false, "skipped": true }),
                    );
                    s.reports.push(r);
                }
                Next::Suggest { id, text, by_model } => {
                    s.tally
                        .written(self.runner.audit.suggestion(&self.info, n, &text));
                    let mut r = StepReport::new(n, &id, StepStatus::Suggested);
                    r.detail = Some(text.clone());
                    if by_model {
                        s.model_suggestions.push(text.clone());
                    }
                    s.suggestions.push(text);
                    s.reports.push(r);
                }
                Next::Call { id, mut call } => {
                    call.step = n;
                    // `call` sets what the call came to.
                    let mut r = StepReport::new(n, &id, StepStatus::Error);
                    r.tool = Some(call.tool.chars().take(200).collect());
                    self.call(&mut s, &id, &call, &mut r).await;
                    self.count_call(&r);
                    s.reports.push(r);
                }
            }
        }
        if let Some(clears) = self.runbook.done_when.clone()
            && s.tally.stop.is_none()
            && s.tally.worst == Verdict::Ok
            && !self.req.dry_run
        {
            self.until_cleared(&mut s, &clears).await;
        }
        if let Some(Some(held)) = s.silence.take() {
            self.unsilence(&held).await;
        } else if s.silence_lost {
            self.unsilence_lost().await;
        }
        self.finish(s, started, started_at)
    }

    /// `silence:`: before the run's first change, a silence of the host's
    /// matching alerts (never the one `done_when` waits on), written with
    /// its id; Alertmanager unreachable leaves the run going on unsilenced,
    /// and written so.
    async fn silence(&self, s: &mut RunState) {
        let Some(cfg) = &self.runbook.silence else {
            s.silence = Some(None);
            return;
        };
        let except = self
            .runbook
            .done_when
            .as_ref()
            .and(self.req.alert.as_ref())
            .and_then(|a| a["labels"]["alertname"].as_str());
        let matchers = crate::silence::matchers(cfg, &self.host.name, except);
        let comment = format!(
            "runwarden: run {} of {} changes {} (expired when the run ends)",
            self.info.run_id, self.runbook.name, self.host.name
        );
        let ends = jiff::Timestamp::now()
            + jiff::SignedDuration::try_from(cfg.longest).unwrap_or_default();
        let (held, outcome, detail) = match crate::silence::hold(cfg, &matchers, &comment).await {
            Ok(h) => {
                let detail = json!({
                    "id": h.id,
                    "alertmanager": h.alertmanager.as_str(),
                    "matchers": matchers,
                    "ends_at": ends.to_string(),
                });
                (Some(h), "created", detail)
            }
            Err(not) => {
                tracing::warn!(run_id = %self.info.run_id, "no silence for this run's changes: {}; the run goes on unsilenced", not.why);
                let detail = json!({
                    "alertmanager": cfg.alertmanager.as_str(),
                    "why": format!("{}; the run goes on unsilenced", not.why),
                    "lost_answer": not.lost_answer,
                });
                (None, "unsilenced", detail)
            }
        };
        let lost_answer = detail["lost_answer"] == true;
        s.tally
            .written(self.runner.audit.silence(&self.info, outcome, detail));
        s.silence = Some(held);
        s.silence_lost = lost_answer;
    }

    /// A create whose answer was lost may have made a silence all the
    /// same: looked for by the run's id when the run ends, and expired.
    async fn unsilence_lost(&self) {
        let Some(cfg) = &self.runbook.silence else {
            return;
        };
        let detail = match crate::silence::expire_tagged(&cfg.alertmanager, &self.info.run_id).await
        {
            Ok(ids) if ids.is_empty() => return,
            Ok(ids) => {
                json!({ "ids": ids, "by": "the run's end: a create whose answer was lost had made them" })
            }
            Err(why) => {
                tracing::warn!(run_id = %self.info.run_id, "silences a lost create may have made cannot be looked for: {why}; runwarden's next start looks again");
                return;
            }
        };
        if let Err(e) = self.runner.audit.silence(&self.info, "expired", detail) {
            tracing::error!(run_id = %self.info.run_id, "the expiry of a silence could not be written: {e}");
        }
    }

    /// The run is over: its silence expired, and written so.
    async fn unsilence(&self, held: &crate::silence::Held) {
        let written = match crate::silence::expire(held).await {
            Ok(()) => self
                .runner
                .audit
                .silence(&self.info, "expired", json!({ "id": held.id })),
            Err(why) => {
                tracing::warn!(run_id = %self.info.run_id, "silence {} cannot be expired: {why}; it ends by itself at its end time, or at runwarden's next start", held.id);
                self.runner.audit.silence(
                    &self.info,
                    "not_expired",
                    json!({ "id": held.id, "why": why, "ends_by_itself": true }),
                )
            }
        };
        if let Err(e) = written {
            tracing::error!(run_id = %self.info.run_id, "the end of silence {} could not be written: {e}", held.id);
        }
    }

    /// Every call went well: the run is done when its alert clears
    /// (`done_when.alert_clears`); the evidence line says what was seen.
    async fn until_cleared(&self, s: &mut RunState, clears: &crate::config::AlertClears) {
        use crate::done_when::Outcome;
        let budget_ends = s.gate.budget().deadline();
        let sighted = s.sighted.clone().unwrap_or_default();
        let outcome = super::cleared::check(
            self.runner,
            &self.runbook,
            self.req,
            clears,
            budget_ends,
            &sighted,
        )
        .await;
        let check = super::cleared::report_of(&outcome);
        if let Some(detail) = outcome.detail() {
            s.tally.written(self.runner.audit.evidence(
                &self.info,
                &check.outcome,
                &check.said,
                detail,
            ));
        }
        match &outcome {
            Outcome::Cleared {
                evidence, seconds, ..
            } => {
                if let Some(m) = &self.runner.metrics {
                    m.alert_clear
                        .with_label_values(&[&self.runbook.name])
                        .observe(*seconds);
                }
                if let Some(c) = &self.runner.clears {
                    c.cleared(
                        (&self.runbook.name, &self.host.name),
                        &super::cleared::fingerprints(self.req),
                        &self.info.run_id,
                        clears.recurrence,
                    );
                }
                s.tally.cleared = Some(evidence.clone());
            }
            Outcome::Stopped(v, why) => s.tally.stop(*v, why.clone()),
            Outcome::Firing { why, .. } if s.gate.budget().mutations() > 0 => s.tally.note(
                Verdict::Unresolved,
                format!("{why}; its changes stay made: the report's steps say how a person puts each back"),
            ),
            other => s.tally.note(other.verdict(), other.words().to_string()),
        }
        s.alert_check = Some(check);
    }

    /// The fleet budgets this run's tier-2 calls count against on this
    /// machine; with shared state they are counted in each call's fence.
    fn fleet(&self) -> Option<crate::gate::fleet::BudgetLedger> {
        let settings = &self.runner.config.settings;
        if self.lease.is_some() {
            return None;
        }
        crate::gate::fleet::BudgetLedger::new(
            &settings.state_dir,
            settings.fleet_budget,
            &self.runbook.name,
            self.runbook.fleet_budget,
        )
    }

    /// The daemon is stopping. A run that proposed nothing and ran nothing
    /// is handed back rather than lost until Alertmanager's next repeat
    /// (hours): on one machine to the next start, which runs it again; with
    /// shared state to the fleet's queue, where another replica takes it
    /// now. A run that made a call halts.
    async fn stop_for_shutdown(&self, s: &mut RunState) {
        // An agent's session ends with the daemon: nothing is left to hand on.
        if !s.reports.is_empty() || self.req.dry_run || self.req.agent.is_some() {
            s.tally.stop(
                Verdict::Halted,
                "runwarden is shutting down; the run stopped before its next call".into(),
            );
            return;
        }
        let Some(claim) = self.lease else {
            s.handed_back = true;
            s.tally.stop(
                Verdict::Halted,
                "runwarden is shutting down before this run made any call; its trigger is handed to the next start, which runs it again".into(),
            );
            return;
        };
        let next = uuid::Uuid::now_v7().to_string();
        let mut again = self.req.clone();
        again
            .keys
            .push(crate::audit::runs::resumes_key(&self.info.run_id));
        match claim.hand_back(&next, &again.to_queue()).await {
            Ok(()) => {
                s.handed_back_to = Some(next.clone());
                s.tally.stop(
                    Verdict::Halted,
                    format!(
                        "runwarden is shutting down before this run made any call; its trigger is handed to the fleet's queue as run {next}, which another replica takes"
                    ),
                );
            }
            Err(e) => s.tally.stop(
                Verdict::Halted,
                format!(
                    "runwarden is shutting down; the run made no call and could not be handed to the fleet's queue ({e})"
                ),
            ),
        }
    }

    pub(super) fn shutting_down(&self) -> bool {
        self.runner.shutdown.as_ref().is_some_and(|s| *s.borrow())
    }

    fn turn(&self, s: &mut RunState, turn: &ModelTurn) {
        s.model_turns += 1;
        if turn.final_answer {
            s.final_answer = Some(turn.content.clone());
        }
        s.tally
            .written(self.runner.audit.model_turn(&self.info, turn));
        // An answer cut at max_tokens is a step without a call: the report
        // says so, and the step limit counts it.
        if let Some(limit) = turn.cut_off_at {
            let n = s.reports.len() as u32 + 1;
            let mut r = StepReport::new(n, &format!("m{}_cut_off", turn.turn), StepStatus::Error);
            r.detail = Some(format!(
                "model turn {} reached model.max_tokens ({limit}) before a call or a final answer: nothing ran, and the model was asked to answer shorter",
                turn.turn
            ));
            s.reports.push(r);
            if let Err(spent) = s.gate.count_turn_without_call() {
                s.tally.stop(Verdict::StepLimit, spent.to_string());
            }
        }
    }

    /// The gate refused the next model request itself (kill switch, limits).
    fn stopped(&self, s: &mut RunState, denial: &Denial) {
        self.count_denial(denial);
        let why = format!(
            "before model request {}: {denial}",
            s.gate.budget().model_requests() + 1
        );
        s.tally.stop(Verdict::from(denial.reason), why);
    }

    /// One proposed call: the gate decides, and one method acts on it.
    async fn call(&self, s: &mut RunState, id: &str, call: &ProposedCall, r: &mut StepReport) {
        match s.gate.check(call) {
            // A dry run asks nobody: it shows what a person would be asked.
            Decision::Hold(hold) if self.req.dry_run => self.show(s, id, hold.action(), None, r),
            Decision::Hold(hold) => match self.ask(s, hold, r).await {
                Ok(permit) => match self.cleared_meanwhile(&permit).await {
                    Some(denial) => self.deny(s, id, call, &denial, r),
                    None => self.allow(s, id, call, permit, r).await,
                },
                Err(denial) => self.deny(s, id, call, &denial, r),
            },
            Decision::Deny(denial) => self.deny(s, id, call, &denial, r),
            Decision::Propose(p) => self.propose(s, id, &p, r),
            Decision::Allow(permit) => self.allow(s, id, call, permit, r).await,
        }
    }

    /// A person approved the call, maybe long after it was asked for: with
    /// `done_when`, a change for an alert that has since cleared by itself
    /// is not made.
    async fn cleared_meanwhile(&self, permit: &Permit) -> Option<Denial> {
        if super::cleared::firing_now(self.runner, &self.runbook, self.req).await != Some(false) {
            return None;
        }
        let detail = format!(
            "approved by {}, but the alert that started the run has cleared by itself since (its series is gone from its rule's expression now): the change is not made",
            permit.approved_by()
        );
        Some(
            Denial::new(
                permit.step(),
                crate::gate::DenyReason::AlertResolved,
                detail,
            )
            .of(permit.action().tool()),
        )
    }

    fn deny(
        &self,
        s: &mut RunState,
        id: &str,
        call: &ProposedCall,
        denial: &Denial,
        r: &mut StepReport,
    ) {
        r.status = StepStatus::Denied;
        r.args = crate::text::bounded(&call.args);
        r.tier = denial.tool.as_ref().map(|t| t.tier().number());
        r.detail = Some(denial.to_string());
        s.transcript.steps.insert(
            id.into(),
            json!({ "outcome": "denied", "ok": false, "error": denial.for_planner() }),
        );
        s.tally.written(
            self.runner
                .audit
                .denied(&self.info, &call.tool, &call.args, denial),
        );
        self.count_denial(denial);
        let v = Verdict::from(denial.reason);
        if denial.reason.stops_run() {
            s.tally.stop(v, denial.to_string());
        }
        s.tally.note(v, format!("step {}: {denial}", r.step));
    }

    /// L1: record the call for a person, with the argv it would run.
    fn propose(&self, s: &mut RunState, id: &str, p: &Proposal, r: &mut StepReport) {
        let argv = self.argv(p.action());
        r.status = StepStatus::Proposed;
        r.tier = Some(p.action().tier().number());
        r.args = p.action().args_json();
        r.reason = p.action().reason().map(String::from);
        r.detail = Some("L1: recorded as a proposal for a person; not run".into());
        let flat: Vec<String> = argv
            .iter()
            .map(|a| serde_json::to_string(a).unwrap_or_default())
            .collect();
        r.argv = Some(argv);
        s.transcript
            .steps
            .insert(id.into(), json!({ "outcome": "proposed", "ok": false }));
        s.tally
            .written(self.runner.audit.proposal(&self.info, p, &flat));
    }

    /// A dry run's tier-2 call: the argv it would run and who would allow it
    /// (`None`: a person would be asked, L2); nothing runs.
    fn show(
        &self,
        s: &mut RunState,
        id: &str,
        action: &Action,
        approved_by: Option<&ApprovedBy>,
        r: &mut StepReport,
    ) {
        let argv = self.argv(action);
        s.tally.written(
            self.runner
                .audit
                .dry_run(&self.info, r.step, action, approved_by, &argv),
        );
        r.status = StepStatus::DryRun;
        r.tier = Some(action.tier().number());
        r.args = action.args_json();
        r.reason = action.reason().map(String::from);
        match approved_by {
            Some(by) => r.approved_by = Some(by.to_string()),
            None => {
                r.detail = Some("L2: a person would be asked to approve exactly this call".into())
            }
        }
        r.argv = Some(argv);
        r.would_verify = action.tool().verification();
        s.would_change += 1;
        s.transcript
            .steps
            .insert(id.into(), json!({ "outcome": "dry_run", "ok": false }));
    }

    /// An allowed call: its intent line takes the permit, and what comes
    /// back is the one thing dispatch accepts, once.
    async fn allow(
        &self,
        s: &mut RunState,
        id: &str,
        call: &ProposedCall,
        permit: Permit,
        r: &mut StepReport,
    ) {
        let action = permit.action();
        if self.req.dry_run && action.tier() == Tier::Change {
            return self.show(s, id, action, Some(permit.approved_by()), r);
        }
        // `silence:` before the first change, and before the fence, so the
        // fence's proof is fresh for the intent line.
        if action.tier() == Tier::Change && s.silence.is_none() {
            self.silence(s).await;
        }
        // With shared state, the last word before the intent line: this run
        // still holds its lease, the fleet's switch is off, the fleet's
        // budget has room (counted here, in the same round trip).
        if let Some(lease) = self.lease
            && let Err((reason, detail)) =
                lease.fence(action.tier() == Tier::Change, &s.budgets).await
        {
            let denial = Denial::new(permit.step(), reason, detail).of(action.tool());
            return self.deny(s, id, call, &denial, r);
        }
        // done_when: the alert seen firing before anything changes, so a
        // fix that clears it before the wait's first look is not taken for
        // an alert never seen.
        if action.tier() == Tier::Change && self.runbook.done_when.is_some() && s.sighted.is_none()
        {
            s.sighted = Some(super::cleared::sight(self.runner, &self.runbook, self.req).await);
        }
        let tool_id = action.tool();
        let tool = tool_id.name();
        r.tier = Some(action.tier().number());
        r.args = action.args_json();
        r.approved_by = Some(permit.approved_by().to_string());
        r.reason = action.reason().map(String::from);
        // A declared change's undo, offered to a person with its result.
        let undo = action.undo_argv(&self.host);
        let ticket = match self.runner.audit.intent(&self.info, permit) {
            Ok(t) => t,
            Err(err) => {
                r.status = StepStatus::Denied;
                r.detail = Some(format!(
                    "not run: the intent line could not be written: {err}"
                ));
                s.tally.stop(
                    Verdict::Broken,
                    format!("audit log unusable, no call was made: {err}"),
                );
                return;
            }
        };
        // Writing the intent line can take long (a stalled disk): the call
        // goes out only if the kill switch is still off and, with shared
        // state, the last fence or renewal still proves the lease.
        let (step, tool_id) = (ticket.step(), ticket.permit().action().tool());
        let late = s.gate.last_look(step, &tool_id).err().or_else(|| {
            let (reason, detail) = self.lease?.still_proven().err()?;
            Some(Denial::new(step, reason, detail).of(tool_id.clone()))
        });
        if let Some(denial) = late {
            let unsent = ToolResult::failed(format!("not dispatched: {}", denial.detail));
            if let Err(err) = self
                .runner
                .audit
                .result(&self.info, ticket.unsent(), &unsent)
            {
                s.tally.stop(
                    Verdict::Broken,
                    format!("the result line could not be written: {err}"),
                );
            }
            return self.deny(s, id, call, &denial, r);
        }
        let deadline =
            tokio::time::Instant::now() + self.host.tool_timeout.min(s.gate.budget().remaining());
        let (done, result) = self
            .executor
            .dispatch(ticket, &self.info, &self.host, deadline)
            .await;
        if let Err(err) = self.runner.audit.result(&self.info, done, &result) {
            s.tally.stop(
                Verdict::Broken,
                format!("the result line could not be written: {err}"),
            );
        }
        r.status = result.outcome.into();
        if crate::executor::ssh::is_transport_error(&result) {
            s.unreachable += 1;
            if s.unreachable >= MAX_UNREACHABLE {
                s.tally.stop(
                    Verdict::Failed,
                    format!(
                        "host {} cannot be reached: {} calls in a row failed before reaching it (last: {}); the run stops rather than wait out every step's timeout",
                        self.host.name,
                        s.unreachable,
                        result.error.as_deref().unwrap_or("transport error")
                    ),
                );
            }
        } else {
            s.unreachable = 0;
        }
        if !result.succeeded() {
            let why = result
                .error
                .clone()
                .unwrap_or_else(|| "change not verified".into());
            s.tally
                .note(Verdict::Failed, format!("step {} ({tool}): {why}", r.step));
        }
        s.transcript.steps.insert(id.into(), result.view());
        if let Some(undo) = undo
            && result.data.get("undo").is_none()
        {
            r.detail = Some(format!("to put it back, a person runs: {undo}"));
        }
        r.result = Some(result);
    }

    fn argv(&self, action: &Action) -> Argvs {
        action
            .planned_argv(&self.host)
            .iter()
            .map(|a| a.to_vec())
            .collect()
    }

    fn count_denial(&self, denial: &Denial) {
        if let Some(m) = &self.runner.metrics {
            m.gate_denials
                .with_label_values(&[&self.runbook.name, denial.reason.as_str()])
                .inc();
        }
    }

    /// `runwarden_tool_calls_total`: label values from the registry and fixed
    /// outcomes only (an unknown tool name from a planner is `unknown`).
    fn count_call(&self, r: &StepReport) {
        let Some(m) = &self.runner.metrics else {
            return;
        };
        // A name the runbook lists (its declared tools included) or a
        // built-in's; anything else a planner made up is `unknown`.
        let known = r.tool.as_deref().and_then(|name| {
            self.runbook
                .tool(name)
                .cloned()
                .or_else(|| crate::tools::Builtin::from_name(name).map(ToolId::from))
        });
        let tool = known.as_ref().map_or("unknown", ToolId::name);
        let tier = match r.tier {
            Some(1) => "1",
            Some(2) => "2",
            _ => "none",
        };
        m.tool_calls
            .with_label_values(&[
                &self.runbook.name,
                &self.host.name,
                tool,
                tier,
                r.status.as_str(),
                self.planner.name(),
            ])
            .inc();
        if r.result
            .as_ref()
            .is_some_and(crate::executor::ssh::is_transport_error)
        {
            m.transport_errors
                .with_label_values(&[&self.host.name])
                .inc();
        }
    }

    /// The verdict line, the journal head, and the report.
    fn finish(self, mut s: RunState, started: Instant, started_at: String) -> RunReport {
        crate::fault::point(crate::fault::Stage::Report);
        // A model's account is held to the run's own record before the
        // verdict: no evidence, or a change it claims and the record lacks,
        // and the run is inconclusive, whatever the model said.
        let claims = match self.planner.model() {
            Some(_) => {
                let account =
                    super::account::judge(&self.runbook, &s.reports, s.final_answer.as_deref());
                if let Some((verdict, why)) = account.verdict {
                    s.tally.note(verdict, why);
                }
                if let Some(m) = &self.runner.metrics {
                    for c in &account.claims {
                        let supported = if c.supported { "true" } else { "false" };
                        m.model_claims
                            .with_label_values(&[&self.runbook.name, supported])
                            .inc();
                    }
                }
                account.claims
            }
            None => Vec::new(),
        };
        let cleared = s.tally.stop.is_none() && s.tally.cleared.is_some();
        let (mut verdict, mut verdict_detail) = s.tally.verdict(self.req.dry_run, s.would_change);
        // A dry run changed nothing, whatever the gate would have allowed.
        let mutations = match self.req.dry_run {
            true => 0,
            false => s.gate.budget().mutations(),
        };
        let end = RunEnd {
            duration_ms: started.elapsed().as_millis() as u64,
            final_answer: s.final_answer,
            steps: s.gate.budget().steps(),
            mutations,
            suggestions: s.suggestions,
            handed_back: s.handed_back || s.handed_back_to.is_some(),
            handed_to: s.handed_back_to,
            claims,
            model_suggestions: s.model_suggestions,
            reason: None,
            alert_cleared: cleared && verdict == Verdict::Ok,
        };
        let audit = &self.runner.audit;
        if let Err(err) = audit.verdict(&self.info, verdict, &verdict_detail, Some(&end)) {
            // The record is the product: a run whose verdict is not on disk
            // did not end well, whatever its calls did.
            tracing::error!(run_id = %self.info.run_id, "verdict line not written: {err}");
            if let Some(m) = &self.runner.metrics {
                m.audit_write_failures.inc();
            }
            verdict_detail = format!(
                "the verdict line ({}: {verdict_detail}) could not be written: {err}",
                verdict.as_str()
            );
            verdict = Verdict::Broken;
        } else {
            self.runner.ship_head(&self.info.run_id);
        }
        tracing::info!(run_id = %self.info.run_id, runbook = %self.runbook.name, host = %self.host.name, verdict = verdict.as_str(), detail = %verdict_detail, "run ended");
        RunReport {
            run_id: self.info.run_id.clone(),
            runbook: self.runbook.name.clone(),
            runbook_version: self.runbook.version.clone(),
            host: self.host.name.clone(),
            autonomy: self.runbook.autonomy.as_str().into(),
            planner: self.planner.name().into(),
            model: self.planner.model().map(String::from),
            final_answer: end.final_answer,
            model_turns: s.model_turns,
            trigger: self.req.trigger,
            dry_run: self.req.dry_run,
            started_at,
            duration_ms: started.elapsed().as_millis() as u64,
            steps: s.reports,
            suggestions: end.suggestions,
            model_suggestions: end.model_suggestions,
            claims: end.claims,
            mutations,
            alert_check: s.alert_check,
            recurred_from: self.recurred.map(|r| r.run_id),
            verdict,
            verdict_detail,
        }
    }
}

/// Resolves once the daemon is stopping (never outside one).
async fn until_shutdown(shutdown: Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(mut shutdown) = shutdown
        && shutdown.wait_for(|stopping| *stopping).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

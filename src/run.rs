//! One runbook on one host: planner -> gate -> audit -> executor, until the
//! planner finishes or a limit stops it; then a verdict.
//!
//! The verdict is judged from the tool events (every call's outcome and, for
//! tier-2 calls, its own verification), never from an exit code alone.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use crate::audit::{AuditError, AuditLog, RunEnd, RunInfo};
use crate::config::{Config, Host, Runbook};
use crate::executor::Executor;
use crate::gate::approvals::{self, Approvals, Request, State};
use crate::gate::{Decision, Denial, DenyReason, Gate, Hold, KillSwitch};
use crate::metrics::Metrics;
use crate::planner::{ModelPlanner, Next, Planner, PlannerChoice, StepsPlanner, Transcript};
use crate::tools::{Outcome, Tier, ToolId, ToolResult};
use tokio::sync::watch;

pub use crate::trigger::{RunRequest, Trigger};

/// How a run ended. Ordered from best to worst; the worst event decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every call succeeded and every change verified.
    Ok,
    /// A call failed, timed out, or a change could not be verified.
    Failed,
    /// The gate refused at least one call.
    Denied,
    /// `max_steps` ran out.
    StepLimit,
    /// The mutation or wall-time budget ran out.
    BudgetExhausted,
    /// The run could not go on: the audit log failed, or a `when` or template did.
    Broken,
    /// The kill switch stopped the run.
    Halted,
    /// The process running it stopped before its verdict (closed by the
    /// next daemon to start).
    Interrupted,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed => "failed",
            Verdict::Denied => "denied",
            Verdict::StepLimit => "step_limit",
            Verdict::BudgetExhausted => "budget_exhausted",
            Verdict::Broken => "broken",
            Verdict::Halted => "halted",
            Verdict::Interrupted => "interrupted",
        }
    }

    /// The process exit code of `runwarden run` (2 is kept for usage and config errors).
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Ok => 0,
            Verdict::Failed => 1,
            Verdict::Denied => 3,
            Verdict::StepLimit => 4,
            Verdict::BudgetExhausted => 5,
            Verdict::Broken => 6,
            Verdict::Halted => 7,
            // Like broken: the run ended without reaching its own verdict.
            Verdict::Interrupted => 6,
        }
    }

    pub const ALL: [Verdict; 8] = [
        Verdict::Ok,
        Verdict::Failed,
        Verdict::Denied,
        Verdict::StepLimit,
        Verdict::BudgetExhausted,
        Verdict::Broken,
        Verdict::Halted,
        Verdict::Interrupted,
    ];
}

impl std::str::FromStr for Verdict {
    type Err = String;

    fn from_str(s: &str) -> Result<Verdict, String> {
        Verdict::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a verdict"))
    }
}

impl From<DenyReason> for Verdict {
    /// What a refusal makes of the run, when it is the worst thing that happened.
    fn from(reason: DenyReason) -> Verdict {
        match reason {
            DenyReason::KillSwitch => Verdict::Halted,
            DenyReason::StepLimit => Verdict::StepLimit,
            DenyReason::TimeBudget | DenyReason::MutationBudget => Verdict::BudgetExhausted,
            _ => Verdict::Denied,
        }
    }
}

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
    fn new(step: u32, id: &str, status: &str) -> StepReport {
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

/// Problems that keep a run from starting at all (nothing was called or audited).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no runbook named \"{0}\" (runwarden check lists them)")]
    UnknownRunbook(String),
    #[error("no host named \"{0}\" in hosts/")]
    UnknownHost(String),
    #[error(
        "runbook \"{runbook}\" does not name host \"{host}\" (its hosts: {hosts}); nothing ran"
    )]
    HostNotInRunbook {
        runbook: String,
        host: String,
        hosts: String,
    },
    #[error("{0}")]
    Unreachable(String),
    #[error("{0}")]
    Planner(String),
    /// Another process runs this runbook on this host (`runwarden run` exits 75).
    #[error("{0}; nothing ran")]
    Busy(String),
    /// The run lock could not be taken (the state directory is unusable): broken.
    #[error("{0}")]
    Lock(String),
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// Everything a run needs from outside: the config it started with, the audit log, the switch.
pub struct Runner {
    pub config: Arc<Config>,
    pub audit: Arc<AuditLog>,
    pub killswitch: KillSwitch,
    /// The daemon's metrics; `None` on the command line.
    pub metrics: Option<Arc<Metrics>>,
    /// Turns true when the daemon shuts down: the run stops before its next call.
    pub shutdown: Option<watch::Receiver<bool>>,
    /// Open approval requests (L2); `None` where nobody can be asked.
    pub approvals: Option<Arc<Approvals>>,
    /// Where to POST each new approval request (chat-ops); nothing runs because it answered.
    pub approval_webhook: Option<String>,
}

impl Runner {
    pub fn new(config: Arc<Config>, audit: Arc<AuditLog>) -> Runner {
        let killswitch = KillSwitch::new(config.settings.kill_switch_dir.clone());
        Runner {
            config,
            audit,
            killswitch,
            metrics: None,
            shutdown: None,
            approvals: None,
            approval_webhook: None,
        }
    }

    /// The (runbook, host) lock (see [`crate::runlock`]). On the command line
    /// a held lock refuses the run; in the daemon the run waits for it, up
    /// to the runbook's `max_duration`, and gives up on shutdown.
    async fn lock(
        &self,
        runbook: &Runbook,
        host: &str,
        run_id: &str,
    ) -> Result<crate::runlock::RunLock, StartError> {
        let state = &self.config.settings.state_dir;
        let give_up = Instant::now() + runbook.budget.max_duration;
        loop {
            let busy = match crate::runlock::try_acquire(state, &runbook.name, host, run_id) {
                Ok(Ok(lock)) => return Ok(lock),
                Ok(Err(busy)) => busy,
                Err(e) => {
                    return Err(StartError::Lock(format!(
                        "cannot take the run lock under {}: {e}; nothing ran (fix the state directory or its filesystem)",
                        state.display()
                    )));
                }
            };
            let Some(shutdown) = &self.shutdown else {
                return Err(StartError::Busy(busy.to_string()));
            };
            if *shutdown.borrow() || Instant::now() >= give_up {
                return Err(StartError::Busy(format!(
                    "{busy}, waited for it until it was time to stop"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Send the audit log's head to the journal, where the runwarden user
    /// cannot rewrite it (see [`crate::audit::head`]). A failure is logged
    /// and counted: the run's own record is already on disk.
    pub fn ship_head(&self, run_id: &str) {
        if !self.config.settings.audit_head_journal {
            return;
        }
        let head = self.audit.head();
        let journal = crate::audit::head::journal_available();
        let shipped = if journal {
            crate::audit::head::ship(self.audit.path(), &head, run_id).map_err(|e| {
                format!(
                    "cannot write to {}: {e}",
                    crate::audit::head::JOURNAL_SOCKET
                )
            })
        } else {
            Err(format!(
                "no system journal here ({} is missing); pin heads by hand with `audit verify --head`, or set `audit_head: none` in runwarden.yaml",
                crate::audit::head::JOURNAL_SOCKET
            ))
        };
        if let Some(m) = &self.metrics {
            let result = if shipped.is_ok() { "shipped" } else { "failed" };
            m.audit_heads.with_label_values(&[result]).inc();
        }
        match shipped {
            Ok(()) => tracing::debug!(%run_id, head = %head, "audit head sent to the journal"),
            // No journal at all is how this machine is, not a fault of the
            // moment: said once per process.
            Err(e) if !journal => {
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!("audit heads are not shipped: {e}");
                }
            }
            Err(e) => tracing::warn!(%run_id, "audit head {head} not shipped: {e}"),
        }
    }

    pub async fn run(&self, req: &RunRequest) -> Result<RunReport, StartError> {
        self.run_as(req, uuid::Uuid::now_v7().to_string()).await
    }

    /// The planner a run gets: see [`PlannerChoice`].
    fn planner(
        &self,
        runbook: &Arc<Runbook>,
        host: &Host,
        choice: PlannerChoice,
        context: Value,
    ) -> Result<Planner, StartError> {
        let endpoint = self.config.settings.model.as_ref();
        let use_model = match (choice, &runbook.agent, endpoint) {
            (PlannerChoice::Steps, _, _) => false,
            (PlannerChoice::Model, None, _) => {
                return Err(StartError::Planner(format!(
                    "runbook \"{}\" has no agent goal for a model to work on",
                    runbook.name
                )));
            }
            (PlannerChoice::Model, Some(_), None) => {
                return Err(StartError::Planner(
                    "no model is configured: add a `model:` section to runwarden.yaml".into(),
                ));
            }
            (_, Some(_), Some(_)) => true,
            (PlannerChoice::Auto, _, _) => false,
        };
        if runbook.steps.is_empty() && !use_model {
            return Err(StartError::Planner(format!(
                "runbook \"{}\" has no steps, only an agent goal, and the model planner is not in use",
                runbook.name
            )));
        }
        let model = match (use_model, endpoint) {
            (true, Some(endpoint)) => Some(
                ModelPlanner::new(runbook, host, endpoint, &context, self.metrics.clone())
                    .map_err(StartError::Planner)?,
            ),
            _ => None,
        };
        let after_steps = runbook.agent.as_ref().is_some_and(|a| a.after_steps);
        let steps =
            (model.is_none() || after_steps).then(|| StepsPlanner::new(runbook.clone(), context));
        Ok(Planner::new(steps, model))
    }

    /// Run with an id chosen by the caller (the daemon lists runs before they end).
    pub async fn run_as(&self, req: &RunRequest, run_id: String) -> Result<RunReport, StartError> {
        let runbook = self
            .config
            .runbooks
            .get(&req.runbook)
            .cloned()
            .ok_or_else(|| StartError::UnknownRunbook(req.runbook.clone()))?;
        let host = self
            .config
            .hosts
            .get(&req.host)
            .cloned()
            .ok_or_else(|| StartError::UnknownHost(req.host.clone()))?;
        // Asking for a host the runbook does not name is a usage error; the
        // gate would refuse every call of such a run anyway.
        if !runbook.allows_host(&host.name) {
            return Err(StartError::HostNotInRunbook {
                runbook: runbook.name.clone(),
                host: host.name.clone(),
                hosts: runbook
                    .hosts
                    .iter()
                    .map(|h| &**h)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        // A dry run changes nothing and takes no lock.
        let lock = match req.dry_run {
            true => None,
            false => Some(self.lock(&runbook, &host.name, &run_id).await?),
        };
        let executor = Executor::for_host(&host, &run_id, &self.config.settings.permit_key_file)
            .map_err(StartError::Unreachable)?;
        let mut context = json!({ "run": { "id": run_id, "runbook": runbook.name, "host": host.name, "trigger": req.trigger } });
        if let Some(alert) = &req.alert {
            context["alert"] = alert.clone();
        }
        let planner = self.planner(&runbook, &host, req.planner, context)?;
        let info = RunInfo {
            run_id: run_id.clone(),
            runbook: runbook.name.clone(),
            runbook_version: runbook.version.clone(),
            host: host.name.clone(),
            planner: planner.name().into(),
            model: planner.model().map(String::from),
            prompt: planner.model().map(|_| crate::planner::model::prompt_tag()),
        };
        if let Err(e) = self
            .audit
            .start(&info, req.trigger, req.dry_run, runbook.autonomy)
        {
            if let Some(m) = &self.metrics {
                m.audit_write_failures.inc();
            }
            return Err(e.into());
        }
        tracing::info!(%run_id, runbook = %runbook.name, host = %host.name, trigger = req.trigger.as_str(), planner = info.planner, dry_run = req.dry_run, "run started");
        Ok(RunLoop {
            _lock: lock,
            runner: self,
            runbook,
            host,
            executor,
            info,
            planner,
            req,
        }
        .go()
        .await)
    }
}

impl RunLoop<'_> {
    /// L2: ask a person about a held call and wait, while the kill switch, the
    /// time budget and shutdown still apply. Returns the gate's final decision.
    async fn ask(
        &self,
        hold: Hold,
        gate: &mut Gate,
        transcript: &Transcript,
        r: &mut StepReport,
    ) -> Decision {
        let tool = hold.action().tool();
        let deny = |reason, detail: String| {
            Decision::Deny(Denial {
                step: hold.step(),
                reason,
                detail,
                tool: Some(tool),
            })
        };
        let Some(approvals) = self.runner.approvals.clone() else {
            return deny(
                DenyReason::NoApprover,
                "autonomy L2: no person can approve here; run it under `runwarden serve` with `approvers_file` set".into(),
            );
        };
        let args = hold.action().args_json();
        let reason = hold.action().reason().unwrap_or_default().to_string();
        let digest = approvals::digest(
            &self.info.run_id,
            hold.step(),
            &self.runbook.name,
            &self.host.name,
            tool.name(),
            &args,
            &reason,
        );
        let id = uuid::Uuid::now_v7().to_string();
        if let Err(err) = self.runner.audit.pending(&self.info, &hold, &id, &digest) {
            return deny(
                DenyReason::NoApprover,
                format!("the pending line could not be written, nobody was asked: {err}"),
            );
        }
        let request = Request {
            id: id.clone(),
            run_id: self.info.run_id.clone(),
            step: hold.step(),
            runbook: self.runbook.name.clone(),
            host: self.host.name.clone(),
            tool: tool.name().into(),
            args,
            reason,
            findings: Value::Object(transcript.steps.clone()),
            digest,
            created_at: String::new(),
            expires_at: String::new(),
            state: State::Pending,
        };
        let mut rx = approvals.open(request);
        tracing::info!(approval_id = %id, run_id = %self.info.run_id, runbook = %self.runbook.name, host = %self.host.name, tool = tool.name(), "approval requested");
        if let Some(m) = &self.runner.metrics {
            m.approvals_pending.inc();
        }
        if let (Some(url), Some(req)) = (&self.runner.approval_webhook, approvals.get(&id)) {
            notify(url.clone(), req);
        }
        r.detail = Some(format!("waiting for approval {id}"));
        let expires = approvals
            .expires(&id)
            .unwrap_or_else(std::time::Instant::now);
        let state = loop {
            let now = rx.borrow_and_update().clone();
            if now != State::Pending {
                break now;
            }
            let why = if let Err(engaged) = self.runner.killswitch.check(&self.runbook.name) {
                Some(State::Cancelled {
                    why: engaged.to_string(),
                })
            } else if self.runner.shutdown.as_ref().is_some_and(|s| *s.borrow()) {
                Some(State::Cancelled {
                    why: "runwarden is shutting down".into(),
                })
            } else if std::time::Instant::now() >= gate.budget().deadline() {
                Some(State::Cancelled {
                    why: "the run's max_duration is spent".into(),
                })
            } else if std::time::Instant::now() >= expires {
                Some(State::Expired)
            } else {
                None
            };
            if let Some(end) = why {
                if approvals.close(&id, end.clone()) {
                    break end;
                }
                continue; // a decision got there first
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        };
        tracing::info!(approval_id = %id, run_id = %self.info.run_id, decision = ?state, "approval decided");
        if let Some(m) = &self.runner.metrics {
            m.approvals_pending.dec();
            m.approval_wait.observe(approvals.waited(&id).as_secs_f64());
            let decision = match &state {
                State::Approved { .. } => "approved",
                State::Denied { .. } => "denied",
                State::Expired => "expired",
                _ => "cancelled",
            };
            m.approvals
                .with_label_values(&[&self.runbook.name, tool.name(), decision])
                .inc();
        }
        match state {
            State::Approved { by, comment } => {
                r.detail = Some(format!(
                    "approved by {by}{}",
                    if comment.is_empty() {
                        String::new()
                    } else {
                        format!(": {comment}")
                    }
                ));
                gate.approved(hold, by)
            }
            State::Denied { by, comment } => deny(
                DenyReason::ApprovalDenied,
                format!("{by} denied approval {id}: {comment}"),
            ),
            State::Expired => deny(
                DenyReason::ApprovalExpired,
                format!("nobody decided on approval {id} in time"),
            ),
            State::Cancelled { why } if why.contains("max_duration") => {
                deny(DenyReason::TimeBudget, why)
            }
            State::Cancelled { why } => deny(
                DenyReason::KillSwitch,
                format!("approval {id} cancelled: {why}"),
            ),
            State::Pending => deny(
                DenyReason::NoApprover,
                format!("approval {id} ended undecided"),
            ),
        }
    }

    /// The `dry_run` line of a tier-2 call a dry run shows instead of running:
    /// its argv, and who approved it (`None`: a person would be asked, L2).
    /// Returns the argv, and whether the line was written.
    fn dry_run_line(
        &self,
        step: u32,
        action: &crate::tools::Action,
        approved_by: Option<&crate::gate::ApprovedBy>,
    ) -> (Argvs, Result<(), AuditError>) {
        let argv: Vec<Vec<String>> = action
            .planned_argv(&self.host)
            .iter()
            .map(|a| a.to_vec())
            .collect();
        let written = self
            .runner
            .audit
            .dry_run(&self.info, step, action, approved_by, &argv);
        (argv, written)
    }

    /// `runwarden_tool_calls_total`: label values from the registry and fixed
    /// outcomes only (an unknown tool name from a planner is `unknown`).
    fn count_call(&self, r: &StepReport) {
        let Some(m) = &self.runner.metrics else {
            return;
        };
        let tool = r
            .tool
            .as_deref()
            .and_then(ToolId::from_name)
            .map_or("unknown", ToolId::name);
        let tier = match r.tier {
            Some(1) => "1",
            Some(2) => "2",
            _ => "none",
        };
        m.tool_calls
            .with_label_values(&[&self.runbook.name, &self.host.name, tool, tier, &r.status])
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
}

struct RunLoop<'a> {
    /// Held for the run's whole life: one run per (runbook, host) on this machine.
    _lock: Option<crate::runlock::RunLock>,
    runner: &'a Runner,
    runbook: Arc<Runbook>,
    host: Arc<Host>,
    executor: Executor,
    info: RunInfo,
    planner: Planner,
    req: &'a RunRequest,
}

impl RunLoop<'_> {
    async fn go(mut self) -> RunReport {
        let started = Instant::now();
        let started_at = jiff::Timestamp::now().to_string();
        let audit = self.runner.audit.clone();
        let mut gate = Gate::new(
            self.runbook.clone(),
            self.host.clone(),
            self.runner.killswitch.clone(),
        );
        let mut transcript = Transcript::default();
        let mut steps = Vec::new();
        let mut suggestions = Vec::new();
        let mut worst = Verdict::Ok;
        let mut stop: Option<(Verdict, String)> = None;
        let mut worst_detail = String::new();
        let mut final_answer = None;
        let mut model_turns = 0;
        // Calls in a row that never reached the host (SSH transport errors).
        let mut unreachable = 0u32;
        // Dry runs: the tier-2 calls shown instead of run.
        let mut would_change = 0u32;
        let mut note = |v: Verdict, why: String, worst: &mut Verdict| {
            if v > *worst {
                *worst = v;
                worst_detail = why;
            }
        };

        while stop.is_none() {
            if self.runner.shutdown.as_ref().is_some_and(|s| *s.borrow()) {
                stop = Some((
                    Verdict::Halted,
                    "runwarden is shutting down; the run stopped before its next call".into(),
                ));
                break;
            }
            let n = steps.len() as u32 + 1;
            let mut admit = || gate.admit_model_request();
            let next = self.planner.next(&transcript, &mut admit).await;
            if let Some(more) = self.planner.take_step_limit() {
                gate.limit_steps(more);
            }
            match next {
                Next::Finish => break,
                Next::Turn(turn) => {
                    model_turns += 1;
                    if turn.final_answer {
                        final_answer = Some(turn.content.clone());
                    }
                    if let Err(err) = audit.model_turn(&self.info, &turn) {
                        stop = Some((Verdict::Broken, err.to_string()));
                    }
                }
                Next::Fail(msg) => stop = Some((Verdict::Broken, msg)),
                Next::Stopped(denial) => {
                    if let Some(m) = &self.runner.metrics {
                        m.gate_denials
                            .with_label_values(&[&self.runbook.name, denial.reason.as_str()])
                            .inc();
                    }
                    let why = format!(
                        "before model request {}: {denial}",
                        gate.budget().model_requests() + 1
                    );
                    stop = Some((Verdict::from(denial.reason), why));
                }
                Next::Skip { id, when } => {
                    let mut r = StepReport::new(n, &id, "skipped");
                    r.detail = Some(format!("when: {when}"));
                    transcript.steps.insert(
                        id,
                        json!({ "outcome": "skipped", "ok": false, "skipped": true }),
                    );
                    steps.push(r);
                }
                Next::Suggest { id, text } => {
                    if let Err(err) = audit.suggestion(&self.info, n, &text) {
                        stop = Some((Verdict::Broken, err.to_string()));
                    }
                    let mut r = StepReport::new(n, &id, "suggested");
                    r.detail = Some(text.clone());
                    suggestions.push(text);
                    steps.push(r);
                }
                Next::Call { id, mut call } => {
                    call.step = n;
                    let mut r = StepReport::new(n, &id, "");
                    r.tool = Some(call.tool.chars().take(200).collect());
                    let decision = match gate.check(&call) {
                        // A dry run asks nobody: it shows what a person would be asked.
                        Decision::Hold(hold) if !self.req.dry_run => {
                            self.ask(hold, &mut gate, &transcript, &mut r).await
                        }
                        other => other,
                    };
                    match decision {
                        Decision::Hold(hold) if self.req.dry_run => {
                            let action = hold.action();
                            let (argv, written) = self.dry_run_line(n, action, None);
                            if let Err(err) = written {
                                stop = Some((Verdict::Broken, err.to_string()));
                            }
                            r.status = "dry_run".into();
                            r.tier = Some(2);
                            r.args = action.args_json();
                            r.reason = action.reason().map(String::from);
                            r.detail = Some(
                                "L2: a person would be asked to approve exactly this call".into(),
                            );
                            r.argv = Some(argv);
                            would_change += 1;
                            transcript
                                .steps
                                .insert(id, json!({ "outcome": "dry_run", "ok": false }));
                        }
                        Decision::Hold(hold) => {
                            // `ask` resolves every hold; a hold here would be a bug, and it is refused.
                            let denial = Denial {
                                step: hold.step(),
                                reason: DenyReason::NoApprover,
                                detail: "unresolved approval".into(),
                                tool: Some(hold.action().tool()),
                            };
                            r.status = "denied".into();
                            r.detail = Some(denial.to_string());
                            let _ = audit.denied(&self.info, &call.tool, &call.args, &denial);
                            note(Verdict::Denied, format!("step {n}: {denial}"), &mut worst);
                        }
                        Decision::Deny(denial) => {
                            r.status = "denied".into();
                            r.args = crate::audit::bounded(&call.args);
                            r.tier = denial.tool.map(|t| t.tier().number());
                            r.detail = Some(denial.to_string());
                            transcript.steps.insert(id, json!({ "outcome": "denied", "ok": false, "error": denial.for_planner() }));
                            if let Err(err) =
                                audit.denied(&self.info, &call.tool, &call.args, &denial)
                            {
                                stop = Some((Verdict::Broken, err.to_string()));
                            }
                            if let Some(m) = &self.runner.metrics {
                                m.gate_denials
                                    .with_label_values(&[
                                        &self.runbook.name,
                                        denial.reason.as_str(),
                                    ])
                                    .inc();
                            }
                            let v = Verdict::from(denial.reason);
                            if denial.reason.stops_run() && stop.is_none() {
                                stop = Some((v, denial.to_string()));
                            }
                            note(v, format!("step {n}: {denial}"), &mut worst);
                        }
                        Decision::Propose(p) => {
                            let argv: Vec<Vec<String>> = p
                                .action()
                                .planned_argv(&self.host)
                                .iter()
                                .map(|a| a.to_vec())
                                .collect();
                            r.status = "proposed".into();
                            r.tier = Some(p.action().tier().number());
                            r.args = p.action().args_json();
                            r.reason = p.action().reason().map(String::from);
                            r.detail =
                                Some("L1: recorded as a proposal for a person; not run".into());
                            let flat: Vec<String> = argv
                                .iter()
                                .map(|a| serde_json::to_string(a).unwrap_or_default())
                                .collect();
                            r.argv = Some(argv);
                            transcript
                                .steps
                                .insert(id, json!({ "outcome": "proposed", "ok": false }));
                            if let Err(err) = audit.proposal(&self.info, &p, &flat) {
                                stop = Some((Verdict::Broken, err.to_string()));
                            }
                        }
                        Decision::Allow(permit) => {
                            let action = permit.action();
                            let tool_name = action.tool().name();
                            r.tier = Some(action.tier().number());
                            r.args = action.args_json();
                            r.approved_by = Some(permit.approved_by().to_string());
                            r.reason = action.reason().map(String::from);
                            if self.req.dry_run && action.tier() == Tier::Change {
                                let (argv, written) =
                                    self.dry_run_line(n, action, Some(permit.approved_by()));
                                if let Err(err) = written {
                                    stop = Some((Verdict::Broken, err.to_string()));
                                }
                                r.status = "dry_run".into();
                                r.argv = Some(argv);
                                would_change += 1;
                                transcript
                                    .steps
                                    .insert(id, json!({ "outcome": "dry_run", "ok": false }));
                            } else {
                                // The intent line takes the permit: what comes back is
                                // the one thing dispatch accepts, once.
                                let ticket = match audit.intent(&self.info, permit) {
                                    Ok(t) => t,
                                    Err(err) => {
                                        r.status = "denied".into();
                                        r.detail = Some(format!(
                                            "not run: the intent line could not be written: {err}"
                                        ));
                                        steps.push(r);
                                        stop = Some((
                                            Verdict::Broken,
                                            format!("audit log unusable, no call was made: {err}"),
                                        ));
                                        continue;
                                    }
                                };
                                let deadline = tokio::time::Instant::now()
                                    + self.host.tool_timeout.min(gate.budget().remaining());
                                let (done, result) = self
                                    .executor
                                    .dispatch(ticket, &self.info, &self.host, deadline)
                                    .await;
                                if let Err(err) = audit.result(&self.info, done, &result) {
                                    stop = Some((
                                        Verdict::Broken,
                                        format!("the result line could not be written: {err}"),
                                    ));
                                }
                                r.status = match result.outcome {
                                    Outcome::Ok => "ok",
                                    Outcome::Error => "error",
                                    Outcome::Timeout => "timeout",
                                }
                                .into();
                                if crate::executor::ssh::is_transport_error(&result) {
                                    unreachable += 1;
                                    if unreachable >= MAX_UNREACHABLE && stop.is_none() {
                                        stop = Some((
                                            Verdict::Failed,
                                            format!(
                                                "host {} cannot be reached: {unreachable} calls in a row failed before reaching it (last: {}); the run stops rather than wait out every step's timeout",
                                                self.host.name,
                                                result
                                                    .error
                                                    .as_deref()
                                                    .unwrap_or("transport error")
                                            ),
                                        ));
                                    }
                                } else {
                                    unreachable = 0;
                                }
                                if result.outcome != Outcome::Ok || result.verified == Some(false) {
                                    let why = result
                                        .error
                                        .clone()
                                        .unwrap_or_else(|| "change not verified".into());
                                    note(
                                        Verdict::Failed,
                                        format!("step {n} ({tool_name}): {why}"),
                                        &mut worst,
                                    );
                                }
                                transcript.steps.insert(id, result.view());
                                r.result = Some(result);
                            }
                        }
                    }
                    self.count_call(&r);
                    steps.push(r);
                }
            }
        }

        let (mut verdict, mut verdict_detail) = match stop {
            Some((v, why)) => (v.max(worst), why),
            None if worst == Verdict::Ok && self.req.dry_run => (
                Verdict::Ok,
                format!(
                    "dry run: {would_change} change(s) would run, each shown with its argv; nothing was changed"
                ),
            ),
            None if worst == Verdict::Ok => (
                Verdict::Ok,
                "every call succeeded and every change verified".into(),
            ),
            None => (worst, worst_detail),
        };
        // A dry run changed nothing, whatever the gate would have allowed.
        let mutations = if self.req.dry_run {
            0
        } else {
            gate.budget().mutations()
        };
        let end = RunEnd {
            duration_ms: started.elapsed().as_millis() as u64,
            final_answer: final_answer.clone(),
            steps: gate.budget().steps(),
            mutations,
            suggestions: suggestions.clone(),
        };
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
            autonomy: self.runbook.autonomy.as_str(),
            planner: self.planner.name(),
            model: self.planner.model().map(String::from),
            final_answer,
            model_turns,
            trigger: self.req.trigger,
            dry_run: self.req.dry_run,
            started_at,
            duration_ms: started.elapsed().as_millis() as u64,
            steps,
            suggestions,
            mutations,
            verdict,
            verdict_detail,
        }
    }
}

/// Transport failures in a row to one host after which a run gives up on it.
const MAX_UNREACHABLE: u32 = 2;

/// The argv of each process a call would run, as a report shows them.
type Argvs = Vec<Vec<String>>;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// POST a pending approval request to the configured webhook, in the background.
/// Its answer changes nothing: only a decision through the API approves.
fn notify(url: String, request: Request) {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build();
        if let Ok(client) = client {
            let body = serde_json::to_vec(&request).unwrap_or_default();
            let post = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body);
            if let Err(e) = post.send().await {
                // The URL may carry a token: name only its host.
                let host = reqwest::Url::parse(&url)
                    .ok()
                    .and_then(|u| u.host_str().map(String::from))
                    .unwrap_or_default();
                tracing::warn!(
                    "approval webhook at {host}: {}",
                    crate::error_chain(&e.without_url())
                );
            }
        }
    });
}

//! One runbook on one host: the runner starts a run (looks up the runbook
//! and host, checks the host is the runbook's, takes the (runbook, host)
//! lock, picks the planner, writes the `start` line) and hands it to the
//! run loop (`run_loop`), which takes each step through the gate until the planner
//! finishes or a limit stops it; then a [`Verdict`].
//!
//! The verdict is judged from the tool events (every call's outcome and, for
//! tier-2 calls, its own verification), never from an exit code alone.
//!
//! One file: a run's start and its end (lock, lease, planner, `start` line;
//! demotion, lease release, hand-back) pair up around the loop and share
//! the runner's state.

mod account;
mod ask;
mod claim;
mod cleared;
mod internal;
mod run_loop;

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::watch;

use crate::audit::{AuditError, AuditLog, RunInfo};
use crate::config::{Config, Host, Runbook};
use crate::executor::Executor;
use crate::gate::approvals::Approvals;
use crate::gate::{Demotions, KillSwitch};
use crate::metrics::Metrics;
use crate::planner::{ModelPlanner, Planner, PlannerChoice, StepsPlanner};
use crate::rules::TriggerResult;
use crate::state::Admitted;
use crate::verdict::Verdict;
use claim::Holding;
use run_loop::RunLoop;

pub(crate) use crate::report::RunReport;
pub use crate::trigger::{RunRequest, Trigger};

/// Problems that keep a run from starting at all (nothing was called or audited).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The runbook does not exist.
    #[error("no runbook named \"{0}\" (runwarden check lists them)")]
    UnknownRunbook(String),
    /// The host does not exist.
    #[error("no host named \"{0}\" in hosts/")]
    UnknownHost(String),
    #[error(
        "runbook \"{runbook}\" does not name host \"{host}\" (its hosts: {hosts}); nothing ran"
    )]
    /// The runbook does not name the host.
    HostNotInRunbook {
        /// The runbook.
        runbook: String,
        /// The host asked for.
        host: String,
        /// The hosts it names.
        hosts: String,
    },
    /// The host's executor could not be set up.
    #[error("{0}")]
    Unreachable(String),
    /// The planner could not be set up (no model endpoint for the runbook).
    #[error("{0}")]
    Planner(String),
    /// The model planner could not be set up (its endpoint or key).
    #[error(transparent)]
    Model(#[from] crate::planner::openai::ModelError),
    /// Another process runs this runbook on this host (`runwarden run` exits 75).
    #[error("{0}; nothing ran")]
    Busy(String),
    /// The fleet's kill switch refused the run at admission (`runwarden run`
    /// exits 7, as for a run the switch halts).
    #[error("{0}")]
    KillSwitch(String),
    /// The run lock could not be taken (the state directory is unusable): broken.
    #[error("{0}")]
    Lock(String),
    /// The daemon stopped while the run waited to start, and its trigger
    /// went to the fleet's queue as run `to`, for another replica.
    #[error(
        "{why}; its trigger is handed to the fleet's queue as run {to}, which another replica takes"
    )]
    HandedBack {
        /// Why it did not start here.
        why: String,
        /// The queued run that takes its trigger.
        to: String,
    },
    /// The run's first line could not be written.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// A bug: the run panicked before its first line, or while it ended
    /// its run after a panic (see `internal`).
    #[error("{0}")]
    Internal(String),
}

/// Everything a run needs from outside: the config it started with, the audit log, the switch.
pub struct Runner {
    /// The configuration the run started with.
    pub(crate) config: Arc<Config>,
    /// The audit log.
    pub(crate) audit: Arc<AuditLog>,
    /// The kill switch.
    pub(crate) killswitch: KillSwitch,
    /// Runbooks that lost their standing approval (`demote_after`).
    pub(crate) demotions: Demotions,
    /// The daemon's metrics; `None` on the command line.
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Turns true when the daemon shuts down: the run stops before its next call.
    pub(crate) shutdown: Option<watch::Receiver<bool>>,
    /// Open approval requests (L2); `None` where nobody can be asked.
    pub(crate) approvals: Option<Arc<Approvals>>,
    /// Who is told of each approval request (the webhook, Slack); nothing
    /// runs because one answered.
    pub(crate) chat: Option<Arc<crate::chat::Outbox>>,
    /// What this run and the others must agree on: this machine's own
    /// state, or the fleet's (`state.postgres`).
    pub(crate) state: Arc<dyn crate::state::SharedState>,
    /// Told how a model's turn is coming along while it writes (`run` on a
    /// terminal shows a progress line).
    pub(crate) model_progress: Option<crate::planner::openai::ProgressFn>,
    /// The alerts this daemon's runs saw clear, for `recurred` (`None` on
    /// the command line, where no alert comes back to the same process).
    pub(crate) clears: Option<Arc<crate::done_when::Clears>>,
}

impl Runner {
    /// A runner for the command line: no metrics, no approvers, no shutdown.
    pub fn new(config: Arc<Config>, audit: Arc<AuditLog>) -> Runner {
        let killswitch = KillSwitch::new(config.settings.kill_switch_dir.clone());
        let demotions = crate::audit::demotions(&config.settings);
        Runner {
            config,
            audit,
            killswitch,
            demotions,
            metrics: None,
            shutdown: None,
            approvals: None,
            chat: None,
            state: crate::state::chosen(None),
            model_progress: None,
            clears: None,
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

    /// Whether the daemon this runner serves is stopping.
    fn stopping(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|s| *s.borrow())
    }

    /// Send the audit log's head to the journal, where the runwarden user
    /// cannot rewrite it (see [`crate::audit::head`]). A failure is logged
    /// and counted: the run's own record is already on disk.
    pub(crate) fn ship_head(&self, run_id: &str) {
        if !self.config.settings.audit_head.ships() {
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

    /// Run `req` under a new run id, from the first call to the verdict.
    pub async fn run(&self, req: &RunRequest) -> Result<RunReport, StartError> {
        self.run_as(req, uuid::Uuid::now_v7().to_string(), None)
            .await
    }

    /// The planner a run gets: see [`PlannerChoice`].
    fn planner(
        &self,
        runbook: &Arc<Runbook>,
        host: &Host,
        choice: PlannerChoice,
        context: Value,
    ) -> Result<Planner, StartError> {
        if runbook.planner == crate::config::PlannedBy::Mcp {
            return Err(StartError::Planner(format!(
                "runbook \"{}\" is planned by an agent over MCP (planner: mcp): only an agent's session starts it, with `runwarden mcp {} --host {}` or the daemon's /mcp",
                runbook.name, runbook.name, host.name
            )));
        }
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
            (PlannerChoice::Model, Some(_), Some(_)) => true,
            // Only a runbook that says so (`planner: model`, or one with
            // only a goal): a configured model alone changes nothing.
            (PlannerChoice::Auto, Some(_), Some(_)) => {
                runbook.planner == crate::config::PlannedBy::Model
            }
            (PlannerChoice::Auto, _, _) => false,
        };
        if runbook.steps.is_empty() && !use_model {
            return Err(StartError::Planner(format!(
                "runbook \"{}\" has no steps, only an agent goal, and the model planner is not in use",
                runbook.name
            )));
        }
        let model = match (use_model, endpoint) {
            (true, Some(endpoint)) => Some(ModelPlanner::new(
                runbook,
                host,
                endpoint,
                &context,
                self.metrics.clone(),
                self.model_progress.clone(),
            )?),
            _ => None,
        };
        let after_steps = runbook.agent.as_ref().is_some_and(|a| a.after_steps);
        let steps =
            (model.is_none() || after_steps).then(|| StepsPlanner::new(runbook.clone(), context));
        Ok(Planner::new(steps, model))
    }

    /// Run with an id chosen by the caller (the daemon lists runs before they end).
    ///
    /// With shared state, the run holds its (runbook, host) lease: the one
    /// the daemon claimed when it accepted the trigger, or one claimed here
    /// (the command line). Its verdict is recorded there too, which frees it.
    pub(crate) async fn run_as(
        &self,
        req: &RunRequest,
        run_id: String,
        lease: Option<crate::store::Lease>,
    ) -> Result<RunReport, StartError> {
        let lease = match lease {
            Some(lease) => Some(lease),
            None if !req.dry_run => match self.state.claim(req, &run_id).await {
                Ok(Admitted::Started(lease)) => lease,
                Ok(Admitted::Refused(TriggerResult::KillSwitch)) => {
                    return Err(StartError::KillSwitch(format!(
                        "the fleet's kill switch is engaged for {}: nothing ran",
                        req.runbook
                    )));
                }
                Ok(_) => {
                    return Err(StartError::Busy(format!(
                        "another run of {} on {} holds its lease in the shared state",
                        req.runbook, req.host
                    )));
                }
                Err(e) => return Err(StartError::Lock(format!("{e}; nothing ran"))),
            },
            None => None,
        };
        let claim = lease.as_ref().map(|l| l as &dyn Holding);
        // A panic that got past the run loop's own catch (before the run's
        // first line, or in ending it) still ends here: what the run held
        // is given back below and by its caller, as for any other end.
        let mut outcome = match internal::caught(self.run_leased(req, &run_id, claim)).await {
            Ok(outcome) => outcome,
            Err(panicked) => {
                tracing::error!(%run_id, runbook = %req.runbook, host = %req.host, "{panicked}");
                self.count_internal_error(&req.runbook);
                Err(StartError::Internal(panicked.to_string()))
            }
        };
        // Stopped while it waited for its run lock: the fleet gets it back.
        if let (Err(StartError::Busy(why)), Some(claim), true) = (&outcome, claim, self.stopping())
            && !req.dry_run
            && req.agent.is_none()
        {
            let to = uuid::Uuid::now_v7().to_string();
            let mut again = req.clone();
            again.keys.push(crate::audit::runs::resumes_key(&run_id));
            match claim.hand_back(&to, &again.to_queue()).await {
                Ok(()) => {
                    outcome = Err(StartError::HandedBack {
                        why: why.clone(),
                        to,
                    })
                }
                Err(e) => {
                    tracing::warn!(%run_id, "the run could not be handed to the fleet's queue: {e}")
                }
            }
        }
        // Before the lease is freed: the next run of it sees the demotion.
        if let Ok(report) = &outcome {
            self.count_failure(req, report).await;
        }
        if let Some(lease) = lease {
            let verdict = match &outcome {
                Ok(report) => report.verdict,
                Err(_) => Verdict::Broken,
            };
            let run_id = lease.id().run_id.clone();
            if let Err(e) = lease
                .finish(
                    verdict.as_str(),
                    &self.audit.head().to_string(),
                    req.dry_run,
                )
                .await
            {
                tracing::warn!(%run_id, "the verdict could not be recorded in the shared state ({e}); its lease expires and another replica closes it as interrupted");
            }
        }
        outcome
    }

    /// A failed run of a runbook with `demote_after` counts toward its
    /// demotion, fleet-wide with shared state; the run that reaches it
    /// writes the `demoted` line with the evidence and says so.
    async fn count_failure(&self, req: &RunRequest, report: &RunReport) {
        let Some(rule) = self
            .config
            .runbooks
            .get(&req.runbook)
            .and_then(|r| r.demote_after)
        else {
            return;
        };
        let Some(failure) = failure_of(report).filter(|_| !req.dry_run) else {
            return;
        };
        self.count_demotion(failure, rule).await;
    }

    /// One failure toward `rule`: the run that reaches it writes the
    /// `demoted` line with the evidence and says so.
    async fn count_demotion(
        &self,
        failure: crate::gate::demotion::Failure,
        rule: crate::config::DemoteAfter,
    ) {
        let run_id = failure.run_id.clone();
        let runbook = failure.runbook.clone();
        let reached = self
            .state
            .record_failure(&self.config.settings, failure, rule)
            .await;
        match reached {
            Ok(None) => {}
            Ok(Some(demotion)) => {
                tracing::warn!(%run_id, runbook = %demotion.runbook, "{}", demotion.summary());
                if let Err(e) = self.audit.demoted(&demotion) {
                    tracing::error!(%run_id, "the demotion could not be audited: {e}");
                }
                if let Some(m) = &self.metrics {
                    m.runbook_demoted
                        .with_label_values(&[&demotion.runbook])
                        .set(1);
                }
            }
            Err(e) => tracing::error!(
                %run_id,
                %runbook,
                "this failed run could not be counted toward demote_after: {e}"
            ),
        }
    }

    async fn run_leased(
        &self,
        req: &RunRequest,
        run_id: &str,
        lease: Option<&dyn Holding>,
    ) -> Result<RunReport, StartError> {
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
            false => Some(self.lock(&runbook, &host.name, run_id).await?),
        };
        let executor = Executor::for_host(&host, run_id, &self.config.settings.permit_key_file);
        let context = req.template_context(run_id);
        // An MCP session's run: the agent on the other end plans it.
        let agent = req.agent.as_ref().and_then(|slot| {
            slot.planner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
        });
        let planner = match agent {
            Some(agent) => Planner::agent(agent),
            // An agent's run is planned by its session alone: one that
            // reached a runner without it (another replica, a later start)
            // never falls back to the runbook's steps.
            None if req.trigger == crate::origin::Trigger::Mcp => {
                return Err(StartError::Planner(
                    "an MCP session's run is planned by its agent, which is not connected here; the agent opens a new session to start another".into(),
                ));
            }
            None => self.planner(&runbook, &host, req.planner, context)?,
        };
        let info = RunInfo {
            run_id: run_id.to_string(),
            runbook: runbook.name.clone(),
            runbook_version: runbook.version.clone(),
            host: host.name.clone(),
            planner: planner.name().into(),
            model: planner.model().map(String::from),
            prompt: planner.model().map(|_| crate::planner::model::prompt_tag()),
        };
        if let Err(e) = self.audit.start(
            &info,
            req.trigger,
            req.dry_run,
            runbook.autonomy,
            &req.origin(),
        ) {
            if let Some(m) = &self.metrics {
                m.audit_write_failures.inc();
            }
            return Err(e.into());
        }
        tracing::info!(%run_id, runbook = %runbook.name, host = %host.name, trigger = req.trigger.as_str(), planner = info.planner, dry_run = req.dry_run, "run started");
        let recurred = self.recurred(&runbook, req, &info).await;
        let started = (Instant::now(), jiff::Timestamp::now().to_string());
        let (ran, runbook_of, host_of) = (info.clone(), runbook.clone(), host.name.clone());
        let run = RunLoop {
            _lock: lock,
            runner: self,
            runbook,
            host,
            executor,
            info,
            planner,
            req,
            lease,
            recurred,
        };
        // The run lock is the loop's: a panic drops it with the loop.
        match internal::caught(run.go()).await {
            Ok(report) => Ok(report),
            Err(panicked) => {
                tracing::error!(%run_id, runbook = %runbook_of.name, host = %host_of, "{panicked}");
                self.count_internal_error(&runbook_of.name);
                Ok(self.end_panicked(&ran, &runbook_of, req, started, &panicked))
            }
        }
    }

    /// The alert that started this run was seen to clear by an earlier run
    /// within `recurrence`: that fix did not hold. The earlier run gets a
    /// `recurred` line, it counts toward `demote_after`, and this run's
    /// report names it.
    async fn recurred(
        &self,
        runbook: &Runbook,
        req: &RunRequest,
        info: &RunInfo,
    ) -> Option<crate::done_when::Recurred> {
        runbook.done_when.as_ref()?;
        let back = self
            .clears
            .as_ref()?
            .recurred((&runbook.name, &info.host), &cleared::fingerprints(req))?;
        tracing::warn!(run_id = %info.run_id, earlier = %back.run_id, "the alert run {} saw clear came back after {} s", back.run_id, back.after.as_secs());
        if let Err(e) = self
            .audit
            .recurred(&back.run_id, info, &back.fingerprint, back.after)
        {
            tracing::error!(run_id = %info.run_id, "the recurred line could not be written: {e}");
        }
        if let Some(m) = &self.metrics {
            m.fixes_recurred.with_label_values(&[&runbook.name]).inc();
        }
        if let Some(rule) = runbook.demote_after {
            let failure = crate::gate::demotion::Failure {
                run_id: back.run_id.clone(),
                runbook: runbook.name.clone(),
                host: info.host.clone(),
                at: jiff::Timestamp::now().to_string(),
                verdict: "recurred".into(),
                detail: format!(
                    "its alert came back {} s after it cleared (run {})",
                    back.after.as_secs(),
                    info.run_id
                ),
                calls: Vec::new(),
            };
            self.count_demotion(failure, rule).await;
        }
        Some(back)
    }

    fn count_internal_error(&self, runbook: &str) {
        if let Some(m) = &self.metrics {
            m.internal_errors.with_label_values(&[runbook]).inc();
        }
    }

    /// The run loop panicked: the run's verdict line (`failed`, `reason:
    /// internal_error`, the panic's message and place) and its report.
    fn end_panicked(
        &self,
        info: &RunInfo,
        runbook: &Runbook,
        req: &RunRequest,
        (started, started_at): (Instant, String),
        panicked: &internal::Panicked,
    ) -> RunReport {
        let mut verdict = Verdict::Failed;
        let mut detail = panicked.to_string();
        let end = crate::audit::RunEnd {
            duration_ms: started.elapsed().as_millis() as u64,
            reason: Some("internal_error"),
            ..Default::default()
        };
        if let Err(err) = self.audit.verdict(info, verdict, &detail, Some(&end)) {
            if let Some(m) = &self.metrics {
                m.audit_write_failures.inc();
            }
            detail = format!("the verdict line ({detail}) could not be written: {err}");
            verdict = Verdict::Broken;
        } else {
            self.ship_head(&info.run_id);
        }
        RunReport {
            run_id: info.run_id.clone(),
            runbook: runbook.name.clone(),
            runbook_version: runbook.version.clone(),
            host: info.host.clone(),
            autonomy: runbook.autonomy.as_str().into(),
            planner: info.planner.clone().into(),
            model: info.model.clone(),
            final_answer: None,
            model_turns: 0,
            trigger: req.trigger,
            dry_run: req.dry_run,
            started_at,
            duration_ms: end.duration_ms,
            steps: Vec::new(),
            suggestions: Vec::new(),
            model_suggestions: Vec::new(),
            claims: Vec::new(),
            mutations: 0,
            alert_check: None,
            recurred_from: None,
            verdict,
            verdict_detail: detail,
        }
    }
}

/// What `demote_after` counts of a run: a `failed` or `unresolved`
/// verdict, an `inconclusive` one whose alert could not be checked, or any
/// tier-2 call that did not succeed (its own verification included)
/// whatever the verdict; `None` for a run that did none of these.
fn failure_of(report: &RunReport) -> Option<crate::gate::demotion::Failure> {
    use crate::gate::demotion::{FailedCall, Failure};
    let calls: Vec<FailedCall> = report
        .steps
        .iter()
        .filter_map(|s| {
            let result = s.result.as_ref().filter(|r| !r.succeeded())?;
            Some(FailedCall {
                step: s.step,
                tool: s.tool.clone().unwrap_or_default(),
                tier: s.tier.unwrap_or(0),
                error: result
                    .error
                    .clone()
                    .unwrap_or_else(|| "the change was not verified".into()),
            })
        })
        .collect();
    let changed_and_failed = calls.iter().any(|c| c.tier == 2);
    // A fix whose alert did not clear, or whose clear could not be
    // checked, is not a success.
    let not_fixed = match report.verdict {
        Verdict::Failed | Verdict::Unresolved => true,
        Verdict::Inconclusive => report.alert_check.is_some(),
        _ => false,
    };
    if !not_fixed && !changed_and_failed {
        return None;
    }
    Some(Failure {
        run_id: report.run_id.clone(),
        runbook: report.runbook.clone(),
        host: report.host.clone(),
        at: jiff::Timestamp::now().to_string(),
        verdict: report.verdict.as_str().into(),
        detail: report.verdict_detail.clone(),
        calls,
    })
}

#[cfg(test)]
mod tests {
    use super::claim::{Holding, Lost};
    use super::*;
    use crate::gate::DenyReason;
    use crate::store::Budgets;

    /// A claim that answers as told: the fence, then the check after the
    /// intent line. No database: the run loop's lease branches, in the fast tier.
    #[derive(Default)]
    struct Told {
        fence: Option<Lost>,
        proven: Option<Lost>,
        /// What `hand_back` was given (the next run's id, its request).
        handed: std::sync::Mutex<Option<(String, String)>>,
    }

    impl Holding for Told {
        fn fence<'a>(
            &'a self,
            _: bool,
            _: &'a Budgets,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Lost>> + Send + 'a>>
        {
            let answer = self.fence.clone().map_or(Ok(()), Err);
            Box::pin(async move { answer })
        }

        fn still_proven(&self) -> Result<(), Lost> {
            self.proven.clone().map_or(Ok(()), Err)
        }

        fn hand_back<'a>(
            &'a self,
            next: &'a str,
            request: &'a str,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), super::claim::NotHanded>> + Send + 'a>,
        > {
            *self.handed.lock().unwrap() = Some((next.to_string(), request.to_string()));
            Box::pin(async { Ok(()) })
        }
    }

    fn lost(what: &str) -> Option<Lost> {
        Some((DenyReason::LeaseLost, what.to_string()))
    }

    /// A runbook of one `disk_usage` call on a local host, and a runner.
    fn runner(dir: &std::path::Path) -> Runner {
        for d in ["hosts", "runbooks", "kill-switch", "data"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("runwarden.yaml"), "audit_head: none\n").unwrap();
        let data = dir.join("data");
        std::fs::write(
            dir.join("hosts/h.yaml"),
            format!("name: h\nconnection: local\npaths: [{}]\n", data.display()),
        )
        .unwrap();
        std::fs::write(
            dir.join("runbooks/rb.yaml"),
            format!(
                "name: rb\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\n\
                 steps:\n  - id: look\n    call: disk_usage\n    args: {{ path: {} }}\n",
                data.display()
            ),
        )
        .unwrap();
        let config = Arc::new(Config::load(dir).unwrap());
        let audit = Arc::new(AuditLog::open(&config.settings.audit_log).unwrap());
        Runner::new(config, audit)
    }

    async fn run_with(claim: &Told) -> (RunReport, Vec<crate::audit::Entry>) {
        let (report, lines, _) = run_stopping(claim, false).await;
        (report, lines)
    }

    /// As [`run_with`], the daemon already stopping when `stopping`; also
    /// how many runs this machine's next start would run again.
    async fn run_stopping(
        claim: &Told,
        stopping: bool,
    ) -> (RunReport, Vec<crate::audit::Entry>, usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut runner = runner(dir.path());
        let (_stop, shutdown) = tokio::sync::watch::channel(stopping);
        runner.shutdown = Some(shutdown);
        let req = RunRequest::cli("rb".into(), "h".into(), false);
        let report = runner.run_leased(&req, "run-1", Some(claim)).await.unwrap();
        let lines = crate::audit::run_lines(&runner.config.settings.audit_log, "run-1").unwrap();
        let again = crate::audit::runs::recovery(&runner.config.settings.audit_log)
            .unwrap()
            .handed_back
            .len();
        (report, lines, again)
    }

    fn phases(lines: &[crate::audit::Entry]) -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.phase.map(|p| format!("{p:?}").to_lowercase()))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_that_fails_stops_the_call_before_its_intent_line() {
        let (report, lines) = run_with(&Told {
            fence: lost("another replica took the lease"),
            ..Told::default()
        })
        .await;
        assert_eq!(report.verdict, Verdict::Interrupted, "{report:?}");
        assert_eq!(report.steps[0].status, crate::report::StepStatus::Denied);
        assert!(
            report.steps[0]
                .detail
                .as_deref()
                .unwrap_or_default()
                .contains("lease_lost"),
            "{report:?}"
        );
        let said = phases(&lines);
        assert!(!said.contains(&"intent".to_string()), "{said:?}");
        assert!(said.contains(&"denied".to_string()), "{said:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_no_longer_proven_after_the_intent_line_is_not_sent() {
        let (report, lines) = run_with(&Told {
            proven: lost("the last renewal is too old"),
            ..Told::default()
        })
        .await;
        assert_eq!(report.verdict, Verdict::Interrupted, "{report:?}");
        let result = lines
            .iter()
            .find(|l| l.phase == Some(crate::audit::Phase::Result))
            .expect("the intent line has its result line");
        assert_eq!(result.outcome.as_deref(), Some("error"));
        let detail = result
            .detail
            .as_ref()
            .map(|d| d.to_string())
            .unwrap_or_default();
        assert!(detail.contains("not dispatched"), "{detail}");
        assert!(
            report.steps[0].result.is_none(),
            "no tool result: nothing ran {report:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_that_holds_lets_the_call_run() {
        let claim = Told::default();
        let (report, lines) = run_with(&claim).await;
        assert_eq!(report.verdict, Verdict::Ok, "{report:?}");
        let said = phases(&lines);
        assert!(said.contains(&"intent".to_string()) && said.contains(&"result".to_string()));
        assert!(
            claim.handed.lock().unwrap().is_none(),
            "a run that ran keeps its trigger"
        );
    }

    /// With shared state, a run the daemon's stop ends before any call hands
    /// its trigger to the fleet's queue (as a new run that resumes it), and
    /// its verdict line names that run; nothing was called.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_run_stopped_before_any_call_is_handed_to_the_fleets_queue() {
        let claim = Told::default();
        let (report, lines, restarts) = run_stopping(&claim, true).await;
        assert_eq!(report.verdict, Verdict::Halted, "{report:?}");
        let (next, request) = claim.handed.lock().unwrap().clone().expect("handed back");
        assert!(report.verdict_detail.contains(&next), "{report:?}");
        let again = RunRequest::from_queue("rb".into(), "h".into(), &request).unwrap();
        assert!(
            again
                .keys
                .contains(&crate::audit::runs::resumes_key("run-1")),
            "{again:?}"
        );
        let verdict = lines.last().unwrap();
        let detail = verdict.detail.clone().unwrap();
        assert_eq!(detail["handed_back"], true, "{detail}");
        assert_eq!(detail["handed_to"], next.as_str(), "{detail}");
        assert!(!phases(&lines).contains(&"intent".to_string()));
        // This machine's next start does not run it again: the fleet has it.
        assert_eq!(restarts, 0);
    }
}

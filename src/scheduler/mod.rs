//! The one consumer of triggers: what it can say alone (no runbook, out of
//! scope, the kill switch), then the [`SharedState`]'s admission for the rest, each outcome
//! counted and recorded once, the accepted ones on disk (`queued`), then a
//! run under the global concurrency limit.
//!
//! [`Scheduler::submit_candidates`] decides synchronously and returns each
//! trigger's one recorded outcome, so the webhook can answer only once every
//! alert has one; the run itself continues in its own task, and
//! `Scheduler::end` closes it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::audit::{AuditLog, Phase, RunInfo};
use crate::config::Config;
use crate::gate::KillSwitch;
use crate::metrics::Metrics;
use crate::run::{RunReport, RunRequest, Runner};
use crate::state::SharedState;
use crate::store::Lease;
use crate::verdict::Verdict;

mod batch;
mod queue;
mod reports;
#[cfg(test)]
mod tests;

pub(crate) use batch::{Outcome, SubmitError};
pub(crate) use reports::{NoReport, Reports};

/// What becomes of each trigger: the kill switch, one run per runbook and
/// host, cooldown, dedupe, the concurrency limit; then the run, on a thread
/// of its own.
pub(crate) struct Scheduler {
    config: watch::Receiver<Arc<Config>>,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    /// Reports of recent runs, for the API.
    pub(crate) reports: Arc<Reports>,
    /// Decides what this daemon cannot decide alone, and records it; and
    /// the rest one machine and a fleet must agree on.
    state: Arc<dyn SharedState>,
    /// The global limit on runs in flight, and the limit it holds now
    /// (`max_concurrent_runs` of the config in force: a reload changes it).
    permits: Arc<Semaphore>,
    limit: Mutex<usize>,
    /// How many run tasks exist (waiting for a permit or running).
    active: watch::Sender<usize>,
    shutdown: watch::Receiver<bool>,
    /// Open approval requests (L2), when approvers are configured.
    pub(crate) approvals: Option<Arc<crate::gate::approvals::Approvals>>,
    /// Held from deciding a batch to recording it: a trigger is only ever
    /// deduplicated against a run whose trigger is already on disk.
    submitting: tokio::sync::Mutex<()>,
    /// The demotions every run's gate asks, one for all runs so the audit
    /// log's record of them is read once and followed (made again when a
    /// reload moves the state directory or the log).
    demotions: Mutex<Option<crate::gate::Demotions>>,
    /// The alerts this daemon's runs saw clear (`done_when`), for `recurred`.
    clears: Arc<crate::done_when::Clears>,
    /// Who is told of approval requests (the webhook, Slack).
    chat: Arc<crate::chat::Outbox>,
}

impl Scheduler {
    /// A scheduler for the configuration in `config`, writing to `audit`.
    pub(crate) fn new(
        config: watch::Receiver<Arc<Config>>,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
        approvals: Option<Arc<crate::gate::approvals::Approvals>>,
        state: Arc<dyn SharedState>,
    ) -> Arc<Scheduler> {
        let limit = config.borrow().settings.max_concurrent_runs;
        Arc::new(Scheduler {
            clears: Default::default(),
            chat: Default::default(),
            config,
            audit,
            metrics,
            reports: Default::default(),
            state,
            permits: Arc::new(Semaphore::new(limit)),
            limit: Mutex::new(limit),
            active: watch::channel(0).0,
            shutdown,
            approvals,
            submitting: Default::default(),
            demotions: Mutex::default(),
        })
    }

    /// Whether this daemon is shutting down (it starts no new run).
    pub(crate) fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// The kill switch as this daemon sees it: its directory, and the fleet's.
    fn demotions(&self, config: &Config) -> crate::gate::Demotions {
        let mut held = self.demotions.lock().unwrap_or_else(|p| p.into_inner());
        match held.as_ref() {
            Some(d) if d.is_of(&config.settings) => d.clone(),
            _ => {
                let d = self.state.demotions(&config.settings);
                *held = Some(d.clone());
                d
            }
        }
    }

    pub(crate) fn killswitch(&self, config: &Config) -> KillSwitch {
        self.state.kill_switch(&config.settings.kill_switch_dir)
    }

    /// Bring the number of run permits to `max_concurrent_runs` of `config`:
    /// more at once, or fewer as runs in flight give theirs back.
    fn apply_limit(&self, config: &Config) {
        let want = config.settings.max_concurrent_runs;
        let mut limit = self.limit.lock().unwrap_or_else(|p| p.into_inner());
        if want > *limit {
            self.permits.add_permits(want - *limit);
        } else if want < *limit {
            let (fewer, permits) = ((*limit - want) as u32, self.permits.clone());
            tokio::spawn(async move {
                if let Ok(p) = permits.acquire_many_owned(fewer).await {
                    p.forget();
                }
            });
        }
        if want != *limit {
            tracing::info!("max_concurrent_runs is now {want} (was {})", *limit);
            *limit = want;
        }
    }

    /// Start an admitted run: wait for a run permit, then run it on a
    /// thread of its own and [`end`](Self::end) it. True when it went
    /// straight to its thread (a permit was free), false when it waits.
    fn start(
        self: &Arc<Self>,
        config: Arc<Config>,
        run_id: String,
        req: RunRequest,
        lease: Option<Lease>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> bool {
        self.apply_limit(&config);
        self.active.send_modify(|n| *n += 1);
        // A free permit: straight to the run's own thread, with no task
        // between the answer to the trigger and the run's first line.
        if let Some(permit) = permit.or_else(|| self.permits.clone().try_acquire_owned().ok()) {
            let this = self.clone();
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                let outcome = crate::process::on_own_thread(|| {
                    runtime.block_on(this.run(&config, &run_id, &req, lease))
                });
                this.finish(&config, &run_id, &req, outcome, permit);
            });
            return true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let permit = this.permits.clone().acquire_owned().await;
            // A run blocks on fsync and waits on its tools: it gets a thread of
            // its own, so the webhook and /metrics never wait behind it.
            let runtime = tokio::runtime::Handle::current();
            let inner = this.clone();
            let (cfg, id, run_req) = (config.clone(), run_id.clone(), req.clone());
            let outcome = tokio::task::spawn_blocking(move || {
                crate::process::on_own_thread(|| {
                    runtime.block_on(inner.run(&cfg, &id, &run_req, lease))
                })
            })
            .await
            .unwrap_or_else(|e| {
                (
                    Instant::now(),
                    Err(crate::run::StartError::Unreachable(format!(
                        "the run's thread failed: {e}"
                    ))),
                )
            });
            this.finish(&config, &run_id, &req, outcome, permit);
        });
        false
    }

    /// One run, from its runner to its report (on the run's own thread).
    async fn run(
        &self,
        config: &Arc<Config>,
        run_id: &str,
        req: &RunRequest,
        lease: Option<Lease>,
    ) -> (Instant, Result<RunReport, crate::run::StartError>) {
        self.metrics
            .runs_started
            .with_label_values(&[&req.runbook, req.trigger.as_str()])
            .inc();
        self.metrics.runs_in_flight.inc();
        let runner = Runner {
            config: config.clone(),
            audit: self.audit.clone(),
            killswitch: self.killswitch(config),
            demotions: self.demotions(config),
            state: self.state.clone(),
            metrics: Some(self.metrics.clone()),
            shutdown: Some(self.shutdown.clone()),
            approvals: self.approvals.clone(),
            chat: Some(self.chat.clone()),
            model_progress: None,
            clears: Some(self.clears.clone()),
        };
        self.reports.starting(run_id);
        let started = Instant::now();
        (started, runner.run_as(req, run_id.to_string(), lease).await)
    }

    /// After a run: its end, then its permit and its place in the count of active runs.
    fn finish<P>(
        &self,
        config: &Config,
        run_id: &str,
        req: &RunRequest,
        (started, outcome): (Instant, Result<RunReport, crate::run::StartError>),
        permit: P,
    ) {
        self.end(config, run_id, req, started, outcome);
        drop(permit);
        self.active.send_modify(|n| *n -= 1);
    }

    /// A run ended (or could not start): free its (runbook, host) slot,
    /// count its verdict, and give a run that could not start its one
    /// verdict line all the same.
    fn end(
        &self,
        config: &Config,
        run_id: &str,
        req: &RunRequest,
        started: Instant,
        outcome: Result<RunReport, crate::run::StartError>,
    ) {
        // The slot first: once the metrics say the run ended, a new
        // trigger for this runbook and host can start.
        let cleared = outcome.as_ref().is_ok_and(|r| {
            r.verdict == crate::verdict::Verdict::Ok
                && r.alert_check
                    .as_ref()
                    .is_some_and(|c| c.outcome == "cleared")
        });
        self.state.ended(req, cleared);
        self.metrics.runs_in_flight.dec();
        // A run the shutdown kept from starting (it waited for its run
        // lock) is handed to the next start, as one stopped before its
        // first call is (on this machine's own state).
        // With shared state, one the runner handed to the fleet's queue.
        let handed_to = match &outcome {
            Err(crate::run::StartError::HandedBack { to, .. }) => Some(to.clone()),
            _ => None,
        };
        let handed = handed_to.is_some()
            || (outcome.is_err()
                && self.stopping()
                && !self.state.queues()
                && !req.dry_run
                && req.agent.is_none());
        let verdict = match &outcome {
            Ok(report) => report.verdict,
            Err(_) if handed => Verdict::Halted,
            Err(_) => Verdict::Broken,
        };
        self.metrics.run_finished(&req.runbook, verdict.as_str());
        self.metrics
            .run_duration
            .with_label_values(&[&req.runbook])
            .observe(started.elapsed().as_secs_f64());
        if matches!(verdict, Verdict::BudgetExhausted | Verdict::StepLimit) {
            self.metrics
                .budget_exhausted
                .with_label_values(&[&req.runbook])
                .inc();
        }
        if let Err(e) = &outcome {
            tracing::error!(runbook = %req.runbook, host = %req.host, "run could not start: {e}");
            // The accepted trigger ends with its one verdict all the same.
            let info = run_info(config, run_id, req);
            let (verdict, why, end) = match handed {
                true => (
                    Verdict::Halted,
                    match handed_to {
                        Some(_) => {
                            format!("runwarden is shutting down before this run could start: {e}")
                        }
                        None => format!(
                            "runwarden is shutting down before this run could start ({e}); its trigger is handed to the next start, which runs it again"
                        ),
                    },
                    Some(crate::audit::RunEnd {
                        duration_ms: started.elapsed().as_millis() as u64,
                        final_answer: None,
                        steps: 0,
                        mutations: 0,
                        suggestions: Vec::new(),
                        handed_back: true,
                        handed_to,
                        claims: Vec::new(),
                        model_suggestions: Vec::new(),
                        reason: None,
                        alert_cleared: false,
                    }),
                ),
                false => (
                    Verdict::Broken,
                    format!("the run could not start: {e}"),
                    None,
                ),
            };
            if let Err(err) = self.audit.verdict(&info, verdict, &why, end.as_ref()) {
                self.metrics.audit_write_failures.inc();
                tracing::error!(%run_id, "verdict line not written: {err}");
            }
        }
        self.reports.done(run_id, outcome);
    }

    /// Resolved alerts withdraw the approval requests of the runs they
    /// started (`on_resolved: withdraw_approvals`), here and, with shared
    /// state, on every replica; the approval webhook hears of each. The
    /// requests withdrawn. A run already making calls goes on: only a
    /// request still waiting for a person is withdrawn.
    pub(crate) async fn withdraw(
        &self,
        resolved: &[crate::trigger::alerts::Resolved],
    ) -> Vec<crate::gate::approvals::Request> {
        let Some(approvals) = &self.approvals else {
            return Vec::new();
        };
        let config = self.config.borrow().clone();
        let mut out: Vec<crate::gate::approvals::Request> = Vec::new();
        for r in resolved {
            let why = format!(
                "the alert that started the run ({}) resolved; replica {} heard it from Alertmanager",
                r.key, config.settings.replica
            );
            let mut withdrawn = approvals.withdraw(&r.runbook, &r.host, &r.key, &why);
            let state = crate::gate::approvals::State::Withdrawn { why: why.clone() };
            match self
                .state
                .withdraw_approvals(&r.runbook, &r.host, &r.key, &state)
                .await
            {
                Ok(more) => withdrawn.extend(more),
                Err(e) => {
                    tracing::warn!(runbook = %r.runbook, host = %r.host, "approval requests of other replicas not withdrawn: {e}; they wait until decided or expired")
                }
            }
            for req in withdrawn {
                if out.iter().any(|o| o.id == req.id) {
                    continue;
                }
                tracing::info!(approval_id = %req.id, run_id = %req.run_id, runbook = %req.runbook, host = %req.host, "approval withdrawn: {why}");
                out.push(req);
            }
        }
        out
    }

    /// What this daemon and the others it shares state with agree on.
    pub(crate) fn state(&self) -> &dyn SharedState {
        &*self.state
    }

    /// A run whose lease expired (its replica died or lost the database)
    /// was closed in the shared state by this replica: say so in this
    /// machine's audit log and metrics.
    pub(crate) fn closed_elsewhere(&self, run: &crate::store::Reaped, audit: &AuditLog) {
        let config = self.config.borrow().clone();
        let mut info = run_info(
            &config,
            &run.run_id,
            &RunRequest {
                runbook: run.runbook.clone(),
                host: run.host.clone(),
                dry_run: false,
                planner: Default::default(),
                trigger: crate::origin::Trigger::Api,
                alert: None,
                keys: Vec::new(),
                together: None,
                agent: None,
                by: None,
            },
        );
        info.planner = String::new();
        let why = format!(
            "closed by replica {}: the lease of replica {} expired during this run (it stopped, or lost the database); runs are not resumed, and a still-firing alert starts a new one",
            config.settings.replica, run.replica
        );
        tracing::warn!(run_id = %run.run_id, runbook = %run.runbook, host = %run.host, replica = %run.replica, "run closed as interrupted: its lease expired");
        if let Err(e) = audit.verdict(&info, Verdict::Interrupted, &why, None) {
            self.metrics.audit_write_failures.inc();
            tracing::error!(run_id = %run.run_id, "verdict line not written: {e}");
        }
        self.metrics
            .run_finished(&run.runbook, Verdict::Interrupted.as_str());
    }

    /// Wait until no run task is left, at most `grace`; true when all ended.
    pub(crate) async fn wait_idle(&self, grace: Duration) -> bool {
        let mut rx = self.active.subscribe();
        tokio::time::timeout(grace, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// Pick up where the last process left off, from one read of the audit
    /// log: close each run it started and never finished (its process is
    /// gone) with an `interrupted` verdict line, and restore cooldowns and
    /// deduplication keys, so a restart within a runbook's cooldown does not
    /// allow an immediate rerun. Returns how many runs were closed, and the
    /// triggers of runs the last stop handed back (see [`handed_back`]).
    pub(crate) fn recover(&self) -> std::io::Result<(usize, Vec<RunRequest>)> {
        let mut record = crate::audit::runs::recovery(self.audit.path())?;
        let unfinished = std::mem::take(&mut record.unfinished);
        let config = self.config.borrow().clone();
        let again = handed_back(&config, std::mem::take(&mut record.handed_back));
        let mut closed = 0;
        // Only runs whose process is gone: a `runwarden run` still going on
        // the command line closes its own run.
        for (start, keys) in unfinished
            .into_iter()
            .filter(|(e, _)| !crate::audit::process_alive(e))
        {
            let why = if start.phase == Some(Phase::Queued) {
                "the process stopped after accepting this trigger and before the run started; nothing ran (the trigger is not replayed)"
            } else {
                "the process stopped during this run; calls with an intent line and no result line may or may not have completed"
            };
            self.audit
                .verdict(&RunInfo::of(&start), Verdict::Interrupted, why, None)
                .map_err(std::io::Error::other)?;
            self.metrics
                .run_finished(&start.runbook, Verdict::Interrupted.as_str());
            // Its verdict line ends it now, as the log will say after a restart.
            record
                .ends
                .insert((start.runbook, start.host), (jiff::Timestamp::now(), keys));
            closed += 1;
        }
        self.state.restore(&record, self.audit.path());
        Ok((closed, again))
    }
}

/// How long after a stop its handed-back runs are still run again: a
/// daemon down for longer comes back to a world their triggers no longer
/// describe (a firing alert repeats through Alertmanager anyway).
const HAND_BACK_FOR: Duration = Duration::from_secs(3600);

/// The triggers of the runs the last stop handed back (stopped before they
/// proposed anything), to run again: each with its trigger, its keys (and
/// `resumes:RUN`, so it is taken over once), and the alert its line kept
/// (labels, summary and description, as `annotations`). Only on this machine's own state,
/// for a runbook and host still in the config, and stopped within the
/// last hour; the others are said in the log.
fn handed_back(
    config: &Config,
    runs: Vec<(crate::audit::Entry, Vec<String>, jiff::Timestamp)>,
) -> Vec<RunRequest> {
    let since =
        jiff::Timestamp::now() - jiff::SignedDuration::try_from(HAND_BACK_FOR).unwrap_or_default();
    let mut out = Vec::new();
    for (began, mut keys, stopped) in runs {
        let known = config
            .runbooks
            .get(&began.runbook)
            .is_some_and(|r| r.allows_host(&began.host) && config.hosts.contains_key(&began.host));
        let detail = began.detail.clone().unwrap_or_default();
        let trigger =
            serde_json::from_value::<crate::origin::Trigger>(detail["trigger"].clone()).ok();
        match trigger {
            // A command's run and an agent's session end with their caller.
            Some(trigger)
                if known
                    && stopped > since
                    && !matches!(
                        trigger,
                        crate::origin::Trigger::Cli | crate::origin::Trigger::Mcp
                    ) =>
            {
                keys.push(crate::audit::runs::resumes_key(&began.run_id));
                let mut req = RunRequest::cli(began.runbook.clone(), began.host.clone(), false);
                req.trigger = trigger;
                req.keys = keys;
                req.alert = crate::audit::alert_of_record(&detail["alert"]);
                out.push(req);
            }
            _ => tracing::info!(
                run_id = %began.run_id,
                "run {} ({} on {}) was handed back by the last stop at {stopped} but is not run again: {}",
                began.run_id,
                began.runbook,
                began.host,
                if !known { "its runbook or host is no longer in the configuration" } else if stopped <= since { "it was stopped more than an hour ago" } else { "a person or an agent's session started it" }
            ),
        }
    }
    out
}

/// What every line of a trigger's run carries before the run itself starts.
fn run_info(config: &Config, run_id: &str, req: &RunRequest) -> RunInfo {
    RunInfo {
        run_id: run_id.to_string(),
        runbook: req.runbook.clone(),
        runbook_version: config
            .runbooks
            .get(&req.runbook)
            .map(|r| r.version.clone())
            .unwrap_or_default(),
        host: req.host.clone(),
        planner: String::new(),
        model: None,
        prompt: None,
    }
}

impl crate::trigger::Submit for Arc<Scheduler> {
    type Error = SubmitError;

    async fn submit(&self, reqs: Vec<RunRequest>) -> Result<(), SubmitError> {
        Scheduler::submit_all(self, reqs).await.map(drop)
    }
}

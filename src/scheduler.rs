//! The one consumer of run requests: kill switch, per-(runbook, host)
//! exclusivity, cooldown and deduplication, then a run under the global
//! concurrency limit.
//!
//! [`Scheduler::submit`] decides synchronously and returns the trigger's one
//! recorded outcome, so the webhook can answer only once every alert has
//! one; the run itself continues in its own task.
//!
//! About a fifth of its 760 lines are its unit tests (paused time); the
//! rest is one concept, what becomes of a trigger, decided on this machine
//! alone or, with shared state, across replicas.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use serde::Serialize;
use tokio::sync::{Semaphore, watch};

use crate::audit::{AuditError, AuditLog, Phase, Queued, RunInfo};
use crate::config::Config;
use crate::gate::KillSwitch;
use crate::metrics::Metrics;
use crate::run::{RunReport, RunRequest, Runner};
use crate::store::{Admitted, Lease, Postgres, StoreError};
use crate::verdict::Verdict;

/// What became of a trigger. The names are `runwarden_alert_triggers_total` labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerResult {
    /// A run was started.
    Started,
    /// A run for the same alert or group is queued or running.
    Deduplicated,
    /// The runbook ran on the host too recently.
    Cooldown,
    /// The alert names a host the runbook may not touch.
    OutOfScope,
    /// The kill switch is engaged.
    KillSwitch,
    /// No runbook matched the alert.
    NoMatch,
    /// The alert holds what cannot be kept (a NUL byte); it starts nothing.
    Invalid,
}

impl TriggerResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerResult::Started => "started",
            TriggerResult::Deduplicated => "deduplicated",
            TriggerResult::Cooldown => "cooldown",
            TriggerResult::OutOfScope => "out_of_scope",
            TriggerResult::KillSwitch => "kill_switch",
            TriggerResult::NoMatch => "no_match",
            TriggerResult::Invalid => "invalid",
        }
    }
}

/// What this daemon alone can say of a trigger.
#[derive(Debug)]
enum Admission {
    /// The outcome.
    Decided(TriggerResult),
    /// In scope and not stopped here: the shared state decides the rest.
    Fleet,
}

/// How long after a run ends a repeat of its own trigger (the same alert
/// fingerprint or group, the same schedule fire) is still a duplicate,
/// whatever the cooldown: Alertmanager in HA mode sends a notification
/// twice now and then, and every replica fires the same schedule. Well
/// under Alertmanager's shortest sensible `group_interval`, so a real
/// repeat of a still-firing alert starts a run again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(60);

/// The state of one (runbook, host) pair.
#[derive(Default)]
pub(crate) struct Slot {
    in_flight: bool,
    ended: Option<Instant>,
    /// Fingerprints and group keys of the current or last run's triggers.
    keys: BTreeSet<String>,
}

impl Slot {
    /// The slot as the audit log leaves it: the last run ended at `ended`,
    /// started by `keys` (start-up, and `runwarden alerts test`).
    pub(crate) fn from_log(ended: jiff::Timestamp, keys: Vec<String>) -> Slot {
        let ago = Duration::try_from(jiff::Timestamp::now().duration_since(ended))
            .unwrap_or(Duration::ZERO);
        Slot {
            in_flight: false,
            ended: Some(Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)),
            keys: keys.into_iter().collect(),
        }
    }

    /// What a trigger with `keys` comes to against this slot, under the
    /// runbook's `cooldown`: a run in flight, or a repeat of the last run's
    /// triggers within [`DUPLICATE_WINDOW`] or the cooldown, is
    /// deduplicated; another within the cooldown waits it out; `None`: it
    /// starts. How long ago the last run ended comes with a cooldown.
    pub(crate) fn refuses(
        &self,
        keys: &[String],
        cooldown: Option<Duration>,
    ) -> Option<(TriggerResult, Option<Duration>)> {
        if self.in_flight {
            return Some((TriggerResult::Deduplicated, None));
        }
        let ago = self.ended?.elapsed();
        let repeat = keys.iter().any(|k| self.keys.contains(k));
        if repeat && ago < DUPLICATE_WINDOW {
            return Some((TriggerResult::Deduplicated, Some(ago)));
        }
        if ago >= cooldown? {
            return None;
        }
        Some(match repeat {
            true => (TriggerResult::Deduplicated, Some(ago)),
            false => (TriggerResult::Cooldown, Some(ago)),
        })
    }
}

/// The full reports of recent runs this daemon ran, for `GET
/// /api/v1/runs/{id}`; what every run is and how it ended is read from the
/// audit log (see [`crate::audit::runs`]), so only the report lives here.
#[derive(Default)]
pub struct Reports {
    reports: Mutex<VecDeque<RunReport>>,
    /// Runs of this daemon whose report is not kept yet: their verdict line
    /// may already be in the log, but for the API they end with the report.
    finishing: Mutex<std::collections::HashSet<String>>,
}

const KEEP_REPORTS: usize = 500;

impl Reports {
    fn starting(&self, run_id: &str) {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id.to_string());
    }

    /// The run is over here: its report, if it got one, is kept first.
    fn done(&self, run_id: &str, report: Option<RunReport>) {
        if let Some(report) = report {
            let mut reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            reports.push_back(report);
            while reports.len() > KEEP_REPORTS {
                reports.pop_front();
            }
        }
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
    }

    /// Whether this daemon is still finishing the run (its report is not kept yet).
    pub fn finishing(&self, run_id: &str) -> bool {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(run_id)
    }

    /// A kept report of run `run_id`.
    pub fn get(&self, run_id: &str) -> Option<RunReport> {
        let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        reports.iter().find(|r| r.run_id == run_id).cloned()
    }
}

/// What becomes of each trigger: the kill switch, one run per runbook and
/// host, cooldown, dedupe, the concurrency limit; then the run, on a thread
/// of its own.
pub struct Scheduler {
    config: watch::Receiver<Arc<Config>>,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    /// Reports of recent runs, for the API.
    pub reports: Arc<Reports>,
    slots: Mutex<HashMap<(String, String), Slot>>,
    /// The global limit on runs in flight, and the limit it holds now
    /// (`max_concurrent_runs` of the config in force: a reload changes it).
    permits: Arc<Semaphore>,
    limit: Mutex<usize>,
    /// How many run tasks exist (waiting for a permit or running).
    active: watch::Sender<usize>,
    shutdown: watch::Receiver<bool>,
    /// Open approval requests (L2), when approvers are configured.
    pub approvals: Option<Arc<crate::gate::approvals::Approvals>>,
    /// Held from deciding a batch to recording it: a trigger is only ever
    /// deduplicated against a run whose trigger is already on disk.
    submitting: tokio::sync::Mutex<()>,
    /// State shared with other daemons: admission, leases, the fleet's
    /// switch. `None`: this machine decides alone.
    store: Option<Arc<Postgres>>,
}

/// Why a batch of triggers could not be accepted: none of them starts, and
/// the sender is told to retry (503).
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The accepted triggers could not be written to the audit log.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The shared state could not decide them.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Scheduler {
    /// A scheduler for the configuration in `config`, writing to `audit`.
    pub fn new(
        config: watch::Receiver<Arc<Config>>,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
        approvals: Option<Arc<crate::gate::approvals::Approvals>>,
        store: Option<Arc<Postgres>>,
    ) -> Arc<Scheduler> {
        let limit = config.borrow().settings.max_concurrent_runs;
        Arc::new(Scheduler {
            config,
            audit,
            metrics,
            reports: Default::default(),
            slots: Default::default(),
            permits: Arc::new(Semaphore::new(limit)),
            limit: Mutex::new(limit),
            active: watch::channel(0).0,
            shutdown,
            approvals,
            submitting: Default::default(),
            store,
        })
    }

    /// Decide what becomes of one trigger, record it, and start the run if it is one.
    #[allow(
        clippy::expect_used,
        reason = "submit_all returns one result per request, in order"
    )]
    pub async fn submit(self: &Arc<Self>, req: RunRequest) -> Result<TriggerResult, SubmitError> {
        Ok(self
            .submit_all(vec![req])
            .await?
            .pop()
            .expect("one result per request")
            .0)
    }

    /// Decide a batch (one notification's alerts), looking at the kill switch
    /// once per runbook rather than once per alert.
    ///
    /// Each outcome comes with the run id of a run it started. An error means
    /// the accepted triggers could not be recorded: none of them starts, and
    /// the sender must be told to retry.
    pub async fn submit_all(
        self: &Arc<Self>,
        reqs: Vec<RunRequest>,
    ) -> Result<Vec<(TriggerResult, Option<String>)>, SubmitError> {
        self.submit_notification(reqs, Vec::new()).await
    }

    /// [`submit_all`](Self::submit_all) for a notification whose
    /// `unmatched` alerts were decided before they could become a run (no runbook takes
    /// them, or not for the host they name): with shared state, their
    /// outcomes are recorded with the rest, in the same round trip, so the
    /// fleet's table holds every alert's one outcome.
    pub async fn submit_notification(
        self: &Arc<Self>,
        reqs: Vec<RunRequest>,
        unmatched: Vec<crate::store::Recorded>,
    ) -> Result<Vec<(TriggerResult, Option<String>)>, SubmitError> {
        let _one_batch_at_a_time = self.submitting.lock().await;
        let config = self.config.borrow().clone();
        let mut engaged: HashMap<String, bool> = HashMap::new();
        // First what this daemon can say alone; then, with shared state, the
        // rest of the notification in one round trip.
        let mut decided: Vec<Option<TriggerResult>> = Vec::with_capacity(reqs.len());
        let mut fleet = Vec::new();
        // With shared state: the outcomes decided here alone, for the fleet's record.
        let mut alone = if self.store.is_some() {
            unmatched
        } else {
            Vec::new()
        };
        for req in &reqs {
            let stopped = *engaged.entry(req.runbook.clone()).or_insert_with(|| {
                *self.shutdown.borrow() || self.killswitch(&config).check(&req.runbook).is_err()
            });
            match self.decide(&config, req, stopped) {
                Admission::Decided(result) => {
                    if self.store.is_some() {
                        alone.push(crate::store::Recorded {
                            runbook: req.runbook.clone(),
                            host: req.host.clone(),
                            trigger: req.trigger.as_str(),
                            keys: req.keys.clone(),
                            outcome: result.as_str(),
                        });
                    }
                    decided.push(Some(result));
                }
                Admission::Fleet => {
                    fleet.push(crate::store::Admit {
                        runbook: req.runbook.clone(),
                        host: req.host.clone(),
                        keys: req.keys.clone(),
                        cooldown: config.runbooks.get(&req.runbook).and_then(|r| r.cooldown),
                        run_id: uuid::Uuid::now_v7().to_string(),
                        trigger: req.trigger.as_str(),
                    });
                    decided.push(None);
                }
            }
        }
        let admitted = match (&self.store, fleet.is_empty()) {
            (Some(store), false) => match store.admit(&fleet).await {
                Ok(outcomes) => outcomes,
                Err(e) => {
                    tracing::error!("the shared state cannot decide triggers, so none starts: {e}");
                    return Err(e.into());
                }
            },
            _ => Vec::new(),
        };
        let mut admitted = admitted
            .into_iter()
            .zip(fleet.into_iter().map(|a| a.run_id));
        let mut results = Vec::with_capacity(reqs.len());
        let mut accepted: Vec<(String, RunRequest, Option<Lease>)> = Vec::new();
        for (req, here) in reqs.into_iter().zip(decided) {
            // A run started: its id, and its lease in the shared state.
            let (result, started) = match here {
                Some(TriggerResult::Started) => (
                    TriggerResult::Started,
                    Some((uuid::Uuid::now_v7().to_string(), None)),
                ),
                Some(result) => (result, None),
                None => match admitted.next() {
                    Some((Admitted::Started(lease), run_id)) => {
                        (TriggerResult::Started, Some((run_id, Some(lease))))
                    }
                    Some((Admitted::Cooldown, _)) => (TriggerResult::Cooldown, None),
                    Some((Admitted::KillSwitch, _)) => (TriggerResult::KillSwitch, None),
                    // The fleet answers every trigger it is given, or fails whole.
                    Some((Admitted::Deduplicated, _)) | None => (TriggerResult::Deduplicated, None),
                },
            };
            self.count(&req, result);
            let run_id = started.map(|(run_id, lease)| {
                accepted.push((run_id.clone(), req, lease));
                run_id
            });
            results.push((result, run_id));
        }
        if let (Some(store), false) = (&self.store, alone.is_empty())
            && let Err(e) = store.record_triggers(&alone).await
        {
            self.abandon(&accepted).await;
            tracing::error!("the shared state cannot record triggers, so none starts: {e}");
            return Err(e.into());
        }
        if accepted.is_empty() {
            return Ok(results);
        }
        // Every accepted trigger is on disk (one write and one fsync for the
        // notification) before the sender hears so and before its run can
        // write anything: a trigger answered 2xx is never silently lost, and
        // one that could not be recorded is refused so that it is sent again.
        let lines: Vec<Queued> = accepted
            .iter()
            .map(|(id, req, _)| Queued {
                run: run_info(&config, id, req),
                trigger: req.trigger,
                keys: &req.keys,
                alert: req.alert.as_ref(),
            })
            .collect();
        if let Err(e) = self.audit.queued(&lines) {
            self.metrics.audit_write_failures.inc();
            tracing::error!(
                "{} accepted trigger(s) could not be recorded, so none starts: {e}",
                accepted.len()
            );
            {
                let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
                for (_, req, _) in &accepted {
                    if let Some(slot) = slots.get_mut(&(req.runbook.clone(), req.host.clone())) {
                        slot.in_flight = false;
                        slot.keys.clear();
                    }
                }
            }
            self.abandon(&accepted).await;
            return Err(e.into());
        }
        for (run_id, req, lease) in accepted {
            self.start(config.clone(), run_id, req, lease);
        }
        Ok(results)
    }

    /// The kill switch as this daemon sees it: its directory, and the fleet's.
    fn killswitch(&self, config: &Config) -> KillSwitch {
        KillSwitch::new(config.settings.kill_switch_dir.clone())
            .with_fleet(self.store.as_ref().map(|s| s.switch.clone()))
    }

    /// Give back the fleet's claims of runs that will not start after all.
    async fn abandon(&self, accepted: &[(String, RunRequest, Option<Lease>)]) {
        let ids: Vec<String> = accepted
            .iter()
            .filter(|(_, _, lease)| lease.is_some())
            .map(|(id, _, _)| id.clone())
            .collect();
        if let (Some(store), false) = (&self.store, ids.is_empty())
            && let Err(e) = store.abandon(&ids).await
        {
            tracing::warn!(
                "{} claim(s) not given back ({e}); they expire with their lease",
                ids.len()
            );
        }
    }

    fn count(&self, req: &RunRequest, result: TriggerResult) {
        if req.trigger == crate::trigger::Trigger::Alert {
            self.metrics
                .alert_triggers
                .with_label_values(&[&req.runbook, result.as_str()])
                .inc();
        }
        tracing::info!(runbook = %req.runbook, host = %req.host, trigger = req.trigger.as_str(), result = result.as_str(), "trigger");
    }

    fn decide(&self, config: &Config, req: &RunRequest, stopped: bool) -> Admission {
        let Some(runbook) = config.runbooks.get(&req.runbook) else {
            return Admission::Decided(TriggerResult::NoMatch);
        };
        if !runbook.allows_host(&req.host) || !config.hosts.contains_key(&req.host) {
            return Admission::Decided(TriggerResult::OutOfScope);
        }
        if stopped {
            return Admission::Decided(TriggerResult::KillSwitch);
        }
        if self.store.is_some() {
            return Admission::Fleet;
        }
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots
            .entry((req.runbook.clone(), req.host.clone()))
            .or_default();
        if let Some((result, _)) = slot.refuses(&req.keys, runbook.cooldown) {
            if slot.in_flight {
                slot.keys.extend(req.keys.iter().cloned());
            }
            return Admission::Decided(result);
        }
        slot.in_flight = true;
        slot.keys = req.keys.iter().cloned().collect();
        Admission::Decided(TriggerResult::Started)
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
    /// thread of its own and [`end`](Self::end) it.
    fn start(
        self: &Arc<Self>,
        config: Arc<Config>,
        run_id: String,
        req: RunRequest,
        lease: Option<Lease>,
    ) {
        self.apply_limit(&config);
        self.active.send_modify(|n| *n += 1);
        let this = self.clone();
        tokio::spawn(async move {
            let permit = this.permits.clone().acquire_owned().await;
            this.metrics
                .runs_started
                .with_label_values(&[&req.runbook, req.trigger.as_str()])
                .inc();
            this.metrics.runs_in_flight.inc();
            let runner = Runner {
                config: config.clone(),
                audit: this.audit.clone(),
                killswitch: this.killswitch(&config),
                store: this.store.clone(),
                metrics: Some(this.metrics.clone()),
                shutdown: Some(this.shutdown.clone()),
                approvals: this.approvals.clone(),
                approval_webhook: config.settings.approval_webhook.clone(),
            };
            this.reports.starting(&run_id);
            let started = Instant::now();
            // A run blocks on fsync and waits on its tools: it gets a thread of
            // its own, so the webhook and /metrics never wait behind it.
            let runtime = tokio::runtime::Handle::current();
            let (run_req, id) = (req.clone(), run_id.clone());
            let outcome = tokio::task::spawn_blocking(move || {
                crate::process::on_own_thread(|| {
                    runtime.block_on(runner.run_as(&run_req, id, lease))
                })
            })
            .await
            .unwrap_or_else(|e| {
                Err(crate::run::StartError::Unreachable(format!(
                    "the run's thread failed: {e}"
                )))
            });
            this.end(&config, &run_id, &req, started, outcome);
            drop(permit);
            this.active.send_modify(|n| *n -= 1);
        });
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
        {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let slot = slots
                .entry((req.runbook.clone(), req.host.clone()))
                .or_default();
            slot.in_flight = false;
            slot.ended = Some(Instant::now());
        }
        self.metrics.runs_in_flight.dec();
        let verdict = match &outcome {
            Ok(report) => report.verdict,
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
            let why = format!("the run could not start: {e}");
            if let Err(err) = self.audit.verdict(&info, Verdict::Broken, &why, None) {
                self.metrics.audit_write_failures.inc();
                tracing::error!(%run_id, "verdict line not written: {err}");
            }
        }
        self.reports.done(run_id, outcome.ok());
    }

    /// The shared state, when several daemons share one.
    pub fn store(&self) -> Option<&Arc<Postgres>> {
        self.store.as_ref()
    }

    /// A run whose lease expired (its replica died or lost the database)
    /// was closed in the shared state by this replica: say so in this
    /// machine's audit log and metrics.
    pub fn closed_elsewhere(&self, run: &crate::store::Reaped, audit: &AuditLog) {
        let config = self.config.borrow().clone();
        let mut info = run_info(
            &config,
            &run.run_id,
            &RunRequest {
                runbook: run.runbook.clone(),
                host: run.host.clone(),
                dry_run: false,
                planner: Default::default(),
                trigger: crate::trigger::Trigger::Api,
                alert: None,
                keys: Vec::new(),
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
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        let mut rx = self.active.subscribe();
        tokio::time::timeout(grace, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// Pick up where the last process left off, from one read of the audit
    /// log: close each run it started and never finished (its process is
    /// gone) with an `interrupted` verdict line, and restore cooldowns and
    /// deduplication keys, so a restart within a runbook's cooldown does not
    /// allow an immediate rerun. Returns how many runs were closed.
    pub fn recover(&self) -> std::io::Result<usize> {
        let crate::audit::runs::Recovery {
            unfinished,
            mut ends,
        } = crate::audit::runs::recovery(self.audit.path())?;
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
            ends.insert((start.runbook, start.host), (jiff::Timestamp::now(), keys));
            closed += 1;
        }
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for ((runbook, host), (ended, keys)) in ends {
            slots.insert((runbook, host), Slot::from_log(ended, keys));
        }
        Ok(closed)
    }
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

    async fn submit(&self, req: RunRequest) -> Result<(), SubmitError> {
        Scheduler::submit(self, req).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler over a real config directory: runbook `rb` on host `web`,
    /// with a one-hour cooldown.
    fn scheduler() -> (tempfile::TempDir, Arc<Config>, Arc<Scheduler>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for d in ["hosts", "runbooks", "kill-switch"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        std::fs::write(
            p.join("hosts/web.yaml"),
            "name: web\nconnection: local\npaths: [/tmp]\n",
        )
        .unwrap();
        std::fs::write(
            p.join("runbooks/rb.yaml"),
            "name: rb\ndescription: t\nhosts: [web]\nautonomy: L3\ncooldown: 1h\ntools:\n  observe: [disk_usage]\nsteps: [{ call: disk_usage, args: { path: /tmp } }]\n",
        )
        .unwrap();
        let config = Arc::new(Config::load(p).unwrap());
        let audit = Arc::new(AuditLog::open(&p.join("state/audit.jsonl")).unwrap());
        let metrics = Arc::new(Metrics::new(prometheus::Registry::new()));
        let (_, shutdown) = watch::channel(false);
        let s = Scheduler::new(
            watch::channel(config.clone()).1,
            audit,
            metrics,
            shutdown,
            None,
            None,
        );
        (dir, config, s)
    }

    fn alert(keys: &[&str]) -> RunRequest {
        let mut req = RunRequest::cli("rb".into(), "web".into(), false);
        req.trigger = crate::trigger::Trigger::Alert;
        req.keys = keys.iter().map(|k| k.to_string()).collect();
        req
    }

    /// Without shared state, this daemon decides every trigger alone.
    fn decided(a: Admission) -> TriggerResult {
        match a {
            Admission::Decided(r) => r,
            Admission::Fleet => panic!("no shared state here"),
        }
    }

    /// The end of a run, as the run's task records it.
    fn ended(s: &Scheduler) {
        let mut slots = s.slots.lock().unwrap();
        let slot = slots.get_mut(&("rb".into(), "web".into())).unwrap();
        slot.in_flight = false;
        slot.ended = Some(Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn cooldown_holds_for_its_hour_and_a_repeat_of_the_same_alert_is_a_duplicate() {
        let (_d, config, s) = scheduler();
        let decide = |keys: &[&str]| decided(s.decide(&config, &alert(keys), false));
        assert_eq!(decide(&["fp1"]), TriggerResult::Started);
        assert_eq!(decide(&["fp2"]), TriggerResult::Deduplicated, "in flight");
        ended(&s);
        assert_eq!(decide(&["fp3"]), TriggerResult::Cooldown);
        assert_eq!(
            decide(&["fp1"]),
            TriggerResult::Deduplicated,
            "the alert the last run took"
        );
        tokio::time::advance(Duration::from_secs(3599)).await;
        assert_eq!(decide(&["fp3"]), TriggerResult::Cooldown, "a second early");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(decide(&["fp3"]), TriggerResult::Started);
    }

    /// Alertmanager in HA mode sends a notification twice now and then, and
    /// every replica's cron fires the same schedule: a repeat of the keys of
    /// a run that ended moments ago is a duplicate even without a cooldown.
    #[tokio::test(start_paused = true)]
    async fn a_repeat_of_the_last_runs_trigger_within_a_minute_is_a_duplicate_without_a_cooldown() {
        let slot = |ago: u64| {
            let mut s = Slot::from_log(jiff::Timestamp::now(), vec!["fp:a".into()]);
            s.ended = Some(Instant::now() - Duration::from_secs(ago));
            s
        };
        let keys = |k: &str| vec![k.to_string()];
        assert_eq!(
            slot(5).refuses(&keys("fp:a"), None).map(|r| r.0),
            Some(TriggerResult::Deduplicated)
        );
        assert_eq!(
            slot(5).refuses(&keys("fp:b"), None),
            None,
            "another alert starts"
        );
        assert_eq!(
            slot(61).refuses(&keys("fp:a"), None),
            None,
            "a minute on, Alertmanager's repeat starts it again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_trigger_names_outside_the_config_never_starts_a_run() {
        let (_d, config, s) = scheduler();
        let mut other = alert(&[]);
        other.runbook = "nope".into();
        assert_eq!(
            decided(s.decide(&config, &other, false)),
            TriggerResult::NoMatch
        );
        let mut elsewhere = alert(&[]);
        elsewhere.host = "db".into();
        assert_eq!(
            decided(s.decide(&config, &elsewhere, false)),
            TriggerResult::OutOfScope
        );
        assert_eq!(
            decided(s.decide(&config, &alert(&[]), true)),
            TriggerResult::KillSwitch,
            "the switch is engaged"
        );
    }
}

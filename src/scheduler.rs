//! The one consumer of triggers: what it can say alone (no runbook, out of
//! scope, the kill switch), then [`Admission`] for the rest, each outcome
//! counted and recorded once, the accepted ones on disk (`queued`), then a
//! run under the global concurrency limit.
//!
//! [`Scheduler::submit_candidates`] decides synchronously and returns each
//! trigger's one recorded outcome, so the webhook can answer only once every
//! alert has one; the run itself continues in its own task, and
//! `Scheduler::end` closes it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::admission::{Admission, Admitted, Ask, Decided, Fleet, Local, TriggerResult};
use crate::audit::{AuditError, AuditLog, Phase, QueueNote, Queued, RunInfo};
use crate::config::Config;
use crate::gate::KillSwitch;
use crate::metrics::Metrics;
use crate::run::{RunReport, RunRequest, Runner};
use crate::store::{Lease, Postgres, StoreError};
use crate::trigger::alerts::Candidate;
use crate::verdict::Verdict;

/// The full reports of recent runs this daemon ran, for `GET
/// /api/v1/runs/{id}`; what every run is and how it ended is read from the
/// audit log (see [`crate::audit::runs`]), so only the report lives here.
#[derive(Default)]
pub(crate) struct Reports {
    reports: Mutex<VecDeque<RunReport>>,
    /// Runs of this daemon whose report is not kept yet: their verdict line
    /// may already be in the log, but for the API they end with the report.
    finishing: Mutex<std::collections::HashSet<String>>,
    /// Runs that could not start, and why (as many as reports are kept).
    unstarted: Mutex<VecDeque<(String, String)>>,
    /// Bumped as each run ends here: what waits for one looks again.
    ended: watch::Sender<u64>,
}

const KEEP_REPORTS: usize = 500;

impl Reports {
    fn starting(&self, run_id: &str) {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id.to_string());
    }

    /// The run is over here: its report, or why it could not start, is
    /// kept first.
    fn done(&self, run_id: &str, report: Result<RunReport, String>) {
        match report {
            Ok(report) => {
                let mut reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
                reports.push_back(report);
                while reports.len() > KEEP_REPORTS {
                    reports.pop_front();
                }
            }
            Err(why) => {
                let mut unstarted = self.unstarted.lock().unwrap_or_else(|p| p.into_inner());
                unstarted.push_back((run_id.to_string(), why));
                while unstarted.len() > KEEP_REPORTS {
                    unstarted.pop_front();
                }
            }
        }
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        self.ended.send_modify(|n| *n += 1);
    }

    /// Why run `run_id` could not start, if it could not.
    fn unstarted(&self, run_id: &str) -> Option<String> {
        let unstarted = self.unstarted.lock().unwrap_or_else(|p| p.into_inner());
        unstarted
            .iter()
            .find(|(id, _)| id == run_id)
            .map(|(_, why)| why.clone())
    }

    /// Wait for run `run_id` of this daemon to end: its report, or why it
    /// could not start.
    pub(crate) async fn ended(&self, run_id: &str) -> Result<RunReport, String> {
        let mut ended = self.ended.subscribe();
        loop {
            if let Some(report) = self.get(run_id) {
                return Ok(report);
            }
            if let Some(why) = self.unstarted(run_id) {
                return Err(why);
            }
            if ended.changed().await.is_err() {
                return Err("runwarden is stopping".into());
            }
        }
    }

    /// Whether this daemon is still finishing the run (its report is not kept yet).
    pub(crate) fn finishing(&self, run_id: &str) -> bool {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(run_id)
    }

    /// A kept report of run `run_id`.
    pub(crate) fn get(&self, run_id: &str) -> Option<RunReport> {
        let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        reports.iter().find(|r| r.run_id == run_id).cloned()
    }
}

/// What becomes of each trigger: the kill switch, one run per runbook and
/// host, cooldown, dedupe, the concurrency limit; then the run, on a thread
/// of its own.
pub(crate) struct Scheduler {
    config: watch::Receiver<Arc<Config>>,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    /// Reports of recent runs, for the API.
    pub(crate) reports: Arc<Reports>,
    /// Decides what this daemon cannot decide alone, and records it.
    admission: Arc<dyn Admission>,
    /// This machine's own admission (no shared state): restored from the log.
    local: Option<Arc<Local>>,
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
    /// State shared with other daemons: leases, the fleet's switch.
    /// `None`: this machine decides alone.
    store: Option<Arc<Postgres>>,
    /// The demotions every run's gate asks, one for all runs so the audit
    /// log's record of them is read once and followed (made again when a
    /// reload moves the state directory or the log).
    demotions: Mutex<Option<crate::gate::Demotions>>,
}

/// How long the answer to a trigger waits for a run's intent sync to make
/// its `queued` line durable before syncing it alone: a run that went
/// straight to its thread reaches its first call's intent line in well
/// under this; one that makes no call soon (it waits for a person, a
/// model) costs the sender this much.
const SYNC_GRACE: Duration = Duration::from_millis(5);

/// The longest a trigger is asked again while another replica's run that
/// holds its host is unconfirmed (see [`Scheduler::submit_candidates`]),
/// well inside Alertmanager's 10 s webhook timeout.
const PENDING_WAIT: Duration = Duration::from_secs(1);

/// Whether a batch is a schedule's fire (every candidate a schedule's run).
fn a_fire(candidates: &[Candidate]) -> bool {
    candidates
        .iter()
        .all(|c| matches!(c, Candidate::Run(r) if r.trigger == crate::origin::Trigger::Schedule))
}

/// A trigger admission started: run here (with its lease and, with
/// shared state, the permit held for it) or handed to the fleet's queue.
struct Accepted<'a> {
    req: &'a RunRequest,
    run_id: String,
    here: Option<(Option<Lease>, Option<OwnedSemaphorePermit>)>,
}

/// What became of one candidate, and the id of the run it started.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// What became of it.
    pub(crate) result: TriggerResult,
    /// The run it started.
    pub(crate) run_id: Option<String>,
}

/// Why a batch of triggers could not be accepted: none of them starts, and
/// the sender is told to retry (503).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    /// The accepted triggers could not be written to the audit log.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The shared state could not decide them.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Scheduler {
    /// A scheduler for the configuration in `config`, writing to `audit`.
    pub(crate) fn new(
        config: watch::Receiver<Arc<Config>>,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
        approvals: Option<Arc<crate::gate::approvals::Approvals>>,
        store: Option<Arc<Postgres>>,
    ) -> Arc<Scheduler> {
        let limit = config.borrow().settings.max_concurrent_runs;
        let local = store.is_none().then(|| Arc::new(Local::default()));
        let admission: Arc<dyn Admission> = match (&store, &local) {
            (Some(store), _) => Arc::new(Fleet::new(store.clone())),
            (None, Some(local)) => local.clone(),
            (None, None) => Arc::new(Local::default()),
        };
        Arc::new(Scheduler {
            config,
            audit,
            metrics,
            reports: Default::default(),
            admission,
            local,
            permits: Arc::new(Semaphore::new(limit)),
            limit: Mutex::new(limit),
            active: watch::channel(0).0,
            shutdown,
            approvals,
            submitting: Default::default(),
            store,
            demotions: Mutex::default(),
        })
    }

    /// Decide a batch of run requests (an API request's hosts, a
    /// schedule's fire): one outcome per request, in order.
    pub(crate) async fn submit_all(
        self: &Arc<Self>,
        reqs: Vec<RunRequest>,
    ) -> Result<Vec<Outcome>, SubmitError> {
        let candidates: Vec<Candidate> = reqs.into_iter().map(Candidate::Run).collect();
        self.submit_candidates(&candidates).await
    }

    /// Decide every candidate of a notification (or any batch of triggers):
    /// one outcome per candidate, in order, each counted and recorded once.
    /// The kill switch is looked at once per runbook. What this daemon can
    /// say alone is said first; [`Admission`] decides the rest and records
    /// them all (with shared state, in one round trip). Every trigger that
    /// starts a run is on disk (its `queued` line) before this returns.
    ///
    /// An error means the accepted triggers could not be recorded: none of
    /// them starts, and the sender must be told to retry.
    ///
    /// A trigger that meets a run another replica admitted and has not yet
    /// confirmed ([`TriggerResult::Pending`]) is asked again, backing off,
    /// for up to [`PENDING_WAIT`], after this batch's own runs are
    /// confirmed (so two replicas never wait on each other): a live
    /// replica confirms within milliseconds, and only one that stopped
    /// leaves the trigger `pending`, which the sender is told to retry.
    pub(crate) async fn submit_candidates(
        self: &Arc<Self>,
        candidates: &[Candidate],
    ) -> Result<Vec<Outcome>, SubmitError> {
        let _one_batch_at_a_time = self.submitting.lock().await;
        // A schedule's fire is decided once (`runwarden_fires`) and has no
        // sender to tell: its pending hosts are recorded as they are.
        let fire = a_fire(candidates);
        let mut outcomes = self.submit_batch(candidates, false).await?;
        let give_up = Instant::now()
            + if fire || self.stopping() {
                Duration::ZERO
            } else {
                PENDING_WAIT
            };
        let mut pause = Duration::from_millis(2);
        loop {
            let pending: Vec<usize> = (0..outcomes.len())
                .filter(|&i| outcomes[i].result == TriggerResult::Pending)
                .collect();
            if pending.is_empty() {
                return Ok(outcomes);
            }
            let last = Instant::now() + pause >= give_up;
            if !last {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            let again: Vec<Candidate> = pending.iter().map(|&i| candidates[i].clone()).collect();
            let retried = self.submit_batch(&again, last).await?;
            for (i, outcome) in pending.into_iter().zip(retried) {
                outcomes[i] = outcome;
            }
            if last {
                return Ok(outcomes);
            }
        }
    }

    /// One pass of [`submit_candidates`](Self::submit_candidates). A
    /// pending outcome of admission is neither counted nor recorded (it is
    /// asked again); with `give_up`, every candidate is decided `pending`
    /// here and recorded as such.
    async fn submit_batch(
        self: &Arc<Self>,
        candidates: &[Candidate],
        give_up: bool,
    ) -> Result<Vec<Outcome>, SubmitError> {
        let config = self.config.borrow().clone();
        // 1. What this daemon says alone, and what it asks admission.
        let mut engaged: HashMap<String, bool> = HashMap::new();
        let mut alone: Vec<Option<TriggerResult>> = Vec::with_capacity(candidates.len());
        // With shared state, the permits of the runs this replica claims now.
        let mut held: Vec<OwnedSemaphorePermit> = Vec::new();
        if self.store.is_some() {
            self.apply_limit(&config);
        }
        for c in candidates {
            alone.push(match c {
                Candidate::Run(_) if give_up => Some(TriggerResult::Pending),
                Candidate::Run(req) => self
                    .alone(&config, req, &mut engaged)
                    .or_else(|| self.agent_permit(req, &mut held)),
                Candidate::OutOfScope { .. } => Some(TriggerResult::OutOfScope),
                Candidate::NoMatch { .. } => Some(TriggerResult::NoMatch),
                Candidate::Invalid { .. } => Some(TriggerResult::Invalid),
            });
        }
        let asks: Vec<Ask> = candidates
            .iter()
            .zip(&alone)
            .filter_map(|(c, said)| match (c, said) {
                (Candidate::Run(req), None) => Some(Ask {
                    req,
                    cooldown: config.runbooks.get(&req.runbook).and_then(|r| r.cooldown),
                    cap: config.runbooks.get(&req.runbook).and_then(|r| r.max_runs),
                    run_id: uuid::Uuid::now_v7().to_string(),
                }),
                _ => None,
            })
            .collect();
        let decided: Vec<Decided> = candidates
            .iter()
            .zip(&alone)
            .filter_map(|(c, said)| {
                let result = (*said)?;
                let (runbook, host, keys, trigger) = c.names();
                Some(Decided {
                    runbook,
                    host,
                    keys,
                    trigger,
                    result,
                })
            })
            .collect();
        // 2. Admission decides the rest and records every outcome. With
        // shared state this replica claims only the runs it has a permit for
        // now; the fleet's queue keeps the others for whichever replica
        // frees one first.
        // A schedule fires on every replica at once: its runs all go to the
        // fleet's queue, so no replica holds permits idle while its
        // admission of the same fire waits on another's row locks.
        let fire = a_fire(candidates);
        if self.store.is_some() && !fire {
            while held.len() < asks.len()
                && let Ok(permit) = self.permits.clone().try_acquire_owned()
            {
                held.push(permit);
            }
        }
        let admitted = self
            .admission
            .admit(&asks, &decided, held.len())
            .await
            .map_err(|e| {
                tracing::error!("the shared state cannot decide triggers, so none starts: {e}");
                e
            })?;
        let mut admitted = asks.iter().zip(admitted);
        let mut outcomes = Vec::with_capacity(candidates.len());
        let mut accepted: Vec<Accepted> = Vec::new();
        for (c, said) in candidates.iter().zip(&alone) {
            let result = match said {
                Some(result) => *result,
                None => match admitted.next() {
                    Some((ask, Admitted::Started(lease))) => {
                        let permit = held.pop();
                        accepted.push(Accepted {
                            req: ask.req,
                            run_id: ask.run_id.clone(),
                            here: Some((lease, permit)),
                        });
                        TriggerResult::Started
                    }
                    Some((ask, Admitted::Queued)) => {
                        accepted.push(Accepted {
                            req: ask.req,
                            run_id: ask.run_id.clone(),
                            here: None,
                        });
                        TriggerResult::Started
                    }
                    Some((_, Admitted::Refused(result))) => result,
                    // Admission answers every ask it is given, or fails whole.
                    None => TriggerResult::Deduplicated,
                },
            };
            // 3. Counted once, whatever decided it (a pending one when it
            // is given up on).
            if said.is_some() || result != TriggerResult::Pending {
                self.count(c, result);
            }
            let run_id = match result {
                TriggerResult::Started => accepted.last().map(|a| a.run_id.clone()),
                _ => None,
            };
            outcomes.push(Outcome { result, run_id });
        }
        self.audit_refused_fires(candidates, &outcomes).await;
        // Permits not needed after all (a trigger was deduplicated) go back.
        drop(held);
        if accepted.is_empty() {
            return Ok(outcomes);
        }
        // 4. Every accepted trigger is in the log (one write for the batch)
        // before its run can write anything, and on disk before the sender
        // hears so: a trigger answered 2xx is never silently lost, and one
        // that could not be recorded is refused so that it is sent again.
        let lines: Vec<Queued> = accepted
            .iter()
            .map(|a| Queued {
                run: run_info(&config, &a.run_id, a.req),
                trigger: a.req.trigger,
                keys: &a.req.keys,
                origin: a.req.origin(),
                queue: match a.here {
                    Some(_) => QueueNote::Here,
                    None => QueueNote::Handed,
                },
            })
            .collect();
        // Written here when the log is free this instant, else on a
        // blocking thread (the log's lock may be held by a writer's
        // fsync); not yet synced. A write that fails refuses the batch.
        let entries = AuditLog::queued_lines(&lines);
        let audit = self.audit.clone();
        let thread_failed = |e: tokio::task::JoinError| crate::audit::AuditError::Io {
            path: self.audit.path().to_path_buf(),
            source: std::io::Error::other(format!("the writing thread failed: {e}")),
        };
        let recorded = match self.audit.try_append_queued(entries) {
            Ok(recorded) => recorded,
            Err(entries) => tokio::task::spawn_blocking(move || audit.append_queued(entries))
                .await
                .unwrap_or_else(|e| Err(thread_failed(e))),
        };
        let written = match recorded {
            Ok(w) => w,
            Err(e) => {
                self.metrics.audit_write_failures.inc();
                tracing::error!(
                    "{} accepted trigger(s) could not be recorded, so none starts: {e}",
                    accepted.len()
                );
                let started: Vec<(&RunRequest, String)> =
                    accepted.iter().map(|a| (a.req, a.run_id.clone())).collect();
                let _ = self.admission.abandon(&started).await;
                return Err(e.into());
            }
        };
        // 5. The runs start while the lines are synced: no run dispatches a
        // call before its intent line's sync, which covers these lines too,
        // and the sender hears nothing before this sync (or that one) is done.
        let count = accepted.len();
        let ids: Vec<String> = accepted.iter().map(|a| a.run_id.clone()).collect();
        let mut handed = Vec::new();
        let mut running = false;
        for a in accepted {
            match a.here {
                Some((lease, permit)) => {
                    running |= self.start(config.clone(), a.run_id, a.req.clone(), lease, permit)
                }
                None => handed.push(a.run_id),
            }
        }
        // A run that went straight to its thread syncs its intent line
        // within moments, and that sync covers these lines too: wait a
        // little for it rather than flush the device twice in a row.
        let grace = match running {
            true => SYNC_GRACE,
            false => Duration::ZERO,
        };
        let audit = self.audit.clone();
        let synced = tokio::task::spawn_blocking(move || audit.sync_through_within(written, grace))
            .await
            .unwrap_or_else(|e| Err(thread_failed(e)));
        if let Err(e) = synced {
            self.metrics.audit_write_failures.inc();
            tracing::error!(
                "{count} accepted trigger(s) were written but could not be synced; their runs refuse every call (each call's own sync fails the same way), and the sender is told to send again: {e}"
            );
            return Err(e.into());
        }
        // 6. The fleet hears that these triggers are on disk here: a retry
        // of one is a duplicate from now on, and queued runs may be taken.
        if let Some(store) = &self.store {
            self.confirm(store, &ids, &handed).await?;
        }
        Ok(outcomes)
    }

    /// Tell the fleet that runs admitted here have their triggers on disk
    /// (see [`Postgres::recorded`]). Runs this replica queued become
    /// takeable: for them it tries for as long as a lease, and runs the
    /// fleet removed meanwhile (this replica took longer than a lease to
    /// record them) will not run, so the sender is told to send again.
    /// When every run is this replica's own, one try: those runs go on
    /// whatever the answer, and until they end a retry of their trigger is
    /// answered `pending` rather than lost.
    async fn confirm(
        &self,
        store: &Postgres,
        ids: &[String],
        handed: &[String],
    ) -> Result<(), SubmitError> {
        if handed.is_empty() {
            if let Err(e) = store.recorded(ids, &[]).await {
                tracing::warn!(
                    "{} run(s) started here could not be confirmed to the fleet; they go on, and a trigger for their hosts is answered `pending` (retry) until they end: {e}",
                    ids.len()
                );
            }
            return Ok(());
        }
        let give_up = Instant::now() + store.lease;
        let marked = loop {
            match store.recorded(ids, handed).await {
                Ok(marked) => break marked,
                Err(e) if Instant::now() >= give_up => {
                    tracing::error!(
                        "{} queued run(s) could not be handed to the fleet; they are removed after a lease and the sender is told to send again: {e}",
                        handed.len()
                    );
                    return Err(e.into());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        if marked < handed.len() {
            let e = StoreError::Database(format!(
                "{} of {} queued run(s) were removed before this replica handed them over (it took longer than a lease to record them); they do not run, and the sender is told to send again",
                handed.len() - marked,
                handed.len()
            ));
            tracing::error!("{e}");
            return Err(e.into());
        }
        Ok(())
    }

    /// With shared state: whenever this replica has a free run permit,
    /// take runs from the fleet's queue and start them, as many as it has
    /// permits free, so admitted work spreads over every replica whichever
    /// received the trigger. Woken by the queue's notification, by a
    /// permit coming free, and every second (a notification missed while
    /// the listening connection was down is not lost).
    pub(crate) async fn take_queued(
        self: Arc<Self>,
        store: Arc<Postgres>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let config = self.config.borrow().clone();
            self.apply_limit(&config);
            // A permit first: only what can start now is taken.
            let first = tokio::select! {
                permit = self.permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            if *stop.borrow() {
                return;
            }
            let mut held = vec![first];
            while let Ok(permit) = self.permits.clone().try_acquire_owned() {
                held.push(permit);
            }
            let runbooks: Vec<String> = config.runbooks.keys().cloned().collect();
            match store.take(held.len(), runbooks).await {
                Ok(taken) if !taken.is_empty() => {
                    self.start_taken(&config, taken, held).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("the fleet's queue cannot be read: {e}"),
            }
            drop(held);
            tokio::select! {
                _ = store.queue_ready.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Start runs taken from the fleet's queue, each with one of `held`:
    /// their triggers go into this machine's log first (not synced: each
    /// run's intent sync covers them). A run whose line cannot be written
    /// does not start; its lease expires and a replica closes it
    /// `interrupted`.
    async fn start_taken(
        self: &Arc<Self>,
        config: &Arc<Config>,
        taken: Vec<crate::store::Taken>,
        mut held: Vec<OwnedSemaphorePermit>,
    ) {
        let mut runs = Vec::with_capacity(taken.len());
        for t in taken {
            match RunRequest::from_queue(t.runbook.clone(), t.host.clone(), &t.request) {
                Ok(req) => runs.push((t, req)),
                Err(e) => {
                    tracing::error!(run_id = %t.run_id, "a queued run cannot be read ({e}); it does not start, and its lease expires")
                }
            }
        }
        let lines: Vec<Queued> = runs
            .iter()
            .map(|(t, req)| Queued {
                run: run_info(config, &t.run_id, req),
                trigger: req.trigger,
                keys: &req.keys,
                origin: req.origin(),
                queue: QueueNote::TakenFrom(&t.queued_by),
            })
            .collect();
        let entries = AuditLog::queued_lines(&lines);
        let audit = self.audit.clone();
        let written = tokio::task::spawn_blocking(move || audit.append_queued(entries)).await;
        if !matches!(written, Ok(Ok(_))) {
            self.metrics.audit_write_failures.inc();
            tracing::error!(
                "{} run(s) taken from the fleet's queue could not be recorded here, so none starts; their leases expire and a replica closes them interrupted",
                runs.len()
            );
            return;
        }
        for (t, req) in runs {
            let permit = held.pop();
            self.start(config.clone(), t.run_id, req, Some(t.lease), permit);
        }
    }

    /// What this daemon says of a run request alone: no such runbook, a
    /// host out of its scope, the kill switch (looked at once per runbook
    /// in `engaged`) or a shutdown; `None`: admission decides.
    fn alone(
        &self,
        config: &Config,
        req: &RunRequest,
        engaged: &mut HashMap<String, bool>,
    ) -> Option<TriggerResult> {
        let Some(runbook) = config.runbooks.get(&req.runbook) else {
            return Some(TriggerResult::NoMatch);
        };
        if !runbook.allows_host(&req.host) || !config.hosts.contains_key(&req.host) {
            return Some(TriggerResult::OutOfScope);
        }
        // Shutting down, this daemon starts nothing new: the sender is told
        // to retry (503), which reaches another replica or this one when it
        // is back; it is no kill switch, and nothing is lost.
        if self.stopping() {
            return Some(TriggerResult::Pending);
        }
        let stopped = *engaged
            .entry(req.runbook.clone())
            .or_insert_with(|| self.killswitch(config).check(&req.runbook).is_err());
        stopped.then_some(TriggerResult::KillSwitch)
    }

    /// An agent's session plans its run on this replica, so with shared
    /// state its run never goes to the fleet's queue: it takes a permit now
    /// (MCP submits its run alone, so admission gives it that permit), or
    /// is `pending` while every permit is busy (asked again for a while,
    /// then the agent is told to retry).
    fn agent_permit(
        &self,
        req: &RunRequest,
        held: &mut Vec<OwnedSemaphorePermit>,
    ) -> Option<TriggerResult> {
        if req.agent.is_none() || self.store.is_none() {
            return None;
        }
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                held.push(permit);
                None
            }
            Err(_) => Some(TriggerResult::Pending),
        }
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
                let d = crate::audit::demotions(&config.settings)
                    .with_fleet(self.store.as_ref().map(|s| s.demoted.clone()));
                *held = Some(d.clone());
                d
            }
        }
    }

    fn killswitch(&self, config: &Config) -> KillSwitch {
        KillSwitch::new(config.settings.kill_switch_dir.clone())
            .with_fleet(self.store.as_ref().map(|s| s.switch.clone()))
    }

    /// Count what became of a candidate, and say so in the log.
    fn count(&self, c: &Candidate, result: TriggerResult) {
        let (runbook, host, _, trigger) = c.names();
        if result == TriggerResult::Capped {
            self.metrics
                .triggers_capped
                .with_label_values(&[runbook, host])
                .inc();
        }
        if trigger == crate::origin::Trigger::Alert {
            self.metrics
                .alert_triggers
                .with_label_values(&[runbook, result.as_str()])
                .inc();
        }
        match c.why() {
            Some(why) if matches!(c, Candidate::Invalid { .. }) => {
                tracing::warn!(%runbook, fingerprint = c.fingerprint(), result = result.as_str(), "trigger: the alert cannot be kept and starts nothing: {why}")
            }
            Some(why) => {
                tracing::info!(%runbook, %host, fingerprint = c.fingerprint(), result = result.as_str(), "trigger: {why}")
            }
            None => {
                tracing::info!(%runbook, %host, trigger = trigger.as_str(), result = result.as_str(), "trigger")
            }
        }
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
            store: self.store.clone(),
            metrics: Some(self.metrics.clone()),
            shutdown: Some(self.shutdown.clone()),
            approvals: self.approvals.clone(),
            approval_webhook: config.settings.approval_webhook.clone(),
            model_progress: None,
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
        self.admission.ended(req);
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
                && self.store.is_none()
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
        self.reports
            .done(run_id, outcome.map_err(|e| e.to_string()));
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
            if let Some(store) = &self.store {
                let state = crate::gate::approvals::State::Withdrawn { why: why.clone() };
                match store
                    .withdraw_approvals(&r.runbook, &r.host, &r.key, &state)
                    .await
                {
                    Ok(more) => withdrawn.extend(more),
                    Err(e) => {
                        tracing::warn!(runbook = %r.runbook, host = %r.host, "approval requests of other replicas not withdrawn: {e}; they wait until decided or expired")
                    }
                }
            }
            for req in withdrawn {
                if out.iter().any(|o| o.id == req.id) {
                    continue;
                }
                tracing::info!(approval_id = %req.id, run_id = %req.run_id, runbook = %req.runbook, host = %req.host, "approval withdrawn: {why}");
                if let Some(url) = &config.settings.approval_webhook {
                    approvals.notify(url.clone(), req.clone());
                }
                out.push(req);
            }
        }
        out
    }

    /// The shared state, when several daemons share one.
    pub(crate) fn store(&self) -> Option<&Arc<Postgres>> {
        self.store.as_ref()
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

    /// A schedule's fire the kill switch refused is in the audit log, one
    /// line per runbook naming its hosts (an alert's refusal is answered to
    /// its sender; a schedule has no sender).
    async fn audit_refused_fires(&self, candidates: &[Candidate], outcomes: &[Outcome]) {
        let mut refused: Vec<(String, Vec<String>)> = Vec::new();
        for (c, o) in candidates.iter().zip(outcomes) {
            let (runbook, host, _, trigger) = c.names();
            if trigger != crate::origin::Trigger::Schedule || o.result != TriggerResult::KillSwitch
            {
                continue;
            }
            match refused.iter_mut().find(|(r, _)| r == runbook) {
                Some((_, hosts)) => hosts.push(host.to_string()),
                None => refused.push((runbook.to_string(), vec![host.to_string()])),
            }
        }
        if refused.is_empty() {
            return;
        }
        let audit = self.audit.clone();
        let written = tokio::task::spawn_blocking(move || {
            refused
                .iter()
                .try_for_each(|(runbook, hosts)| audit.schedule_refused(runbook, hosts))
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            self.metrics.audit_write_failures.inc();
            tracing::error!("a schedule's fire the kill switch refused could not be audited");
        }
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
        if let Some(local) = &self.local {
            local.restore(&record, self.audit.path());
        }
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
        req.trigger = crate::origin::Trigger::Alert;
        req.keys = keys.iter().map(|k| k.to_string()).collect();
        req
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_trigger_names_outside_the_config_never_starts_a_run() {
        let (_d, config, s) = scheduler();
        let mut engaged = HashMap::new();
        let mut other = alert(&[]);
        other.runbook = "nope".into();
        assert_eq!(
            s.alone(&config, &other, &mut engaged),
            Some(TriggerResult::NoMatch)
        );
        let mut elsewhere = alert(&[]);
        elsewhere.host = "db".into();
        assert_eq!(
            s.alone(&config, &elsewhere, &mut engaged),
            Some(TriggerResult::OutOfScope)
        );
        assert_eq!(s.alone(&config, &alert(&[]), &mut engaged), None);
        engaged.insert("rb".into(), true);
        assert_eq!(
            s.alone(&config, &alert(&[]), &mut engaged),
            Some(TriggerResult::KillSwitch),
            "the switch is engaged"
        );
    }

    /// Every candidate of a notification gets one outcome, counted once:
    /// the run, its duplicate, and the alerts decided before admission.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_candidate_is_decided_and_counted_once() {
        let (_d, _config, s) = scheduler();
        let candidates = vec![
            Candidate::Run(alert(&["fp:1"])),
            Candidate::Run(alert(&["fp:2"])),
            Candidate::NoMatch {
                fingerprint: "f3".into(),
                keys: vec!["fp:f3".into()],
                why: "no runbook".into(),
            },
            Candidate::OutOfScope {
                runbook: "rb".into(),
                host: "db".into(),
                fingerprint: "f4".into(),
                keys: vec!["fp:f4".into()],
                why: "not its host".into(),
            },
        ];
        let got: Vec<TriggerResult> = s
            .submit_candidates(&candidates)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.result)
            .collect();
        assert_eq!(
            got,
            [
                TriggerResult::Started,
                TriggerResult::Deduplicated,
                TriggerResult::NoMatch,
                TriggerResult::OutOfScope
            ]
        );
        let counted = |runbook: &str, result: TriggerResult| {
            s.metrics
                .alert_triggers
                .with_label_values(&[runbook, result.as_str()])
                .get()
        };
        assert_eq!(counted("rb", TriggerResult::Started), 1);
        assert_eq!(counted("rb", TriggerResult::Deduplicated), 1);
        assert_eq!(counted("none", TriggerResult::NoMatch), 1);
        assert_eq!(counted("rb", TriggerResult::OutOfScope), 1);
        assert!(s.wait_idle(Duration::from_secs(20)).await, "the run ended");
    }

    /// A schedule's fire the kill switch refuses leaves an audit line
    /// naming the runbook and its hosts; an alert's refusal (answered to its
    /// sender) and a fire that starts leave none.
    #[tokio::test(start_paused = true)]
    async fn a_schedule_the_kill_switch_refused_is_in_the_audit_log() {
        let (dir, _config, s) = scheduler();
        let lines = || -> Vec<serde_json::Value> {
            std::fs::read_to_string(dir.path().join("state/audit.jsonl"))
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .filter(|l: &serde_json::Value| l["outcome"] == "refused")
                .collect()
        };
        std::fs::write(dir.path().join("kill-switch/ENGAGED"), "").unwrap();
        let mut fire = RunRequest::cli("rb".into(), "web".into(), false);
        fire.trigger = crate::origin::Trigger::Schedule;
        let got = s.submit_all(vec![fire.clone()]).await.unwrap();
        assert_eq!(got[0].result, TriggerResult::KillSwitch);
        let refused = lines();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0]["runbook"], "rb");
        assert_eq!(refused[0]["detail"]["hosts"][0], "web");
        let got = s.submit_all(vec![alert(&["fp:1"])]).await.unwrap();
        assert_eq!(got[0].result, TriggerResult::KillSwitch);
        assert_eq!(lines().len(), 1, "an alert's refusal is its answer");
    }

    /// A daemon shutting down answers what it cannot start as pending (the
    /// webhook's 503: retry), never as stopped by a kill switch nobody
    /// engaged.
    #[tokio::test(start_paused = true)]
    async fn a_daemon_shutting_down_asks_for_a_retry_not_a_kill_switch() {
        let (_dir, _config, s) = scheduler();
        let (stop, shutdown) = watch::channel(false);
        let s = Scheduler::new(
            s.config.clone(),
            s.audit.clone(),
            s.metrics.clone(),
            shutdown,
            None,
            None,
        );
        stop.send(true).unwrap();
        let got = s.submit_all(vec![alert(&["fp:1"])]).await.unwrap();
        assert_eq!(got[0].result, TriggerResult::Pending);
        assert!(s.stopping());
    }

    /// An accepted trigger whose run the shutdown stopped before it made a
    /// call (here: while it waited for its run lock) is handed to the next
    /// start, which runs it again, once: 0 accepted triggers without a run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_the_shutdown_stopped_before_any_call_runs_at_the_next_start() {
        let (dir, config, first) = scheduler();
        let fresh = |shutdown| {
            Scheduler::new(
                first.config.clone(),
                first.audit.clone(),
                first.metrics.clone(),
                shutdown,
                None,
                None,
            )
        };
        let (stop, shutdown) = watch::channel(false);
        let s = fresh(shutdown);
        let held = crate::runlock::try_acquire(&config.settings.state_dir, "rb", "web", "someone")
            .unwrap()
            .unwrap();
        let mut fired = alert(&["fp:1"]);
        fired.alert = Some(serde_json::json!({
            "labels": { "alertname": "DiskAlmostFull", "instance": "web" },
            "annotations": { "summary": "/ is 93% full", "runbook_url": "http://x" },
            "fingerprint": "1",
        }));
        let got = s.submit_all(vec![fired]).await.unwrap();
        assert_eq!(got[0].result, TriggerResult::Started);
        let old = got[0].run_id.clone().unwrap();
        stop.send(true).unwrap();
        assert!(s.wait_idle(Duration::from_secs(10)).await);
        drop(held);
        let lines = || -> Vec<serde_json::Value> {
            std::fs::read_to_string(dir.path().join("state/audit.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let verdict = lines()
            .into_iter()
            .find(|l| l["run_id"] == old.as_str() && l["phase"] == "verdict")
            .unwrap();
        assert_eq!(verdict["outcome"], "halted");
        assert_eq!(verdict["detail"]["handed_back"], true, "{verdict}");
        // The next start runs it again, with its trigger and keys.
        let (_stop, shutdown) = watch::channel(false);
        let next = fresh(shutdown);
        let (_, again) = next.recover().unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].trigger, crate::origin::Trigger::Alert);
        assert!(
            again[0].keys.contains(&"fp:1".to_string()),
            "{:?}",
            again[0].keys
        );
        // The alert as its templates read it: labels, and the annotations
        // its queued line kept.
        assert_eq!(
            again[0].alert,
            Some(serde_json::json!({
                "labels": { "alertname": "DiskAlmostFull", "instance": "web" },
                "annotations": { "summary": "/ is 93% full" },
            }))
        );
        let got = next.submit_all(again).await.unwrap();
        assert_eq!(
            got[0].result,
            TriggerResult::Started,
            "no cooldown from a run that did nothing"
        );
        let new = got[0].run_id.clone().unwrap();
        assert!(next.wait_idle(Duration::from_secs(10)).await);
        let ended = lines()
            .into_iter()
            .find(|l| l["run_id"] == new.as_str() && l["phase"] == "verdict")
            .unwrap();
        assert_eq!(ended["outcome"], "ok", "{ended}");
        // Once: the start after that has nothing to hand back.
        let (_stop, shutdown) = watch::channel(false);
        let (_, again) = fresh(shutdown).recover().unwrap();
        assert!(again.is_empty(), "{again:?}");
    }

    /// The other way a shutdown meets an accepted trigger: its run waited
    /// for the one permit (`max_concurrent_runs: 1`) and starts only as the
    /// daemon stops, so its loop stops it before its first proposal; it is
    /// handed back too, and so is the run that held the permit waiting for
    /// its lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_that_waited_for_a_permit_through_the_shutdown_is_handed_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for d in ["hosts", "runbooks", "kill-switch"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        std::fs::write(p.join("runwarden.yaml"), "max_concurrent_runs: 1\n").unwrap();
        for h in ["web", "db"] {
            std::fs::write(
                p.join(format!("hosts/{h}.yaml")),
                format!("name: {h}\nconnection: local\npaths: [/tmp]\n"),
            )
            .unwrap();
        }
        std::fs::write(
            p.join("runbooks/rb.yaml"),
            "name: rb\ndescription: t\nhosts: [web, db]\nautonomy: L3\ntools:\n  observe: [disk_usage]\nsteps: [{ call: disk_usage, args: { path: /tmp } }]\n",
        )
        .unwrap();
        let config = Arc::new(Config::load(p).unwrap());
        let audit = Arc::new(AuditLog::open(&p.join("state/audit.jsonl")).unwrap());
        let (stop, shutdown) = watch::channel(false);
        let s = Scheduler::new(
            watch::channel(config.clone()).1,
            audit,
            Arc::new(Metrics::new(prometheus::Registry::new())),
            shutdown,
            None,
            None,
        );
        let held = crate::runlock::try_acquire(&config.settings.state_dir, "rb", "web", "someone")
            .unwrap()
            .unwrap();
        let mut on_db = alert(&["fp:db"]);
        on_db.host = "db".into();
        let got = s.submit_all(vec![alert(&["fp:web"]), on_db]).await.unwrap();
        assert!(
            got.iter().all(|o| o.result == TriggerResult::Started),
            "{got:?}"
        );
        stop.send(true).unwrap();
        assert!(s.wait_idle(Duration::from_secs(10)).await);
        drop(held);
        let text = std::fs::read_to_string(p.join("state/audit.jsonl")).unwrap();
        let handed: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|l| l["phase"] == "verdict" && l["detail"]["handed_back"] == true)
            .collect();
        assert_eq!(handed.len(), 2, "{text}");
        assert!(
            !text.contains("\"phase\":\"intent\""),
            "no call was made: {text}"
        );
        let (_stop, shutdown) = watch::channel(false);
        let next = Scheduler::new(
            watch::channel(config.clone()).1,
            Arc::new(AuditLog::open(&p.join("state/audit.jsonl")).unwrap()),
            Arc::new(Metrics::new(prometheus::Registry::new())),
            shutdown,
            None,
            None,
        );
        let (_, again) = next.recover().unwrap();
        let mut hosts: Vec<&str> = again.iter().map(|r| r.host.as_str()).collect();
        hosts.sort();
        assert_eq!(hosts, ["db", "web"]);
    }
}

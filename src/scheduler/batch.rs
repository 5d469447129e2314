//! A batch of triggers through its stages: what this daemon says alone,
//! what admission decides, each outcome counted, the accepted ones
//! recorded and started. One list of typed items moves through them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{Scheduler, run_info};
use crate::audit::{AuditError, AuditLog, QueueNote, Queued, Written};
use crate::config::Config;
use crate::rules::TriggerResult;
use crate::run::RunRequest;
use crate::state::{Admitted, Ask, Decided};
use crate::store::{Lease, StoreError};
use crate::trigger::alerts::Candidate;

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

/// Whether a batch is a schedule's fire, which every replica submits at
/// once (a rollout's wave is one replica's, its driver's).
fn a_fire(candidates: &[Candidate]) -> bool {
    candidates.iter().all(|c| {
        matches!(c, Candidate::Run(r) if r.trigger == crate::origin::Trigger::Schedule
            && !r.keys.iter().any(|k| k.starts_with("rollout:")))
    })
}

/// One trigger of a batch on its way through the stages of
/// [`Scheduler::submit_batch`].
struct Item<'a> {
    candidate: &'a Candidate,
    fate: Fate<'a>,
}

/// Where a trigger of a batch stands.
enum Fate<'a> {
    /// This daemon decided it alone: no runbook, out of scope, the kill
    /// switch, a shutdown, an agent's run with no permit free.
    Said(TriggerResult),
    /// Put to admission, which has not answered yet.
    Asked(Ask<'a>),
    /// Admission refused it (a `pending` one is asked again).
    Refused(TriggerResult),
    /// Admission started its run.
    Started(Ask<'a>, Runs),
}

/// Where an admitted run runs.
enum Runs {
    /// Here, holding its lease (with shared state) and the run permit
    /// taken for it (if one was).
    Here(Option<Lease>, Option<OwnedSemaphorePermit>),
    /// In the fleet's queue, for whichever replica has a permit free first.
    Queued,
}

impl<'a> Item<'a> {
    /// What it asks of admission, if it is still to be asked.
    fn ask(&self) -> Option<&Ask<'a>> {
        match &self.fate {
            Fate::Asked(ask) => Some(ask),
            _ => None,
        }
    }

    /// What admission records beside the asks, if this daemon decided it.
    fn decided_alone(&self) -> Option<Decided<'a>> {
        let Fate::Said(result) = self.fate else {
            return None;
        };
        let (runbook, host, keys, trigger) = self.candidate.names();
        Some(Decided {
            runbook,
            host,
            keys,
            trigger,
            result,
        })
    }

    /// What became of it.
    fn outcome(&self) -> Outcome {
        let (result, run_id) = match &self.fate {
            Fate::Said(result) | Fate::Refused(result) => (*result, None),
            Fate::Started(ask, _) => (TriggerResult::Started, Some(ask.run_id.clone())),
            Fate::Asked(_) => (TriggerResult::Deduplicated, None),
        };
        Outcome { result, run_id }
    }
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
    /// say alone is said first; [`SharedState`](crate::state::SharedState) decides the rest and records
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

    /// One pass of [`submit_candidates`](Self::submit_candidates), in
    /// stages over one list of [`Item`]s: what this daemon says alone, what
    /// admission decides of the rest, each outcome counted, then the
    /// accepted triggers recorded and their runs started. A pending outcome
    /// of admission is neither counted nor recorded (it is asked again);
    /// with `give_up`, every candidate is decided `pending` here and
    /// recorded as such.
    async fn submit_batch(
        self: &Arc<Self>,
        candidates: &[Candidate],
        give_up: bool,
    ) -> Result<Vec<Outcome>, SubmitError> {
        let config = self.config.borrow().clone();
        // With shared state, the permits of the runs this replica claims now.
        let mut held: Vec<OwnedSemaphorePermit> = Vec::new();
        let items = self.said_alone(&config, candidates, give_up, &mut held);
        let items = self.asked(items, &mut held, a_fire(candidates)).await?;
        // Permits not needed after all (a trigger was deduplicated) go back.
        drop(held);
        let outcomes = self.counted(&items);
        self.audit_refused_fires(candidates, &outcomes).await;
        self.recorded(&config, items).await?;
        Ok(outcomes)
    }

    /// Stage 1: what this daemon says alone of each candidate; the rest are
    /// asked of admission, each with the id its run takes if it starts.
    fn said_alone<'a>(
        &self,
        config: &Config,
        candidates: &'a [Candidate],
        give_up: bool,
        held: &mut Vec<OwnedSemaphorePermit>,
    ) -> Vec<Item<'a>> {
        if self.state.queues() {
            self.apply_limit(config);
        }
        let mut engaged: HashMap<String, bool> = HashMap::new();
        let mut said = |req: &'a RunRequest| {
            let alone = self
                .alone(config, req, &mut engaged)
                .or_else(|| self.agent_permit(req, held));
            match alone {
                Some(result) => Fate::Said(result),
                None => Fate::Asked(Ask {
                    req,
                    cooldown: config.runbooks.get(&req.runbook).and_then(|r| r.cooldown),
                    cap: config.runbooks.get(&req.runbook).and_then(|r| r.max_runs),
                    run_id: uuid::Uuid::now_v7().to_string(),
                }),
            }
        };
        candidates
            .iter()
            .map(|candidate| Item {
                candidate,
                fate: match candidate {
                    Candidate::Run(_) if give_up => Fate::Said(TriggerResult::Pending),
                    Candidate::Run(req) => said(req),
                    Candidate::OutOfScope { .. } => Fate::Said(TriggerResult::OutOfScope),
                    Candidate::NoMatch { .. } => Fate::Said(TriggerResult::NoMatch),
                    Candidate::Invalid { .. } => Fate::Said(TriggerResult::Invalid),
                },
            })
            .collect()
    }

    /// Stage 2: admission decides what was asked and records every
    /// outcome (those said alone beside them). With shared state this
    /// replica claims only the runs it has a permit for now; the fleet's
    /// queue keeps the others for whichever replica frees one first. A
    /// schedule fires on every replica at once: its runs all go to the
    /// fleet's queue, so no replica holds permits idle while its admission
    /// of the same fire waits on another's row locks.
    async fn asked<'a>(
        &self,
        items: Vec<Item<'a>>,
        held: &mut Vec<OwnedSemaphorePermit>,
        fire: bool,
    ) -> Result<Vec<Item<'a>>, SubmitError> {
        let asks: Vec<&Ask> = items.iter().filter_map(Item::ask).collect();
        if self.state.queues() && !fire {
            while held.len() < asks.len()
                && let Ok(permit) = self.permits.clone().try_acquire_owned()
            {
                held.push(permit);
            }
        }
        let decided: Vec<Decided> = items.iter().filter_map(Item::decided_alone).collect();
        let answers = self
            .state
            .admit(&asks, &decided, held.len())
            .await
            .map_err(|e| {
                tracing::error!("the shared state cannot decide triggers, so none starts: {e}");
                e
            })?;
        drop((asks, decided));
        let mut answers = answers.into_iter();
        Ok(items
            .into_iter()
            .map(|Item { candidate, fate }| Item {
                candidate,
                fate: match fate {
                    Fate::Asked(ask) => match answers.next() {
                        Some(Admitted::Started(lease)) => {
                            Fate::Started(ask, Runs::Here(lease, held.pop()))
                        }
                        Some(Admitted::Queued) => Fate::Started(ask, Runs::Queued),
                        Some(Admitted::Refused(result)) => Fate::Refused(result),
                        // Admission answers every ask it is given, or fails whole.
                        None => Fate::Refused(TriggerResult::Deduplicated),
                    },
                    decided => decided,
                },
            })
            .collect())
    }

    /// Stage 3: each outcome counted once, whatever decided it. A pending
    /// refusal is asked again, and counted when it is given up on.
    fn counted(&self, items: &[Item<'_>]) -> Vec<Outcome> {
        items
            .iter()
            .map(|item| {
                let outcome = item.outcome();
                if !matches!(item.fate, Fate::Refused(TriggerResult::Pending)) {
                    self.count(item.candidate, outcome.result);
                }
                outcome
            })
            .collect()
    }

    /// Stage 4: every accepted trigger is in the log (one write for the
    /// batch) before its run can write anything, and on disk before the
    /// sender hears so: a trigger answered 2xx is never silently lost, and
    /// one that could not be recorded is refused so that it is sent again.
    /// The runs start while the lines are synced: no run dispatches a call
    /// before its intent line's sync, which covers these lines too. Then
    /// the fleet hears that these triggers are on disk here: a retry of one
    /// is a duplicate from then on, and queued runs may be taken.
    async fn recorded(
        self: &Arc<Self>,
        config: &Arc<Config>,
        items: Vec<Item<'_>>,
    ) -> Result<(), SubmitError> {
        let accepted: Vec<(Ask, Runs)> = items
            .into_iter()
            .filter_map(|item| match item.fate {
                Fate::Started(ask, runs) => Some((ask, runs)),
                _ => None,
            })
            .collect();
        if accepted.is_empty() {
            return Ok(());
        }
        let written = self.write_queued(config, &accepted).await?;
        let count = accepted.len();
        let ids: Vec<String> = accepted.iter().map(|(a, _)| a.run_id.clone()).collect();
        let mut handed = Vec::new();
        let mut running = false;
        for (ask, runs) in accepted {
            match runs {
                Runs::Here(lease, permit) => {
                    running |=
                        self.start(config.clone(), ask.run_id, ask.req.clone(), lease, permit)
                }
                Runs::Queued => handed.push(ask.run_id),
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
            .unwrap_or_else(|e| Err(self.thread_failed(e)));
        if let Err(e) = synced {
            self.metrics.audit_write_failures.inc();
            tracing::error!(
                "{count} accepted trigger(s) were written but could not be synced; their runs refuse every call (each call's own sync fails the same way), and the sender is told to send again: {e}"
            );
            return Err(e.into());
        }
        self.state.confirm(&ids, &handed).await?;
        Ok(())
    }

    /// The `queued` lines of accepted triggers, written (not yet synced):
    /// here when the log is free this instant, else on a blocking thread
    /// (the log's lock may be held by a writer's fsync). A write that
    /// fails refuses the batch, and admission's claims are given back.
    async fn write_queued(
        &self,
        config: &Config,
        accepted: &[(Ask<'_>, Runs)],
    ) -> Result<Written, SubmitError> {
        let lines: Vec<Queued> = accepted
            .iter()
            .map(|(ask, runs)| Queued {
                run: run_info(config, &ask.run_id, ask.req),
                trigger: ask.req.trigger,
                keys: &ask.req.keys,
                origin: ask.req.origin(),
                queue: match runs {
                    Runs::Here(..) => QueueNote::Here,
                    Runs::Queued => QueueNote::Handed,
                },
            })
            .collect();
        let entries = AuditLog::queued_lines(&lines);
        let audit = self.audit.clone();
        let recorded = match self.audit.try_append_queued(entries) {
            Ok(recorded) => recorded,
            Err(entries) => tokio::task::spawn_blocking(move || audit.append_queued(entries))
                .await
                .unwrap_or_else(|e| Err(self.thread_failed(e))),
        };
        match recorded {
            Ok(written) => Ok(written),
            Err(e) => {
                self.metrics.audit_write_failures.inc();
                tracing::error!(
                    "{} accepted trigger(s) could not be recorded, so none starts: {e}",
                    accepted.len()
                );
                let started: Vec<(&RunRequest, String)> = accepted
                    .iter()
                    .map(|(ask, _)| (ask.req, ask.run_id.clone()))
                    .collect();
                let _ = self.state.abandon(&started).await;
                Err(e.into())
            }
        }
    }

    /// An audit write whose blocking thread failed.
    fn thread_failed(&self, e: tokio::task::JoinError) -> AuditError {
        AuditError::Io {
            path: self.audit.path().to_path_buf(),
            source: std::io::Error::other(format!("the writing thread failed: {e}")),
        }
    }

    /// What this daemon says of a run request alone: no such runbook, a
    /// host out of its scope, the kill switch (looked at once per runbook
    /// in `engaged`) or a shutdown; `None`: admission decides.
    pub(super) fn alone(
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
        if req.agent.is_none() || !self.state.queues() {
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
}

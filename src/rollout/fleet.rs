//! A rollout the fleet shares (`state.postgres`): one replica drives it,
//! every replica shows it, any replica takes it over when its driver dies.
//!
//! Why the database is the record here, not the audit log: three replicas
//! have three logs, and the replica that goes on with a rollout is not the
//! one that wrote its lines. The row (`store::postgres::rollouts`) holds
//! the status as its driver last wrote it, under a token that only grows;
//! what happened after that write is read back from the fleet's triggers
//! (every host a wave dispatched carries the rollout's key) and runs.
//!
//! - The keeper writes the status on each change and every third of the
//!   lease, and brings back the decisions people took through other
//!   replicas. A write refused by the fence means another replica took
//!   the rollout: this one stops driving it at once.
//! - A driver dispatches a batch only after a write made for it renewed
//!   its hold, so the batch's triggers are committed well inside the lease
//!   that write bought: a replica cut off from the database, or frozen,
//!   starts no host (fail closed), and a takeover, which waits for the
//!   lease to expire, reads back every trigger its driver committed. What
//!   this cannot close: a batch's admission that takes longer than a whole
//!   lease after that write (PostgreSQL stalled on it) could commit after
//!   a takeover's read.
//! - The taker reconciles before it dispatches anything: a host whose
//!   trigger started a run waits for that run, one whose trigger started
//!   nothing is counted as not started, and only hosts no trigger names
//!   are dispatched. So a replica's death mid-wave runs no host twice and
//!   skips none.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{One, Rollouts, State, Status};
use crate::audit::RolloutEvent;
use crate::store::Postgres;

/// How often a driver that waits for runs of other replicas asks the
/// fleet's table how they ended.
const RUNS_EVERY: Duration = Duration::from_millis(500);

/// This replica's hold on a rollout it drives with shared state.
pub(super) struct Hold {
    pub(super) token: i64,
    /// Another replica took it over: this one stops driving it.
    lost: AtomicBool,
    /// When the last write that renewed the hold was sent.
    proven: Mutex<Instant>,
    /// The driver asks for a write now: it dispatches on a fresh proof.
    renew: tokio::sync::Notify,
}

impl Hold {
    pub(super) fn new(token: i64) -> Hold {
        Hold {
            token,
            lost: AtomicBool::new(false),
            proven: Mutex::new(Instant::now()),
            renew: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    fn proven_at(&self) -> Instant {
        *self.proven.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Wait until this replica may dispatch hosts of `one`: at once without
/// shared state; with it, once a write sent after this call renewed the
/// hold (so the batch goes out on a proof a full lease ahead of any
/// takeover, not on one up to a third of a lease old). False when another
/// replica took the rollout over, or the daemon stops.
pub(super) async fn held(rs: &Rollouts, one: &One) -> bool {
    let (Some(pg), Some(hold)) = (&rs.fleet, &one.hold) else {
        return true;
    };
    let asked = Instant::now();
    hold.renew.notify_one();
    let mut said = false;
    loop {
        if hold.lost() {
            return false;
        }
        if hold.proven_at() >= asked {
            return true;
        }
        if !said && asked.elapsed() > pg.lease / 2 {
            tracing::warn!(rollout = %one.status.borrow().id, "rollout {}: its hold in the shared state cannot be renewed; nothing more is dispatched until it is", one.status.borrow().id);
            said = true;
        }
        if rs.scheduler.stopping() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Keep `one`'s row: its status written on each change and every third
/// of the lease, until it is over, lost, or the daemon stops. A person's
/// decision taken through another replica is applied here.
pub(super) async fn keeper(rs: Arc<Rollouts>, one: Arc<One>, pg: Arc<Postgres>) {
    let Some(hold) = &one.hold else { return };
    let mut changes = one.status.subscribe();
    let mut applied: Option<String> = None;
    let every = pg.lease / 3;
    loop {
        let (id, state, text) = {
            let s = changes.borrow_and_update();
            (s.id.clone(), s.state, serde_json::to_string(&*s))
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(rollout = %id, "rollout {id}'s status cannot be written as JSON: {e}");
                return;
            }
        };
        let sent = Instant::now();
        match pg
            .rollout_write(&id, hold.token, state.as_str(), &text, applied.as_deref())
            .await
        {
            Ok(None) => {
                hold.lost.store(true, Ordering::Release);
                tracing::warn!(rollout = %id, "rollout {id} is driven by another replica now: this one stops driving it");
                // Its halt is the new driver's to count now; the driver
                // task waiting for a person here is woken, and ends.
                let runbook = one.status.borrow().runbook.clone();
                if state == State::Halted {
                    rs.metrics
                        .rollouts_halted
                        .with_label_values(&[&runbook])
                        .dec();
                }
                one.status.send_modify(|s| {
                    s.waiting_on = "nothing here: another replica drives it".into();
                });
                return;
            }
            Ok(Some(decision)) => {
                *hold.proven.lock().unwrap_or_else(|p| p.into_inner()) = sent;
                applied = None;
                if let Some(d) = decision {
                    apply(&rs, &id, &d);
                    applied = Some(d);
                    continue;
                }
            }
            Err(e) => {
                tracing::warn!(rollout = %id, "rollout {id}'s status cannot be written to the shared state: {e}; tried again");
            }
        }
        if state.is_over() && applied.is_none() {
            return;
        }
        if rs.scheduler.stopping() {
            return;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = hold.renew.notified() => {}
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// A person's decision, as another replica recorded it.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Decision {
    pub(super) verb: String,
    pub(super) by: String,
    pub(super) reason: String,
    pub(super) replica: String,
}

/// Apply the decision `text` recorded for rollout `id` through another
/// replica: audited here with the person and where they decided.
fn apply(rs: &Rollouts, id: &str, text: &str) {
    let d: Decision = match serde_json::from_str(text) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(rollout = %id, "a decision on rollout {id} cannot be read ({e}): dropped");
            return;
        }
    };
    let by = format!("{} (through replica {})", d.by, d.replica);
    let done = match d.verb.as_str() {
        "resume" => rs.resume_here(id, &by, &d.reason),
        _ => rs.abort_here(id, &by, &d.reason),
    };
    if let Err(e) = done {
        tracing::warn!(rollout = %id, "the {} of rollout {id} by {by} is not applied: {e}", d.verb);
    }
}

/// How a run of another replica (or of this one) ended, from the fleet's
/// table: its verdict, `interrupted`, or `not_started`. This replica's own
/// report answers first when it ran the run here.
pub(super) async fn ended(rs: &Rollouts, pg: &Postgres, run_id: &str) -> Option<(String, String)> {
    let ids = [run_id.to_string()];
    let here = async {
        // A run handed to the fleet's queue ends here without a report:
        // only a report counts; the table says the rest.
        match rs.scheduler.reports.ended(run_id).await {
            Ok(report) => (
                report.verdict.as_str().to_string(),
                report.verdict_detail.clone(),
            ),
            Err(_) => std::future::pending().await,
        }
    };
    let there = async {
        loop {
            tokio::time::sleep(RUNS_EVERY).await;
            if rs.scheduler.stopping() {
                return None;
            }
            match pg.runs_ended(&ids).await {
                Ok(ends) => {
                    if let Some(end) = ends.into_iter().next() {
                        return Some(match end.status.as_str() {
                            "ended" => (
                                end.verdict.unwrap_or_else(|| "failed".into()),
                                "as the fleet's runs have it".to_string(),
                            ),
                            other => (other.to_string(), format!("the run was closed {other}")),
                        });
                    }
                }
                Err(e) => tracing::debug!("how run {run_id} ended cannot be read yet: {e}"),
            }
        }
    };
    tokio::select! {
        end = here => Some(end),
        end = there => end,
    }
}

/// Take over, every third of the lease, the rollouts whose driver stopped
/// renewing them, and drive them from where they were.
pub(crate) async fn takeover_worker(
    rs: Arc<Rollouts>,
    pg: Arc<Postgres>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let runbooks: Vec<String> = rs
            .config
            .borrow()
            .runbooks
            .values()
            .filter(|r| r.rollout.is_some())
            .map(|r| r.name.clone())
            .collect();
        if !runbooks.is_empty() {
            match pg.rollouts_take(&runbooks).await {
                Ok(taken) => {
                    for t in taken {
                        take(&rs, &pg, t).await;
                    }
                }
                Err(e) => {
                    tracing::debug!("the fleet's rollouts cannot be read for a takeover: {e}")
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(pg.lease / 3) => {}
        }
    }
}

/// Go on with rollout `t`, taken over from a replica that stopped renewing it.
async fn take(rs: &Arc<Rollouts>, pg: &Arc<Postgres>, t: crate::store::RolloutTaken) {
    let mut status: Status = match serde_json::from_str(&t.status) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(rollout = %t.id, "rollout {} taken over from replica {} cannot be read ({e}); it is not driven: abort it", t.id, t.was);
            return;
        }
    };
    let triggers = match pg
        .triggers_keyed(&status.runbook, &super::key(&status.id))
        .await
    {
        Ok(t) => t,
        Err(e) => {
            // Not driven without them: the hold expires, and this replica
            // or another takes it again.
            tracing::warn!(rollout = %t.id, "the triggers of rollout {} cannot be read ({e}); taken over again later", t.id);
            return;
        }
    };
    let mut in_flight = Vec::new();
    let mut not_started = Vec::new();
    for (host, outcome, run_id) in triggers {
        let Some((wave, h)) = status.host_mut(&host) else {
            continue;
        };
        if h.ended() {
            continue;
        }
        match run_id {
            Some(run) if outcome == "started" => {
                h.outcome = "running".into();
                h.run_id = Some(run.clone());
                in_flight.push((host, run));
            }
            _ => not_started.push((wave, host, outcome)),
        }
    }
    // A host the status shows running whose trigger was not read back.
    for h in status.waves.iter().flatten() {
        if let (Some(run), "running") = (&h.run_id, h.outcome.as_str())
            && !in_flight.iter().any(|(host, _)| host == &h.host)
        {
            in_flight.push((h.host.clone(), run.clone()));
        }
    }
    let mut events = vec![RolloutEvent::TakenOver {
        from: t.was.clone(),
        token: t.token,
    }];
    for (wave, host, outcome) in not_started {
        let detail = format!("not started: {outcome}");
        if status.ended(&host, None, "not_started", &detail) {
            events.push(RolloutEvent::Host {
                wave,
                host,
                run_id: None,
                outcome: "not_started".into(),
                detail,
            });
        }
    }
    if let Err(e) = rs.audit.rollout_all(&status.id, &status.runbook, &events) {
        tracing::error!(rollout = %status.id, "the takeover of rollout {} could not be written: {e}; not driven here", status.id);
        return;
    }
    if status.state == State::Halted {
        rs.metrics
            .rollouts_halted
            .with_label_values(&[&status.runbook])
            .inc();
    }
    rs.metrics
        .rollouts
        .with_label_values(&[&status.runbook, "taken_over"])
        .inc();
    tracing::warn!(rollout = %status.id, "rollout {} of {} taken over from replica {}: {} run(s) in flight", status.id, status.runbook, t.was, in_flight.len());
    let one = rs.keep(status, Some(Hold::new(t.token)));
    tokio::spawn(keeper(rs.clone(), one.clone(), pg.clone()));
    // A decision its last driver had not applied comes back with the
    // keeper's first write, and is applied then, once.
    if let Some(d) = &t.decision {
        tracing::info!(rollout = %t.id, "rollout {}: a decision its last driver had not applied is applied now: {d}", t.id);
    }
    tokio::spawn(super::drive::drive(rs.clone(), one, in_flight));
}

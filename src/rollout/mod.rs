//! Staged rollouts: a fan-out (a schedule's fire, `run --all-hosts`, the
//! API's `all_hosts`) of a runbook with `rollout:` reaches its hosts a wave
//! at a time, canaries first, and halts at the first failure past
//! `max_failures`, so a runbook that breaks something breaks it once.
//!
//! Why a driver of its own, above the scheduler: each host's run is still
//! an ordinary trigger (the kill switch, admission, cooldown, budgets and
//! `max_runs` decide it as any other, and the fleet budget counts across
//! waves because every run spends from it), but what comes next depends
//! on how the last runs ended, which only a task that waits for them knows.
//!
//! - The host list is frozen into waves when the rollout starts
//!   ([`crate::rules::rollout::waves`]) and written in its `started` line.
//! - A wave's hosts are dispatched at most `max_concurrent_runs` at a time,
//!   each batch after looking at the kill switch and the failures, so a
//!   halt never starts a host that was merely waiting for a slot.
//! - Between waves: every run ended, failures within `max_failures`, the
//!   pause kept, and `guard:` (PromQL) empty for all of it; a guard that
//!   cannot be evaluated halts, it never passes.
//! - A halt dispatches nothing new, lets runs in flight finish, and waits
//!   for a person (`runwarden rollout resume|abort`). The kill switch halts
//!   a rollout too; releasing the switch does not resume it.
//! - Every event is a synced audit line; a restarted daemon folds them
//!   ([`record`]) and goes on where it was: a host whose run is in the
//!   log (its `queued` line carries `rollout:ID`) is never run again, and
//!   one without is never skipped.

mod decide;
mod drive;
mod fleet;
mod record;
mod status;

pub(crate) use decide::{Decision, Refused};
pub(crate) use fleet::takeover_worker;
pub(crate) use status::{State, Status};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::audit::{AuditError, AuditLog, RolloutEvent};
use crate::config::{Config, Runbook};
use crate::metrics::Metrics;
use crate::origin::Trigger;
use crate::run::RunRequest;
use crate::scheduler::Scheduler;
use crate::store::{Begun, Postgres};

/// Why a rollout did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotStarted {
    /// One rollout of a runbook at a time: another is not over.
    #[error(
        "rollout {0} of this runbook is {1:?} and not over: one rollout of a runbook at a time (`runwarden rollout status {0}`; resume or abort it first)"
    )]
    Unfinished(String, State),
    /// Another replica started the rollout of this schedule fire.
    #[error("replica-shared rollout {0} already answers this schedule fire")]
    Elsewhere(String),
    /// Its `started` line could not be written.
    #[error("the rollout could not be recorded, so it did not start: {0}")]
    Audit(#[from] AuditError),
    /// The shared state could not record it.
    #[error("the rollout could not be recorded in the shared state, so it did not start: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// One rollout this daemon drives: its status, which the driver and a
/// person's decisions change and everyone else watches.
pub(crate) struct One {
    status: watch::Sender<Status>,
    /// With shared state: this replica's hold on it.
    hold: Option<fleet::Hold>,
}

impl One {
    /// Its status now.
    pub(crate) fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Whether this daemon drives it (another replica may have taken it).
    fn driven_here(&self) -> bool {
        self.hold.as_ref().is_none_or(|h| !h.lost())
    }
}

/// Every rollout this daemon knows: those it drives and those it drove.
pub(crate) struct Rollouts {
    scheduler: Arc<Scheduler>,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    config: watch::Receiver<Arc<Config>>,
    all: Mutex<BTreeMap<String, Arc<One>>>,
    /// With `state.postgres`: the fleet's rollouts, one replica driving each.
    fleet: Option<Arc<Postgres>>,
}

/// Rollouts kept once over, for `list` and `status`.
const KEEP_OVER: usize = 200;

impl Rollouts {
    pub(crate) fn new(
        scheduler: Arc<Scheduler>,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
        config: watch::Receiver<Arc<Config>>,
        fleet: Option<Arc<Postgres>>,
    ) -> Arc<Rollouts> {
        Arc::new(Rollouts {
            scheduler,
            audit,
            metrics,
            config,
            all: Mutex::default(),
            fleet,
        })
    }

    /// Start a rollout of `runbook` on its hosts (all but example ones),
    /// frozen now; `keys` go on every run it starts. Returns once its
    /// `started` line is synced (and, with shared state, its row written:
    /// a schedule fire every replica saw starts one rollout for the fleet).
    pub(crate) async fn start(
        self: &Arc<Self>,
        runbook: &Runbook,
        trigger: Trigger,
        keys: Vec<String>,
    ) -> Result<Status, NotStarted> {
        if self.fleet.is_none()
            && let Some(going) = self
                .list()
                .into_iter()
                .find(|r| r.runbook == runbook.name && !r.state.is_over())
        {
            return Err(NotStarted::Unfinished(going.id, going.state));
        }
        let config = self.config.borrow().clone();
        let waves = plan(&config, runbook);
        let id = uuid::Uuid::now_v7().to_string();
        let mut status = Status::new(
            &id,
            &runbook.name,
            trigger,
            &waves,
            runbook.rollout.as_ref(),
        );
        status.keys = keys;
        let hold = match &self.fleet {
            Some(pg) => Some(self.begin_shared(pg, &status).await?),
            None => None,
        };
        let started = self.audit.rollout(
            &id,
            &runbook.name,
            &RolloutEvent::Started {
                waves: waves
                    .iter()
                    .map(|w| w.iter().map(|h| h.to_string()).collect())
                    .collect(),
                trigger,
                max_failures: status.max_failures,
                pause_secs: status.pause_secs,
                guard: status.guard.clone(),
            },
        );
        if let Err(e) = started {
            if let (Some(pg), Some(hold)) = (&self.fleet, &hold) {
                // Its row must not hold the runbook's one rollout.
                status.state = State::Aborted;
                status.reason = Some(format!("its started line could not be written: {e}"));
                let text = serde_json::to_string(&status).unwrap_or_default();
                let _ = pg
                    .rollout_write(&id, hold.token, "aborted", &text, None)
                    .await;
            }
            return Err(e.into());
        }
        self.metrics
            .rollouts
            .with_label_values(&[&runbook.name, "started"])
            .inc();
        tracing::info!(rollout = %id, runbook = %runbook.name, "rollout {id} of {} started: {} wave(s)", runbook.name, waves.len());
        let one = self.keep(status.clone(), hold);
        if let Some(pg) = &self.fleet {
            tokio::spawn(fleet::keeper(self.clone(), one.clone(), pg.clone()));
        }
        tokio::spawn(drive::drive(self.clone(), one, Vec::new()));
        Ok(status)
    }

    /// The fleet's row of a rollout about to start: this replica drives it.
    async fn begin_shared(
        &self,
        pg: &Postgres,
        status: &Status,
    ) -> Result<fleet::Hold, NotStarted> {
        // A schedule's fire, once for the fleet: every replica fires it.
        let fire = match status.trigger {
            Trigger::Schedule => status
                .keys
                .iter()
                .find(|k| k.starts_with("cron:"))
                .map(|k| format!("{} {k}", status.runbook)),
            _ => None,
        };
        let text = serde_json::to_string(status).map_err(|e| {
            NotStarted::Store(crate::store::StoreError::Local(format!(
                "its status cannot be written as JSON: {e}"
            )))
        })?;
        // The rollout that held the runbook may end between the insert
        // and the look at it: then the insert is tried once more.
        let mut again = true;
        loop {
            let begun = pg
                .rollout_begin(
                    &status.id,
                    &status.runbook,
                    fire.as_deref(),
                    "running",
                    &text,
                )
                .await?;
            return match begun {
                Begun::Started { token } => Ok(fleet::Hold::new(token)),
                Begun::FireTaken { id } => Err(NotStarted::Elsewhere(id)),
                Begun::Going { id, .. } if id.is_empty() && std::mem::take(&mut again) => continue,
                Begun::Going { id, state } => Err(NotStarted::Unfinished(
                    id,
                    serde_json::from_value(serde_json::Value::String(state))
                        .unwrap_or(State::Running),
                )),
            };
        }
    }

    /// Hold `status` as one of this daemon's rollouts.
    fn keep(&self, status: Status, hold: Option<fleet::Hold>) -> Arc<One> {
        let one = Arc::new(One {
            status: watch::channel(status.clone()).0,
            hold,
        });
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        all.insert(status.id.clone(), one.clone());
        let over: Vec<String> = all
            .iter()
            .filter(|(_, o)| o.status.borrow().state.is_over())
            .map(|(id, _)| id.clone())
            .collect();
        // Ids are UUIDv7: the oldest sort first.
        for id in over.iter().take(over.len().saturating_sub(KEEP_OVER)) {
            all.remove(id);
        }
        one
    }

    /// Every rollout it knows, newest first.
    pub(crate) fn list(&self) -> Vec<Status> {
        let all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        all.values().rev().map(|o| o.status()).collect()
    }

    /// One rollout, by id or a prefix of one.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<One>> {
        let all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        let mut hits = all.iter().filter(|(k, _)| k.starts_with(id));
        match (hits.next(), hits.next()) {
            (Some((_, one)), None) if !id.is_empty() => Some(one.clone()),
            _ => None,
        }
    }

    /// Every rollout, newest first, as JSON: this daemon's; with shared
    /// state the fleet's, each with the replica that drives it.
    pub(crate) async fn listed(&self) -> Result<Vec<serde_json::Value>, crate::store::StoreError> {
        match &self.fleet {
            None => Ok(self.list().iter().map(json).collect()),
            Some(pg) => Ok(pg
                .rollouts(KEEP_OVER as i64)
                .await?
                .into_iter()
                .map(shared)
                .collect()),
        }
    }

    /// One rollout (by id or an unambiguous prefix of one) as JSON.
    pub(crate) async fn shown(
        &self,
        id: &str,
    ) -> Result<Option<serde_json::Value>, crate::store::StoreError> {
        match &self.fleet {
            None => Ok(self.get(id).map(|o| json(&o.status()))),
            Some(pg) => {
                let mut rows = pg.rollouts_like(id).await?;
                Ok(match rows.len() {
                    1 => rows.pop().map(shared),
                    _ => None,
                })
            }
        }
    }

    /// Take up, from the audit log, the rollouts the last process left:
    /// each one's outcomes as the log has them; the unfinished go on
    /// (after [`Scheduler::recover`] closed the runs it left open).
    /// Returns how many go on.
    pub(crate) fn recover(self: &Arc<Self>) -> std::io::Result<usize> {
        if self.fleet.is_some() {
            // The fleet's rows are the record: the takeover worker goes on
            // with what this replica (or another) left.
            return Ok(0);
        }
        let config = self.config.borrow().clone();
        let found = record::fold(self.audit.path())?;
        let mut going_on = 0;
        for r in found {
            let mut status = r.status;
            // A run the log shows ended, but the rollout line that says so
            // was not written before the stop: written now.
            for (host, run_id, verdict, detail) in r.ended_unrecorded {
                if status.ended(&host, Some(&run_id), &verdict, &detail) {
                    let wave = status.host_mut(&host).map_or(0, |(w, _)| w);
                    self.audit
                        .rollout(
                            &status.id,
                            &status.runbook,
                            &RolloutEvent::Host {
                                wave,
                                host,
                                run_id: Some(run_id),
                                outcome: verdict,
                                detail,
                            },
                        )
                        .map_err(std::io::Error::other)?;
                }
            }
            let state = status.state;
            if state == State::Halted {
                self.metrics
                    .rollouts_halted
                    .with_label_values(&[&status.runbook])
                    .inc();
            }
            status.keys = r.keys;
            let in_flight = r.in_flight;
            let runbook_known = config.runbooks.contains_key(&status.runbook);
            let one = self.keep(status, None);
            if state.is_over() {
                continue;
            }
            if !runbook_known {
                tracing::warn!(rollout = %one.status().id, "rollout {} of {} is not taken up: the runbook is no longer in the configuration; abort it with `runwarden rollout abort`", one.status().id, one.status().runbook);
                one.status.send_modify(|s| {
                    s.state = State::Halted;
                    s.reason = Some("its runbook is no longer in the configuration".into());
                });
                continue;
            }
            going_on += 1;
            tokio::spawn(drive::drive(self.clone(), one, in_flight));
        }
        Ok(going_on)
    }
}

/// The hosts a fan-out of `runbook` reaches (example hosts are never
/// called), frozen into waves.
pub(crate) fn plan(config: &Config, runbook: &Runbook) -> Vec<Vec<Arc<str>>> {
    let hosts: Vec<Arc<str>> = runbook
        .hosts
        .iter()
        .filter(|h| config.hosts.get(&***h).is_none_or(|host| !host.example))
        .cloned()
        .collect();
    match &runbook.rollout {
        Some(r) => crate::rules::rollout::waves(r, &hosts),
        None => vec![hosts],
    }
}

/// What a fan-out of `runbook` would do, for `check` and a dry run: the
/// waves one line each (`wave 1: web-1`), what holds them, and whether
/// the fleet budget could take every host's changes.
pub(crate) fn describe(config: &Config, runbook: &Runbook) -> Vec<String> {
    let Some(r) = &runbook.rollout else {
        return Vec::new();
    };
    let waves = plan(config, runbook);
    let mut out: Vec<String> = waves
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let names: Vec<&str> = w.iter().map(|h| &**h).collect();
            format!("wave {}: {}", i + 1, names.join(" "))
        })
        .collect();
    out.push(format!(
        "halts past {} failure(s); {} between waves{}",
        r.max_failures,
        match r.pause.is_zero() {
            true => "no pause".to_string(),
            false => format!("a pause of {}", humantime::format_duration(r.pause)),
        },
        r.guard
            .as_ref()
            .map(|g| format!(", the guard `{g}` returning nothing all through it"))
            .unwrap_or_default()
    ));
    let hosts: usize = waves.iter().map(Vec::len).sum();
    let most = hosts as u64 * u64::from(runbook.budget.max_mutations);
    for (whose, b) in [
        ("runbook's", runbook.fleet_budget),
        ("fleet's", config.settings.fleet_budget),
    ] {
        if let Some(b) = b
            && most > u64::from(b.max_mutations)
        {
            out.push(format!(
                "note: {hosts} host(s) x budget.max_mutations {} = up to {most} tier-2 calls, past the {whose} fleet_budget of {} per {}: once it is spent, later hosts' changes are refused (and count as failures)",
                runbook.budget.max_mutations,
                b.max_mutations,
                humantime::format_duration(b.per)
            ));
        }
    }
    out
}

/// A rollout as the API shows it.
fn json(s: &Status) -> serde_json::Value {
    serde_json::to_value(s).unwrap_or_default()
}

/// A fleet's row as the API shows it: the status its driver wrote, and
/// which replica that is.
fn shared((status, driver): (String, String)) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("driver".into(), serde_json::Value::String(driver));
    }
    v
}

/// The key every run of rollout `id` carries: how a restarted daemon
/// finds which hosts already ran.
pub(crate) fn key(id: &str) -> String {
    format!("rollout:{id}")
}

/// A fan-out's runs: through a rollout for a runbook that has one, else
/// all at once (what the schedule's worker submits).
pub(crate) struct Fanout(pub(crate) Arc<Rollouts>);

impl crate::trigger::Submit for Fanout {
    type Error = String;

    async fn submit(&self, reqs: Vec<RunRequest>) -> Result<(), String> {
        let rollouts = &self.0;
        let config = rollouts.config.borrow().clone();
        let staged = reqs.first().and_then(|r| {
            config
                .runbooks
                .get(&r.runbook)
                .filter(|rb| rb.rollout.is_some())
                .map(|rb| (rb.clone(), r.trigger, r.keys.clone()))
        });
        match staged {
            Some((runbook, trigger, keys)) if !reqs.iter().any(|r| r.dry_run) => {
                match rollouts.start(&runbook, trigger, keys).await {
                    Ok(_) => Ok(()),
                    // Every replica fires a schedule: one rollout answers it.
                    Err(NotStarted::Elsewhere(id)) => {
                        tracing::debug!("rollout {id} of another replica answers this fire");
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            _ => rollouts
                .scheduler
                .submit_all(reqs)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }
}

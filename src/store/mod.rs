//! State shared by several daemons: `state.postgres` in runwarden.yaml.
//!
//! Without it, each machine keeps its own state, and that is enough for one
//! daemon: runs are kept apart by a `flock` ([`crate::runlock`]), cooldown
//! and dedupe live in the scheduler and are restored from the audit log,
//! the fleet budget is a file under a lock ([`crate::gate::fleet`]), the
//! kill switch is a directory. All of that still holds on each replica with
//! PostgreSQL: it is what keeps a person's `runwarden run` and the daemon
//! apart on one machine, and what stops a machine offline.
//!
//! PostgreSQL adds what several machines must agree on, each check and its
//! record in one transaction so no two replicas interleave between them:
//! - **Admission** ([`Postgres::lock_batch`]): a batch's (runbook, host)
//!   rows locked and read, and everything decided of them written in the
//!   same transaction, every trigger with its one outcome. The decisions
//!   are not here: they are [`crate::rules`], the same Rust functions
//!   this machine's own admission calls. (Releases before 0.4 decided in
//!   SQL, `runwarden_admit_all`, which stays for them during a roll.)
//! - **Leases and fencing** ([`Lease`]): a run holds its (runbook, host)
//!   under a token that only grows, renews it every third of the lease, and
//!   proves it before every call in the same round trip that counts the
//!   call against the fleet budget ([`Lease::fence`]). A replica that cannot
//!   reach the database makes no call: the fence fails closed, and it is
//!   the last step before the intent line. Once that line is on disk the
//!   run checks, without I/O, that the last fence or renewal still proves
//!   the lease ([`Lease::still_proven`]): a sync that stalled past it is
//!   not followed by the call.
//! - **Failover** ([`Postgres::reap`]): any replica closes a run whose lease
//!   expired as `interrupted`. Runs are not resumed; a still-firing alert
//!   starts a new one through Alertmanager's repeat.
//! - **One kill switch for the fleet**: a table, with LISTEN/NOTIFY so every
//!   replica hears of it within a second, and checked again in every fence.
//! - **Approvals anywhere**: an L2 request is shared when it opens; any
//!   replica lists it and records a decision (exactly once, against the
//!   digest shown); the replica whose run waits reads it back within a
//!   second ([`Postgres::settled_approvals`]).
//!
//! Each replica keeps its own hash-chained audit log: the record on its
//! machine.

mod approvals;
mod postgres;
pub(crate) mod workers;

use std::sync::Arc;
use std::time::Duration;

#[cfg(all(test, feature = "estate"))]
pub(crate) use postgres::tests::{crossed, leased, migrated};
pub(crate) use postgres::{
    Begun, Decided, LeaseWrite, PairRow, Postgres, RolloutTaken, RunWrite, Schema, TriggerRow,
    Writes, again,
};

use crate::config::runbook::FleetBudget;
use crate::gate::DenyReason;
pub(crate) use crate::gate::killswitch::FleetSwitch;

/// What went wrong with the shared state.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum StoreError {
    /// The database could not be reached (or did not answer in time).
    #[error("PostgreSQL cannot be reached: {0}")]
    Unreachable(String),
    /// The database answered with an error.
    #[error("PostgreSQL refused: {0}")]
    Database(String),
    /// The database rolled the transaction back because it waited on
    /// another that waited on it (a deadlock) or could not be serialized:
    /// nothing of it was written, and it may simply be tried again.
    #[error("PostgreSQL rolled back a transaction that waited on another: {0}")]
    Contended(String),
    /// This machine's own state (a file under the state directory) could
    /// not be read or written.
    #[error("this machine's state: {0}")]
    Local(String),
    /// `state.postgres` or the database's schema is not usable.
    #[error("{0}")]
    Config(String),
}

/// A run another replica (or this one, before a restart) left open, now
/// closed as `interrupted`.
#[derive(Debug, Clone)]
pub(crate) struct Reaped {
    /// Its run id.
    pub(crate) run_id: String,
    /// Its runbook.
    pub(crate) runbook: String,
    /// Its host.
    pub(crate) host: String,
    /// The replica that ran it.
    pub(crate) replica: String,
}

/// A run taken from the fleet's queue: this replica's to run now.
#[derive(Debug)]
pub(crate) struct Taken {
    /// Its run id, given when it was admitted.
    pub(crate) run_id: String,
    /// Its runbook.
    pub(crate) runbook: String,
    /// Its host.
    pub(crate) host: String,
    /// The lease it runs under.
    pub(crate) lease: Lease,
    /// The trigger, as [`crate::trigger::RunRequest::to_queue`] wrote it.
    pub(crate) request: String,
    /// The replica that admitted it.
    pub(crate) queued_by: String,
}

/// One replica's own switch file, as it last published it.
#[derive(Debug, Clone)]
pub(crate) struct ReplicaSwitch {
    /// The replica.
    pub(crate) replica: String,
    /// `global`, or a runbook.
    pub(crate) scope: String,
    /// What the file says, and when the replica last said so.
    pub(crate) detail: String,
}

/// Which claim a run holds: its (runbook, host), its run id and token.
#[derive(Debug, Clone)]
pub(crate) struct LeaseId {
    /// The runbook.
    pub(crate) runbook: String,
    /// The host.
    pub(crate) host: String,
    /// The run holding it.
    pub(crate) run_id: String,
    /// The fencing token of the claim.
    pub(crate) token: i64,
}

/// A run's claim on its (runbook, host) across the fleet, renewed in the
/// background while it lives; dropping it stops the renewals (the lease
/// then expires on its own).
#[derive(Debug)]
pub(crate) struct Lease {
    store: Arc<Postgres>,
    id: LeaseId,
    renewals: tokio::task::JoinHandle<()>,
    proof: Arc<Proof>,
}

/// Until when a claim is known to be this run's, from the last fence or
/// renewal the database answered. An answer proves the lease lives until at
/// least a whole lease after the question was sent; two thirds of that are
/// counted, so the proof runs out before the lease can, whatever the
/// answer's own delay (at most a third of a lease, or it is a failure).
#[derive(Debug)]
struct Proof {
    until: std::sync::Mutex<tokio::time::Instant>,
    lasts: Duration,
}

impl Proof {
    /// The database answered a question sent at `sent`: the claim was current.
    fn answered(&self, sent: tokio::time::Instant) {
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        *until = (*until).max(sent + self.lasts);
    }

    fn until(&self) -> tokio::time::Instant {
        *self.until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewals.abort();
    }
}

/// The fleet budgets one call counts against: runwarden.yaml's (every
/// runbook's calls) first, then the runbook's own. Made once per run, with
/// what the fence sends for them, so a call builds nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Budgets {
    runbook: String,
    all: Option<FleetBudget>,
    own: Option<FleetBudget>,
    /// Per budget, whose calls it counts (`None`: every runbook's) ...
    scopes: Vec<Option<String>>,
    /// ... and its window in milliseconds.
    windows: Vec<i64>,
    /// How long a counted call is kept, in milliseconds.
    keep: i64,
}

impl Budgets {
    /// runwarden.yaml's `fleet_budget` (`all`) and the runbook's own.
    pub(crate) fn new(
        all: Option<FleetBudget>,
        runbook: &str,
        own: Option<FleetBudget>,
    ) -> Budgets {
        let mut b = Budgets {
            runbook: runbook.to_string(),
            all,
            own,
            ..Budgets::default()
        };
        let each: Vec<(Option<String>, FleetBudget)> =
            b.each().map(|(r, w)| (r.map(str::to_string), w)).collect();
        b.keep = postgres::millis(crate::rules::budget::kept(
            &each.iter().map(|(_, w)| *w).collect::<Vec<_>>(),
        ));
        b.windows = each.iter().map(|(_, w)| postgres::millis(w.per)).collect();
        b.scopes = each.into_iter().map(|(r, _)| r).collect();
        b
    }

    /// Each budget set, with whose calls it counts (`None`: every runbook's).
    fn each(&self) -> impl Iterator<Item = (Option<&str>, FleetBudget)> {
        [(None, self.all), (Some(self.runbook.as_str()), self.own)]
            .into_iter()
            .filter_map(|(runbook, budget)| Some((runbook, budget?)))
    }
}

impl Postgres {
    /// Take up to `limit` runs from the fleet's queue (of the runbooks this
    /// replica knows), each now this replica's under its lease, renewed
    /// from now on. No other replica takes the same one.
    pub(crate) async fn take(
        self: &Arc<Self>,
        limit: usize,
        runbooks: Vec<String>,
    ) -> Result<Vec<Taken>, StoreError> {
        Ok(self
            .take_queued(limit, runbooks)
            .await?
            .into_iter()
            .map(|(run_id, runbook, host, token, request, queued_by)| Taken {
                lease: self.lease(&runbook, &host, &run_id, token),
                request,
                queued_by,
                run_id,
                runbook,
                host,
            })
            .collect())
    }

    /// The lease a run admitted under `token` holds, renewed from now on.
    pub(crate) fn lease(
        self: &Arc<Self>,
        runbook: &str,
        host: &str,
        run_id: &str,
        token: i64,
    ) -> Lease {
        let id = LeaseId {
            runbook: runbook.to_string(),
            host: host.to_string(),
            run_id: run_id.to_string(),
            token,
        };
        let lasts = self.lease * 2 / 3;
        let proof = Arc::new(Proof {
            // Admission just claimed it.
            until: std::sync::Mutex::new(tokio::time::Instant::now() + lasts),
            lasts,
        });
        let (store, renewing, renewed) = (self.clone(), id.clone(), proof.clone());
        let renewals = tokio::spawn(async move {
            let every = store.lease / 3;
            loop {
                tokio::time::sleep(every).await;
                let sent = tokio::time::Instant::now();
                match store.renew(&renewing).await {
                    Ok(true) => renewed.answered(sent),
                    Ok(false) => {
                        tracing::warn!(run_id = %renewing.run_id, "the run's lease was taken over or expired; its next call is refused");
                        return;
                    }
                    Err(e) => tracing::warn!(run_id = %renewing.run_id, "lease not renewed: {e}"),
                }
            }
        });
        Lease {
            store: self.clone(),
            id,
            renewals,
            proof,
        }
    }
}

impl Lease {
    /// Which claim this is.
    pub(crate) fn id(&self) -> &LeaseId {
        &self.id
    }

    /// Before a call: prove the claim is current (renewing it), that the
    /// fleet's kill switch does not stop the runbook, and that a tier-2
    /// call fits the fleet budgets, counting it, in one round trip. The
    /// database proves the lease and reserves the call; the rules
    /// ([`crate::rules`]) decide on what it reports, and a call they refuse
    /// is given back (a second round trip, on a refusal only). A refusal
    /// is the gate's: the call does not run.
    pub(crate) async fn fence(
        &self,
        mutating: bool,
        budgets: &Budgets,
    ) -> Result<(), (DenyReason, String)> {
        let sent = tokio::time::Instant::now();
        let proved = match self.store.prove(&self.id, mutating, budgets).await {
            Ok(p) => p,
            Err(e) => {
                return Err((
                    DenyReason::LeaseLost,
                    format!("{e}; no call runs without proof that this run still holds its lease"),
                ));
            }
        };
        if let Some(lost) = proved.lost {
            return Err((DenyReason::LeaseLost, lost));
        }
        let refused = proved.refusal(&self.id.runbook, budgets);
        match (refused, proved.reserved) {
            (None, _) => {
                self.proof.answered(sent);
                Ok(())
            }
            (Some(refused), Some(reserved)) => {
                // Until it is given back, it counts: fail closed.
                if let Err(e) = self.store.give_back(reserved).await {
                    tracing::warn!(run_id = %self.id.run_id, "a refused call's reservation of the fleet budget was not given back, and counts until it leaves the window: {e}");
                }
                Err(refused)
            }
            (Some(refused), None) => Err(refused),
        }
    }

    /// Just before a call is sent, after its intent line is on disk: the
    /// claim is still proven by the last fence or renewal. A sync that
    /// stalled past the proof (a sick disk, a paused process) while the
    /// database could not be reached means another replica may hold the
    /// host by now: the call is not sent. A refusal is the gate's.
    pub(crate) fn still_proven(&self) -> Result<(), (DenyReason, String)> {
        let until = self.proof.until();
        let now = tokio::time::Instant::now();
        if now < until {
            return Ok(());
        }
        Err((
            DenyReason::LeaseLost,
            format!(
                "the lease (token {}) was last proven {} ago, longer than two thirds of a {} lease, and another replica may hold the host by now; the call was not sent",
                self.id.token,
                humantime::format_duration(Duration::from_millis(
                    (now - until + self.proof.lasts).as_millis() as u64
                )),
                humantime::format_duration(self.store.lease),
            ),
        ))
    }

    /// The run made no call and this replica is stopping: the run ends here
    /// and its trigger goes back to the fleet's queue as run `next` (see
    /// [`Postgres::hand_back`]); renewals stop. `false`: the lease was no
    /// longer this run's, and nothing was queued.
    pub(crate) async fn hand_back(&self, next: &str, request: &str) -> Result<bool, StoreError> {
        self.renewals.abort();
        self.store.hand_back(&self.id, next, request).await
    }

    /// The run ended: record its verdict and free the claim. The database
    /// is tried for as long as the lease would have lived; if it never
    /// answers, the lease expires and another replica closes the run
    /// `interrupted`.
    pub(crate) async fn finish(
        self,
        verdict: &str,
        audit_head: &str,
        dry_run: bool,
    ) -> Result<(), StoreError> {
        self.renewals.abort();
        let give_up = tokio::time::Instant::now() + self.store.lease;
        loop {
            match self
                .store
                .finish(&self.id, verdict, audit_head, dry_run)
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= give_up => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

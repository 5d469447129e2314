//! What one machine and a fleet must agree on, behind one trait.
//!
//! Every trigger (an alert, a schedule's fire, an API request) meets the
//! same admission rule for its (runbook, host): a run in flight, or a
//! repeat of the last run's own trigger within the duplicate window or the
//! runbook's cooldown, is `deduplicated`; another trigger within the
//! cooldown is `cooldown`; anything else starts a run. What a daemon can
//! say alone (no runbook, a host out of scope, an alert that cannot be
//! kept, the kill switch) is decided before; [`SharedState`] decides the
//! rest and records every outcome, so counting and recording happen once,
//! in the scheduler. The same trait holds what else replicas must agree
//! on: a person's run's claim of its host, a failed run counted toward its
//! runbook's demotion and a person's promotion of it, approval requests
//! any replica may decide, and the kill switch and demotions a run's gate
//! sees.
//!
//! The rules themselves are written once, in [`crate::rules`], as pure
//! functions over what is known (of a (runbook, host), a runbook's
//! failures, a call's budgets). Two implementations
//! gather that and keep what the rules decide: [`Local`] in this process
//! (restored from the audit log at start, its files under the state
//! directory), [`Fleet`] in the shared PostgreSQL state, under the rows'
//! locks. One table of cases (`tests/fixtures/admission-cases.json`) holds
//! both to the same outcomes. Which one a daemon (or `runwarden run`, or
//! `runwarden promote`) uses is chosen once, at its start (`state.postgres`
//! in the settings); nothing else asks.

mod fleet;
mod local;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub(crate) use fleet::Fleet;
pub(crate) use local::{Local, Slot};

use std::path::Path;

use crate::config::{DemoteAfter, Settings};
use crate::gate::approvals::{Approvals, Decision, DecisionError, Request, State as ApprovalState};
use crate::gate::demotion::{Demotion, Failure, PromoteRefused};
use crate::gate::{Demotions, KillSwitch};
use crate::store::{Lease, StoreError};
use crate::trigger::RunRequest;

use crate::rules::TriggerResult;

/// A trigger in scope and not stopped here, put to admission.
#[derive(Debug)]
pub(crate) struct Ask<'a> {
    /// The trigger.
    pub(crate) req: &'a RunRequest,
    /// The runbook's cooldown.
    pub(crate) cooldown: Option<Duration>,
    /// The runbook's `max_runs`.
    pub(crate) cap: Option<crate::config::MaxRuns>,
    /// The id its run takes if it starts.
    pub(crate) run_id: String,
}

/// A trigger decided before admission, for the record.
#[derive(Debug)]
pub(crate) struct Decided<'a> {
    /// The runbook it named (`none` when none took it).
    pub(crate) runbook: &'a str,
    /// The host it named (empty when it named none).
    pub(crate) host: &'a str,
    /// Its fingerprint and group keys.
    pub(crate) keys: &'a [String],
    /// What kind of trigger it was.
    pub(crate) trigger: crate::origin::Trigger,
    /// What became of it.
    pub(crate) result: TriggerResult,
}

/// What admission made of an [`Ask`].
#[derive(Debug)]
pub(crate) enum Admitted {
    /// It starts a run; with shared state, the run holds this lease.
    Started(Option<Lease>),
    /// It starts a run that waits in the fleet's queue for whichever
    /// replica has a free run permit first (this one included).
    Queued,
    /// It does not: deduplicated, cooldown, or the fleet's kill switch.
    Refused(TriggerResult),
}

/// The shared state of a daemon or a person's run: PostgreSQL's when
/// `state.postgres` is set (`store`), else this machine's. Chosen here,
/// once, at start-up.
pub(crate) fn chosen(
    store: Option<std::sync::Arc<crate::store::Postgres>>,
) -> std::sync::Arc<dyn SharedState> {
    match store {
        Some(store) => std::sync::Arc::new(Fleet::new(store)),
        None => std::sync::Arc::new(Local::default()),
    }
}

/// A future a [`SharedState`] returns.
pub(crate) type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What one machine and a fleet must agree on: [`Local`] or [`Fleet`],
/// chosen once at start-up.
pub(crate) trait SharedState: Send + Sync {
    /// One outcome per ask, in order; `decided` are recorded with them
    /// (with shared state, in the fleet's table). With shared state, only
    /// the first `direct` that start are this daemon's to run now (it holds
    /// that many run permits) and the rest are [`Admitted::Queued`]; on one
    /// machine every run waits for a permit here. An error: nothing was
    /// admitted, and the sender must be told to retry.
    fn admit<'a>(
        &'a self,
        asks: &'a [&'a Ask<'a>],
        decided: &'a [Decided<'a>],
        direct: usize,
    ) -> Pending<'a, Vec<Admitted>>;

    /// Runs admitted by `admit` that will not start after all (their
    /// `queued` lines could not be written): give their claims back.
    fn abandon<'a>(&'a self, started: &'a [(&'a RunRequest, String)]) -> Pending<'a, ()>;

    /// The triggers of the runs `admit` started (`started`) and queued
    /// (`handed`) are on this machine's disk: a retry of one is now its
    /// duplicate, and the queued runs may be taken by any daemon. An
    /// error: the queued runs will not run, and the sender must be told to
    /// retry (the started ones go on whatever the answer).
    fn confirm<'a>(&'a self, started: &'a [String], handed: &'a [String]) -> Pending<'a, ()>;

    /// The run of `req` ended (or never started): its (runbook, host) is
    /// free, and its trigger keys count as the last run's; none do when
    /// the run saw its alert clear (`cleared`), so that alert firing
    /// again starts a run at once, as the fix that did not hold.
    fn ended(&self, req: &RunRequest, cleared: bool);

    /// Whether runs admitted here that this daemon cannot start at once
    /// go to a queue every daemon takes from (the fleet's). Then a daemon
    /// takes its run permits as it admits (and an agent's run, which
    /// cannot be queued, is `pending` while none is free), and a run
    /// stopped before it started is handed to the queue; on one machine a
    /// run waits for a permit here, and one stopped before it started is
    /// restored from the audit log at the next start.
    fn queues(&self) -> bool;

    /// Claim the (runbook, host) for a run a person started on the
    /// command line, through the same admission as a daemon's (not
    /// recorded as a trigger): with shared state its lease, refused while
    /// another run holds it or the fleet's kill switch is engaged; on one
    /// machine no claim (the run lock is).
    fn claim<'a>(&'a self, req: &'a RunRequest, run_id: &'a str) -> Pending<'a, Admitted>;

    /// A failed run of a runbook with `demote_after` (`rule`) counts
    /// toward its demotion: the demotion, if this failure reached it (of
    /// racing replicas, exactly one does).
    fn record_failure<'a>(
        &'a self,
        settings: &'a Settings,
        failure: Failure,
        rule: DemoteAfter,
    ) -> Pending<'a, Option<Demotion>>;

    /// A person gives `runbook` its standing approval back (`runwarden
    /// promote`), refused while the evidence is in its window unless
    /// `force` ([`crate::rules::demotion::window_holds`]): with shared state
    /// the fleet's demotion is lifted for every replica and this machine's
    /// own record goes with it; on one machine, this machine's.
    fn promote<'a>(
        &'a self,
        settings: &'a Settings,
        runbook: &'a str,
        force: bool,
    ) -> Pending<'a, Result<Demotion, PromoteRefused>>;

    /// An approval request this daemon's run waits on: with shared state,
    /// shared so any replica lists and decides it.
    fn share_approval<'a>(&'a self, request: &'a Request) -> Pending<'a, ()>;

    /// A request this daemon stopped waiting on ends so for every replica,
    /// unless a decision got there first.
    fn close_approval<'a>(&'a self, request: &'a Request) -> Pending<'a, ()>;

    /// Withdraw the pending requests of other replicas' runs of `runbook`
    /// on `host` that trigger key `key` started: the requests withdrawn.
    fn withdraw_approvals<'a>(
        &'a self,
        runbook: &'a str,
        host: &'a str,
        key: &'a str,
        state: &'a ApprovalState,
    ) -> Pending<'a, Vec<Request>>;

    /// The approval requests a person may see through this daemon (`id`:
    /// that one): with shared state every replica's, else `here`'s, this
    /// daemon's own.
    fn approvals<'a>(
        &'a self,
        here: Option<&'a Approvals>,
        id: Option<&'a str>,
    ) -> Pending<'a, Vec<Request>>;

    /// A person's decision on request `id`, as `by` (authorized by
    /// [`crate::access`]), taken exactly once: with shared state in the
    /// fleet's table (the replica whose run waits reads it back), else by
    /// `here`.
    fn decide_approval<'a>(
        &'a self,
        here: &'a Approvals,
        id: &'a str,
        d: &'a Decision<'a>,
    ) -> Pending<'a, Result<Request, DecisionError>>;

    /// The fleet's runs, newest first (`GET /api/v1/fleet/runs`); `None`
    /// without shared state, where this daemon's runs are all there is.
    fn fleet_runs<'a>(
        &'a self,
        runbook: Option<&'a str>,
        host: Option<&'a str>,
        limit: i64,
    ) -> Pending<'a, Option<serde_json::Value>>;

    /// What the audit log says of recent runs at start-up (when each
    /// (runbook, host) last ended, the keys that started it, its recent
    /// starts), read from `log`, which is then followed for the runs of
    /// other processes on this machine. With shared state the fleet's rows
    /// say it already.
    fn restore(&self, record: &crate::audit::runs::Recovery, log: &Path);

    /// `Some(why)` while the state cannot be relied on (the database is
    /// unreachable): triggers are answered 503 and `/healthz` says why.
    fn unhealthy(&self) -> Option<String>;

    /// End the fleet's timed kill switches whose time has come: those
    /// ended (this machine's own files end through [`KillSwitch`]).
    fn sweep_switches(&self) -> Pending<'_, Vec<crate::gate::killswitch::Expired>>;

    /// Tell the other replicas which of this machine's switch files are
    /// engaged (scope, what a person reads), so `status` and `release` on
    /// any of them can say what still stops runs here.
    fn publish_switches<'a>(&'a self, engaged: &'a [(String, String)]) -> Pending<'a, ()>;

    /// The kill switch a run's gate checks: the files in `dir`, and with
    /// shared state the fleet's switch beside them.
    fn kill_switch(&self, dir: &Path) -> KillSwitch;

    /// Engage the switch of `runbook` (`None`: every runbook) as `by`, for
    /// `for_` (`None`: until released): with shared state the fleet's, which
    /// every replica's gate reads within a second (this machine's file when
    /// the database cannot be reached, and the answer says so), else
    /// `ks`'s file. A switch in force is never weakened.
    fn engage_switch<'a>(
        &'a self,
        ks: &'a KillSwitch,
        runbook: Option<&'a str>,
        by: &'a str,
        reason: &'a str,
        for_: Option<Duration>,
    ) -> Pending<'a, crate::gate::killswitch::Switched>;

    /// Release the switch of `runbook` (`None`: the global one): this
    /// machine's file and, with shared state, the fleet's. Whether either
    /// was engaged; an error when the fleet's could not be released.
    fn release_switch<'a>(
        &'a self,
        ks: &'a KillSwitch,
        runbook: Option<&'a str>,
    ) -> Pending<'a, bool>;

    /// What stops runs now (scope, what a person reads): `ks`'s files and,
    /// with shared state, the fleet's switches (scopes `fleet:SCOPE`).
    fn switches<'a>(&'a self, ks: &'a KillSwitch) -> Pending<'a, Vec<(String, String)>>;

    /// The demotions a run's gate asks: this machine's record, and with
    /// shared state the fleet's beside it.
    fn demotions(&self, settings: &Settings) -> Demotions;
}

/// Engage `ks`'s file for `runbook` as `by`, off the async threads (it
/// takes the switch directory's lock): both backends, the fleet's as its
/// fallback when the database cannot be reached, which `warning` says.
async fn engage_file(
    ks: &KillSwitch,
    runbook: Option<&str>,
    by: &str,
    reason: &str,
    for_: Option<Duration>,
    warning: Option<String>,
) -> Result<crate::gate::killswitch::Switched, StoreError> {
    let until = for_
        .map(|d| crate::gate::killswitch::end_for(d, "`for`"))
        .transpose()
        .map_err(StoreError::Local)?;
    let scope = runbook
        .unwrap_or(crate::rules::kill_switch::GLOBAL)
        .to_string();
    let (ks, runbook, by, reason) = (
        ks.clone(),
        runbook.map(String::from),
        by.to_string(),
        reason.to_string(),
    );
    let done = tokio::task::spawn_blocking(move || {
        ks.engage_as(runbook.as_deref(), &by, &reason, until)
            .map_err(|e| {
                format!(
                    "cannot engage the kill switch in {}: {e}",
                    ks.dir().display()
                )
            })
    })
    .await
    .map_err(|e| StoreError::Local(format!("engaging the kill switch: {e}")))?
    .map_err(StoreError::Local)?;
    Ok(crate::gate::killswitch::Switched {
        scope,
        until: done.until,
        reach: "replica",
        warning,
    })
}

/// Release `ks`'s file for `runbook`: whether it was engaged.
fn release_file(ks: &KillSwitch, runbook: Option<&str>) -> Result<bool, StoreError> {
    ks.release(runbook).map_err(|e| {
        StoreError::Local(format!(
            "cannot release {}: {e}",
            ks.file_of(runbook).display()
        ))
    })
}

/// What stops runs now: this machine's switch files and, with shared state,
/// the fleet's switch and every other replica's own files as each last
/// published them (with where to release them); `kill-switch status` and
/// `GET /api/v1/kill-switch` list it, and a release says it stays engaged.
pub(crate) async fn in_force(
    ks: &KillSwitch,
    fleet: Option<&crate::store::Postgres>,
) -> Result<Vec<(String, String)>, String> {
    let mut list = ks.status().map_err(|e| e.to_string())?;
    let Some(store) = fleet else {
        return Ok(list);
    };
    match store.switches().await {
        Ok(on) => list.extend(
            on.into_iter()
                .map(|(scope, d)| (format!("fleet:{scope}"), d)),
        ),
        Err(e) => list.push((
            "fleet".into(),
            format!("unknown, {e} (each replica still fences its calls against it)"),
        )),
    }
    let others = store.replica_switches().await.unwrap_or_default();
    list.extend(
        others
            .into_iter()
            .filter(|r| r.replica != store.replica)
            .map(|r| {
                (
                    format!("{} on replica {}", r.scope, r.replica),
                    format!(
                        "{} (release it there: runwarden kill-switch release on {})",
                        r.detail, r.replica
                    ),
                )
            }),
    );
    Ok(list)
}

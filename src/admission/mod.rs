//! Admission: what becomes of a trigger before any run starts.
//!
//! Every trigger (an alert, a schedule's fire, an API request) meets the
//! same rule for its (runbook, host): a run in flight, or a repeat of the
//! last run's own trigger within [`DUPLICATE_WINDOW`] or the runbook's
//! cooldown, is `deduplicated`; another trigger within the cooldown is
//! `cooldown`; anything else starts a run. What a daemon can say alone
//! (no runbook, a host out of scope, an alert that cannot be kept, the kill
//! switch) is decided before; [`Admission`] decides the rest and records
//! every outcome, so counting and recording happen once, in the scheduler.
//!
//! The rule itself is written once, in [`rules`], as pure functions over
//! what is known of a (runbook, host). Two implementations gather that and
//! keep what the rules decide: [`Local`] in this process (restored from the
//! audit log at start), [`Fleet`] in the shared PostgreSQL state, under the
//! rows' locks. One table of cases (`tests/fixtures/admission-cases.json`)
//! holds both to the same outcomes.

mod fleet;
mod local;
pub(crate) mod rules;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;

pub(crate) use fleet::Fleet;
pub(crate) use local::{Local, Slot};

use crate::store::{Lease, StoreError};
use crate::trigger::RunRequest;

/// How long after a run ends a repeat of its own trigger (the same alert
/// fingerprint or group, the same schedule fire) is still a duplicate,
/// whatever the cooldown: Alertmanager in HA mode sends a notification
/// twice now and then, and every replica fires the same schedule. Well
/// under Alertmanager's shortest sensible `group_interval`, so a real
/// repeat of a still-firing alert starts a run again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(60);

/// What became of a trigger. The names are `runwarden_alert_triggers_total` labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TriggerResult {
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
    /// The runbook ran on the host as often as its `max_runs` allows within
    /// the window: a fix that keeps being needed is for a person to look at.
    Capped,
    /// Another replica admitted a run for the host that its disk does not
    /// hold yet: it may die before it does, and then this trigger would be
    /// the only trace of the alert. Not accepted; the sender retries (the
    /// webhook answers 503) and by then that run is confirmed, a duplicate,
    /// or gone, and the retry starts one.
    Pending,
}

impl TriggerResult {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TriggerResult::Started => "started",
            TriggerResult::Deduplicated => "deduplicated",
            TriggerResult::Cooldown => "cooldown",
            TriggerResult::OutOfScope => "out_of_scope",
            TriggerResult::KillSwitch => "kill_switch",
            TriggerResult::NoMatch => "no_match",
            TriggerResult::Invalid => "invalid",
            TriggerResult::Capped => "capped",
            TriggerResult::Pending => "pending",
        }
    }
}

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

/// A future an [`Admission`] returns.
pub(crate) type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Decides the triggers a daemon cannot decide alone, and records every
/// trigger's outcome.
pub(crate) trait Admission: Send + Sync {
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

    /// The run of `req` ended (or never started): its (runbook, host) is
    /// free, and its trigger keys count as the last run's.
    fn ended(&self, req: &RunRequest);
}

//! The rules: what a trigger, a call and a failed run come to, written
//! once, as pure functions over what is known when they are decided.
//!
//! One machine and a fleet gather those facts differently (this machine
//! from its files, its memory and its clock; a fleet from PostgreSQL's
//! rows, under their locks, by PostgreSQL's clock) and keep what the rules
//! decide in their own storage, but neither decides anything itself: the
//! gate's ledgers (`gate::fleet`, `gate::demotion`, `gate::killswitch`)
//! and the shared state (`state::Local`, `state::Fleet`) all call these.
//! A rule changed here changes for both, and the tests of each rule are
//! tables both backends are held to.
//!
//! - [`admission`]: whether a trigger starts a run (duplicates, cooldown,
//!   `max_runs`).
//! - [`budget`]: whether the fleet budgets take one more tier-2 call.
//! - [`demotion`]: whether a failed run demotes its runbook to L2, and
//!   whether a person may promote it yet.
//! - [`exit`]: how a command that reached several hosts exits.
//! - [`kill_switch`]: which engaged switch, if any, stops a runbook.
//! - [`rollout`]: a fan-out's waves, and whether its next host may start.
//!
//! This module sits just above `config` (it reads a runbook's settings)
//! and below everything that keeps state.

pub mod admission;
pub(crate) mod budget;
pub(crate) mod demotion;
pub(crate) mod exit;
pub(crate) mod kill_switch;
pub(crate) mod rollout;

use serde::Serialize;

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

//! What a rollout is at any moment: its state, each wave's hosts and
//! their outcomes, the failures `max_failures` counts. The driver, a
//! person's decisions and a restart's fold of the log all change it
//! through these methods, so the counting is written once.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::origin::Trigger;
use crate::verdict::Verdict;

/// Where a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum State {
    /// Dispatching a wave, or waiting for its runs.
    Running,
    /// Between two waves: the pause, the guard.
    Pausing,
    /// Nothing new starts until a person resumes or aborts it.
    Halted,
    /// A person ended it.
    Aborted,
    /// Every wave ran.
    Finished,
}

impl State {
    /// As the fleet's row has it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Pausing => "pausing",
            State::Halted => "halted",
            State::Aborted => "aborted",
            State::Finished => "finished",
        }
    }

    /// Whether nothing more will ever happen to it.
    pub(crate) fn is_over(self) -> bool {
        matches!(self, State::Aborted | State::Finished)
    }
}

/// One host of a rollout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HostOutcome {
    pub(crate) host: String,
    /// Its run, once one started.
    pub(crate) run_id: Option<String>,
    /// `waiting`, `running`, the run's verdict, or `not_started`.
    pub(crate) outcome: String,
    /// Why that outcome (a verdict's detail, why it did not start).
    pub(crate) detail: String,
}

impl HostOutcome {
    /// Whether its run is over (or never started, and never will by itself).
    pub(super) fn ended(&self) -> bool {
        !matches!(self.outcome.as_str(), "waiting" | "running")
    }

    /// Whether it counts against `max_failures`: any end but `ok`.
    pub(super) fn failed(&self) -> bool {
        self.ended() && self.outcome != "ok"
    }
}

/// A rollout as `status` shows it (and, with shared state, as the
/// fleet's row keeps it for the replica that takes it over).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Status {
    pub(crate) id: String,
    pub(crate) runbook: String,
    pub(crate) trigger: Trigger,
    pub(crate) started_at: String,
    pub(crate) state: State,
    /// Why it is halted or was aborted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// The frozen waves, each host's outcome.
    pub(crate) waves: Vec<Vec<HostOutcome>>,
    pub(crate) max_failures: u32,
    pub(crate) pause_secs: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) guard: Option<String>,
    /// Failures across the rollout.
    pub(crate) failures: u32,
    /// Failures a person already accepted by resuming: `max_failures`
    /// counts from here.
    pub(crate) accepted: u32,
    /// When the next wave may start (in a pause).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_wave_at: Option<String>,
    /// What the next step waits on.
    pub(crate) waiting_on: String,
    /// Of the runs' verdicts so far, the worst (a host that never started counts as `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) worst: Option<Verdict>,
    /// Keys every run it starts carries besides its own (a schedule
    /// fire's): what a replica that takes it over goes on with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) keys: Vec<String>,
}

impl Status {
    /// A rollout of `runbook` just frozen into `waves`, held by `rollout`.
    pub(super) fn new(
        id: &str,
        runbook: &str,
        trigger: Trigger,
        waves: &[Vec<Arc<str>>],
        rollout: Option<&crate::config::Rollout>,
    ) -> Status {
        let r = rollout;
        Status {
            id: id.to_string(),
            runbook: runbook.to_string(),
            trigger,
            started_at: jiff::Timestamp::now().to_string(),
            state: State::Running,
            reason: None,
            waves: waves
                .iter()
                .map(|w| {
                    w.iter()
                        .map(|h| HostOutcome {
                            host: h.to_string(),
                            run_id: None,
                            outcome: "waiting".into(),
                            detail: String::new(),
                        })
                        .collect()
                })
                .collect(),
            max_failures: r.map_or(0, |r| r.max_failures),
            pause_secs: r.map_or(0, |r| r.pause.as_secs()),
            guard: r.and_then(|r| r.guard.clone()),
            failures: 0,
            accepted: 0,
            next_wave_at: None,
            waiting_on: "its first wave".into(),
            worst: None,
            keys: Vec::new(),
        }
    }

    /// The host `host`, mutably.
    pub(super) fn host_mut(&mut self, host: &str) -> Option<(usize, &mut HostOutcome)> {
        self.waves
            .iter_mut()
            .enumerate()
            .find_map(|(i, w)| w.iter_mut().find(|h| h.host == host).map(|h| (i, h)))
    }

    /// Record how `host`'s run ended (or why it did not start), counting
    /// its failure. False when it had already ended.
    pub(super) fn ended(
        &mut self,
        host: &str,
        run_id: Option<&str>,
        outcome: &str,
        detail: &str,
    ) -> bool {
        let Some((_, h)) = self.host_mut(host) else {
            return false;
        };
        if h.ended() {
            return false;
        }
        h.outcome = outcome.to_string();
        h.detail = detail.to_string();
        if let Some(id) = run_id {
            h.run_id = Some(id.to_string());
        }
        let verdict = outcome.parse::<Verdict>().unwrap_or(Verdict::Failed);
        self.worst = Some(self.worst.map_or(verdict, |w| w.max(verdict)));
        if verdict != Verdict::Ok {
            self.failures += 1;
        }
        true
    }

    /// The hosts that ran or run still, and those never started.
    pub(super) fn split(&self) -> (Vec<String>, Vec<String>) {
        let (never, ran): (Vec<&HostOutcome>, Vec<&HostOutcome>) = self
            .waves
            .iter()
            .flatten()
            .partition(|h| h.outcome == "waiting" || h.outcome == "not_started");
        (
            ran.iter().map(|h| h.host.clone()).collect(),
            never.iter().map(|h| h.host.clone()).collect(),
        )
    }

    /// Failures `max_failures` counts: those since a person last resumed.
    pub(super) fn counted(&self) -> u32 {
        self.failures.saturating_sub(self.accepted)
    }
}

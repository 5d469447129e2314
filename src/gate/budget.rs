//! What a run has spent: steps, mutations and wall time, counted by the gate.
//!
//! A planner cannot under-report: every proposed call passes the gate, which
//! counts it, whether it is then allowed, proposed or denied.

use std::time::{Duration, Instant};

use super::DenyReason;
use crate::config::runbook::Budget as Limits;

#[derive(Debug, Clone)]
pub struct Budget {
    limits: Limits,
    started: Instant,
    steps: u32,
    mutations: u32,
}

impl Budget {
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            started: Instant::now(),
            steps: 0,
            mutations: 0,
        }
    }

    /// Count one proposed call.
    pub(super) fn count_step(&mut self) {
        self.steps += 1;
    }

    /// Would one more call (a mutation if `mutating`) stay inside the budget?
    pub(super) fn check(&self, mutating: bool) -> Result<(), (DenyReason, String)> {
        if self.steps > self.limits.max_steps {
            return Err((
                DenyReason::StepLimit,
                format!("max_steps {} reached", self.limits.max_steps),
            ));
        }
        if self.started.elapsed() >= self.limits.max_duration {
            return Err((
                DenyReason::TimeBudget,
                format!(
                    "max_duration {} spent",
                    humantime::format_duration(self.limits.max_duration)
                ),
            ));
        }
        if mutating && self.mutations >= self.limits.max_mutations {
            return Err((
                DenyReason::MutationBudget,
                format!("max_mutations {} already used", self.limits.max_mutations),
            ));
        }
        Ok(())
    }

    pub(super) fn limit_steps(&mut self, more: u32) {
        self.limits.max_steps = self.limits.max_steps.min(self.steps.saturating_add(more));
    }

    pub(super) fn count_mutation(&mut self) {
        self.mutations += 1;
    }

    pub fn steps(&self) -> u32 {
        self.steps
    }

    pub fn mutations(&self) -> u32 {
        self.mutations
    }

    /// When the run's wall-time budget ends.
    pub fn deadline(&self) -> Instant {
        self.started + self.limits.max_duration
    }

    pub fn remaining(&self) -> Duration {
        self.limits
            .max_duration
            .saturating_sub(self.started.elapsed())
    }
}

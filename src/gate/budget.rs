//! What a run has spent: steps, mutations and wall time, counted by the gate.
//!
//! A planner cannot under-report: every proposed call passes the gate, which
//! counts it, whether it is then allowed, proposed or denied.

use std::time::Duration;

use tokio::time::Instant;

use super::DenyReason;
use crate::config::runbook::Budget as Limits;

/// What one run has spent against its runbook's limits.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    limits: Limits,
    started: Instant,
    steps: u32,
    mutations: u32,
    /// Requests made to the model planner, and the most it may make.
    model_requests: u32,
    max_model_requests: u32,
}

impl Budget {
    /// A fresh budget, its clock started now.
    pub(crate) fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            started: Instant::now(),
            steps: 0,
            mutations: 0,
            model_requests: 0,
            max_model_requests: limits.max_steps.saturating_add(1),
        }
    }

    /// Count one proposed call.
    pub(super) fn count_step(&mut self) {
        self.steps += 1;
    }

    /// Would one more call (a mutation if `mutating`) stay inside the budget?
    pub(super) fn check(&self, mutating: bool) -> Result<(), (DenyReason, String)> {
        self.step_check()?;
        self.time_check()?;
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
        // Every useful request proposes at least one call, and one more gives
        // the final answer: a model that asks more is stuck.
        self.max_model_requests = self.max_model_requests.min(more.saturating_add(1));
    }

    /// Refuses the call just counted when it is past `max_steps`.
    /// The run's `max_steps`, as it stands (a model's run may have lowered it).
    pub(super) fn max_steps(&self) -> u32 {
        self.limits.max_steps
    }

    pub(super) fn step_check(&self) -> Result<(), (DenyReason, String)> {
        if self.steps > self.limits.max_steps {
            return Err((
                DenyReason::StepLimit,
                format!("max_steps {} reached", self.limits.max_steps),
            ));
        }
        Ok(())
    }

    /// Count one model request, refusing it past the ceiling.
    pub(super) fn count_model_request(&mut self) -> Result<(), (DenyReason, String)> {
        if self.model_requests >= self.max_model_requests {
            return Err((
                DenyReason::StepLimit,
                format!(
                    "the model made {} requests, the most one run may make (its max_steps plus the final answer); it is not converging",
                    self.model_requests
                ),
            ));
        }
        self.model_requests += 1;
        Ok(())
    }

    /// Model requests made so far.
    pub(crate) fn model_requests(&self) -> u32 {
        self.model_requests
    }

    /// Whether the wall-time budget is spent.
    pub(super) fn time_check(&self) -> Result<(), (DenyReason, String)> {
        if self.started.elapsed() >= self.limits.max_duration {
            return Err((
                DenyReason::TimeBudget,
                format!(
                    "max_duration {} spent",
                    humantime::format_duration(self.limits.max_duration)
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn count_mutation(&mut self) {
        self.mutations += 1;
    }

    /// Calls proposed so far (denied ones included).
    pub(crate) fn steps(&self) -> u32 {
        self.steps
    }

    /// Tier-2 calls made so far.
    pub(crate) fn mutations(&self) -> u32 {
        self.mutations
    }

    /// When the run's wall-time budget ends.
    pub(crate) fn deadline(&self) -> Instant {
        self.started + self.limits.max_duration
    }

    /// The run's `max_duration`.
    pub(crate) fn max_duration(&self) -> Duration {
        self.limits.max_duration
    }

    /// What the run may still spend: steps, tier-2 calls, whole seconds.
    pub(crate) fn left(&self) -> serde_json::Value {
        serde_json::json!({
            "steps": self.limits.max_steps.saturating_sub(self.steps),
            "mutations": self.limits.max_mutations.saturating_sub(self.mutations),
            "seconds": self.remaining().as_secs(),
        })
    }

    /// Time left before `max_duration`.
    pub(crate) fn remaining(&self) -> Duration {
        self.limits
            .max_duration
            .saturating_sub(self.started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_steps: 3,
            max_mutations: 1,
            max_duration: Duration::from_secs(600),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_budget_runs_out_on_the_clock() {
        let b = Budget::new(limits());
        assert!(b.check(false).is_ok());
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(b.check(true).is_ok());
        assert_eq!(b.remaining(), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        let (reason, why) = b.check(false).unwrap_err();
        assert_eq!(reason, DenyReason::TimeBudget, "{why}");
        assert_eq!(b.remaining(), Duration::ZERO);
        assert!(Instant::now() >= b.deadline());
    }

    #[test]
    fn steps_and_mutations_run_out_by_count() {
        let mut b = Budget::new(limits());
        b.count_mutation();
        assert_eq!(b.check(true).unwrap_err().0, DenyReason::MutationBudget);
        assert!(b.check(false).is_ok(), "observing still fits");
        for _ in 0..3 {
            b.count_step();
        }
        assert!(b.check(false).is_ok(), "the third of max_steps 3");
        b.count_step();
        assert_eq!(b.check(false).unwrap_err().0, DenyReason::StepLimit);
    }
}

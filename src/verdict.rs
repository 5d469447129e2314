//! How a run ended: one verdict, folded from what its steps came to.
//!
//! A leaf: the run loop judges it, and the audit log, the report, the
//! metrics and the command line's exit code all read it.

use serde::Serialize;

/// How a run ended. Ordered from best to worst; the worst event decides.
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every call succeeded and every change verified; for a runbook with
    /// `done_when.alert_clears`, and the alert that started it is gone.
    #[default]
    Ok,
    /// Every call succeeded, and the alert that started the run was still
    /// firing when `done_when.alert_clears.within` ended: the fix did not fix.
    Unresolved,
    /// A call failed, timed out, or a change could not be verified.
    Failed,
    /// A model-planned run without evidence: it made no successful call, or
    /// its answer claims a change the run's record lacks. Its account is
    /// not to be believed as it stands.
    Inconclusive,
    /// The gate refused at least one call.
    Denied,
    /// `max_steps` ran out.
    StepLimit,
    /// The mutation or wall-time budget ran out.
    BudgetExhausted,
    /// The run could not go on: the audit log failed, or a `when` or template did.
    Broken,
    /// The kill switch stopped the run.
    Halted,
    /// The process running it stopped before its verdict (closed by the
    /// next daemon to start).
    Interrupted,
}

impl Verdict {
    /// As reports, audit lines and metric labels write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Unresolved => "unresolved",
            Verdict::Failed => "failed",
            Verdict::Inconclusive => "inconclusive",
            Verdict::Denied => "denied",
            Verdict::StepLimit => "step_limit",
            Verdict::BudgetExhausted => "budget_exhausted",
            Verdict::Broken => "broken",
            Verdict::Halted => "halted",
            Verdict::Interrupted => "interrupted",
        }
    }

    /// The process exit code of `runwarden run` (2 is kept for usage and config errors).
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Verdict::Ok => 0,
            Verdict::Failed => 1,
            Verdict::Denied => 3,
            Verdict::StepLimit => 4,
            Verdict::BudgetExhausted => 5,
            Verdict::Broken => 6,
            Verdict::Halted => 7,
            Verdict::Inconclusive => 8,
            Verdict::Unresolved => 9,
            // Like broken: the run ended without reaching its own verdict.
            Verdict::Interrupted => 6,
        }
    }

    /// Every verdict, from best to worst.
    pub(crate) const ALL: [Verdict; 10] = [
        Verdict::Ok,
        Verdict::Unresolved,
        Verdict::Failed,
        Verdict::Inconclusive,
        Verdict::Denied,
        Verdict::StepLimit,
        Verdict::BudgetExhausted,
        Verdict::Broken,
        Verdict::Halted,
        Verdict::Interrupted,
    ];
}

impl std::str::FromStr for Verdict {
    type Err = crate::text::NotOfForm;

    fn from_str(s: &str) -> Result<Verdict, Self::Err> {
        Verdict::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| crate::text::NotOfForm::new(s, "not a verdict"))
    }
}

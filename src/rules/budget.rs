//! The fleet budgets: whether one more tier-2 call fits in every sliding
//! window it counts against (`fleet_budget:` in runwarden.yaml for every
//! runbook's calls, in a runbook for its own).
//!
//! The facts are how many calls each window holds now, counted by the
//! caller under its own lock (a `flock` on one machine, an advisory lock
//! in PostgreSQL), so two runs never both take the last call; [`spend`]
//! decides. runwarden.yaml's window is asked first.

use std::time::Duration;

use crate::config::runbook::FleetBudget;

/// One budget a call counts against, and how many calls its window holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window<'a> {
    /// The budget.
    pub(crate) budget: FleetBudget,
    /// Whose calls it counts: `None` every runbook's (runwarden.yaml's),
    /// else the runbook's own.
    pub(crate) runbook: Option<&'a str>,
    /// Calls in the window now, before this one.
    pub(crate) used: usize,
}

/// A window is full: nothing more changes until older calls leave it.
///
/// The message says what the budget allows and that it is taken, not how
/// many calls the window counted: in a fleet that count may include calls
/// other runs are being refused at the same moment (each is reserved, then
/// given back), and a refusal must never claim more calls than ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fleet budget spent: {} {allows} tier-2 calls in {} are taken (fleet_budget in {}); nothing more changes until older calls leave the window",
    match .runbook { None => "every runbook's".to_string(), Some(r) => format!("runbook \"{r}\"'s") },
    humantime::format_duration(*.per),
    if .runbook.is_none() { "runwarden.yaml" } else { "the runbook" })]
pub(crate) struct Spent {
    /// Calls the window counted (at least `allows`; in a fleet, perhaps
    /// with others being refused).
    pub(crate) used: usize,
    /// Whose budget: `None` every runbook's.
    pub(crate) runbook: Option<String>,
    /// The window.
    pub(crate) per: Duration,
    /// How many calls it allows.
    pub(crate) allows: u32,
}

/// Whether one more call fits: the first full window, in the order given,
/// refuses it.
pub(crate) fn spend(windows: &[Window<'_>]) -> Result<(), Spent> {
    match windows
        .iter()
        .find(|w| w.used >= w.budget.max_mutations as usize)
    {
        None => Ok(()),
        Some(w) => Err(Spent {
            used: w.used,
            runbook: w.runbook.map(str::to_string),
            per: w.budget.per,
            allows: w.budget.max_mutations,
        }),
    }
}

/// How long a counted call is kept: as long as the longest window that
/// can see it, and a day at least, so a window made longer later still
/// sees the calls of the last day.
pub(crate) fn kept(budgets: &[FleetBudget]) -> Duration {
    budgets
        .iter()
        .map(|b| b.per)
        .max()
        .unwrap_or_default()
        .max(Duration::from_secs(24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(runbook: Option<&str>, allows: u32, used: usize) -> Window<'_> {
        Window {
            budget: FleetBudget {
                max_mutations: allows,
                per: Duration::from_secs(3600),
            },
            runbook,
            used,
        }
    }

    /// Under every window: taken. At a window's limit: refused, by the
    /// first full one in order, which the refusal names.
    #[test]
    fn the_first_full_window_refuses_and_names_itself() {
        assert_eq!(
            spend(&[window(None, 3, 2), window(Some("a"), 2, 1)]),
            Ok(())
        );
        let all = spend(&[window(None, 3, 3), window(Some("a"), 2, 2)]).unwrap_err();
        assert_eq!(all.runbook, None);
        assert!(
            all.to_string().contains(
                "every runbook's 3 tier-2 calls in 1h are taken (fleet_budget in runwarden.yaml)"
            ),
            "{all}"
        );
        let own = spend(&[window(None, 3, 2), window(Some("a"), 2, 2)]).unwrap_err();
        assert_eq!(own.runbook.as_deref(), Some("a"));
        assert!(
            own.to_string().contains(
                "runbook \"a\"'s 2 tier-2 calls in 1h are taken (fleet_budget in the runbook)"
            ),
            "{own}"
        );
        // No budget: nothing to refuse.
        assert_eq!(spend(&[]), Ok(()));
    }

    /// A fleet's window may count calls other runs are being refused at
    /// that moment (reserved, then given back): the refusal says what the
    /// budget allows and that it is taken, never more calls than ran.
    #[test]
    fn a_refusal_never_claims_more_calls_than_the_budget_let_run() {
        let crowded = spend(&[window(None, 10, 16)]).unwrap_err();
        let said = crowded.to_string();
        assert!(!said.contains("16"), "{said}");
        assert!(
            said.contains(
                "every runbook's 10 tier-2 calls in 1h are taken (fleet_budget in runwarden.yaml)"
            ),
            "{said}"
        );
    }

    #[test]
    fn a_call_is_kept_for_its_longest_window_and_a_day_at_least() {
        let hour = FleetBudget {
            max_mutations: 1,
            per: Duration::from_secs(3600),
        };
        let week = FleetBudget {
            per: Duration::from_secs(7 * 86_400),
            ..hour
        };
        assert_eq!(kept(&[hour]), Duration::from_secs(86_400));
        assert_eq!(kept(&[hour, week]), week.per);
        assert_eq!(kept(&[]), Duration::from_secs(86_400));
    }
}

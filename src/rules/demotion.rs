//! Demotion: when failed runs of an L3 runbook take its standing approval
//! away (`demote_after`: so many failures within a window, whichever host
//! or replica ran them), and when a person may give it back.
//!
//! The facts are how long ago each kept failure of the runbook happened
//! and whether it is demoted already, gathered under the keeper's lock (a
//! `flock` on one machine, an advisory lock per runbook in a fleet), so of
//! racing failures exactly one demotes.

use std::time::Duration;

use crate::config::DemoteAfter;

/// Whether a failure `ago` old is evidence under `rule`: within its window.
pub(crate) fn counts(ago: Duration, rule: DemoteAfter) -> bool {
    ago < rule.per
}

/// Whether the failure just kept demotes the runbook: it is not demoted
/// already, and its failures within the window (`failed_ago`, this one
/// included) reach the rule's count.
pub(crate) fn demotes(demoted: bool, failed_ago: &[Duration], rule: DemoteAfter) -> bool {
    !demoted && failed_ago.iter().filter(|a| counts(**a, rule)).count() >= rule.failures as usize
}

/// Whether a demotion's evidence still holds a promotion back: the newest
/// failure that reached it is less than `per` old. A person may promote
/// before then only with `--force`.
pub(crate) fn window_holds(newest_failure_ago: Duration, per: Duration) -> bool {
    newest_failure_ago < per
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    /// Two failures within ten minutes demote; one, an old one, or a
    /// runbook demoted already does not.
    #[test]
    fn failures_within_the_window_reach_the_count_once() {
        let rule = DemoteAfter {
            failures: 2,
            per: 10 * MIN,
        };
        assert!(demotes(false, &[9 * MIN, Duration::ZERO], rule));
        assert!(!demotes(false, &[Duration::ZERO], rule), "one is not two");
        assert!(
            !demotes(false, &[10 * MIN, Duration::ZERO], rule),
            "out of its window"
        );
        assert!(
            !demotes(true, &[MIN, Duration::ZERO], rule),
            "demoted already"
        );
        assert!(
            demotes(false, &[MIN, MIN, Duration::ZERO], rule),
            "past the count"
        );
    }

    #[test]
    fn the_window_holds_until_the_newest_evidence_is_as_old_as_it() {
        assert!(window_holds(9 * MIN, 10 * MIN));
        assert!(!window_holds(10 * MIN, 10 * MIN));
    }
}

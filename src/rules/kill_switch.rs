//! The kill switch: which engaged switch stops a runbook's calls.
//!
//! A switch is engaged for every runbook (`global`) or one; it is in force
//! while it is untimed or its end is still to come, whether or not the
//! sweep that removes ended switches has run yet. The global one is named
//! first. The facts are the switches found (files on this machine, rows
//! of the fleet's table), each with how long it has left; the keeper of a
//! switch that cannot be read counts it engaged and untimed (fail closed).

use jiff::SignedDuration;

/// The scope of a switch that stops every runbook.
pub(crate) const GLOBAL: &str = "global";

/// A switch found engaged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Switch<'a> {
    /// [`GLOBAL`], or the runbook it stops.
    pub(crate) scope: &'a str,
    /// How long until a timed switch ends (negative: it has ended); `None`
    /// untimed.
    pub(crate) left: Option<SignedDuration>,
}

impl<'a> Switch<'a> {
    /// A switch as a database row reports it: milliseconds left, `None`
    /// untimed.
    pub(crate) fn of_millis(scope: &'a str, left_ms: Option<i64>) -> Switch<'a> {
        Switch {
            scope,
            left: left_ms.map(SignedDuration::from_millis),
        }
    }
}

/// Whether a switch with `left` to go still stops calls.
pub(crate) fn in_force(left: Option<SignedDuration>) -> bool {
    left.is_none_or(|l| l.is_positive())
}

/// Which of `found` stops calls of `runbook` (`None`: ask only for what
/// stops every runbook), as its index: the first global one in force,
/// else the first of the runbook's own.
pub(crate) fn stops(found: &[Switch<'_>], runbook: Option<&str>) -> Option<usize> {
    let first = |scope: &str| {
        found
            .iter()
            .position(|s| s.scope == scope && in_force(s.left))
    };
    first(GLOBAL).or_else(|| runbook.and_then(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(scope: &str, left_secs: Option<i64>) -> Switch<'_> {
        Switch {
            scope,
            left: left_secs.map(SignedDuration::from_secs),
        }
    }

    #[test]
    fn the_global_switch_wins_and_an_ended_one_stops_nothing() {
        let found = [switch("web", None), switch(GLOBAL, Some(60))];
        assert_eq!(stops(&found, Some("web")), Some(1), "global first");
        assert_eq!(stops(&found, None), Some(1));
        assert_eq!(stops(&found[..1], Some("web")), Some(0));
        assert_eq!(stops(&found[..1], Some("db")), None, "another runbook's");
        assert_eq!(stops(&found[..1], None), None);
        let ended = [switch(GLOBAL, Some(0)), switch("web", Some(-5))];
        assert_eq!(stops(&ended, Some("web")), None, "ended, not yet swept");
        let both = [switch(GLOBAL, Some(-1)), switch("web", Some(1))];
        assert_eq!(stops(&both, Some("web")), Some(1));
    }
}

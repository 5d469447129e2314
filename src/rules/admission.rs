//! Admission: what a trigger comes to against what is known of its
//! (runbook, host).
//!
//! Pure functions over [`Facts`], which say how long ago things happened
//! rather than when, so each admission reads them off its own clock: this
//! machine's from its monotonic clock and the audit log, the fleet's from
//! PostgreSQL's rows and PostgreSQL's clock, under the rows' locks. Both
//! call [`decide`]; neither decides anything itself. A new rule is a
//! branch here and its rows in `tests/fixtures/admission-cases.json`, the
//! table both admissions are held to.

use std::time::Duration;

use super::TriggerResult;
use crate::config::MaxRuns;

/// How long after a run ends a repeat of its own trigger (the same alert
/// fingerprint or group, the same schedule fire) is still a duplicate,
/// whatever the cooldown: Alertmanager in HA mode sends a notification
/// twice now and then, and every replica fires the same schedule. Well
/// under Alertmanager's shortest sensible `group_interval`, so a real
/// repeat of a still-firing alert starts a run again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(60);

/// A run that holds the (runbook, host) now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Its trigger is on its replica's disk (always so on one machine).
    Confirmed,
    /// Another replica admitted it and has not yet said its trigger is on
    /// disk: it may die before it does, and then a trigger refused as its
    /// duplicate would be lost.
    Unconfirmed,
}

/// What is known of a (runbook, host) when a trigger for it is decided.
#[derive(Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// The fleet's kill switch is engaged for the runbook (on one machine
    /// the daemon refuses those before admission).
    pub(crate) stopped: bool,
    /// The run that holds it, if one does.
    pub(crate) held: Option<Holder>,
    /// How long ago its last run ended, if one did.
    pub(crate) ended_ago: Option<Duration>,
    /// Whether a trigger key (an alert's fingerprint or group, a schedule's
    /// fire) started the current or last run.
    pub(crate) last_started_by: &'a dyn Fn(&str) -> bool,
    /// How long ago each of its recent runs started (those that ran).
    pub(crate) started_ago: &'a [Duration],
}

/// A trigger's terms: its own keys, and what its runbook sets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms<'a> {
    /// Its keys.
    pub(crate) keys: &'a [String],
    /// The runbook's cooldown.
    pub(crate) cooldown: Option<Duration>,
    /// The runbook's `max_runs`.
    pub(crate) cap: Option<MaxRuns>,
    /// How long after a run ends a repeat of its own trigger is still a
    /// duplicate ([`DUPLICATE_WINDOW`]).
    pub(crate) window: Duration,
}

/// What `trigger` comes to against `facts`; `None`: it starts a run. In
/// order: the fleet's kill switch; a run holding the host (unconfirmed:
/// `pending`, the sender retries; else `deduplicated`); a repeat of the
/// last run's own trigger within the window; the cooldown (its own repeat
/// a duplicate, another trigger `cooldown`); `max_runs`.
pub(crate) fn decide(facts: &Facts<'_>, trigger: &Terms<'_>) -> Option<TriggerResult> {
    if facts.stopped {
        return Some(TriggerResult::KillSwitch);
    }
    match facts.held {
        Some(Holder::Unconfirmed) => return Some(TriggerResult::Pending),
        Some(Holder::Confirmed) => return Some(TriggerResult::Deduplicated),
        None => {}
    }
    if let Some(ago) = facts.ended_ago {
        let repeat = trigger.keys.iter().any(|k| (facts.last_started_by)(k));
        if repeat && ago < trigger.window {
            return Some(TriggerResult::Deduplicated);
        }
        if trigger.cooldown.is_some_and(|c| ago < c) {
            return Some(match repeat {
                true => TriggerResult::Deduplicated,
                false => TriggerResult::Cooldown,
            });
        }
    }
    capped(trigger.cap?, facts.started_ago).map(|_| TriggerResult::Capped)
}

/// Where `max_runs` holds a (runbook, host) now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capped {
    /// Its runs started inside the window.
    pub(crate) runs: usize,
    /// How long ago the oldest of them started: when that leaves the
    /// window, triggers start runs again.
    pub(crate) oldest_ago: Duration,
}

/// `max_runs` against how long ago each of a pair's runs started: `Some`
/// while the runs inside its window reach its count. Admission refuses a
/// trigger on it, and `kill-switch status` lists the pair as `CAPPED`
/// (one machine's record or the fleet's rows alike).
pub(crate) fn capped(cap: MaxRuns, started_ago: &[Duration]) -> Option<Capped> {
    let recent = started_ago.iter().filter(|a| **a < cap.per);
    let runs = recent.clone().count();
    (runs >= cap.count as usize).then(|| Capped {
        runs,
        oldest_ago: recent.max().copied().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    /// `decide` for a pair whose last run was started by `fp:a`.
    fn decide_for(
        stopped: bool,
        held: Option<Holder>,
        ended_s_ago: Option<u64>,
        started_s_ago: &[u64],
        key: &str,
        cooldown: Option<Duration>,
    ) -> Option<TriggerResult> {
        let started_ago: Vec<Duration> = started_s_ago
            .iter()
            .map(|s| Duration::from_secs(*s))
            .collect();
        let facts = Facts {
            stopped,
            held,
            ended_ago: ended_s_ago.map(Duration::from_secs),
            last_started_by: &|k| k == "fp:a",
            started_ago: &started_ago,
        };
        let keys = [key.to_string()];
        let terms = Terms {
            keys: &keys,
            cooldown,
            cap: Some(MaxRuns {
                count: 1,
                per: HOUR,
            }),
            window: Duration::from_secs(60),
        };
        decide(&facts, &terms)
    }

    /// Every rule in its place in the order: each row's facts also meet
    /// the rules after its own, so a rule moved later fails its row.
    #[test]
    fn the_rules_apply_in_their_order() {
        use Holder::*;
        use TriggerResult::*;
        let held = Some(Unconfirmed);
        let rows = [
            (
                decide_for(true, held, Some(5), &[10], "fp:a", Some(HOUR)),
                Some(KillSwitch),
            ),
            (
                decide_for(false, held, Some(5), &[10], "fp:a", Some(HOUR)),
                Some(Pending),
            ),
            (
                decide_for(false, Some(Confirmed), Some(5), &[10], "fp:b", Some(HOUR)),
                Some(Deduplicated),
            ),
            (
                decide_for(false, None, Some(5), &[10], "fp:a", None),
                Some(Deduplicated),
            ),
            (
                decide_for(false, None, Some(120), &[10], "fp:b", Some(HOUR)),
                Some(Cooldown),
            ),
            (
                decide_for(false, None, Some(120), &[10], "fp:a", Some(HOUR)),
                Some(Deduplicated),
            ),
            (
                decide_for(false, None, Some(120), &[10], "fp:b", None),
                Some(Capped),
            ),
            (
                decide_for(false, None, Some(120), &[3700], "fp:b", None),
                None,
            ),
            (decide_for(false, None, None, &[], "fp:a", Some(HOUR)), None),
        ];
        for (i, (got, want)) in rows.iter().enumerate() {
            assert_eq!(got, want, "row {i}");
        }
    }

    /// `max_runs` holds while the runs inside its window reach its count,
    /// and says when the oldest of them leaves it; runs started before the
    /// window do not count.
    #[test]
    fn max_runs_caps_on_the_runs_inside_its_window() {
        let cap = MaxRuns {
            count: 2,
            per: HOUR,
        };
        let ago = |s: &[u64]| {
            s.iter()
                .map(|s| Duration::from_secs(*s))
                .collect::<Vec<_>>()
        };
        assert_eq!(capped(cap, &ago(&[10])), None);
        assert_eq!(
            capped(cap, &ago(&[10, 4000])),
            None,
            "one is past the window"
        );
        assert_eq!(
            capped(cap, &ago(&[10, 600, 4000])),
            Some(Capped {
                runs: 2,
                oldest_ago: Duration::from_secs(600)
            })
        );
    }
}

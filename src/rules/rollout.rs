//! A rollout's waves, and whether the next host may start: pure, so that
//! `check`, a dry run, `alerts test` and the daemon that drives a rollout
//! all compute the same waves from the same frozen host list.
//!
//! The waves: every canary host alone, in order; then each value of
//! `waves:` as how far the rollout reaches in all (a count, or a share of
//! the frozen list rounded down), always at least one host more than the
//! wave before; when the last value leaves hosts, waves of that value's
//! size follow until every host is in one. So `["25%"]` is 25 %, 50 %,
//! 75 %, 100 %, and a share of a short list never rounds to an empty wave.

use std::sync::Arc;

use crate::config::{Canary, Reach, Rollout};

/// The frozen host list cut into waves, in the order they run.
pub(crate) fn waves(rollout: &Rollout, hosts: &[Arc<str>]) -> Vec<Vec<Arc<str>>> {
    let n = hosts.len();
    let mut order: Vec<Arc<str>> = Vec::with_capacity(n);
    let canaries = match &rollout.canary {
        Canary::First(k) => (*k as usize).min(n),
        Canary::Hosts(names) => {
            order.extend(names.iter().filter(|h| hosts.contains(h)).cloned());
            order.len()
        }
    };
    let rest: Vec<Arc<str>> = hosts
        .iter()
        .filter(|h| !order.contains(h))
        .cloned()
        .collect();
    order.extend(rest);
    let mut waves: Vec<Vec<Arc<str>>> = order[..canaries].iter().map(|h| vec![h.clone()]).collect();
    let mut done = canaries;
    let reach = |r: &Reach| match *r {
        Reach::Hosts(k) => k as usize,
        Reach::Percent(p) => n * p as usize / 100,
    };
    let cut = |to: usize, waves: &mut Vec<Vec<Arc<str>>>, done: &mut usize| {
        let to = to.max(*done + 1).min(n);
        waves.push(order[*done..to].to_vec());
        *done = to;
    };
    for r in &rollout.waves {
        if done >= n {
            break;
        }
        cut(reach(r), &mut waves, &mut done);
    }
    let step = rollout.waves.last().map_or(n, |r| reach(r).max(1));
    while done < n {
        cut(done + step, &mut waves, &mut done);
    }
    waves
}

/// Whether a rollout that has seen `failures` since it started (or since a
/// person last resumed it) may start another host: `max_failures` are
/// allowed, one more halts it.
pub(crate) fn may_go_on(max_failures: u32, failures: u32) -> bool {
    failures <= max_failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hosts(n: usize) -> Vec<Arc<str>> {
        (1..=n).map(|i| Arc::from(format!("h{i}"))).collect()
    }

    fn rollout(canary: Canary, waves: Vec<Reach>) -> Rollout {
        Rollout {
            canary,
            waves,
            pause: Duration::ZERO,
            max_failures: 0,
            guard: None,
        }
    }

    fn sizes(w: &[Vec<Arc<str>>]) -> Vec<usize> {
        w.iter().map(Vec::len).collect()
    }

    /// The table: each row a rollout, a host count, the wave sizes.
    #[test]
    fn waves_are_cumulative_never_empty_and_cover_every_host_once() {
        use Reach::*;
        let rows: Vec<(Canary, Vec<Reach>, usize, Vec<usize>)> = vec![
            (
                Canary::First(1),
                vec![Percent(50), Percent(100)],
                10,
                vec![1, 4, 5],
            ),
            (
                Canary::First(1),
                vec![Percent(10), Percent(100)],
                500,
                vec![1, 49, 450],
            ),
            (Canary::First(2), vec![], 5, vec![1, 1, 3]),
            (Canary::First(0), vec![Percent(25)], 8, vec![2, 2, 2, 2]),
            // A share of a short list rounds down to nothing: one host more.
            (Canary::First(0), vec![Percent(10)], 3, vec![1, 1, 1]),
            (
                Canary::First(1),
                vec![Percent(10), Percent(20)],
                4,
                vec![1, 1, 1, 1],
            ),
            // A reach below the canaries: still one more host.
            (
                Canary::First(3),
                vec![Hosts(2), Percent(100)],
                6,
                vec![1, 1, 1, 1, 2],
            ),
            // Counts, the last repeating as a step.
            (Canary::First(1), vec![Hosts(3)], 10, vec![1, 2, 3, 3, 1]),
            (Canary::First(1), vec![Percent(100)], 1, vec![1]),
            (Canary::First(0), vec![], 0, vec![]),
        ];
        for (canary, reach, n, want) in rows {
            let r = rollout(canary.clone(), reach.clone());
            let hs = hosts(n);
            let w = waves(&r, &hs);
            assert_eq!(sizes(&w), want, "{canary:?} {reach:?} on {n} hosts");
            let mut all: Vec<Arc<str>> = w.concat();
            assert_eq!(all.len(), n, "every host once");
            all.sort();
            all.dedup();
            assert_eq!(all.len(), n, "no host twice");
        }
    }

    #[test]
    fn named_canaries_go_first_in_their_order_and_the_rest_keep_the_runbooks() {
        let hs = hosts(5);
        let r = rollout(
            Canary::Hosts(vec![Arc::from("h4"), Arc::from("h2")]),
            vec![Reach::Percent(100)],
        );
        let w = waves(&r, &hs);
        let names: Vec<Vec<&str>> = w.iter().map(|w| w.iter().map(|h| &**h).collect()).collect();
        assert_eq!(names, vec![vec!["h4"], vec!["h2"], vec!["h1", "h3", "h5"]]);
    }

    #[test]
    fn max_failures_are_allowed_and_one_more_halts() {
        assert!(may_go_on(0, 0));
        assert!(!may_go_on(0, 1));
        assert!(may_go_on(2, 2));
        assert!(!may_go_on(2, 3));
    }
}

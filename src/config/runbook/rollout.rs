//! `rollout:` in a runbook: the order in which a fan-out (a schedule's
//! fire, `run --all-hosts`, the API's `all_hosts`) reaches its hosts. The
//! waves themselves are computed from the host list frozen when a rollout
//! starts (by the rollout module); this checks what can be checked before.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::super::diag::Diagnostics;
use super::super::raw;

/// The first hosts of a rollout, each a wave of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Canary {
    /// The first this many hosts of the runbook's `hosts:`.
    First(u32),
    /// These hosts, in this order.
    Hosts(Vec<Arc<str>>),
}

/// How far a wave takes the rollout: cumulative, of the frozen host list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// This many hosts in all.
    Hosts(u32),
    /// This share of the hosts in all, rounded down (at least one more).
    Percent(u32),
}

/// `rollout:`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rollout {
    pub(crate) canary: Canary,
    /// Where each wave after the canaries brings the rollout; when the
    /// last leaves hosts, waves of its size follow until none is left.
    pub(crate) waves: Vec<Reach>,
    /// After a wave ends well, before the next starts.
    pub(crate) pause: Duration,
    /// Failures allowed across the whole rollout; one more halts it.
    pub(crate) max_failures: u32,
    /// PromQL that must return nothing for the whole pause.
    pub(crate) guard: Option<String>,
}

/// What a rollout needs besides its own lines.
pub(super) struct Needs<'a> {
    /// The runbook's hosts, as checked.
    pub(super) hosts: &'a [Arc<str>],
    /// runwarden.yaml has a `prometheus:` (for a guard).
    pub(super) prometheus: bool,
}

/// Check `rollout:`, each problem at its own line.
pub(super) fn validate(
    raw: &raw::Runbook,
    needs: Needs<'_>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Rollout> {
    let spanned = raw.rollout.as_ref()?;
    let r = &spanned.value;
    let before = diags.len();
    let n = needs.hosts.len() as u32;
    let canary = match r.canary.as_ref().map(|c| (&c.value, c.referenced)) {
        None => Canary::First(0),
        Some((raw::Canary::Count(k), at)) => {
            if *k > n {
                diags.at(
                    file,
                    at,
                    format!("rollout.canary: {k} hosts, but the runbook names {n}"),
                );
            }
            Canary::First(*k)
        }
        Some((raw::Canary::Hosts(names), at)) => {
            if names.is_empty() {
                diags.at(
                    file,
                    at,
                    "rollout.canary: an empty list; name hosts, give a count, or leave canary out",
                );
            }
            let mut hosts: Vec<Arc<str>> = Vec::new();
            for name in names {
                match needs.hosts.iter().find(|h| ***h == *name.value) {
                    None => diags.at(
                        file,
                        name.referenced,
                        format!(
                            "rollout.canary: {:?} is not among the runbook's hosts",
                            name.value
                        ),
                    ),
                    Some(h) if hosts.contains(h) => diags.at(
                        file,
                        name.referenced,
                        format!("rollout.canary: {:?} is named twice", name.value),
                    ),
                    Some(h) => hosts.push(h.clone()),
                }
            }
            Canary::Hosts(hosts)
        }
    };
    let mut waves = Vec::new();
    for w in &r.waves {
        let reach = match &w.value {
            raw::CountOrShare::Count(0) => None,
            raw::CountOrShare::Count(k) => Some(Reach::Hosts(*k)),
            raw::CountOrShare::Text(t) => t
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<u32>().ok())
                .filter(|p| (1..=100).contains(p))
                .map(Reach::Percent),
        };
        let Some(reach) = reach else {
            diags.at(
                file,
                w.referenced,
                "rollout.waves: each wave is a count of hosts (1 or more) or a share such as \"25%\" (1% to 100%), of all the hosts, cumulative",
            );
            continue;
        };
        let shrinks = waves.last().is_some_and(|last| match (last, &reach) {
            (Reach::Hosts(a), Reach::Hosts(b)) | (Reach::Percent(a), Reach::Percent(b)) => b <= a,
            _ => false,
        });
        if shrinks {
            diags.at(
                file,
                w.referenced,
                "rollout.waves: each value is how far the rollout reaches in all, so it grows from one wave to the next (\"25%\", \"50%\", \"100%\")",
            );
        }
        waves.push(reach);
    }
    let pause = match &r.pause {
        None => Duration::ZERO,
        Some(p) => match humantime::parse_duration(&p.value) {
            Ok(d) if d <= Duration::from_secs(7 * 24 * 3600) => d,
            Ok(_) => {
                diags.at(file, p.referenced, "rollout.pause must be at most 7d");
                Duration::ZERO
            }
            Err(e) => {
                diags.at(
                    file,
                    p.referenced,
                    format!(
                        "rollout.pause \"{}\" is not a duration ({e}); write e.g. 0s, 10m or 1h",
                        p.value
                    ),
                );
                Duration::ZERO
            }
        },
    };
    let guard = match &r.guard {
        Some(g) if g.value.trim().is_empty() => {
            diags.at(
                file,
                g.referenced,
                "rollout.guard is empty: give a PromQL expression that returns nothing while it is safe to go on",
            );
            None
        }
        Some(g) => {
            if !needs.prometheus {
                diags.at(
                    file,
                    g.referenced,
                    "rollout.guard needs `prometheus: { url: http://HOST:9090 }` in runwarden.yaml: runwarden asks it between waves",
                );
            }
            Some(g.value.trim().to_string())
        }
        None => None,
    };
    if diags.len() != before {
        return None;
    }
    Some(Rollout {
        canary,
        waves,
        pause,
        max_failures: r.max_failures.as_ref().map_or(0, |m| m.value),
        guard,
    })
}

//! Rollouts read back from the audit log: what a restarted daemon takes
//! up. The rollout's own lines say where it stood; the `queued` lines of
//! its runs (each carries `rollout:ID`) and their verdicts say what ran
//! that its lines had not yet recorded.

use std::collections::HashMap;
use std::path::Path;

use super::{State, Status};
use crate::audit::{Entry, Phase, RolloutEvent};

/// How far back a restart looks for rollouts: a weekly rollout left
/// longer than this is a person's to start again.
const LOOK_BACK: jiff::SignedDuration = jiff::SignedDuration::from_hours(8 * 24);

/// One rollout as the log leaves it.
pub(super) struct Found {
    pub(super) status: Status,
    /// Keys its runs carried besides its own (a schedule's fire's).
    pub(super) keys: Vec<String>,
    /// Runs of it the log shows ended, whose rollout line is missing:
    /// (host, run id, verdict, detail).
    pub(super) ended_unrecorded: Vec<(String, String, String, String)>,
    /// Runs of it with no verdict yet (host, run id): taken over by this
    /// daemon (a run the last stop handed back).
    pub(super) in_flight: Vec<(String, String)>,
}

/// A host's latest run of a rollout: its id, and its verdict and the
/// verdict's detail once it has one.
type Latest = (String, Option<(String, String)>);

/// The rollouts of the log at `path` from the last [`LOOK_BACK`], oldest first.
pub(super) fn fold(path: &Path) -> std::io::Result<Vec<Found>> {
    let since = jiff::Timestamp::now() - LOOK_BACK;
    let lines = crate::audit::entries(path, Some(since), |l| {
        l.contains("\"phase\":\"rollout\"")
            || l.contains("\"rollout:")
            || l.contains("\"phase\":\"verdict\"")
    })?;
    let mut found: Vec<Found> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    // run id -> (rollout index, host)
    let mut runs: HashMap<String, (usize, String)> = HashMap::new();
    // (rollout index, host) -> its latest run, and that run's verdict
    let mut latest: HashMap<(usize, String), Latest> = HashMap::new();
    for e in lines {
        match e.phase {
            Some(Phase::Rollout) => event(&e, &mut found, &mut by_id),
            Some(Phase::Queued) => {
                let keys: Vec<String> = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["keys"].as_array())
                    .map(|k| {
                        k.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let Some(id) = keys.iter().find_map(|k| k.strip_prefix("rollout:")) else {
                    continue;
                };
                let Some(&i) = by_id.get(id) else { continue };
                if found[i].keys.is_empty() {
                    found[i].keys = keys
                        .iter()
                        .filter(|k| !k.starts_with("rollout:") && !k.starts_with("resumes:"))
                        .cloned()
                        .collect();
                }
                runs.insert(e.run_id.clone(), (i, e.host.clone()));
                latest.insert((i, e.host.clone()), (e.run_id.clone(), None));
            }
            Some(Phase::Verdict) => {
                let Some((i, host)) = runs.get(&e.run_id) else {
                    continue;
                };
                let detail = e.detail.as_ref();
                // Handed back by a stop before it proposed anything: the
                // run that takes it over is the host's.
                if detail.is_some_and(|d| d["handed_back"] == true) {
                    continue;
                }
                if let Some(l) = latest.get_mut(&(*i, host.clone()))
                    && l.0 == e.run_id
                {
                    let why = detail
                        .and_then(|d| d["detail"].as_str())
                        .unwrap_or_default()
                        .to_string();
                    l.1 = Some((e.outcome.clone().unwrap_or_else(|| "broken".into()), why));
                }
            }
            _ => {}
        }
    }
    for ((i, host), (run_id, verdict)) in latest {
        let f = &mut found[i];
        let unrecorded = f
            .status
            .waves
            .iter()
            .flatten()
            .any(|h| h.host == host && !h.ended());
        if !unrecorded || f.status.state.is_over() {
            continue;
        }
        match verdict {
            Some((v, why)) => f.ended_unrecorded.push((host, run_id, v, why)),
            None => {
                if let Some((_, h)) = f.status.host_mut(&host) {
                    h.outcome = "running".into();
                    h.run_id = Some(run_id.clone());
                }
                f.in_flight.push((host, run_id));
            }
        }
    }
    Ok(found)
}

/// Fold one rollout line into `found`.
fn event(e: &Entry, found: &mut Vec<Found>, by_id: &mut HashMap<String, usize>) {
    let Some(detail) = e.detail.as_ref() else {
        return;
    };
    let Some(id) = detail["rollout"].as_str() else {
        return;
    };
    let Ok(ev) = serde_json::from_value::<RolloutEvent>(detail.clone()) else {
        return;
    };
    if let RolloutEvent::Started {
        waves,
        trigger,
        max_failures,
        pause_secs,
        guard,
    } = &ev
    {
        let waves: Vec<Vec<std::sync::Arc<str>>> = waves
            .iter()
            .map(|w| w.iter().map(|h| std::sync::Arc::from(h.as_str())).collect())
            .collect();
        let mut status = Status {
            max_failures: *max_failures,
            pause_secs: *pause_secs,
            guard: guard.clone(),
            started_at: e.ts.clone(),
            ..Status::new(id, &e.runbook, *trigger, &waves, None)
        };
        status.waiting_on = "this daemon to take it up".into();
        by_id.insert(id.to_string(), found.len());
        found.push(Found {
            status,
            keys: Vec::new(),
            ended_unrecorded: Vec::new(),
            in_flight: Vec::new(),
        });
        return;
    }
    let Some(&i) = by_id.get(id) else { return };
    let s = &mut found[i].status;
    match ev {
        RolloutEvent::Started { .. } | RolloutEvent::TakenOver { .. } => {}
        RolloutEvent::Host {
            host,
            run_id,
            outcome,
            detail,
            ..
        } => {
            s.ended(&host, run_id.as_deref(), &outcome, &detail);
        }
        RolloutEvent::Halted { reason, .. } => {
            s.state = State::Halted;
            s.reason = Some(reason);
            s.waiting_on = "a person: `runwarden rollout resume ID --reason` or `abort`".into();
        }
        RolloutEvent::Resumed { .. } => {
            s.state = State::Running;
            s.reason = None;
            s.accepted = s.failures;
        }
        RolloutEvent::Aborted { by, reason, .. } => {
            s.state = State::Aborted;
            s.reason = Some(format!("aborted by {by}: {reason}"));
            s.waiting_on = "nothing: aborted".into();
        }
        RolloutEvent::Finished { .. } => {
            s.state = State::Finished;
            s.waiting_on = "nothing: finished".into();
        }
    }
}

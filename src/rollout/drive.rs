//! The task that drives one rollout: a wave's hosts at most
//! `max_concurrent_runs` at a time, each batch only after the kill switch
//! and the failures say it may; the pause and the guard between waves; a
//! halt that waits for a person.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::{One, Rollouts, State, Status};
use crate::audit::RolloutEvent;
use crate::run::RunRequest;
use crate::scheduler::NoReport;
use crate::verdict::Verdict;

/// How often a guard is asked during a pause (and the kill switch looked at).
const GUARD_EVERY: Duration = Duration::from_secs(5);

/// Why the driver stopped dispatching.
enum Stop {
    /// A halt: nothing new until a person decides.
    Halt(String),
    /// The daemon is stopping: the next one goes on from the log.
    Shutdown,
}

/// Drive `one` to its end: wave after wave, halted when it must be,
/// until finished or aborted (or the daemon stops, or another replica
/// takes it over). `in_flight`: runs a restart or a takeover found
/// running for it (host, run id).
pub(super) async fn drive(rs: Arc<Rollouts>, one: Arc<One>, in_flight: Vec<(String, String)>) {
    let mut in_flight = in_flight;
    let keys = one.status.borrow().keys.clone();
    loop {
        if let Some(State::Aborted | State::Finished) = wait_for_a_person(&one).await {
            return;
        }
        if !one.driven_here() {
            return;
        }
        let status = one.status();
        let Some(wave) = status.waves.iter().position(|w| {
            w.iter()
                .any(|h| h.outcome == "waiting" || h.outcome == "running")
        }) else {
            finish(&rs, &one);
            return;
        };
        // A wave none of whose hosts has started yet follows a pause.
        let fresh = status.waves[wave].iter().all(|h| h.outcome == "waiting");
        if wave > 0 && fresh && in_flight.is_empty() {
            match pause(&rs, &one).await {
                Ok(()) => {}
                Err(Stop::Shutdown) => return,
                Err(Stop::Halt(why)) => {
                    halt(&rs, &one, why);
                    continue;
                }
            }
        }
        match run_wave(&rs, &one, wave, &keys, std::mem::take(&mut in_flight)).await {
            Ok(()) => {}
            Err(Stop::Shutdown) => return,
            Err(Stop::Halt(_)) => {} // written as it was decided
        }
    }
}

/// While `one` is halted, wait for a person; its state after.
async fn wait_for_a_person(one: &One) -> Option<State> {
    let mut rx = one.status.subscribe();
    match rx
        .wait_for(|s| s.state != State::Halted || !one.driven_here())
        .await
    {
        Ok(s) => Some(s.state),
        Err(_) => None,
    }
}

/// Halt `one` for `why`: written (with which hosts ran and which never
/// started), counted, alerted on; nothing new starts.
fn halt(rs: &Rollouts, one: &One, why: String) {
    let now = one.status();
    if now.state == State::Halted || now.state.is_over() {
        return;
    }
    let (ran, never_started) = now.split();
    let event = RolloutEvent::Halted {
        reason: why.clone(),
        ran,
        never_started,
    };
    if let Err(e) = rs.audit.rollout(&now.id, &now.runbook, &event) {
        // Halted all the same: a halt is the safe side of a lost line.
        tracing::error!(rollout = %now.id, "the halt of rollout {} could not be written: {e}", now.id);
    }
    rs.metrics
        .rollouts_halted
        .with_label_values(&[&now.runbook])
        .inc();
    rs.metrics
        .rollouts
        .with_label_values(&[&now.runbook, "halted"])
        .inc();
    tracing::warn!(rollout = %now.id, runbook = %now.runbook, "rollout {} of {} halted: {why}", now.id, now.runbook);
    one.status.send_modify(|s| {
        s.state = State::Halted;
        s.reason = Some(why);
        s.next_wave_at = None;
        s.waiting_on = "a person: `runwarden rollout resume ID --reason` or `abort`".into();
    });
}

/// Every wave ran: written with the worst verdict.
fn finish(rs: &Rollouts, one: &One) {
    let now = one.status();
    let worst = now.worst.unwrap_or(Verdict::Ok);
    let event = RolloutEvent::Finished {
        worst,
        failures: now.failures,
    };
    if let Err(e) = rs.audit.rollout(&now.id, &now.runbook, &event) {
        tracing::error!(rollout = %now.id, "the end of rollout {} could not be written: {e}", now.id);
    }
    rs.metrics
        .rollouts
        .with_label_values(&[&now.runbook, "finished"])
        .inc();
    tracing::info!(rollout = %now.id, "rollout {} of {} finished: worst {}, {} failure(s)", now.id, now.runbook, worst.as_str(), now.failures);
    one.status.send_modify(|s| {
        s.state = State::Finished;
        s.waiting_on = "nothing: finished".into();
        s.next_wave_at = None;
    });
}

/// Whether the next host may start: the daemon is not stopping, the kill
/// switch is released, the failures are within `max_failures`.
fn may_start(rs: &Rollouts, one: &One) -> Result<(), Stop> {
    if rs.scheduler.stopping() {
        return Err(Stop::Shutdown);
    }
    // Looked at in place, not copied: this runs before every batch, and a
    // rollout's status holds every host.
    let (runbook, max_failures, counted) = {
        let status = one.status.borrow();
        if status.state != State::Running && status.state != State::Pausing {
            return Err(Stop::Halt(status.reason.clone().unwrap_or_default()));
        }
        (
            status.runbook.clone(),
            status.max_failures,
            status.counted(),
        )
    };
    let config = rs.config.borrow().clone();
    if let Err(engaged) = rs.scheduler.killswitch(&config).check(&runbook) {
        return Err(Stop::Halt(format!(
            "{engaged}; releasing the switch does not resume the rollout"
        )));
    }
    if !crate::rules::rollout::may_go_on(max_failures, counted) {
        return Err(Stop::Halt(failures_why(&one.status.borrow())));
    }
    Ok(())
}

fn failures_why(s: &Status) -> String {
    let failed: Vec<String> = s
        .waves
        .iter()
        .flatten()
        .filter(|h| h.failed())
        .map(|h| format!("{} {}", h.host, h.outcome))
        .collect();
    format!(
        "{} failure(s) past max_failures {} ({})",
        s.counted(),
        s.max_failures,
        failed.join(", ")
    )
}

/// The pause before the next wave, the guard asked every [`GUARD_EVERY`]
/// all through it (and once with no pause). Any series it returns, or any
/// error asking it, halts.
async fn pause(rs: &Rollouts, one: &One) -> Result<(), Stop> {
    let status = one.status();
    let length = Duration::from_secs(status.pause_secs);
    let until = tokio::time::Instant::now() + length;
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(status.pause_secs as i64);
    one.status.send_modify(|s| {
        s.state = State::Pausing;
        s.next_wave_at = Some(at.to_string());
        s.waiting_on = match &s.guard {
            Some(g) => format!("the pause, with the guard `{g}` returning nothing"),
            None => "the pause".into(),
        };
    });
    let prometheus = rs
        .config
        .borrow()
        .settings
        .prometheus
        .as_ref()
        .map(crate::prometheus::Prometheus::new);
    loop {
        may_start(rs, one)?;
        if let Some(guard) = &status.guard {
            let Some(prom) = &prometheus else {
                return Err(Stop::Halt(
                    "the guard cannot be asked: runwarden.yaml has no prometheus".into(),
                ));
            };
            match prom.query(guard).await {
                Ok(series) if series.is_empty() => {}
                Ok(series) => {
                    return Err(Stop::Halt(format!(
                        "the guard `{guard}` returned {} series (first: {:?} = {}) during the pause",
                        series.len(),
                        series[0].labels,
                        series[0].value
                    )));
                }
                Err(e) => {
                    return Err(Stop::Halt(format!(
                        "the guard `{guard}` could not be evaluated on {}: {e}; a guard that cannot be asked never passes",
                        prom.url()
                    )));
                }
            }
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            break;
        }
        tokio::time::sleep((until - now).min(GUARD_EVERY)).await;
    }
    one.status.send_modify(|s| {
        if s.state == State::Pausing {
            s.state = State::Running;
        }
        s.next_wave_at = None;
    });
    Ok(())
}

/// Run wave `wave`'s hosts that have not started, at most
/// `max_concurrent_runs` at once, and wait for every run of it to end.
async fn run_wave(
    rs: &Arc<Rollouts>,
    one: &One,
    wave: usize,
    keys: &[String],
    recovered: Vec<(String, String)>,
) -> Result<(), Stop> {
    let mut running = FuturesUnordered::new();
    let ended = |host: String, run_id: String| {
        let rs = rs.clone();
        async move {
            let end = match &rs.fleet {
                None => match rs.scheduler.reports.ended(&run_id).await {
                    Ok(report) => Some((
                        report.verdict.as_str().to_string(),
                        report.verdict_detail.clone(),
                    )),
                    Err(NoReport::Unstarted(why)) => Some(("broken".to_string(), why)),
                    Err(NoReport::Stopping) => None,
                },
                Some(pg) => super::fleet::ended(&rs, pg, &run_id).await,
            };
            (host, run_id, end)
        }
    };
    for (host, run_id) in recovered {
        running.push(ended(host, run_id));
    }
    let mut stop: Option<Stop> = None;
    let mut halted = false;
    loop {
        let window = rs.config.borrow().settings.max_concurrent_runs.max(1);
        let room = window.saturating_sub(running.len());
        let waiting: Vec<String> = one.status.borrow().waves[wave]
            .iter()
            .filter(|h| h.outcome == "waiting")
            .take(room)
            .map(|h| h.host.clone())
            .collect();
        if stop.is_none() && room > 0 && !waiting.is_empty() {
            if !super::fleet::held(rs, one).await {
                // Another replica drives it now, or the daemon stops: the
                // runs in flight are that one's to wait for.
                return Err(Stop::Shutdown);
            }
            match may_start(rs, one) {
                Err(s) => stop = Some(s),
                Ok(()) => {
                    let waiting_on = format!("the runs of wave {}", wave + 1);
                    one.status.send_if_modified(|s| {
                        let same = s.state == State::Running && s.waiting_on == waiting_on;
                        s.state = State::Running;
                        s.waiting_on = waiting_on;
                        !same
                    });
                    match dispatch(rs, one, wave, &waiting, keys).await {
                        Ok(started) => {
                            for (host, run_id) in started {
                                running.push(ended(host, run_id));
                            }
                            continue;
                        }
                        Err(why) => stop = Some(Stop::Halt(why)),
                    }
                }
            }
        }
        if let Some(Stop::Halt(why)) = &stop
            && !halted
        {
            halt(rs, one, why.clone());
            halted = true;
        }
        let Some(first) = running.next().await else {
            break;
        };
        // Every run that ended meanwhile too, so the next batch fills
        // every slot they freed at once.
        let mut ended_now = vec![first];
        while let Some(Some(more)) = running.next().now_or_never() {
            ended_now.push(more);
        }
        let mut ends = Vec::with_capacity(ended_now.len());
        for (host, run_id, end) in ended_now {
            let Some((outcome, detail)) = end else {
                return Err(Stop::Shutdown);
            };
            ends.push(End {
                host,
                run_id: Some(run_id),
                outcome,
                detail,
            });
        }
        record(rs, one, wave, ends);
    }
    match stop {
        Some(s) => Err(s),
        None => Ok(()),
    }
}

/// Start `hosts` of wave `wave` in one batch: their runs, or each one's
/// reason for not starting (recorded as its outcome, a failure).
async fn dispatch(
    rs: &Rollouts,
    one: &One,
    wave: usize,
    hosts: &[String],
    keys: &[String],
) -> Result<Vec<(String, String)>, String> {
    let (id, runbook, trigger) = {
        let s = one.status.borrow();
        (s.id.clone(), s.runbook.clone(), s.trigger)
    };
    let mut keys = keys.to_vec();
    keys.push(super::key(&id));
    let reqs: Vec<RunRequest> = hosts
        .iter()
        .map(|h| {
            let mut req = RunRequest::cli(runbook.clone(), h.clone(), false);
            req.trigger = trigger;
            req.keys = keys.clone();
            req
        })
        .collect();
    let outcomes = rs
        .scheduler
        .submit_all(reqs)
        .await
        .map_err(|e| format!("the runs of wave {} could not be recorded: {e}", wave + 1))?;
    let (mut started, mut not_started) = (Vec::new(), Vec::new());
    for (host, o) in hosts.iter().zip(outcomes) {
        match o.run_id {
            Some(id) => {
                one.status.send_modify(|s| {
                    if let Some((_, h)) = s.host_mut(host) {
                        h.outcome = "running".into();
                        h.run_id = Some(id.clone());
                    }
                });
                started.push((host.clone(), id));
            }
            None => not_started.push(End {
                host: host.clone(),
                run_id: None,
                outcome: "not_started".into(),
                detail: format!("not started: {}", o.result.as_str()),
            }),
        }
    }
    record(rs, one, wave, not_started);
    Ok(started)
}

/// How one host's part of a wave ended (or why it did not start).
struct End {
    host: String,
    run_id: Option<String>,
    outcome: String,
    detail: String,
}

/// The hosts' outcomes: in the status, and in the log in one synced
/// append (hosts whose outcome was already recorded are left out).
fn record(rs: &Rollouts, one: &One, wave: usize, ends: Vec<End>) {
    if ends.is_empty() {
        return;
    }
    let mut events = Vec::with_capacity(ends.len());
    let (mut id, mut runbook) = (String::new(), String::new());
    one.status.send_if_modified(|s| {
        (id, runbook) = (s.id.clone(), s.runbook.clone());
        for e in ends {
            if s.ended(&e.host, e.run_id.as_deref(), &e.outcome, &e.detail) {
                events.push(RolloutEvent::Host {
                    wave,
                    host: e.host,
                    run_id: e.run_id,
                    outcome: e.outcome,
                    detail: crate::text::one_line(&e.detail).chars().take(500).collect(),
                });
            }
        }
        !events.is_empty()
    });
    if events.is_empty() {
        return;
    }
    if let Err(e) = rs.audit.rollout_all(&id, &runbook, &events) {
        tracing::error!(rollout = %id, "the outcomes of {} host(s) in rollout {id} could not be written: {e}", events.len());
    }
}

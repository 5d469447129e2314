//! Schedules: a runbook's `schedule` fires one run per listed host.
//!
//! The worker sleeps until the earliest next fire time (monotonic sleep), then
//! fires whatever is due and computes the next times from the wall clock
//! again. Missed fire times (the daemon was down, the clock jumped forward)
//! are not replayed, and a clock set back does not fire anything twice in a
//! row: the next time is always strictly after "now".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use croner::Cron;
use croner::parser::CronParser;
use jiff::Zoned;
use tokio::sync::watch;

use super::{RunRequest, Submit, Trigger};
use crate::config::Config;
use crate::metrics::Metrics;

fn schedules(config: &Config) -> BTreeMap<String, Cron> {
    config
        .runbooks
        .values()
        .filter_map(|rb| {
            Some((
                rb.name.clone(),
                CronParser::new().parse(rb.schedule.as_deref()?).ok()?,
            ))
        })
        .collect()
}

fn next_after(cron: &Cron, now: &Zoned) -> Option<Zoned> {
    cron.find_next_occurrence(now, false).ok()
}

/// Take every schedule whose next time has come (`now` is the wall clock),
/// and plan its next time strictly after `now`. Whatever the clock did since
/// the last call, each schedule fires at most once here and is never left
/// without a next time: a forward jump fires once, not once per missed time;
/// a backward jump fires nothing until the wall clock reaches the planned time.
fn fire_due(
    next: &mut BTreeMap<String, Zoned>,
    crons: &BTreeMap<String, Cron>,
    now: &Zoned,
) -> Vec<(String, Zoned)> {
    let due: Vec<String> = next
        .iter()
        .filter(|(_, t)| t.timestamp() <= now.timestamp())
        .map(|(n, _)| n.clone())
        .collect();
    let mut fired = Vec::new();
    for name in due {
        let Some(at) = next.remove(&name) else {
            continue;
        };
        if let Some(t) = crons.get(&name).and_then(|c| next_after(c, now)) {
            next.insert(name.clone(), t);
        }
        fired.push((name, at));
    }
    fired
}

/// Start each runbook's schedule as it comes due, in the configured time
/// zone, for as long as the daemon runs; a reload takes effect at once.
pub(crate) async fn worker(
    mut config: watch::Receiver<Arc<Config>>,
    scheduler: impl Submit,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let cfg = config.borrow_and_update().clone();
        let crons = schedules(&cfg);
        let tz = cfg.settings.timezone.clone();
        let mut next: BTreeMap<String, Zoned> = BTreeMap::new();
        let now = Zoned::now().with_time_zone(tz.clone());
        for (name, cron) in &crons {
            if let Some(t) = next_after(cron, &now) {
                metrics
                    .schedule_next
                    .with_label_values(&[name])
                    .set(t.timestamp().as_second() as f64);
                next.insert(name.clone(), t);
            }
        }
        loop {
            let Some(earliest) = next.values().map(|z| z.timestamp()).min() else {
                // Nothing scheduled: wait for a new config or the end.
                tokio::select! {
                    _ = config.changed() => break,
                    _ = shutdown.changed() => return,
                }
            };
            let wait = Duration::try_from(earliest.duration_since(jiff::Timestamp::now()))
                .unwrap_or(Duration::ZERO);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = config.changed() => break,
                _ = shutdown.changed() => return,
            }
            let now = Zoned::now().with_time_zone(tz.clone());
            for (name, fired) in fire_due(&mut next, &crons, &now) {
                if let Some(rb) = cfg.runbooks.get(&name) {
                    // Every host of the fire in one batch: with replicas,
                    // one round trip decides them all, and the fleet's
                    // queue spreads what this replica cannot start now.
                    let reqs = fire_requests(&cfg, rb, &fired);
                    let hosts = reqs.len();
                    if hosts > 0
                        && let Err(e) = scheduler.submit(reqs).await
                    {
                        tracing::error!(runbook = %name, "{hosts} scheduled run(s) not started (their triggers could not be recorded): {e}");
                    }
                }
                metrics
                    .schedule_last
                    .with_label_values(&[&name])
                    .set(fired.timestamp().as_second() as f64);
                if let Some(t) = next.get(&name) {
                    metrics
                        .schedule_next
                        .with_label_values(&[&name])
                        .set(t.timestamp().as_second() as f64);
                }
            }
        }
    }
}

/// The runs one fire of `rb`'s schedule asks for: one per host, but for
/// example hosts (`example: true`), which are never called until someone
/// sets them up.
fn fire_requests(cfg: &Config, rb: &crate::config::Runbook, fired: &Zoned) -> Vec<RunRequest> {
    rb.hosts
        .iter()
        .filter(|h| cfg.hosts.get(&***h).is_none_or(|host| !host.example))
        .map(|host| RunRequest {
            runbook: rb.name.clone(),
            host: host.to_string(),
            dry_run: false,
            planner: Default::default(),
            trigger: Trigger::Schedule,
            alert: None,
            together: None,
            agent: None,
            by: None,
            keys: vec![format!("cron:{}", fired.timestamp())],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Zoned {
        format!("{s}[UTC]").parse().unwrap()
    }

    fn every_minute() -> BTreeMap<String, Cron> {
        [(
            "m".to_string(),
            CronParser::new().parse("* * * * *").unwrap(),
        )]
        .into()
    }

    #[test]
    fn a_forward_jump_fires_once_and_plans_the_next_time_after_the_new_now() {
        let crons = every_minute();
        let mut next = BTreeMap::from([("m".to_string(), at("2026-11-30T10:01:00"))]);
        // The wall clock jumps three hours ahead: 180 fire times were skipped.
        let fired = fire_due(&mut next, &crons, &at("2026-11-30T13:01:30"));
        assert_eq!(fired.len(), 1, "no burst of catch-up runs");
        assert_eq!(fired[0].1, at("2026-11-30T10:01:00"));
        assert_eq!(next["m"], at("2026-11-30T13:02:00"), "no missed next run");
        // Nothing more fires until that next time.
        assert!(fire_due(&mut next, &crons, &at("2026-11-30T13:01:59")).is_empty());
        assert_eq!(
            fire_due(&mut next, &crons, &at("2026-11-30T13:02:00")).len(),
            1
        );
    }

    #[test]
    fn a_backward_jump_fires_nothing_twice_and_nothing_early() {
        let crons = every_minute();
        let mut next = BTreeMap::from([("m".to_string(), at("2026-11-30T10:02:00"))]);
        assert_eq!(
            fire_due(&mut next, &crons, &at("2026-11-30T10:02:00")).len(),
            1
        );
        assert_eq!(next["m"], at("2026-11-30T10:03:00"));
        // The clock is set back an hour: the time that just fired is not fired
        // again, and the planned one waits for the wall clock to reach it.
        for minute in 0..60 {
            let now = at("2026-11-30T09:02:30")
                .checked_add(jiff::SignedDuration::from_secs(minute * 60))
                .unwrap();
            assert!(fire_due(&mut next, &crons, &now).is_empty(), "at {now}");
        }
        let fired = fire_due(&mut next, &crons, &at("2026-11-30T10:03:00"));
        assert_eq!(fired.len(), 1);
        assert_eq!(next["m"], at("2026-11-30T10:04:00"));
    }

    /// The shipped schedules never call the shipped example hosts: a fire
    /// of `cert-expiry` (whose hosts are both examples) asks for no run.
    #[test]
    fn a_schedule_never_calls_an_example_host() {
        let cfg = Config::load(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let now = Zoned::now();
        let rb = &cfg.runbooks["cert-expiry"];
        assert!(rb.hosts.iter().all(|h| cfg.hosts[&**h].example));
        assert!(fire_requests(&cfg, rb, &now).is_empty());
        let local = &cfg.runbooks["local-health"];
        let reqs = fire_requests(&cfg, local, &now);
        assert_eq!(
            reqs.iter().map(|r| r.host.as_str()).collect::<Vec<_>>(),
            ["local"]
        );
    }
}

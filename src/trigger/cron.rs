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

use super::{RunRequest, Trigger};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;

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

pub async fn worker(
    mut config: watch::Receiver<Arc<Config>>,
    scheduler: Arc<Scheduler>,
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
            let due: Vec<String> = next
                .iter()
                .filter(|(_, t)| t.timestamp() <= now.timestamp())
                .map(|(n, _)| n.clone())
                .collect();
            for name in due {
                let fired = next.remove(&name).expect("due");
                if let Some(rb) = cfg.runbooks.get(&name) {
                    for host in &rb.hosts {
                        scheduler.submit(RunRequest {
                            runbook: name.clone(),
                            host: host.to_string(),
                            dry_run: false,
                            planner: Default::default(),
                            trigger: Trigger::Schedule,
                            alert: None,
                            keys: vec![format!("cron:{}", fired.timestamp())],
                        });
                    }
                }
                metrics
                    .schedule_last
                    .with_label_values(&[&name])
                    .set(fired.timestamp().as_second() as f64);
                if let Some(t) = crons.get(&name).and_then(|c| next_after(c, &now)) {
                    metrics
                        .schedule_next
                        .with_label_values(&[&name])
                        .set(t.timestamp().as_second() as f64);
                    next.insert(name, t);
                }
            }
        }
    }
}

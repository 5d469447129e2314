//! After a run's last call: whether the alert that started it cleared
//! (`done_when.alert_clears`), asked of the configured Prometheus through
//! [`crate::done_when`], within the run's own time budget, the kill
//! switch and the daemon's stop still in force while it waits.

use serde_json::Value;
use tokio::time::Instant;

use super::Runner;
use crate::config::{AlertClears, Runbook};
use crate::done_when::{self, Outcome};
use crate::prometheus::Prometheus;
use crate::trigger::RunRequest;
use crate::verdict::Verdict;

/// Wait for the run's alerts to clear, from now until `within` or the
/// run's `budget_ends`, whichever is first. `sighted`: which of them were
/// seen firing before the run's first change (none: the wait's first
/// evaluation must see each).
pub(super) async fn check(
    runner: &Runner,
    runbook: &Runbook,
    req: &RunRequest,
    clears: &AlertClears,
    budget_ends: Instant,
    sighted: &[bool],
) -> Outcome {
    let since = Instant::now();
    let alerts = req.alerts_seen();
    if alerts.is_empty() {
        return Outcome::unknown(format!(
            "no alert started this run (trigger {}): there is no alert to see clear, so whether it fixed anything is not known; not called ok",
            req.trigger.as_str()
        ));
    }
    let Some(endpoint) = &runner.config.settings.prometheus else {
        return Outcome::unknown(
            "no `prometheus:` in runwarden.yaml: whether the alert cleared cannot be asked",
        );
    };
    let prom = Prometheus::new(endpoint);
    let watched = match watched(&prom, &alerts, clears).await {
        Ok(watched) => watched,
        Err(why) => return Outcome::unknown(format!("{why}; not called ok")),
    };
    let deadline = (since + clears.within).min(budget_ends);
    let stop = || -> Option<(Verdict, String)> {
        if let Err(engaged) = runner.killswitch.check(&runbook.name) {
            return Some((
                Verdict::Halted,
                format!("{engaged}; it stopped the wait for the alert to clear"),
            ));
        }
        runner.stopping().then(|| {
            (
                Verdict::Halted,
                "runwarden is shutting down; it stopped the wait for the alert to clear"
                    .to_string(),
            )
        })
    };
    done_when::watch(&prom, &watched, sighted, clears, since, deadline, &stop).await
}

/// Which of the run's alerts are firing now, by one evaluation: taken
/// before its first change, so that a fix that clears an alert before the
/// wait's first look still counts as seen. Where it cannot be told, none.
pub(super) async fn sight(runner: &Runner, runbook: &Runbook, req: &RunRequest) -> Vec<bool> {
    let alerts = req.alerts_seen();
    let (Some(clears), Some(endpoint)) = (
        runbook.done_when.as_ref(),
        runner.config.settings.prometheus.as_ref(),
    ) else {
        return Vec::new();
    };
    let prom = Prometheus::new(endpoint);
    match watched(&prom, &alerts, clears).await {
        Ok(watched) => done_when::sight(&prom, &watched).await.unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// The series each of `alerts` is.
async fn watched(
    prom: &Prometheus,
    alerts: &[Value],
    clears: &AlertClears,
) -> Result<Vec<done_when::Watched>, done_when::Unknowable> {
    let names: Vec<&str> = alerts
        .iter()
        .filter_map(|a| a["labels"]["alertname"].as_str())
        .collect();
    let known = done_when::Known::ask(prom, &names).await?;
    alerts.iter().map(|a| known.watched(a, clears)).collect()
}

/// `Some(false)` when the alerts that started the run are known to be
/// gone now, by one evaluation (an L2 call approved after its alert
/// cleared by itself is not made); `None` when that cannot be told here.
pub(super) async fn firing_now(
    runner: &Runner,
    runbook: &Runbook,
    req: &RunRequest,
) -> Option<bool> {
    let clears = runbook.done_when.as_ref()?;
    let prom = Prometheus::new(runner.config.settings.prometheus.as_ref()?);
    let alerts = req.alerts_seen();
    if alerts.is_empty() {
        return None;
    }
    let watched = watched(&prom, &alerts, clears).await.ok()?;
    done_when::firing_now(&prom, &watched).await.ok()
}

/// The fingerprints of the alerts a run was started by.
pub(super) fn fingerprints(req: &RunRequest) -> Vec<String> {
    req.alerts_seen()
        .iter()
        .filter_map(|a| a["fingerprint"].as_str().map(String::from))
        .filter(|f| !f.is_empty())
        .collect()
}

/// `outcome` as the report's `alert_check`.
pub(super) fn report_of(outcome: &Outcome) -> crate::report::AlertCheck {
    let kind = match outcome {
        Outcome::Cleared { .. } => "cleared",
        Outcome::Firing { .. } => "firing",
        Outcome::Unknown { .. } => "unknown",
        Outcome::Stopped(..) => "stopped",
    };
    crate::report::AlertCheck {
        outcome: kind.into(),
        said: outcome.words().to_string(),
        detail: outcome.detail().cloned().unwrap_or(Value::Null),
    }
}

//! `done_when:` in a runbook: a run started by an alert is `ok` only when
//! that alert's own series is gone (see the `done_when` module for how it
//! is found and watched).

use std::path::Path;
use std::time::Duration;

use super::super::diag::Diagnostics;
use super::super::{duration, raw};

/// `done_when.alert_clears`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AlertClears {
    /// How long after the run's last call the alert has to clear.
    pub(crate) within: Duration,
    /// Labels a fix legitimately changes (a replaced process's `pid`):
    /// matched on neither side.
    pub(crate) ignore_labels: Vec<String>,
    /// Evaluations in a row, one evaluation interval apart, that must find
    /// no series: one gap of a flapping series is not a clear.
    pub(crate) absent_evaluations: u32,
    /// A clear followed by the same alert within this long is a fix that
    /// did not hold (`recurred`).
    pub(crate) recurrence: Duration,
}

/// `absent_evaluations` when a runbook does not set it.
pub(crate) const ABSENT_EVALUATIONS: u32 = 2;

/// Check `done_when` against the rest of the runbook: it needs an alert
/// to start the run and a Prometheus to ask, and its wait is part of the
/// run's `max_duration`.
pub(super) fn validate(
    raw: &raw::Runbook,
    max_duration: Duration,
    prometheus: bool,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<AlertClears> {
    let done = raw.done_when.as_ref()?;
    let c = &done.alert_clears;
    let at = c.referenced;
    if raw.on_alert.is_none() {
        diags.at(
            file,
            at,
            "done_when.alert_clears needs on_alert: only a run an alert started has an alert to clear",
        );
    }
    if let Some(schedule) = &raw.schedule {
        diags.at(
            file,
            schedule.referenced,
            "a runbook with done_when.alert_clears has no schedule: a scheduled run has no alert to see clear and would end inconclusive each time; put the schedule in a runbook of its own",
        );
    }
    if !prometheus {
        diags.at(
            file,
            at,
            "done_when.alert_clears needs `prometheus: { url: http://HOST:9090 }` in runwarden.yaml: runwarden asks it whether the alert's series is gone",
        );
    }
    let c = &c.value;
    let within = duration(&c.within, "done_when.alert_clears.within", file, diags)?;
    if within >= max_duration {
        diags.at(
            file,
            c.within.referenced,
            format!(
                "done_when.alert_clears.within {} is not shorter than budget.max_duration {}: the wait is part of the run's time; raise max_duration or shorten within",
                humantime::format_duration(within),
                humantime::format_duration(max_duration)
            ),
        );
    }
    let absent_evaluations = match &c.absent_evaluations {
        Some(n) if !(1..=20).contains(&n.value) => {
            diags.at(
                file,
                n.referenced,
                "done_when.alert_clears.absent_evaluations must be between 1 and 20",
            );
            ABSENT_EVALUATIONS
        }
        Some(n) => n.value,
        None => ABSENT_EVALUATIONS,
    };
    let recurrence = match &c.recurrence {
        Some(r) => duration(r, "done_when.alert_clears.recurrence", file, diags)?,
        None => Duration::from_secs(3600),
    };
    let mut ignore_labels = Vec::new();
    for l in &c.ignore_labels {
        let ok = !l.value.is_empty()
            && l.value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !l.value.starts_with(|c: char| c.is_ascii_digit());
        if !ok || l.value == "alertname" {
            diags.at(
                file,
                l.referenced,
                format!(
                    "done_when.alert_clears.ignore_labels: \"{}\" is not a label a fix can change (a Prometheus label name, not alertname)",
                    l.value
                ),
            );
        }
        ignore_labels.push(l.value.clone());
    }
    Some(AlertClears {
        within,
        ignore_labels,
        absent_evaluations,
        recurrence,
    })
}

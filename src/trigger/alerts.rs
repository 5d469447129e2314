//! Alertmanager webhook notifications (payload version 4) turned into run requests.
//!
//! Every firing alert is matched against every runbook's `on_alert`; each
//! (alert, runbook) pair, and each alert no runbook wants, ends in exactly
//! one recorded outcome. Resolved alerts start nothing.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use super::{RunRequest, Trigger};
use crate::config::Config;

/// The webhook body, as Alertmanager sends it. Unknown fields are ignored:
/// Alertmanager may add some, and none of them can widen what runs.
#[derive(Debug, Deserialize)]
pub struct Notification {
    pub version: String,
    #[serde(rename = "groupKey")]
    pub group_key: String,
    pub status: String,
    #[serde(default)]
    pub receiver: String,
    pub alerts: Vec<Alert>,
    #[serde(rename = "truncatedAlerts", default)]
    pub truncated_alerts: u64,
}

#[derive(Debug, Deserialize)]
pub struct Alert {
    pub status: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub fingerprint: String,
}

impl Notification {
    /// Parse and check a body; the error is the reason given back with a 400.
    pub fn parse(body: &[u8]) -> Result<Notification, String> {
        let n: Notification = serde_json::from_slice(body)
            .map_err(|e| format!("not an Alertmanager notification: {e}"))?;
        if n.version != "4" {
            return Err(format!(
                "payload version {:?} is not supported; Alertmanager sends version \"4\"",
                n.version
            ));
        }
        Ok(n)
    }
}

/// What became of one alert for one runbook (or of an alert no runbook wanted).
#[derive(Debug, Clone)]
pub enum Candidate {
    /// Matched and in scope: the scheduler decides (started, deduplicated, cooldown, kill_switch).
    Run(RunRequest),
    /// Matched, but the host it names is not one of the runbook's.
    OutOfScope {
        runbook: String,
        fingerprint: String,
    },
    /// No runbook matched this firing alert.
    NoMatch { fingerprint: String },
}

/// The candidates of one notification, in alert order.
pub fn candidates(n: &Notification, config: &Config) -> Vec<Candidate> {
    // Most runbooks name the alert they handle (`alertname="..."`): look only
    // at those for each alert, and at the others always.
    let mut by_name: std::collections::HashMap<&str, Vec<&crate::config::Runbook>> =
        Default::default();
    let mut unnamed = Vec::new();
    for rb in config.runbooks.values() {
        let Some(on) = &rb.on_alert else { continue };
        match on.matchers.iter().find_map(|m| m.requires("alertname")) {
            Some(name) => by_name.entry(name).or_default().push(rb.as_ref()),
            None => unnamed.push(rb.as_ref()),
        }
    }
    let mut out = Vec::new();
    for alert in n.alerts.iter().filter(|a| a.status == "firing") {
        let mut matched = false;
        let named = alert
            .labels
            .get("alertname")
            .and_then(|a| by_name.get(a.as_str()));
        for rb in named.into_iter().flatten().chain(unnamed.iter()) {
            let Some(on) = &rb.on_alert else { continue };
            if !on.matchers.iter().all(|m| m.matches(&alert.labels)) {
                continue;
            }
            matched = true;
            match on
                .host_of(&alert.labels)
                .filter(|h| rb.allows_host(h) && config.hosts.contains_key(h))
            {
                Some(host) => out.push(Candidate::Run(RunRequest {
                    runbook: rb.name.clone(),
                    host,
                    dry_run: false,
                    planner: Default::default(),
                    trigger: Trigger::Alert,
                    alert: Some(json!({
                        "labels": alert.labels,
                        "annotations": alert.annotations,
                        "fingerprint": alert.fingerprint,
                        "group_key": n.group_key,
                    })),
                    keys: vec![
                        format!("fp:{}", alert.fingerprint),
                        format!("group:{}", n.group_key),
                    ],
                })),
                None => out.push(Candidate::OutOfScope {
                    runbook: rb.name.clone(),
                    fingerprint: alert.fingerprint.clone(),
                }),
            }
        }
        if !matched {
            out.push(Candidate::NoMatch {
                fingerprint: alert.fingerprint.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRING: &str = include_str!("../../tests/fixtures/alertmanager/firing-two-alerts.json");
    const RESOLVED: &str =
        include_str!("../../tests/fixtures/alertmanager/resolved-two-alerts.json");

    #[test]
    fn parses_real_alertmanager_payloads() {
        let n = Notification::parse(FIRING.as_bytes()).unwrap();
        assert_eq!(n.alerts.len(), 2);
        assert_eq!(n.alerts[0].labels["instance"], "web-01:9100");
        assert_eq!(
            n.group_key,
            "{}:{alertname=\"DiskAlmostFull\", instance=\"web-01:9100\"}"
        );
        let r = Notification::parse(RESOLVED.as_bytes()).unwrap();
        assert!(r.alerts.iter().all(|a| a.status == "resolved"));
        let v3 = FIRING.replace("\"version\":\"4\"", "\"version\":\"3\"");
        assert!(
            Notification::parse(v3.as_bytes())
                .unwrap_err()
                .contains("version \"3\"")
        );
        assert!(Notification::parse(b"{\"alerts\": 5}").is_err());
    }
}

//! Alertmanager webhook notifications (payload version 4) turned into run requests.
//!
//! Every firing alert is matched against every runbook's `on_alert`; each
//! (alert, runbook) pair, and each alert no runbook wants, ends in exactly
//! one recorded outcome. Resolved alerts start nothing.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{RunRequest, Trigger};
use crate::config::Config;

/// The webhook body, as Alertmanager sends it. Unknown fields are ignored:
/// Alertmanager may add some, and none of them can widen what runs.
#[derive(Debug, Clone, Deserialize)]
pub struct Notification {
    /// The payload version (runwarden reads "4").
    pub(crate) version: String,
    /// Alertmanager's key for the alert group.
    #[serde(rename = "groupKey")]
    pub(crate) group_key: String,
    /// `firing` or `resolved`, for the group: not read (each alert says
    /// its own), but a payload without it is not Alertmanager's.
    #[allow(dead_code, reason = "required by the payload's shape, read per alert")]
    pub(crate) status: String,
    /// The alerts of the group.
    pub(crate) alerts: Vec<Alert>,
    /// How many alerts Alertmanager left out (its `max_alerts`).
    #[serde(rename = "truncatedAlerts", default)]
    pub(crate) truncated_alerts: u64,
}

/// One alert of a notification.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Alert {
    /// `firing` or `resolved`.
    pub(crate) status: String,
    /// Its labels (the host label among them).
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
    /// Its annotations.
    #[serde(default)]
    pub(crate) annotations: BTreeMap<String, String>,
    /// Alertmanager's fingerprint of its labels.
    #[serde(default)]
    pub(crate) fingerprint: String,
    /// The Prometheus page of the rule that fired it (`g0.expr` is its
    /// expression): where `done_when` reads the rule when the rules API
    /// has none of that name and labels.
    #[serde(default, rename = "generatorURL")]
    pub(crate) generator_url: String,
}

impl Notification {
    /// Parse and check a body; the error is the reason given back with a 400.
    pub fn parse(body: &[u8]) -> Result<Notification, NotANotification> {
        let n: Notification = serde_json::from_slice(body).map_err(NotANotification::Json)?;
        if n.version != "4" {
            return Err(NotANotification::Version(n.version));
        }
        Ok(n)
    }
}

/// A webhook body runwarden does not take (answered with a 400 and this reason).
#[derive(Debug, thiserror::Error)]
pub enum NotANotification {
    /// Not the JSON of an Alertmanager notification.
    #[error("not an Alertmanager notification: {0}")]
    Json(#[source] serde_json::Error),
    /// Another payload version.
    #[error("payload version {0:?} is not supported; Alertmanager sends version \"4\"")]
    Version(String),
}

/// What became of one alert for one runbook (or of an alert no runbook wanted).
#[derive(Debug, Clone)]
pub enum Candidate {
    /// Matched and in scope: the scheduler decides (started, deduplicated, cooldown, kill_switch).
    Run(RunRequest),
    /// Matched, but the host it names is not one of the runbook's.
    OutOfScope {
        /// The runbook that matched.
        runbook: String,
        /// The host the alert names (empty when it names none).
        host: String,
        /// The alert's fingerprint.
        fingerprint: String,
        /// Its deduplication keys, as a run's would be (for the fleet's record).
        keys: Vec<String>,
        /// Which host, and why it is not one the runbook may touch.
        why: String,
    },
    /// The alert holds what no store can keep (a NUL byte): it starts
    /// nothing, and its record shows the bytes escaped.
    Invalid {
        /// The alert's fingerprint, escaped.
        fingerprint: String,
        /// Its deduplication keys, escaped (for the fleet's record).
        keys: Vec<String>,
        /// Which field, and why.
        why: String,
    },
    /// No runbook matched this firing alert.
    NoMatch {
        /// The alert's fingerprint.
        fingerprint: String,
        /// Its deduplication keys, as a run's would be (for the fleet's record).
        keys: Vec<String>,
        /// The closest runbook and the first of its matchers that failed.
        why: String,
    },
}

impl Candidate {
    /// The runbook (`none` when none took it), the host (empty when the
    /// alert names none), the keys, and what kind of trigger it is.
    pub(crate) fn names(&self) -> (&str, &str, &[String], Trigger) {
        match self {
            Candidate::Run(req) => (&req.runbook, &req.host, &req.keys, req.trigger),
            Candidate::OutOfScope {
                runbook,
                host,
                keys,
                ..
            } => (runbook, host, keys, Trigger::Alert),
            Candidate::NoMatch { keys, .. } | Candidate::Invalid { keys, .. } => {
                ("none", "", keys, Trigger::Alert)
            }
        }
    }

    /// Why it starts nothing, when that is known before admission.
    pub(crate) fn why(&self) -> Option<&str> {
        match self {
            Candidate::Run(_) => None,
            Candidate::OutOfScope { why, .. }
            | Candidate::NoMatch { why, .. }
            | Candidate::Invalid { why, .. } => Some(why),
        }
    }

    /// The alert's fingerprint (a run request's first key, without `fp:`).
    pub(crate) fn fingerprint(&self) -> &str {
        match self {
            Candidate::Run(req) => req
                .keys
                .first()
                .map(|k| k.trim_start_matches("fp:"))
                .unwrap_or_default(),
            Candidate::OutOfScope { fingerprint, .. }
            | Candidate::NoMatch { fingerprint, .. }
            | Candidate::Invalid { fingerprint, .. } => fingerprint,
        }
    }
}

/// Why no runbook took `labels`: the runbook whose matchers match the most
/// (the first by name among equals) and its first matcher that does not.
fn closest_miss(labels: &std::collections::BTreeMap<String, String>, config: &Config) -> String {
    let mut best: Option<(usize, &str, String)> = None;
    for rb in config.runbooks.values() {
        let Some(on) = &rb.on_alert else { continue };
        let hits = on.matchers.iter().filter(|m| m.matches(labels)).count();
        let Some(miss) = on.matchers.iter().find(|m| !m.matches(labels)) else {
            continue;
        };
        let seen = match labels.get(&miss.name) {
            Some(v) => format!("{}={v:?}", miss.name),
            None => format!("no {} label", miss.name),
        };
        let why = format!(
            "closest runbook {:?} ({hits} of {} matchers): {miss} does not match ({seen})",
            rb.name,
            on.matchers.len()
        );
        if best.as_ref().is_none_or(|(h, _, _)| hits > *h) {
            best = Some((hits, &rb.name, why));
        }
    }
    match best {
        None => "no runbook has on_alert".to_string(),
        Some((0, _, _)) => {
            // Nothing in common: say which alerts the runbooks do take.
            let taken: std::collections::BTreeSet<&str> = config
                .runbooks
                .values()
                .filter_map(|r| r.on_alert.as_ref())
                .filter_map(|on| on.matchers.iter().find_map(|m| m.requires("alertname")))
                .collect();
            format!(
                "no runbook's matchers match any of its labels; this alert is alertname={:?}, the runbooks take alertname {}",
                labels.get("alertname").map(String::as_str).unwrap_or(""),
                taken.into_iter().collect::<Vec<_>>().join(", ")
            )
        }
        Some((_, _, why)) => why,
    }
}

/// Why an alert cannot be kept as it is, if it cannot: a NUL byte in any
/// string of it (PostgreSQL's text and jsonb refuse it, so one such alert
/// once made a whole notification fail for good, and Alertmanager resent
/// it forever). Checked on either store, so both say the same.
fn unkeepable(n: &Notification, alert: &Alert) -> Option<String> {
    let nul = |s: &str| s.contains('\0');
    if nul(&n.group_key) {
        return Some("the notification's groupKey holds a NUL byte".into());
    }
    if nul(&alert.fingerprint) {
        return Some("its fingerprint holds a NUL byte".into());
    }
    for (what, map) in [("label", &alert.labels), ("annotation", &alert.annotations)] {
        if let Some((k, _)) = map.iter().find(|(k, v)| nul(k) || nul(v)) {
            return Some(format!("its {what} {} holds a NUL byte", escaped(k)));
        }
    }
    None
}

/// `s` with NUL bytes shown as `\0`, as an invalid alert's record keeps it.
fn escaped(s: &str) -> String {
    s.replace('\0', "\\0")
}

/// A `resolved` alert that a runbook with `on_resolved:
/// withdraw_approvals` takes: the approval requests of the runs it started
/// on that host are withdrawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The runbook whose matchers take it.
    pub(crate) runbook: String,
    /// The host it names.
    pub(crate) host: String,
    /// The trigger key its run carries (`fp:FINGERPRINT`).
    pub(crate) key: String,
}

/// The resolved alerts of one notification that withdraw approval
/// requests, by the same matchers and host label that start runs.
pub(crate) fn resolved(n: &Notification, config: &Config) -> Vec<Resolved> {
    let mut out = Vec::new();
    for alert in n.alerts.iter().filter(|a| a.status == "resolved") {
        if unkeepable(n, alert).is_some() {
            continue;
        }
        for rb in config.runbooks.values() {
            let Some(on) = &rb.on_alert else { continue };
            if rb.on_resolved != crate::config::OnResolved::WithdrawApprovals
                || !on.matchers.iter().all(|m| m.matches(&alert.labels))
            {
                continue;
            }
            if let Some(host) = on.host_of(&alert.labels).filter(|h| rb.allows_host(h)) {
                out.push(Resolved {
                    runbook: rb.name.clone(),
                    host,
                    key: format!("fp:{}", alert.fingerprint),
                });
            }
        }
    }
    out
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
        let keys = || {
            vec![
                format!("fp:{}", alert.fingerprint),
                format!("group:{}", n.group_key),
            ]
        };
        if let Some(why) = unkeepable(n, alert) {
            out.push(Candidate::Invalid {
                fingerprint: escaped(&alert.fingerprint),
                keys: keys().iter().map(|k| escaped(k)).collect(),
                why,
            });
            continue;
        }
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
            // An example host (`example: true`) is never called until
            // someone sets it up: no alert starts a run there.
            match on.host_of(&alert.labels).filter(|h| {
                rb.allows_host(h) && config.hosts.get(h).is_some_and(|host| !host.example)
            }) {
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
                        "generator_url": alert.generator_url,
                        "group_key": n.group_key,
                    })),
                    keys: keys(),
                    together: None,
                    agent: None,
                    by: None,
                })),
                None => out.push(Candidate::OutOfScope {
                    runbook: rb.name.clone(),
                    host: on.host_of(&alert.labels).unwrap_or_default(),
                    fingerprint: alert.fingerprint.clone(),
                    keys: keys(),
                    why: match on.host_of(&alert.labels) {
                        None => format!("the alert has no {} label", on.host_label),
                        Some(h) if !rb.allows_host(&h) => {
                            format!("host {h:?} is not one of the runbook's hosts")
                        }
                        Some(h) if config.hosts.get(&h).is_some_and(|host| host.example) => {
                            format!("host {h:?} is an example (example: true in its host file): set it up, then remove that line")
                        }
                        Some(h) => format!("host {h:?} has no host file"),
                    },
                }),
            }
        }
        if !matched {
            out.push(Candidate::NoMatch {
                fingerprint: alert.fingerprint.clone(),
                keys: keys(),
                why: closest_miss(&alert.labels, config),
            });
        }
    }
    // A run started by a notification sees the alerts of it for its
    // runbook and host (`/` and `/var` filling at once), not only the
    // first: one list per pair, shared by its requests, so memory and
    // time stay linear in the notification whatever it holds.
    let mut together: std::collections::HashMap<(&str, &str), crate::trigger::Together> =
        Default::default();
    for c in &out {
        if let Candidate::Run(r) = c {
            let t = together.entry((&r.runbook, &r.host)).or_default();
            t.total += 1;
            if t.alerts.len() < crate::trigger::TOGETHER {
                t.alerts.push(r.alert.clone().unwrap_or(Value::Null));
            }
        }
    }
    let together: std::collections::HashMap<
        (String, String),
        std::sync::Arc<crate::trigger::Together>,
    > = together
        .into_iter()
        .map(|((rb, h), t)| ((rb.to_string(), h.to_string()), std::sync::Arc::new(t)))
        .collect();
    for c in &mut out {
        if let Candidate::Run(r) = c {
            r.together = together.get(&(r.runbook.clone(), r.host.clone())).cloned();
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
        assert!(matches!(
            Notification::parse(v3.as_bytes()),
            Err(NotANotification::Version(v)) if v == "3"
        ));
        assert!(Notification::parse(b"{\"alerts\": 5}").is_err());
    }

    /// The captured `resolved` notification names the runbook and host
    /// its firing twin started, with each alert's own key; a runbook with
    /// `on_resolved: ignore` names none; firing alerts withdraw nothing.
    #[test]
    fn resolved_alerts_name_the_runs_whose_requests_they_withdraw() {
        let mut config = Config::load(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let n = Notification::parse(RESOLVED.as_bytes()).unwrap();
        let got = resolved(&n, &config);
        let keys: Vec<String> = n
            .alerts
            .iter()
            .map(|a| format!("fp:{}", a.fingerprint))
            .collect();
        assert_eq!(
            got,
            keys.iter()
                .map(|k| Resolved {
                    runbook: "disk-almost-full".into(),
                    host: "web-01".into(),
                    key: k.clone(),
                })
                .collect::<Vec<_>>()
        );
        // Their firing twins started runs under the same keys.
        let firing = Notification::parse(FIRING.as_bytes()).unwrap();
        let started: Vec<String> = candidates(&firing, &config)
            .into_iter()
            .filter_map(|c| match c {
                Candidate::Run(r) => r.keys.into_iter().next(),
                _ => None,
            })
            .collect();
        assert_eq!(started, keys);
        assert!(resolved(&firing, &config).is_empty());
        let rb = config.runbooks.get_mut("disk-almost-full").unwrap();
        std::sync::Arc::make_mut(rb).on_resolved = crate::config::OnResolved::Ignore;
        assert!(resolved(&n, &config).is_empty());
    }

    /// An alert no runbook takes says why: the closest runbook and its
    /// failing matcher, or which alerts the runbooks take; one that matches
    /// but names a host the runbook may not touch says which host.
    #[test]
    fn an_alert_that_starts_nothing_says_why() {
        let config = Config::load(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let why = |text: &str| -> Vec<String> {
            let n = Notification::parse(text.as_bytes()).unwrap();
            candidates(&n, &config)
                .into_iter()
                .map(|c| match c {
                    Candidate::NoMatch { why, .. } => format!("no_match: {why}"),
                    Candidate::OutOfScope { why, .. } => format!("out_of_scope: {why}"),
                    Candidate::Invalid { why, .. } => format!("invalid: {why}"),
                    Candidate::Run(r) => format!("run {}", r.runbook),
                })
                .collect()
        };
        // The captured payload starts the shipped example, once per alert
        // (the scheduler makes them one run).
        let got = why(FIRING);
        assert_eq!(got, ["run disk-almost-full", "run disk-almost-full"]);
        // Nothing in common with any runbook: which alerts the runbooks take.
        let got = why(&FIRING.replace("DiskAlmostFull", "MemoryPressure"));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].starts_with("no_match: ")
                && got[0].contains("alertname=\"MemoryPressure\"")
                && got[0].contains("DiskAlmostFull, NodeFilesystemAlmostFull"),
            "{got:?}"
        );
        // The right alert name without `env`: the closest runbook and its miss.
        let renamed = FIRING.replace(
            "\"alertname\":\"DiskAlmostFull\"",
            "\"alertname\":\"NodeFilesystemAlmostFull\"",
        );
        let got = why(&renamed);
        assert!(
            got[0].contains("closest runbook \"staging-disk-full\" (1 of 2 matchers)")
                && got[0].contains("env=\"staging\" does not match (no env label)"),
            "{got:?}"
        );
        // Matched, but the host is not one of the runbook's.
        let staged = renamed.replace("\"job\":\"node\"", "\"job\":\"node\",\"env\":\"staging\"");
        let got = why(&staged);
        assert!(
            got[0].starts_with("out_of_scope: host \"web-01\" is not one of the runbook's hosts"),
            "{got:?}"
        );
    }

    /// 10,000 alerts of one notification for one (runbook, host): their
    /// requests share one bounded list of them (no copy per alert), and
    /// each run sees its own alert first, then the others, at most 100.
    #[test]
    fn the_alerts_of_one_host_share_one_bounded_list() {
        let config = Config::load(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let mut v: Value = serde_json::from_str(FIRING).unwrap();
        let first = v["alerts"][0].clone();
        v["alerts"] = (0..10_000)
            .map(|i| {
                let mut a = first.clone();
                a["labels"]["mountpoint"] = format!("/m{i}").into();
                a["fingerprint"] = format!("{i:016x}").into();
                a
            })
            .collect();
        let n = Notification::parse(v.to_string().as_bytes()).unwrap();
        let out = candidates(&n, &config);
        let runs: Vec<&RunRequest> = out
            .iter()
            .filter_map(|c| match c {
                Candidate::Run(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(runs.len(), 10_000);
        let shared = runs[0].together.clone().unwrap();
        assert!(
            runs.iter()
                .all(|r| std::sync::Arc::ptr_eq(r.together.as_ref().unwrap(), &shared))
        );
        assert_eq!(
            (shared.alerts.len(), shared.total),
            (crate::trigger::TOGETHER, 10_000)
        );
        let seen = runs[5000].alerts_seen();
        assert_eq!(seen.len(), crate::trigger::TOGETHER);
        assert_eq!(seen[0]["fingerprint"], format!("{:016x}", 5000));
        assert_eq!(seen[1]["fingerprint"], format!("{:016x}", 0));
        let seen = runs[1].alerts_seen();
        assert_eq!(seen[0]["fingerprint"], format!("{:016x}", 1));
        assert_eq!(seen[1]["fingerprint"], format!("{:016x}", 0));
        assert_eq!(
            seen[2]["fingerprint"],
            format!("{:016x}", 2),
            "itself not twice"
        );
        // Through the fleet's queue and back, the same.
        let back = RunRequest::from_queue(
            "disk-almost-full".into(),
            "web-01".into(),
            &runs[1].to_queue(),
        )
        .unwrap();
        assert_eq!(back.alerts_seen(), runs[1].alerts_seen());
    }
}

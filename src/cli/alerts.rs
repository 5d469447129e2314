//! `runwarden alerts test FILE`: what a notification would start, alert by
//! alert, in the spirit of `amtool config routes test`. The same matching
//! the webhook does, plus the kill switch and each runbook's cooldown as the
//! audit log has them now; nothing runs and nothing is written.

use std::path::Path;

use serde_json::{Value, json};

use super::{Exit, Failed};
use crate::admission::{DUPLICATE_WINDOW, Slot, TriggerResult};
use crate::config::Config;
use crate::gate::killswitch::KillSwitch;
use crate::trigger::alerts::{Candidate, Notification, candidates};

pub(super) fn alerts_test(file: &Path, dir: &Path, as_json: bool) -> Exit {
    let config = super::check::load(dir)?;
    let body = std::fs::read(file)
        .map_err(|e| Failed::usage(format!("cannot read {}: {e}", file.display())))?;
    let n = Notification::parse(&body)
        .map_err(|e| Failed::usage(format!("{}: {e}", file.display())))?;
    let record = match crate::audit::runs::recovery(&config.settings.audit_log) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "runwarden: cannot read {} for cooldowns: {e}; they are not shown",
                config.settings.audit_log.display()
            );
            Default::default()
        }
    };
    let killswitch = KillSwitch::new(&config.settings.kill_switch_dir);
    // One run per runbook and host: a later alert of the same notification
    // joins the run an earlier one starts (it sees it in `alerts`).
    let mut starting: std::collections::HashMap<(String, String), usize> = Default::default();
    let verdicts: Vec<Value> = n
        .alerts
        .iter()
        .enumerate()
        .map(|(i, alert)| {
            let one = Notification {
                alerts: vec![alert.clone()],
                ..n.clone()
            };
            let outcomes: Vec<Value> = if alert.status != "firing" {
                vec![json!({ "result": "resolved", "why": "a resolved alert starts nothing" })]
            } else {
                candidates(&one, &config)
                    .into_iter()
                    .map(|c| {
                        let mut o = outcome(c, &config, &killswitch, &record);
                        if o["result"] == "would_start" {
                            let key = (
                                o["runbook"].as_str().unwrap_or("").to_string(),
                                o["host"].as_str().unwrap_or("").to_string(),
                            );
                            if let Some(first) = starting.get(&key) {
                                o["result"] = "joins".into();
                                o["why"] = format!(
                                    "the run alert {} starts on {} sees this alert too (in `alerts`); the webhook records it as deduplicated",
                                    first + 1,
                                    key.1
                                )
                                .into();
                            } else {
                                starting.insert(key, i);
                            }
                        }
                        o
                    })
                    .collect()
            };
            json!({ "labels": alert.labels, "fingerprint": alert.fingerprint, "outcomes": outcomes })
        })
        .collect();
    if as_json {
        println!("{}", json!({ "alerts": verdicts }));
        return Ok(0);
    }
    for (i, a) in verdicts.iter().enumerate() {
        let labels: Vec<String> = a["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v))
            .collect();
        println!(
            "alert {}/{} {{{}}}",
            i + 1,
            verdicts.len(),
            crate::text::printable(&labels.join(", "))
        );
        for o in a["outcomes"].as_array().into_iter().flatten() {
            let result = o["result"].as_str().unwrap_or("");
            let line = match result {
                "would_start" => format!(
                    "would start runbook {} on host {}",
                    o["runbook"].as_str().unwrap_or(""),
                    o["host"].as_str().unwrap_or("")
                ),
                _ => format!(
                    "{result}{}: {}",
                    o["runbook"]
                        .as_str()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default(),
                    o["why"].as_str().unwrap_or("")
                ),
            };
            println!("  -> {}", crate::text::printable(&line));
        }
    }
    Ok(0)
}

/// One candidate as `alerts test` reports it: the kill switch, then the
/// scheduler's own rule for the (runbook, host) as the audit log leaves it.
fn outcome(
    c: Candidate,
    config: &Config,
    killswitch: &KillSwitch,
    record: &crate::audit::runs::Recovery,
) -> Value {
    match c {
        Candidate::NoMatch { why, .. } => json!({ "result": "no_match", "why": why }),
        Candidate::Invalid { why, .. } => json!({ "result": "invalid", "why": why }),
        Candidate::OutOfScope { runbook, why, .. } => {
            json!({ "result": "out_of_scope", "runbook": runbook, "why": why })
        }
        Candidate::Run(req) => {
            if let Err(engaged) = killswitch.check(&req.runbook) {
                return json!({ "result": "kill_switch", "runbook": req.runbook, "host": req.host, "why": engaged.to_string() });
            }
            let runbook = config.runbooks.get(&req.runbook);
            let cooldown = runbook.and_then(|r| r.cooldown);
            let cap = runbook.and_then(|r| r.max_runs);
            let refused = Slot::from_record(record, &(req.runbook.clone(), req.host.clone()))
                .refuses(&req.keys, cooldown, cap, DUPLICATE_WINDOW);
            match refused {
                None => {
                    json!({ "result": "would_start", "runbook": req.runbook, "host": req.host })
                }
                Some((result, ago)) => {
                    let ago = humantime::format_duration(std::time::Duration::from_secs(
                        ago.unwrap_or_default().as_secs(),
                    ));
                    let why = match result {
                        TriggerResult::Deduplicated => format!(
                            "this alert started the last run on {}, {ago} ago, within the cooldown",
                            req.host
                        ),
                        TriggerResult::Capped => match cap {
                            Some(cap) => format!(
                                "{} already ran {} time(s) on {} within {} (max_runs): a fix that keeps being needed is for a person to look at",
                                req.runbook,
                                cap.count,
                                req.host,
                                humantime::format_duration(cap.per)
                            ),
                            None => String::new(),
                        },
                        _ => format!(
                            "its last run on {} ended {ago} ago, within the cooldown of {}",
                            req.host,
                            humantime::format_duration(cooldown.unwrap_or_default())
                        ),
                    };
                    json!({ "result": result.as_str(), "runbook": req.runbook, "host": req.host, "why": why })
                }
            }
        }
    }
}

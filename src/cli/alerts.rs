//! `runwarden alerts test FILE [--plan]`: what a notification would start,
//! alert by alert, in the spirit of `amtool config routes test`; with
//! `--plan`, each run it would start through the real gate (see
//! [`crate::plan`]). Nothing runs and nothing is written.

use std::path::Path;

use serde_json::Value;

use super::{Exit, Failed};
use crate::gate::killswitch::KillSwitch;
use crate::trigger::alerts::Notification;

pub(super) async fn alerts_test(file: &Path, dir: &Path, as_json: bool, plans: bool) -> Exit {
    let config = super::check::load(dir)?;
    // `-`: the notification on standard input (`amtool`, `curl`, a pipe),
    // no larger than the webhook takes.
    let body = if file == Path::new("-") {
        use std::io::Read;
        let mut body = Vec::new();
        std::io::stdin()
            .take(crate::http::MAX_NOTIFICATION as u64 + 1)
            .read_to_end(&mut body)
            .map_err(|e| Failed::usage(format!("cannot read standard input: {e}")))?;
        if body.len() > crate::http::MAX_NOTIFICATION {
            return Err(Failed::usage(
                "standard input holds more than a notification may (8 MiB)",
            ));
        }
        body
    } else {
        std::fs::read(file)
            .map_err(|e| Failed::usage(format!("cannot read {}: {e}", file.display())))?
    };
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
    let demotions = crate::audit::demotions(&config.settings);
    let mut all = crate::plan::notification(&n, &config, &killswitch, &demotions, &record, plans);
    done_when(&mut all, &n, &config).await;
    let staged = rollouts(&all, &config);
    if !staged.is_empty() {
        all["rollouts"] = Value::Object(staged);
    }
    if as_json {
        println!("{all}");
        return Ok(0);
    }
    let verdicts = all["alerts"].as_array().cloned().unwrap_or_default();
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
            print_done_when(&o["done_when"]);
            print_plan(&o["plan"]);
        }
    }
    for (runbook, r) in all["rollouts"].as_object().into_iter().flatten() {
        println!(
            "runbook {runbook} has rollout: {}",
            r["why"].as_str().unwrap_or("")
        );
        for line in r["waves"].as_array().into_iter().flatten() {
            println!("  {}", line.as_str().unwrap_or(""));
        }
    }
    Ok(0)
}

/// The runbooks the notification would start that have `rollout:`: an
/// alert's run is not staged (it remedies the host the alert names, now),
/// and a user reading this should not expect it to wait for a canary; the
/// waves its fan-outs take are shown beside that.
fn rollouts(all: &Value, config: &crate::config::Config) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let starts = all["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["outcomes"].as_array().into_iter().flatten())
        .filter(|o| o["result"] == "would_start")
        .filter_map(|o| o["runbook"].as_str());
    for name in starts {
        let Some(runbook) = config.runbooks.get(name) else {
            continue;
        };
        if runbook.rollout.is_none() || out.contains_key(name) {
            continue;
        }
        out.insert(
            name.to_string(),
            serde_json::json!({
                "staged": false,
                "why": "an alert's run starts on the host it names at once, not in waves; a schedule's fire, `run --all-hosts` and the API's all_hosts go in these",
                "waves": crate::rollout::describe(config, runbook),
            }),
        );
    }
    out
}

/// For each run a runbook with `done_when` would start: what would be
/// asked of Prometheus to see its alert clear (`done_when` beside the
/// outcome), or why it could not be.
async fn done_when(all: &mut Value, n: &Notification, config: &crate::config::Config) {
    let Some(endpoint) = &config.settings.prometheus else {
        return;
    };
    let prom = crate::prometheus::Prometheus::new(endpoint);
    let Some(alerts) = all["alerts"].as_array_mut() else {
        return;
    };
    // One entry per alert of the notification, in its order.
    for (a, alert) in alerts.iter_mut().zip(&n.alerts) {
        let shape = serde_json::json!({
            "labels": alert.labels,
            "fingerprint": alert.fingerprint,
            "generator_url": alert.generator_url,
        });
        for o in a["outcomes"].as_array_mut().into_iter().flatten() {
            let clears = o["runbook"]
                .as_str()
                .and_then(|r| config.runbooks.get(r))
                .and_then(|r| r.done_when.clone());
            let (Some(clears), "would_start") = (clears, o["result"].as_str().unwrap_or("")) else {
                continue;
            };
            o["done_when"] = match crate::done_when::preview(&prom, &shape, &clears).await {
                Ok(v) => v,
                Err(why) => serde_json::json!({ "error": why.to_string() }),
            };
        }
    }
}

/// What `done_when` would look for, as a person reads it.
fn print_done_when(d: &Value) {
    if d.is_null() {
        return;
    }
    if let Some(why) = d["error"].as_str() {
        println!(
            "     done when the alert clears: cannot tell ({})",
            crate::text::printable(why)
        );
        return;
    }
    for q in d["queries"].as_array().into_iter().flatten() {
        println!(
            "     done when the alert clears: {} is absent from {}",
            crate::text::printable(d["series_text"].as_str().unwrap_or("")),
            crate::text::printable(q.as_str().unwrap_or(""))
        );
    }
    println!(
        "     within at least {} s (the rule's look-back {} s plus two evaluations of {} s)",
        d["minimum_within_s"], d["look_back_s"], d["evaluation_interval_s"]
    );
    if let Some(w) = d["warning"].as_str() {
        println!("     warning: {}", crate::text::printable(w));
    }
}

/// A planned run, as a person reads it: the model's scope, then each step
/// with the gate's decision and what it would spawn.
fn print_plan(plan: &Value) {
    if plan.is_null() {
        return;
    }
    if let Some(why) = plan["error"].as_str() {
        println!("     plan: {}", crate::text::printable(why));
        return;
    }
    if let Some(m) = plan.get("model") {
        println!(
            "     model planner (autonomy {}): goal {:?}; tools {}; at most {} calls; {}",
            plan["autonomy"].as_str().unwrap_or(""),
            m["goal"].as_str().unwrap_or(""),
            m["tools"],
            m["max_steps"],
            m["what"].as_str().unwrap_or("")
        );
    }
    for (n, step) in plan["steps"].as_array().into_iter().flatten().enumerate() {
        let tool = step["tool"]
            .as_str()
            .map(|t| format!(" {t}"))
            .unwrap_or_default();
        let decision = step["decision"].as_str().unwrap_or("");
        let mut line = format!(
            "step {} ({}){tool}: {decision}",
            n + 1,
            step["id"].as_str().unwrap_or("")
        );
        if let Some(why) = step["why"].as_str() {
            line += &format!(" ({why})");
        }
        println!("     {}", crate::text::printable(&line));
        for argv in step["argv"].as_array().into_iter().flatten() {
            let words: Vec<&str> = argv
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|w| w.as_str())
                .collect();
            println!("         $ {}", crate::text::printable(&words.join(" ")));
        }
    }
}

//! `runwarden run`: one runbook on one host here, or through the daemon (`--via-daemon`) on several.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::check::load;
use super::{EXIT_BUSY, Exit, Failed};
use crate::audit::AuditLog;
use crate::report::render;
use crate::rules::exit::HostEnd;
use crate::run::RunRequest;
use crate::run::Runner;
use crate::run::StartError;
use crate::verdict::Verdict;

/// A runner for a run of this process, on the config in `dir`: its audit
/// log, and with shared state its store (the run holds its lease like the
/// daemon's runs do, and sees the fleet's demotions as they stand now).
pub(super) async fn runner(dir: &Path) -> Result<Runner, Failed> {
    let cfg = load(dir)?;
    let audit = AuditLog::open_with(&cfg.settings.audit_log, cfg.settings.audit_rotation.clone())
        .map_err(|e| Failed::code(Verdict::Broken.exit_code(), e))?;
    let store = crate::store::Postgres::from_settings(&cfg.settings).map_err(Failed::usage)?;
    let mut runner = Runner::new(Arc::new(cfg), Arc::new(audit));
    if let Some(store) = &store {
        let fleet = store.demotions().await.map_err(|e| {
            Failed::code(
                Verdict::Broken.exit_code(),
                format!("{e}; nothing ran (whether the runbook was demoted cannot be told)"),
            )
        })?;
        store.demoted.set(fleet);
        runner.demotions = runner.demotions.with_fleet(Some(store.demoted.clone()));
    }
    runner.state = crate::state::chosen(store);
    Ok(runner)
}

pub(super) async fn run(dir: &Path, req: RunRequest, json: bool) -> Exit {
    let mut runner = runner(dir).await?;
    // On a terminal, a model's turn shows how far it has come (a CPU model
    // takes minutes a turn); elsewhere nothing extra is written.
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if terminal {
        runner.model_progress = Some(Arc::new(|tokens, took| {
            use std::io::Write;
            let _ = write!(
                std::io::stderr(),
                "\r  the model is writing: {tokens} token(s), {:.0} s ",
                took.as_secs_f64()
            );
        }));
    }
    let ran = runner.run(&req).await;
    if terminal && runner.model_progress.is_some() {
        // The progress line goes before the report is printed.
        eprint!("\r\x1b[2K");
    }
    match ran {
        Ok(report) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                );
            } else {
                print!("{}", crate::text::printable(&render(&report)));
            }
            Ok(report.verdict.exit_code())
        }
        Err(e @ (StartError::Audit(_) | StartError::Lock(_))) => {
            Err(Failed::code(Verdict::Broken.exit_code(), e))
        }
        Err(e @ StartError::Busy(_)) => Err(Failed::code(
            EXIT_BUSY,
            format!("{e}; try again when it has ended"),
        )),
        Err(e @ StartError::KillSwitch(_)) => Err(Failed::code(Verdict::Halted.exit_code(), e)),
        Err(e) => Err(Failed::usage(e)),
    }
}

/// How `run --via-daemon` talks to the daemon and what it prints.
pub(super) struct ViaDaemon<'a> {
    /// The daemon's URL.
    pub(crate) base: &'a str,
    /// The webhook token's file, when the daemon requires one.
    pub(crate) token_file: Option<&'a Path>,
    /// Wait for each run's report (else print its id and return).
    pub(crate) wait: bool,
    /// Print each report as JSON.
    pub(crate) json: bool,
}

/// `run --via-daemon`: start the runs through the daemon, wait for each
/// run and print its report as a local run does (verdict detail included),
/// exit as [`crate::rules::exit::fan_out`] says (the worst verdict; 75 or
/// 7 only when every run that started ended `ok`).
pub(super) async fn via_daemon(
    ask: ViaDaemon<'_>,
    runbook: &str,
    hosts: &[String],
    all_hosts: bool,
    dry_run: bool,
) -> Exit {
    let token = match ask
        .token_file
        .map(|f| crate::secret::read_file(f, "webhook token file"))
    {
        Some(t) => Some(t.map_err(Failed::usage)?.trim().to_string()),
        None => None,
    };
    let base = ask.base.trim_end_matches('/');
    let client = reqwest::Client::new();
    let auth = |r: reqwest::RequestBuilder| match &token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    let body = if all_hosts {
        serde_json::json!({ "runbook": runbook, "all_hosts": true, "dry_run": dry_run })
    } else {
        serde_json::json!({ "runbook": runbook, "hosts": hosts, "dry_run": dry_run })
    };
    let answer = auth(client.post(format!("{base}/api/v1/runs")))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    let (status, answer) = match answer {
        Ok(r) => (
            r.status(),
            r.bytes()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .unwrap_or(Value::Null),
        ),
        Err(e) => {
            return Err(Failed::usage(format!(
                "cannot reach the daemon at {base}: {}",
                crate::error_chain(&e)
            )));
        }
    };
    if status != reqwest::StatusCode::ACCEPTED {
        return Err(Failed::usage(format!(
            "the daemon answered {status}: {}",
            answer["error"].as_str().unwrap_or("")
        )));
    }
    if let Some(rollout) = answer.get("rollout").filter(|r| r.is_object()) {
        return follow_rollout(&ask, &client, &auth, base, rollout).await;
    }
    for (i, wave) in answer["waves"].as_array().into_iter().flatten().enumerate() {
        let names: Vec<&str> = wave
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        println!("a real run's rollout, wave {}: {}", i + 1, names.join(" "));
    }
    let mut ends = Vec::new();
    for o in answer["outcomes"].as_array().into_iter().flatten() {
        let host = o["host"].as_str().unwrap_or("?");
        let Some(id) = o["run_id"].as_str() else {
            let result = o["result"].as_str().unwrap_or("?");
            println!("{host}: not started ({result})");
            // A switch engaged is not "busy, try again": a retrying script
            // must not loop on it.
            ends.push(HostEnd::NotStarted {
                kill_switch: result == "kill_switch",
            });
            continue;
        };
        println!("{host}: run {id} started");
        if !ask.wait {
            continue;
        }
        let run = loop {
            let run = json_of(auth(client.get(format!("{base}/api/v1/runs/{id}")))).await;
            match run.as_ref().and_then(|v| v["status"].as_str()) {
                Some("queued" | "running") | None => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await
                }
                Some(_) => break run.unwrap_or_default(),
            }
        };
        let verdict = run["status"].as_str().unwrap_or("broken").to_string();
        // The daemon keeps recent reports: the same report as a local run.
        match serde_json::from_value::<crate::report::RunReport>(run["report"].clone()) {
            Ok(report) if ask.json => println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            ),
            Ok(report) => print!("{}", crate::text::printable(&render(&report))),
            Err(_) => println!(
                "{host}: run {id}: {verdict}{}",
                run["detail"]
                    .as_str()
                    .map(|d| format!(" ({})", crate::text::printable(d)))
                    .unwrap_or_default()
            ),
        }
        ends.push(HostEnd::Ran(
            verdict.parse::<Verdict>().unwrap_or(Verdict::Broken),
        ));
    }
    Ok(crate::rules::exit::fan_out(ends))
}

/// The JSON answer to `req`, if it could be sent and read (a poll tries again).
async fn json_of(req: reqwest::RequestBuilder) -> Option<Value> {
    let bytes = req.send().await.ok()?.bytes().await.ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A rollout the daemon started: its waves, then (unless --no-wait) its
/// status until it is finished, halted or aborted; the exit is
/// [`super::rollout::exit_code`]'s.
async fn follow_rollout(
    ask: &ViaDaemon<'_>,
    client: &reqwest::Client,
    auth: &impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    base: &str,
    started: &Value,
) -> Exit {
    let id = started["id"].as_str().unwrap_or_default().to_string();
    println!("rollout {id} started");
    for (i, wave) in started["waves"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let names: Vec<&str> = wave
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["host"].as_str())
            .collect();
        println!("  wave {}: {}", i + 1, names.join(" "));
    }
    if !ask.wait {
        return Ok(0);
    }
    let status = loop {
        let v = json_of(auth(client.get(format!("{base}/api/v1/rollouts/{id}")))).await;
        match v.as_ref().and_then(|v| v["state"].as_str()) {
            Some("finished" | "halted" | "aborted") => break v.unwrap_or_default(),
            _ => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
        }
    };
    match ask.json {
        true => println!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        ),
        false => print!("{}", super::rollout::status_text(&status)),
    }
    Ok(super::rollout::exit_code(&status))
}

/// `run --alert FILE`: one alert's labels and annotations, as the webhook would pass them.
pub(super) fn read_alert(file: &Path) -> Result<Value, String> {
    let text = std::fs::read(file).map_err(|e| format!("--alert {}: {e}", file.display()))?;
    if text.len() > 1 << 20 {
        return Err(format!("--alert {}: larger than 1 MiB", file.display()));
    }
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| format!("--alert {}: not JSON: {e}", file.display()))?;
    // A whole notification, as the webhook gets it: its first firing alert
    // starts the run, and the run sees all of them as `alerts`.
    if let Some(all) = v.get("alerts").and_then(Value::as_array) {
        let firing: Vec<&Value> = all.iter().filter(|a| a["status"] != "resolved").collect();
        if firing.is_empty() {
            return Err(format!(
                "--alert {}: a notification with no firing alert starts nothing",
                file.display()
            ));
        }
        let mut alerts = Vec::new();
        for a in firing {
            alerts.push(one_alert(a, file)?);
        }
        let mut first = alerts[0].clone();
        first["alerts"] = Value::Array(alerts);
        return Ok(first);
    }
    one_alert(&v, file)
}

/// One alert (`labels`, `annotations`, `fingerprint`, `generatorURL`), checked.
fn one_alert(v: &Value, file: &Path) -> Result<Value, String> {
    let strings = |key: &str| -> Result<Value, String> {
        match &v[key] {
            Value::Null => Ok(Value::Object(Default::default())),
            Value::Object(m) if m.values().all(Value::is_string) => Ok(v[key].clone()),
            _ => Err(format!(
                "--alert {}: `{key}` must be an object of strings",
                file.display()
            )),
        }
    };
    Ok(serde_json::json!({
        "labels": strings("labels")?,
        "annotations": strings("annotations")?,
        "fingerprint": v["fingerprint"].as_str().unwrap_or(""),
        "generator_url": v["generatorURL"].as_str().or(v["generator_url"].as_str()).unwrap_or(""),
    }))
}

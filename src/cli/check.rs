//! `runwarden check` and `runwarden tools`: what the config and the registry say.

use std::path::Path;

use serde_json::Value;

use super::{EXIT_USAGE, Exit, Failed};
use crate::config::Config;
use crate::config::Connection;
use crate::tools::ToolId;

pub(super) fn load(dir: &Path) -> Result<Config, Failed> {
    Config::load(dir).map_err(|e| {
        Failed::listing(&e).then(format!(
            "{} problem(s) in {}; nothing was loaded",
            e.0.len(),
            dir.display()
        ))
    })
}

pub(super) async fn check(dir: &Path) -> Exit {
    crate::app::compile_constants().map_err(|e| Failed::code(super::EXIT_SOFTWARE, e))?;
    let cfg = load(dir)?;
    // What `serve` would refuse, `check` refuses too; what it would warn of, check shows.
    match cfg.serve_problems(None) {
        Ok(warnings) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
        }
        Err(e) => {
            return Err(Failed::listing(&e).then(format!(
                "{} problem(s) that `runwarden serve` would refuse in {}",
                e.0.len(),
                dir.display()
            )));
        }
    }
    // A step whose written argument a host refuses is denied on every
    // run there: a problem now, not a surprise at 3 a.m.
    let denied = cfg.literal_arguments();
    if !denied.is_empty() {
        let n = denied.len();
        return Err(
            Failed::listing(crate::config::ConfigError(denied)).then(format!(
                "{n} step(s) whose arguments the gate would deny on every run, in {}: change the argument, or the host's allowlist if the host should allow it",
                dir.display()
            )),
        );
    }
    for h in cfg.hosts.values() {
        let conn = match &h.connection {
            Connection::Local => "local".to_string(),
            Connection::Ssh(s) => format!("ssh {}@{}:{}", s.user, s.address, s.port),
            Connection::Agent(p) => format!("agent {}", p.display()),
        };
        println!("host {:<24} {conn:<28} {}", h.name, h.source.display());
    }
    for d in cfg.tools.declared() {
        println!(
            "tool {:<24} tier {} declared in {} (sha256 {})",
            d.name,
            d.tier.number(),
            d.file.display(),
            &d.sha256[..12.min(d.sha256.len())]
        );
    }
    for h in cfg.hosts.values() {
        if let Connection::Agent(_) = h.connection {
            for line in agent_policy_differences(h, &dir.join("agent.yaml")) {
                eprintln!("warning: {line}");
            }
        }
    }
    for r in cfg.runbooks.values() {
        println!("{}", runbook_line(r));
        for line in crate::rollout::describe(&cfg, r) {
            println!("  rollout {line}");
        }
    }
    for warning in done_when_windows(&cfg).await {
        eprintln!("warning: {warning}");
    }
    let (demoted, problem) = super::promote::in_force(&cfg.settings, None).await;
    for d in demoted {
        println!("DEMOTED {}", d.summary());
    }
    if let Some(problem) = problem {
        eprintln!("warning: {problem}");
    }
    settings_lines(&cfg.settings);
    let missing: Vec<&str> = crate::sandbox::layers()
        .into_iter()
        .filter(|(_, held)| held.is_err())
        .map(|(layer, _)| layer.as_str())
        .collect();
    println!(
        "tier 1: runs as {}; {}",
        crate::sandbox::observer(),
        match missing.is_empty() {
            true => "every layer of the observer's sandbox holds".to_string(),
            false => format!(
                "missing here: {} (see the warning above)",
                missing.join(", ")
            ),
        }
    );
    let observer = crate::sandbox::describe();
    println!("tier 1: isolation: {}", observer.isolation);
    println!(
        "tier 1: reads every file but {} (and /dev but {})",
        observer
            .protected
            .iter()
            .filter(|p| p.as_path() != std::path::Path::new("/dev"))
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        crate::sandbox::reads::DEVICES.join(" ")
    );
    println!("tier 1: limits: {}", observer.limits);
    println!(
        "ok: {} host(s), {} runbook(s)",
        cfg.hosts.len(),
        cfg.runbooks.len()
    );
    Ok(0)
}

/// A runbook as `check` lists it: autonomy, hosts, tools, steps, and each
/// limit it sets.
fn runbook_line(r: &crate::config::Runbook) -> String {
    format!(
        "runbook {:<21} {} hosts={} observe={} approve={} steps={}{}{}{}{}{}{} {}",
        r.name,
        r.autonomy.as_str(),
        r.hosts.iter().map(|h| &**h).collect::<Vec<_>>().join(","),
        r.observe.len(),
        r.approve.len(),
        r.steps.len(),
        match &r.agent {
            Some(a) => format!(
                " agent(max_steps={}) planner={}",
                a.max_steps,
                r.planner.as_str()
            ),
            None => String::new(),
        },
        match &r.fleet_budget {
            Some(b) => format!(" fleet_budget={}", per_window(b)),
            None => String::new(),
        },
        match &r.max_runs {
            Some(m) => format!(
                " max_runs={}/{}",
                m.count,
                humantime::format_duration(m.per)
            ),
            None => String::new(),
        },
        match (r.on_alert.is_some(), r.on_resolved) {
            (true, crate::config::OnResolved::Ignore) => " on_resolved=ignore",
            _ => "",
        },
        match &r.demote_after {
            Some(d) => format!(
                " demote_after={}/{}",
                d.failures,
                humantime::format_duration(d.per)
            ),
            None => String::new(),
        },
        match &r.done_when {
            Some(c) => format!(
                " done_when=alert_clears/{}",
                humantime::format_duration(c.within)
            ),
            None => String::new(),
        },
        r.source.display()
    )
}

/// Each runbook's `done_when.alert_clears.within` against the rules of
/// its alert that Prometheus serves now: a wait shorter than a rule's
/// window calls every good fix `unresolved`.
async fn done_when_windows(cfg: &Config) -> Vec<String> {
    let Some(endpoint) = &cfg.settings.prometheus else {
        return Vec::new();
    };
    let prom = crate::prometheus::Prometheus::new(endpoint);
    let mut out = Vec::new();
    for r in cfg.runbooks.values() {
        let (Some(clears), Some(on)) = (&r.done_when, &r.on_alert) else {
            continue;
        };
        let Some(name) = on.matchers.iter().find_map(|m| m.requires("alertname")) else {
            continue;
        };
        match crate::done_when::check_windows(&prom, name, clears).await {
            Ok(warnings) => out.extend(
                warnings
                    .into_iter()
                    .map(|w| format!("{}: {w}", r.source.display())),
            ),
            Err(e) => {
                out.push(format!(
                    "{e}: done_when windows are not checked (runs that cannot ask it end inconclusive)"
                ));
                break;
            }
        }
    }
    out
}

/// The settings every run shares: the fleet budget, where state lives, the model.
fn settings_lines(settings: &crate::config::Settings) {
    match &settings.prometheus {
        Some(p) => println!(
            "prometheus at {} (timeout {}{}): done_when asks it whether an alert cleared",
            p.url,
            humantime::format_duration(p.timeout),
            match &p.bearer_token_file {
                Some(f) => format!(", token from {}", f.display()),
                None => String::new(),
            }
        ),
        None => println!("prometheus: none configured (no runbook can use done_when)"),
    }
    match &settings.fleet_budget {
        Some(b) => println!("fleet budget: {} across every run", per_window(b)),
        None => println!("fleet budget: none (each run's own budget only)"),
    }
    match &settings.postgres {
        Some(pg) => println!(
            "state: shared in PostgreSQL ({}), replica {}, lease {}",
            pg.url_file.display(),
            settings.replica,
            humantime::format_duration(pg.lease)
        ),
        None => println!("state: this machine's own (no state.postgres)"),
    }
    match &settings.model {
        Some(m) => println!(
            "model {} at {} (timeout {}, {} retries){}",
            m.name,
            m.endpoint,
            humantime::format_duration(m.timeout),
            m.retries,
            match &m.api_key {
                Some(crate::config::ApiKey::Env(v)) => format!(", key from ${v}"),
                Some(crate::config::ApiKey::File(f)) => format!(", key from {}", f.display()),
                None => String::new(),
            }
        ),
        None => println!("model: none configured (runbooks run their steps)"),
    }
}

/// `check --json`: the same verdict as `check`, as one object for scripts
/// and CI (exit 0 when ok, 2 with the problems).
pub(super) fn check_json(dir: &Path) -> Exit {
    let diagnostics = |list: &[crate::config::Diagnostic]| -> Vec<Value> {
        list.iter()
            .map(|d| {
                serde_json::json!({
                    "file": d.file, "line": d.line, "column": d.column, "message": d.message,
                })
            })
            .collect()
    };
    // What the loader refuses, then what `serve` would refuse.
    let loaded = Config::load(dir).and_then(|cfg| cfg.serve_problems(None).map(|w| (cfg, w)));
    let loaded = loaded.and_then(|(cfg, warnings)| {
        let denied = cfg.literal_arguments();
        match denied.is_empty() {
            true => Ok((cfg, warnings)),
            false => Err(crate::config::ConfigError(denied)),
        }
    });
    let (cfg, warnings) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({ "ok": false, "problems": diagnostics(&e.0) })
            );
            return Ok(EXIT_USAGE);
        }
    };
    let hosts: Vec<Value> = cfg
        .hosts
        .values()
        .map(|h| {
            let connection = match &h.connection {
                Connection::Local => serde_json::json!("local"),
                Connection::Ssh(s) => serde_json::json!({ "ssh": { "user": s.user, "address": s.address, "port": s.port } }),
                Connection::Agent(p) => serde_json::json!({ "agent": p }),
            };
            serde_json::json!({ "name": h.name, "connection": connection, "file": h.source })
        })
        .collect();
    let runbooks: Vec<Value> = cfg
        .runbooks
        .values()
        .map(|r| {
            serde_json::json!({
                "name": r.name,
                "autonomy": r.autonomy.as_str(),
                "hosts": r.hosts.iter().map(|h| &**h).collect::<Vec<_>>(),
                "observe": r.observe.iter().map(|t| t.name()).collect::<Vec<_>>(),
                "approve": r.approve.iter().map(|t| t.name()).collect::<Vec<_>>(),
                "steps": r.steps.len(),
                "schedule": r.schedule,
                // Which alerts start it: each matcher as Alertmanager writes
                // one, the label naming the host and its mapped values.
                "on_alert": r.on_alert.as_ref().map(|on| serde_json::json!({
                    "matchers": on.matchers.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "host_label": on.host_label,
                    "host_map": on.host_map,
                })),
                "model_planned": r.planner == crate::config::PlannedBy::Model,
                "planner": r.planner.as_str(),
                "fleet_budget": r.fleet_budget.as_ref().map(fleet_json),
                "file": r.source,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "ok": true,
            "problems": [],
            "warnings": diagnostics(&warnings),
            "hosts": hosts,
            "runbooks": runbooks,
            "tools": cfg.tools.declared().map(|d| serde_json::json!({
                "name": d.name,
                "tier": d.tier.number(),
                "file": d.file,
                "sha256": d.sha256,
            })).collect::<Vec<_>>(),
            // Each layer of the tier-1 observer's sandbox: true, or why not.
            "sandbox": crate::sandbox::layers()
                .into_iter()
                .map(|(layer, held)| (layer.as_str().to_string(), match held {
                    Ok(()) => serde_json::json!(true),
                    Err(why) => serde_json::json!({ "missing": why.to_string() }),
                }))
                .collect::<serde_json::Map<_, _>>(),
            "observer": observer_json(),
            "model": cfg.settings.model.as_ref().map(|m| m.name.clone()),
            "prometheus": cfg.settings.prometheus.as_ref().map(|p| p.url.to_string()),
            "fleet_budget": cfg.settings.fleet_budget.as_ref().map(fleet_json),
            "state": match &cfg.settings.postgres {
                Some(pg) => serde_json::json!({
                    "store": "postgres",
                    "url_file": pg.url_file,
                    "lease_seconds": pg.lease.as_secs_f64(),
                    "replica": cfg.settings.replica,
                }),
                None => serde_json::json!({ "store": "embedded" }),
            },
        })
    );
    Ok(0)
}

/// `10 tier-2 calls per 1h`.
fn per_window(b: &crate::config::runbook::FleetBudget) -> String {
    format!(
        "{} tier-2 calls per {}",
        b.max_mutations,
        humantime::format_duration(b.per)
    )
}

fn fleet_json(b: &crate::config::runbook::FleetBudget) -> Value {
    serde_json::json!({ "max_mutations": b.max_mutations, "per_seconds": b.per.as_secs() })
}

pub(super) fn tools(json: bool, config: Option<&std::path::Path>, host: Option<&str>) -> Exit {
    // `--host`: its schemas as a model and an agent get them there.
    let host = match (host, config) {
        (None, _) => None,
        (Some(name), Some(dir)) => {
            let file = dir.join("hosts").join(format!("{name}.yaml"));
            match crate::config::load_host_file(&file, dir) {
                Ok(h) => Some(h),
                Err(e) => {
                    return Err(Failed::listing(e).then(format!(
                        "no usable host \"{name}\" in {}",
                        dir.join("hosts").display()
                    )));
                }
            }
        }
        (Some(_), None) => {
            return Err(Failed::usage("--host needs a configuration (--config DIR)"));
        }
    };
    let schema = |t: &ToolId| match &host {
        Some(h) => t.schema_for(h),
        None => t.schema(),
    };
    let tools = match config {
        Some(dir) => match crate::config::load_tools(dir) {
            Ok(t) => t,
            Err(e) => {
                for d in &e.0 {
                    eprintln!("{d}");
                }
                return Ok(EXIT_USAGE);
            }
        },
        None => {
            eprintln!(
                "runwarden: no configuration here (--config DIR, RUNWARDEN_CONFIG, ./runwarden.yaml or /etc/runwarden): the built-in tools only"
            );
            crate::tools::Tools::default()
        }
    };
    let described = |t: &ToolId| {
        let mut v = serde_json::json!({
            "name": t.name(),
            "tier": t.tier().number(),
            "source": if t.declared().is_some() { "declared" } else { "builtin" },
            "description": t.description(),
            "parameters": schema(t),
        });
        if let Some(d) = t.declared() {
            v["file"] = d.file.display().to_string().into();
            v["sha256"] = d.sha256.clone().into();
            if let Some(verb) = &d.verb {
                v["verb"] = verb.clone().into();
            }
        }
        v
    };
    if json {
        let list: Vec<Value> = tools.all().map(|t| described(&t)).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
    } else {
        for t in tools.all() {
            let from = match t.declared() {
                Some(d) => format!(", declared in {}", d.file.display()),
                None => String::new(),
            };
            println!(
                "{} (tier {}{from})\n    {}\n    parameters: {}\n",
                t.name(),
                t.tier().number(),
                crate::text::printable(&t.description()),
                schema(&t)
            );
        }
        println!(
            "Tier 3 (destructive, irreversible) is never a tool: runbooks may only `suggest:` such a command for a person."
        );
    }
    Ok(0)
}

/// Where this machine's agent policy (`agent.yaml` beside the config, as
/// the package installs it) disagrees with a host file that sends calls to
/// that agent: each difference, or why the policy was not compared. A unit
/// missing from the policy otherwise fails only when a call names it.
fn agent_policy_differences(h: &crate::config::Host, policy: &Path) -> Vec<String> {
    if !policy.exists() {
        return Vec::new();
    }
    let theirs = match crate::agent::load_policy(policy) {
        Ok(p) => p,
        Err(e) => {
            return vec![format!(
                "host {}: the agent's policy {} was not compared: {e}",
                h.name,
                policy.display()
            )];
        }
    };
    let ours = crate::agent::allowlists(h);
    crate::agent::policy_differences(&ours, &crate::agent::allowlists(&theirs))
        .into_iter()
        .map(|(field, entry, in_host_file)| match in_host_file {
            true => format!(
                "host {}: {field}: {entry:?} is in {} but not in the agent's policy {}: the agent will refuse every call naming it",
                h.name,
                h.source.display(),
                policy.display()
            ),
            false => format!(
                "host {}: {field}: {entry:?} is allowed by the agent's policy {} but not by {}",
                h.name,
                policy.display(),
                h.source.display()
            ),
        })
        .collect()
}

/// `check --json`'s `observer`: who tier 1 runs as, how observers are
/// kept apart, what they cannot read, their limits.
fn observer_json() -> serde_json::Value {
    let d = crate::sandbox::describe();
    serde_json::json!({
        "runs_as": crate::sandbox::observer(),
        "isolation": d.isolation,
        "protected": d.protected,
        "readable_hierarchies": d.readable,
        "limits": {
            "memory_bytes": crate::sandbox::MAX_MEMORY,
            "processes": crate::sandbox::MAX_PROCESSES,
            "said": d.limits,
        },
    })
}

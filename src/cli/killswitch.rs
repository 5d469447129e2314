//! `runwarden kill-switch engage|release|status`, on the directory `serve`
//! uses, or with shared state on the fleet's switch: engaged once, it
//! reaches every replica within a second, and a release from any replica
//! ends it everywhere. With shared state no file is written (a file would
//! keep one replica stopped after the fleet's release), unless the database
//! cannot be reached: then this machine's file is the fallback, and the
//! command says so. A release says what stays engaged, and where.

use super::{Exit, Failed, KillSwitchCommand};
use crate::gate::KillSwitch;

pub(super) async fn kill_switch(command: KillSwitchCommand) -> Exit {
    let dir = match &command {
        KillSwitchCommand::Engage { config, .. }
        | KillSwitchCommand::Release { config, .. }
        | KillSwitchCommand::Status { config, .. } => super::config_dir(config.clone())?,
    };
    let runbook = match &command {
        KillSwitchCommand::Engage { runbook, .. } | KillSwitchCommand::Release { runbook, .. } => {
            runbook.clone()
        }
        KillSwitchCommand::Status { .. } => None,
    };
    let t = Target::of(dir, runbook)?;
    match command {
        KillSwitchCommand::Engage {
            reason,
            for_,
            until,
            ..
        } => engage(&t, &reason, for_, until).await,
        KillSwitchCommand::Release { .. } => release(&t).await,
        KillSwitchCommand::Status { json: true, .. } => status_json(&t).await,
        KillSwitchCommand::Status { .. } => status(&t).await,
    }
}

/// What a kill-switch command acts on: the directory `serve` uses, the
/// runbook named (if one is), and the fleet's switch with shared state.
struct Target {
    dir: std::path::PathBuf,
    settings: crate::config::Settings,
    ks: KillSwitch,
    runbook: Option<String>,
    fleet: Option<std::sync::Arc<crate::store::Postgres>>,
}

impl Target {
    fn of(dir: std::path::PathBuf, runbook: Option<String>) -> Result<Target, Failed> {
        // The directory `serve` uses, read from runwarden.yaml alone: the switch
        // must work while a runbook or host file is half edited, and must never
        // guess a directory nothing watches.
        let settings = crate::config::Settings::load(&dir).map_err(|e| {
            Failed::usage(format!(
                "cannot tell which kill-switch directory runwarden uses, because runwarden.yaml does not load:\n{e}\nFix runwarden.yaml, or stop everything by hand: `touch KILL_SWITCH_DIR/ENGAGED` (the kill_switch_dir it names) or stop the service"
            ))
        })?;
        let ks = KillSwitch::new(settings.kill_switch_dir.clone());
        if let Some(rb) = runbook.as_deref() {
            let known = crate::config::runbook_names(&dir);
            if !known.contains(rb) {
                return Err(Failed::usage(format!(
                    "{:?} is not a runbook of {}{}; a switch for it would stop nothing (omit --runbook to stop every runbook)",
                    rb,
                    dir.join("runbooks").display(),
                    crate::config::did_you_mean(rb, known.iter().map(String::as_str))
                )));
            }
        }
        let fleet = super::db::shared(&dir)?;
        sweep(&ks, &settings);
        Ok(Target {
            dir,
            settings,
            ks,
            runbook,
            fleet,
        })
    }
}

/// `engage`: the fleet's switch with shared state (this machine's file
/// when the database cannot be reached), else this machine's file.
async fn engage(
    t: &Target,
    reason: &str,
    for_: Option<std::time::Duration>,
    until: Option<jiff::Timestamp>,
) -> Exit {
    let Target {
        settings,
        ks,
        fleet,
        ..
    } = t;
    let runbook = t.runbook.as_deref();
    let shown = ks.dir().display();
    let until = match (for_, until) {
        (Some(d), _) => Some(timed_for(d)?),
        (None, Some(t)) if t <= jiff::Timestamp::now() => {
            return Err(Failed::usage(format!("--until {t} is in the past")));
        }
        (None, t) => t,
    };
    let timed = until.map_or(String::new(), |t| {
        format!(
            "; it releases itself at {t} ({})",
            crate::gate::killswitch::time_left(t)
        )
    });
    if let Some(store) = &fleet {
        let by = format!("{}@{}", crate::gate::killswitch::who(), settings.replica);
        // Timed by the database's clock: how long from now, not an
        // end read off this machine's clock.
        let asked = jiff::Timestamp::now();
        let for_ = until
            .map(|t| std::time::Duration::try_from(t.duration_since(asked)).unwrap_or_default());
        match store
            .engage(runbook.unwrap_or("global"), &by, reason, for_)
            .await
        {
            Ok(done) => {
                let timed = match (done.until, for_) {
                        (None, Some(_)) => "; it stays untimed: an untimed switch was in force, which a timed engage never shortens".to_string(),
                        (None, None) => String::new(),
                        (Some(t), _) => format!("; it releases itself at {t} by the database's clock"),
                    };
                println!(
                    "engaged for the fleet: every replica's runs stop before their next call{timed}"
                );
                let skew = done.clock.duration_since(asked).abs();
                if skew > jiff::SignedDuration::from_secs(5) {
                    eprintln!(
                        "warning: this machine's clock is {:.0}s off the database's ({} here, {} there); the switch's end follows the database's",
                        skew.as_secs_f64(),
                        asked,
                        done.clock
                    );
                }
                return Ok(0);
            }
            Err(e) => eprintln!(
                "runwarden: the fleet's switch was not reached ({e}); engaging this machine's file instead"
            ),
        }
    }
    match ks.engage(runbook, reason, until) {
        Ok(done) => {
            let timed = match (done.until, until) {
                    (None, Some(_)) => "; it stays untimed: an untimed switch was in force, which a timed engage never shortens".to_string(),
                    (Some(t), Some(asked)) if t != asked => format!(
                        "; it releases itself at {t} ({}), the later end of the two",
                        crate::gate::killswitch::time_left(t)
                    ),
                    _ => timed,
                };
            println!(
                "engaged: {} (runs stop before their next call){timed}",
                done.path.display()
            );
            if let Some(kept) = done.kept {
                println!("kept the switch in force before it: {kept}");
            }
            match fleet {
                Some(_) => Err(Failed::code(
                    1,
                    "engaged on this machine only: engage it on each replica, or again when the database answers",
                )),
                None => Ok(0),
            }
        }
        Err(e) => Err(Failed::code(
            1,
            format!(
                "cannot engage the kill switch in {shown}: {e}; as a fallback, `touch {shown}/ENGAGED` or remove the directory (both stop everything)"
            ),
        )),
    }
}

/// `release`: this machine's file and, with shared state, the fleet's
/// switch; then what stays engaged, and where.
async fn release(t: &Target) -> Exit {
    let Target { ks, fleet, .. } = t;
    let runbook = t.runbook.as_deref();
    let here = ks.release(runbook).map_err(|e| {
        Failed::code(
            1,
            format!("cannot release {}: {e}", ks.file_of(runbook).display()),
        )
    })?;
    let was = |on: bool| if on { "was engaged" } else { "was not engaged" };
    let mut said = vec![format!("{} {}", ks.file_of(runbook).display(), was(here))];
    if let Some(store) = &fleet {
        let scope = runbook.unwrap_or("global");
        let released = store.release(scope).await.map_err(|e| {
                Failed::code(
                    1,
                    format!(
                        "released on this machine only: the fleet's switch was not reached ({e}); every replica stays stopped until it is released"
                    ),
                )
            })?;
        said.push(format!("the fleet's switch ({scope}) {}", was(released)));
    }
    let left = crate::state::in_force(ks, fleet.as_deref())
        .await
        .unwrap_or_else(|e| vec![("global".into(), e)]);
    println!("released: {}", said.join("; "));
    if left.is_empty() {
        println!("nothing stays engaged: runs may proceed");
    }
    for (scope, detail) in left {
        println!("still ENGAGED {scope}: {detail}");
    }
    Ok(0)
}

/// `status --json`. Exit 0: released (calls may run); 1: engaged
/// (something is stopped).
async fn status_json(t: &Target) -> Exit {
    let Target {
        dir,
        settings,
        ks,
        fleet,
        ..
    } = t;
    let engaged: Vec<serde_json::Value> = match crate::state::in_force(ks, fleet.as_deref()).await {
        Ok(list) => list
            .into_iter()
            .map(|(scope, detail)| serde_json::json!({ "scope": scope, "detail": detail }))
            .collect(),
        Err(e) => vec![serde_json::json!({ "scope": "global", "detail": e })],
    };
    let (demoted, _) = super::promote::in_force(settings, fleet.clone()).await;
    let (capped, _) = capped(dir, fleet.as_deref()).await;
    println!(
        "{}",
        serde_json::json!({
            "state": if engaged.is_empty() { "released" } else { "engaged" },
            "directory": ks.dir(),
            "engaged": engaged,
            "demoted": demoted,
            "capped": capped,
        })
    );
    Ok(i32::from(!engaged.is_empty()))
}

/// `status`: every switch engaged, and what else holds runs back.
async fn status(t: &Target) -> Exit {
    let Target {
        dir,
        settings,
        ks,
        fleet,
        ..
    } = t;
    let shown = ks.dir().display();
    // Not a switch, but what else holds runs back: runbooks whose
    // changes wait for a person since their fixes kept failing.
    let (demoted, problem) = super::promote::in_force(settings, fleet.clone()).await;
    for d in demoted {
        println!("DEMOTED {}", d.summary());
    }
    let (capped, problem_caps) = capped(dir, fleet.as_deref()).await;
    for c in capped {
        println!(
            "CAPPED runbook \"{}\" on {}: {} run(s) within {} (max_runs {}); its triggers are refused until {}, when the oldest leaves the window",
            c.runbook, c.host, c.runs, c.per, c.max, c.until
        );
    }
    for problem in problem.into_iter().chain(problem_caps) {
        eprintln!("warning: {problem}");
    }
    match crate::state::in_force(ks, fleet.as_deref()).await {
        Ok(list) if list.is_empty() => {
            println!("released: no switch file in {shown}");
            Ok(0)
        }
        Ok(list) => {
            for (scope, detail) in list {
                println!("ENGAGED {scope}: {detail}");
            }
            Ok(1)
        }
        Err(e) => {
            println!("ENGAGED {e}");
            Ok(1)
        }
    }
}

/// Remove this machine's timed switches whose time has come, as the
/// daemon does (only the file read goes), each with its audit line: with
/// no daemon running, or one whose account cannot remove a file a person
/// engaged, the gate already lets runs through, and `status` must say what
/// the gate does.
fn sweep(ks: &KillSwitch, settings: &crate::config::Settings) {
    let ended = ks.sweep_expired();
    if ended.is_empty() {
        return;
    }
    let audit =
        crate::audit::AuditLog::open_with(&settings.audit_log, settings.audit_rotation.clone());
    for e in ended {
        eprintln!(
            "runwarden: the timed kill switch ({}) engaged by {} ended at {}; removed",
            e.scope,
            crate::text::one_line(&e.engaged_by),
            e.until
        );
        match &audit {
            Ok(log) => {
                if let Err(err) = log.kill_switch_ended(&e, "file") {
                    eprintln!("runwarden: its end could not be audited: {err}");
                }
            }
            Err(err) => eprintln!("runwarden: its end could not be audited: {err}"),
        }
    }
}

/// When a switch engaged now `--for d` ends, or why `d` is refused.
fn timed_for(d: std::time::Duration) -> Result<jiff::Timestamp, Failed> {
    crate::gate::killswitch::end_for(d, "--for").map_err(Failed::usage)
}

/// A (runbook, host) whose `max_runs` is reached now: its triggers are
/// `capped` until the oldest run in the window leaves it.
#[derive(Debug, serde::Serialize)]
struct Capped {
    runbook: String,
    host: String,
    /// Runs started within the window.
    runs: i64,
    /// The window, as written.
    per: String,
    /// `max_runs.count`.
    max: u32,
    /// When the oldest run in the window leaves it (RFC 3339).
    until: String,
}

/// Every (runbook, host) capped now, from the fleet's record with shared
/// state, else this machine's audit log; and what could not be read. The
/// runbooks must load for this (the switch itself needs only runwarden.yaml).
async fn capped(
    dir: &std::path::Path,
    fleet: Option<&crate::store::Postgres>,
) -> (Vec<Capped>, Option<String>) {
    let config = match crate::config::Config::load(dir) {
        Ok(c) => c,
        Err(_) => {
            return (
                Vec::new(),
                Some("runbooks that reached max_runs are not shown: the configuration does not load (`runwarden check`)".into()),
            );
        }
    };
    let record = match fleet {
        Some(_) => None,
        None => match crate::audit::runs::recovery(&config.settings.audit_log) {
            Ok(r) => Some(r),
            Err(e) => {
                return (
                    Vec::new(),
                    Some(format!("runbooks that reached max_runs are not shown: {e}")),
                );
            }
        },
    };
    let now = jiff::Timestamp::now();
    let mut out = Vec::new();
    for r in config.runbooks.values() {
        let Some(cap) = r.max_runs else { continue };
        // Each host's recent starts, as how long ago: the fleet's rows or
        // this machine's record; whether they cap it is the rule's.
        let starts: Vec<(String, Vec<std::time::Duration>)> = match (fleet, &record) {
            (Some(store), _) => match store.recent_starts(&r.name, cap.per).await {
                Ok(h) => h,
                Err(e) => return (out, Some(format!("the fleet's max_runs: {e}"))),
            },
            (None, Some(record)) => r
                .hosts
                .iter()
                .map(|h| {
                    let key = (r.name.clone(), h.to_string());
                    let ago = record
                        .starts
                        .get(&key)
                        .map(|s| {
                            s.iter()
                                .map(|t| {
                                    std::time::Duration::try_from(now.duration_since(*t))
                                        .unwrap_or_default()
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    (h.to_string(), ago)
                })
                .collect(),
            (None, None) => Vec::new(),
        };
        let hosts = starts.into_iter().filter_map(|(host, ago)| {
            let capped = crate::rules::admission::capped(cap, &ago)?;
            let oldest =
                now - jiff::SignedDuration::try_from(capped.oldest_ago).unwrap_or_default();
            Some((host, capped.runs as i64, oldest))
        });
        let per = jiff::SignedDuration::try_from(cap.per).unwrap_or_default();
        out.extend(hosts.map(|(host, runs, oldest)| {
            Capped {
                runbook: r.name.clone(),
                host,
                runs,
                per: humantime::format_duration(cap.per).to_string(),
                max: cap.count,
                until: (oldest + per)
                    .round(jiff::Unit::Second)
                    .unwrap_or(oldest + per)
                    .to_string(),
            }
        }));
    }
    (out, None)
}

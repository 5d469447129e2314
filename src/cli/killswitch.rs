//! `runwarden kill-switch engage|release|status`, on the directory `serve` uses.

use super::{Exit, Failed, KillSwitchCommand};
use crate::gate::KillSwitch;

pub(super) fn kill_switch(command: KillSwitchCommand) -> Exit {
    let dir = match &command {
        KillSwitchCommand::Engage { config, .. }
        | KillSwitchCommand::Release { config, .. }
        | KillSwitchCommand::Status { config, .. } => config.clone(),
    };
    // The directory `serve` uses, read from runwarden.yaml alone: the switch
    // must work while a runbook or host file is half edited, and must never
    // guess a directory nothing watches.
    let settings = crate::config::Settings::load(&dir).map_err(|e| {
        Failed::usage(format!(
            "cannot tell which kill-switch directory runwarden uses, because runwarden.yaml does not load:\n{e}\nFix runwarden.yaml, or stop everything by hand: `touch KILL_SWITCH_DIR/ENGAGED` (the kill_switch_dir it names) or stop the service"
        ))
    })?;
    let ks = KillSwitch::new(settings.kill_switch_dir);
    let runbook = match &command {
        KillSwitchCommand::Engage { runbook, .. } | KillSwitchCommand::Release { runbook, .. } => {
            runbook.clone()
        }
        KillSwitchCommand::Status { .. } => None,
    };
    let runbook = runbook.as_deref();
    if let Some(rb) = runbook {
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
    let shown = ks.dir().display();
    match command {
        KillSwitchCommand::Engage { reason, .. } => match ks.engage(runbook, &reason) {
            Ok(path) => {
                println!(
                    "engaged: {} (runs stop before their next call)",
                    path.display()
                );
                Ok(0)
            }
            Err(e) => Err(Failed::code(
                1,
                format!(
                    "cannot engage the kill switch in {shown}: {e}; as a fallback, `touch {shown}/ENGAGED` or remove the directory (both stop everything)"
                ),
            )),
        },
        KillSwitchCommand::Release { .. } => match ks.release(runbook) {
            Ok(true) => {
                println!("released: {}", ks.file_of(runbook).display());
                match ks.status() {
                    Ok(left) if !left.is_empty() => {
                        for (scope, detail) in left {
                            println!("still ENGAGED {scope}: {detail}");
                        }
                    }
                    Err(e) => println!("still ENGAGED {e}"),
                    Ok(_) => {}
                }
                Ok(0)
            }
            Ok(false) => {
                println!("was not engaged: no {}", ks.file_of(runbook).display());
                Ok(0)
            }
            Err(e) => Err(Failed::code(
                1,
                format!("cannot release {}: {e}", ks.file_of(runbook).display()),
            )),
        },
        // Exit 0: released (calls may run); 1: engaged (something is stopped).
        KillSwitchCommand::Status { json: true, .. } => {
            let engaged: Vec<serde_json::Value> = match ks.status() {
                Ok(list) => list
                    .into_iter()
                    .map(|(scope, detail)| serde_json::json!({ "scope": scope, "detail": detail }))
                    .collect(),
                Err(e) => vec![serde_json::json!({ "scope": "global", "detail": e.to_string() })],
            };
            println!(
                "{}",
                serde_json::json!({
                    "state": if engaged.is_empty() { "released" } else { "engaged" },
                    "directory": ks.dir(),
                    "engaged": engaged,
                })
            );
            Ok(i32::from(!engaged.is_empty()))
        }
        KillSwitchCommand::Status { .. } => match ks.status() {
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
        },
    }
}

//! `runwarden kill-switch engage|release|status`, on the directory `serve`
//! uses, and with shared state on the fleet's switch too: engaged once, it
//! reaches every replica within a second. This machine's file is always
//! written first, so the switch holds here even when the database cannot
//! be reached.

use super::{Exit, Failed, KillSwitchCommand};
use crate::gate::KillSwitch;

pub(super) async fn kill_switch(command: KillSwitchCommand) -> Exit {
    let dir = match &command {
        KillSwitchCommand::Engage { config, .. }
        | KillSwitchCommand::Release { config, .. }
        | KillSwitchCommand::Status { config, .. } => super::config_dir(config.clone())?,
    };
    // The directory `serve` uses, read from runwarden.yaml alone: the switch
    // must work while a runbook or host file is half edited, and must never
    // guess a directory nothing watches.
    let settings = crate::config::Settings::load(&dir).map_err(|e| {
        Failed::usage(format!(
            "cannot tell which kill-switch directory runwarden uses, because runwarden.yaml does not load:\n{e}\nFix runwarden.yaml, or stop everything by hand: `touch KILL_SWITCH_DIR/ENGAGED` (the kill_switch_dir it names) or stop the service"
        ))
    })?;
    let ks = KillSwitch::new(settings.kill_switch_dir.clone());
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
    let fleet = super::db::shared(&dir)?;
    let shown = ks.dir().display();
    let heard = match (&command, &fleet) {
        (KillSwitchCommand::Status { .. }, Some(store)) => Some(store.switches().await),
        _ => None,
    };
    let status = || -> Result<Vec<(String, String)>, String> {
        let mut list = ks.status().map_err(|e| e.to_string())?;
        match &heard {
            Some(Ok(fleet)) => list.extend(
                fleet
                    .iter()
                    .map(|(scope, d)| (format!("fleet:{scope}"), d.clone())),
            ),
            Some(Err(e)) => list.push((
                "fleet".into(),
                format!("unknown, {e} (each replica still fences its calls against it)"),
            )),
            None => {}
        }
        Ok(list)
    };
    match command {
        KillSwitchCommand::Engage { reason, .. } => match ks.engage(runbook, &reason) {
            Ok(path) => {
                println!(
                    "engaged: {} (runs stop before their next call)",
                    path.display()
                );
                let Some(store) = fleet else { return Ok(0) };
                let by = format!("{}@{}", crate::gate::killswitch::who(), settings.replica);
                match store
                    .engage(runbook.unwrap_or("global"), &by, &reason)
                    .await
                {
                    Ok(()) => {
                        println!(
                            "engaged for the fleet: every replica's runs stop before their next call"
                        );
                        Ok(0)
                    }
                    Err(e) => Err(Failed::code(
                        1,
                        format!(
                            "engaged on this machine only: the fleet's switch was not reached ({e}); engage it on each replica, or retry when the database answers"
                        ),
                    )),
                }
            }
            Err(e) => Err(Failed::code(
                1,
                format!(
                    "cannot engage the kill switch in {shown}: {e}; as a fallback, `touch {shown}/ENGAGED` or remove the directory (both stop everything)"
                ),
            )),
        },
        KillSwitchCommand::Release { .. } => match (ks.release(runbook), &fleet) {
            (Ok(here), Some(store)) => {
                let was = |on: bool| if on { "was engaged" } else { "was not engaged" };
                match store.release(runbook.unwrap_or("global")).await {
                    Ok(fleet) => {
                        println!(
                            "released: this machine's switch ({}), the fleet's ({})",
                            was(here),
                            was(fleet)
                        );
                        Ok(0)
                    }
                    Err(e) => Err(Failed::code(
                        1,
                        format!(
                            "released on this machine only: the fleet's switch was not reached ({e}); every replica stays stopped until it is released"
                        ),
                    )),
                }
            }
            (Ok(true), None) => {
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
            (Ok(false), None) => {
                println!("was not engaged: no {}", ks.file_of(runbook).display());
                Ok(0)
            }
            (Err(e), _) => Err(Failed::code(
                1,
                format!("cannot release {}: {e}", ks.file_of(runbook).display()),
            )),
        },
        // Exit 0: released (calls may run); 1: engaged (something is stopped).
        KillSwitchCommand::Status { json: true, .. } => {
            let engaged: Vec<serde_json::Value> = match status() {
                Ok(list) => list
                    .into_iter()
                    .map(|(scope, detail)| serde_json::json!({ "scope": scope, "detail": detail }))
                    .collect(),
                Err(e) => vec![serde_json::json!({ "scope": "global", "detail": e })],
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
        KillSwitchCommand::Status { .. } => match status() {
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

//! `runwarden promote RUNBOOK --reason ...`: a person gives a demoted
//! runbook its standing approval back (see [`crate::gate::demotion`]).
//!
//! With shared state the fleet's record is lifted, so every replica sees
//! it within a second; a file this machine kept from before (or from a
//! time it ran alone) goes with it. The audit log is opened first, so a
//! promotion that could not be audited never happens; the `promoted`
//! line names who, why, whether they forced it, and the runs that had
//! demoted it.

use std::path::Path;

use super::{Exit, Failed};
use crate::audit::AuditLog;
use crate::gate::demotion::{Demotion, PromoteRefused};

pub(super) async fn promote(runbook: &str, reason: &str, force: bool, dir: &Path) -> Exit {
    let config = super::check::load(dir)?;
    if !config.runbooks.contains_key(runbook) {
        return Err(Failed::usage(format!(
            "{runbook:?} is not a runbook of {}{}",
            dir.join("runbooks").display(),
            crate::config::did_you_mean(runbook, config.runbooks.keys().map(String::as_str))
        )));
    }
    if reason.trim().is_empty() {
        return Err(Failed::usage(
            "--reason is empty: say why the runbook is safe to run unattended again (it goes to the audit log)",
        ));
    }
    let settings = &config.settings;
    let audit = AuditLog::open_with(&settings.audit_log, settings.audit_rotation.clone())
        .map_err(|e| Failed::code(1, format!("{e}; nothing was promoted")))?;
    let store = crate::store::Postgres::from_settings(settings).map_err(Failed::usage)?;
    let everywhere = store.is_some();
    let outcome = crate::state::chosen(store)
        .promote(settings, runbook, force)
        .await
        .map_err(|e| Failed::code(1, format!("{e}; nothing was promoted")))?;
    let demotion = match outcome {
        Ok(d) => d,
        Err(e @ PromoteRefused::State { .. }) => return Err(Failed::code(1, e)),
        Err(e) => {
            eprintln!("runwarden: {e}");
            return Ok(1);
        }
    };
    let by = format!("{}@{}", crate::gate::killswitch::who(), settings.replica);
    if let Err(e) = audit.promoted(&demotion, &by, reason, force) {
        return Err(Failed::code(
            1,
            format!(
                "runbook \"{runbook}\" was promoted, but the promotion could not be audited: {e}"
            ),
        ));
    }
    let runs: Vec<&str> = demotion
        .evidence
        .iter()
        .map(|f| f.run_id.as_str())
        .collect();
    println!(
        "promoted {runbook}: its standing approval (L3) is back{}, by {by}: {reason}",
        if everywhere { " on every replica" } else { "" }
    );
    println!(
        "it had been demoted since {} by {} (failed runs: {}); its failures count from zero again",
        demotion.since,
        demotion.by,
        if runs.is_empty() {
            "none readable".to_string()
        } else {
            runs.join(", ")
        }
    );
    Ok(0)
}

/// The demotions in force: this machine's and, with shared state, the
/// fleet's, read through `fleet` when the caller holds a connection
/// already; and what could not be read.
pub(super) async fn in_force(
    settings: &crate::config::Settings,
    fleet: Option<std::sync::Arc<crate::store::Postgres>>,
) -> (Vec<Demotion>, Option<String>) {
    let demotions = crate::audit::demotions(settings);
    let store = match fleet {
        Some(store) => Ok(Some(store)),
        None => crate::store::Postgres::from_settings(settings),
    };
    let unread =
        |e: crate::store::StoreError| Some(format!("the fleet's demotions cannot be read: {e}"));
    let (demotions, problem) = match store {
        Ok(Some(store)) => match store.demotions().await {
            Ok(list) => {
                store.demoted.set(list);
                (demotions.with_fleet(Some(store.demoted.clone())), None)
            }
            Err(e) => (demotions, unread(e)),
        },
        Ok(None) => (demotions, None),
        Err(e) => (demotions, unread(e)),
    };
    (demotions.list(), problem)
}

//! The daemon's workers for shared state: connect and check the schema at
//! start-up, close runs whose lease expired (and keep `/healthz` and
//! `runwarden_store_up` current), bring home decisions taken through other
//! replicas, count the fleet budget for its gauge. `app` spawns them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Postgres, StoreError};
use crate::config::Config;
use crate::metrics::Metrics;

/// The shared state `state.postgres` names, its schema checked. A database
/// that cannot be reached yet is no reason not to start: the daemon answers
/// 503 and makes no call until it can (see [`reap_worker`]); a wrong schema
/// or an unreadable URL file is.
pub(crate) async fn shared_state(config: &Config) -> anyhow::Result<Option<Arc<Postgres>>> {
    let Some(store) = Postgres::from_settings(&config.settings)? else {
        return Ok(None);
    };
    match store.check_schema().await {
        Ok(crate::store::Schema::Current(_)) => {
            tracing::info!(replica = %store.replica, "shared state: PostgreSQL, lease {:?}", store.lease)
        }
        Ok(crate::store::Schema::OneAhead(v)) => tracing::warn!(
            replica = %store.replica,
            "shared state: the schema is version {v}, one ahead of this runwarden's: fine while the replicas are upgraded one at a time; upgrade this one too"
        ),
        Err(e @ StoreError::Unreachable(_)) => {
            tracing::warn!(
                "{e}; triggers are answered 503 and no call runs until it can be reached"
            )
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Some(store))
}

/// With shared state, every second (or a third of the lease): close the
/// runs whose lease expired, whichever replica ran them, as `interrupted`,
/// each with its verdict line in this machine's audit log, and count the
/// runs waiting in the fleet's queue (`runwarden_fleet_queued_runs`). The same round
/// trip keeps `/healthz` current. `on_closed` writes each such run's verdict
/// line (the scheduler's `closed_elsewhere`, in the daemon).
pub(crate) async fn reap_worker(
    store: Arc<Postgres>,
    on_closed: impl Fn(&super::Reaped) + Send,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let every = (store.lease / 3).min(Duration::from_secs(1));
    let up = metrics.store_up.with_label_values(&["postgres"]);
    let queued = metrics.fleet_queued.with_label_values(&["postgres"]);
    let mut pruned: Option<tokio::time::Instant> = None;
    loop {
        // At start and every ten minutes, each replica forgets what is a
        // month old; the audit logs keep the record.
        if pruned.is_none_or(|at| at.elapsed() >= Duration::from_secs(600)) {
            pruned = Some(tokio::time::Instant::now());
            if let Err(e) = store.prune(Duration::from_secs(30 * 86_400)).await {
                tracing::warn!("old rows not pruned: {e}");
            }
        }
        match store.reap().await {
            Ok((closed, waiting)) => {
                up.set(1.0);
                queued.set(waiting as f64);
                for run in closed {
                    on_closed(&run);
                }
            }
            Err(e) => {
                up.set(0.0);
                tracing::warn!("{e}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
    }
}

/// With shared state, four times a second while a run here waits for a
/// person: bring home the decisions taken through other replicas.
pub(crate) async fn approval_sync_worker(
    store: Arc<Postgres>,
    approvals: Arc<crate::gate::approvals::Approvals>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let pending = approvals.pending();
        if !pending.is_empty() {
            match store.settled_approvals(&pending).await {
                Ok(settled) => {
                    for (id, state) in settled {
                        approvals.close(&id, state);
                    }
                }
                Err(e) => tracing::warn!("decisions cannot be read: {e}"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// `(scope, used, limit)` of each fleet budget, counted in the shared
/// state; a budget that cannot be counted now shows as full, as the fence
/// would treat it.
async fn fleet_usage(
    store: &Postgres,
    all: Option<crate::config::runbook::FleetBudget>,
    own: &[(String, crate::config::runbook::FleetBudget)],
) -> Vec<(String, u64, u64)> {
    let scopes = all
        .map(|b| ("all".to_string(), None, b))
        .into_iter()
        .chain(own.iter().map(|(n, b)| (n.clone(), Some(n.as_str()), *b)));
    let mut out = Vec::new();
    for (scope, runbook, budget) in scopes {
        let limit = u64::from(budget.max_mutations);
        let used = store
            .fleet_used(runbook, budget.per)
            .await
            .map_or(limit, |n| n.max(0) as u64);
        out.push((scope, used, limit));
    }
    out
}

/// Keep `runwarden_fleet_budget_used` and `..._limit` current for the
/// budgets of the config in force, and `runwarden_runbook_demoted`: the
/// ledger and the demotions are shared with every other process on this
/// machine (and the fleet), so they are read again every few seconds.
pub(crate) async fn fleet_worker(
    config: watch::Receiver<Arc<Config>>,
    store: Option<Arc<Postgres>>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let cfg = config.borrow().clone();
        let own: Vec<(String, crate::config::runbook::FleetBudget)> = cfg
            .runbooks
            .values()
            .filter_map(|r| r.fleet_budget.map(|b| (r.name.clone(), b)))
            .collect();
        if cfg.settings.fleet_budget.is_some() || !own.is_empty() {
            let (dir, all) = (cfg.settings.state_dir.clone(), cfg.settings.fleet_budget);
            let usage = match &store {
                // The fleet's count, every replica's calls.
                Some(store) => fleet_usage(store, all, &own).await,
                // A read of a small file.
                None => tokio::task::spawn_blocking(move || {
                    let named: Vec<(&str, _)> = own.iter().map(|(n, b)| (n.as_str(), *b)).collect();
                    crate::gate::fleet::usage(&dir, all, &named)
                })
                .await
                .unwrap_or_default(),
            };
            metrics.fleet_budget_used.reset();
            metrics.fleet_budget_limit.reset();
            for (scope, used, limit) in usage {
                metrics
                    .fleet_budget_used
                    .with_label_values(&[&scope])
                    .set(used as f64);
                metrics
                    .fleet_budget_limit
                    .with_label_values(&[&scope])
                    .set(limit as f64);
            }
        }
        // Demotions: 0 for each runbook with `demote_after`, 1 for each
        // demoted one (this machine's files, and the fleet's record).
        let demotions = crate::audit::demotions(&cfg.settings)
            .with_fleet(store.as_ref().map(|s| s.demoted.clone()));
        let demoted = tokio::task::spawn_blocking(move || demotions.list())
            .await
            .unwrap_or_default();
        metrics.runbook_demoted.reset();
        for r in cfg.runbooks.values().filter(|r| r.demote_after.is_some()) {
            metrics.runbook_demoted.with_label_values(&[&r.name]).set(0);
        }
        for d in demoted {
            metrics
                .runbook_demoted
                .with_label_values(&[&d.runbook])
                .set(1);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.changed() => return,
        }
    }
}

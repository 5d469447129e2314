//! The fleet's queue: runs admitted anywhere, taken here when a permit is free.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, watch};

use super::{Scheduler, run_info};
use crate::audit::{AuditLog, QueueNote, Queued};
use crate::config::Config;
use crate::run::RunRequest;
use crate::store::Postgres;

impl Scheduler {
    /// With shared state: whenever this replica has a free run permit,
    /// take runs from the fleet's queue and start them, as many as it has
    /// permits free, so admitted work spreads over every replica whichever
    /// received the trigger. Woken by the queue's notification, by a
    /// permit coming free, and every second (a notification missed while
    /// the listening connection was down is not lost).
    pub(crate) async fn take_queued(
        self: Arc<Self>,
        store: Arc<Postgres>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let config = self.config.borrow().clone();
            self.apply_limit(&config);
            // A permit first: only what can start now is taken.
            let first = tokio::select! {
                permit = self.permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            if *stop.borrow() {
                return;
            }
            let mut held = vec![first];
            while let Ok(permit) = self.permits.clone().try_acquire_owned() {
                held.push(permit);
            }
            let runbooks: Vec<String> = config.runbooks.keys().cloned().collect();
            match store.take(held.len(), runbooks).await {
                Ok(taken) if !taken.is_empty() => {
                    self.start_taken(&config, taken, held).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("the fleet's queue cannot be read: {e}"),
            }
            drop(held);
            tokio::select! {
                _ = store.queue_ready.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Start runs taken from the fleet's queue, each with one of `held`:
    /// their triggers go into this machine's log first (not synced: each
    /// run's intent sync covers them). A run whose line cannot be written
    /// does not start; its lease expires and a replica closes it
    /// `interrupted`.
    async fn start_taken(
        self: &Arc<Self>,
        config: &Arc<Config>,
        taken: Vec<crate::store::Taken>,
        mut held: Vec<OwnedSemaphorePermit>,
    ) {
        let mut runs = Vec::with_capacity(taken.len());
        for t in taken {
            match RunRequest::from_queue(t.runbook.clone(), t.host.clone(), &t.request) {
                Ok(req) => runs.push((t, req)),
                Err(e) => {
                    tracing::error!(run_id = %t.run_id, "a queued run cannot be read ({e}); it does not start, and its lease expires")
                }
            }
        }
        let lines: Vec<Queued> = runs
            .iter()
            .map(|(t, req)| Queued {
                run: run_info(config, &t.run_id, req),
                trigger: req.trigger,
                keys: &req.keys,
                origin: req.origin(),
                queue: QueueNote::TakenFrom(&t.queued_by),
            })
            .collect();
        let entries = AuditLog::queued_lines(&lines);
        let audit = self.audit.clone();
        let written = tokio::task::spawn_blocking(move || audit.append_queued(entries)).await;
        if !matches!(written, Ok(Ok(_))) {
            self.metrics.audit_write_failures.inc();
            tracing::error!(
                "{} run(s) taken from the fleet's queue could not be recorded here, so none starts; their leases expire and a replica closes them interrupted",
                runs.len()
            );
            return;
        }
        for (t, req) in runs {
            let permit = held.pop();
            self.start(config.clone(), t.run_id, req, Some(t.lease), permit);
        }
    }
}

//! Admission across replicas: the shared PostgreSQL state decides a
//! notification's triggers in one round trip and one transaction
//! (`runwarden_admit_all`), a started one with the lease its run holds (or
//! queued for the fleet, when this replica has no run permit free for it),
//! and records what the replica decided alone beside them.

use std::sync::Arc;
use std::time::Duration;

use super::{Admission, Admitted, Ask, DUPLICATE_WINDOW, Decided, Pending, TriggerResult};
use crate::store::{Admit, Postgres, Recorded};
use crate::trigger::RunRequest;

/// Admission in the shared state.
pub(crate) struct Fleet {
    store: Arc<Postgres>,
    window: Duration,
}

impl Fleet {
    /// Admission through `store`.
    pub(crate) fn new(store: Arc<Postgres>) -> Fleet {
        Fleet {
            store,
            window: DUPLICATE_WINDOW,
        }
    }
}

impl Admission for Fleet {
    fn admit<'a>(
        &'a self,
        asks: &'a [&'a Ask<'a>],
        decided: &'a [Decided<'a>],
        direct: usize,
    ) -> Pending<'a, Vec<Admitted>> {
        Box::pin(async move {
            // What a replica taking it would run: only needed when some of
            // the asks may go to the queue (more than this replica can start).
            let may_queue = direct < asks.len();
            let items: Vec<Admit> = asks
                .iter()
                .map(|a| Admit {
                    runbook: a.req.runbook.clone(),
                    host: a.req.host.clone(),
                    keys: a.req.keys.clone(),
                    cooldown: a.cooldown,
                    cap: a.cap,
                    run_id: a.run_id.clone(),
                    trigger: a.req.trigger.as_str(),
                    request: match may_queue {
                        true => a.req.to_queue(),
                        false => String::new(),
                    },
                })
                .collect();
            let admitted: Vec<Admitted> = match items.is_empty() {
                true => Vec::new(),
                false => self
                    .store
                    .admit(&items, self.window, Some(direct), true)
                    .await?
                    .into_iter()
                    .map(|a| match a {
                        crate::store::Admitted::Started(lease) => Admitted::Started(Some(lease)),
                        crate::store::Admitted::Queued => Admitted::Queued,
                        crate::store::Admitted::Cooldown => {
                            Admitted::Refused(TriggerResult::Cooldown)
                        }
                        crate::store::Admitted::KillSwitch => {
                            Admitted::Refused(TriggerResult::KillSwitch)
                        }
                        crate::store::Admitted::Deduplicated => {
                            Admitted::Refused(TriggerResult::Deduplicated)
                        }
                        crate::store::Admitted::Capped => Admitted::Refused(TriggerResult::Capped),
                        crate::store::Admitted::Pending => {
                            Admitted::Refused(TriggerResult::Pending)
                        }
                    })
                    .collect(),
            };
            let rows: Vec<Recorded> = decided
                .iter()
                .map(|d| Recorded {
                    runbook: d.runbook.to_string(),
                    host: d.host.to_string(),
                    trigger: d.trigger.as_str(),
                    keys: d.keys.to_vec(),
                    outcome: d.result.as_str(),
                })
                .collect();
            if !rows.is_empty()
                && let Err(e) = self.store.record_triggers(&rows).await
            {
                // None of the notification starts: give back what was claimed.
                let claimed: Vec<String> = asks
                    .iter()
                    .zip(&admitted)
                    .filter(|(_, a)| matches!(a, Admitted::Started(_) | Admitted::Queued))
                    .map(|(ask, _)| ask.run_id.clone())
                    .collect();
                give_back(&self.store, &claimed).await;
                return Err(e);
            }
            Ok(admitted)
        })
    }

    fn abandon<'a>(&'a self, started: &'a [(&'a RunRequest, String)]) -> Pending<'a, ()> {
        Box::pin(async move {
            let ids: Vec<String> = started.iter().map(|(_, id)| id.clone()).collect();
            give_back(&self.store, &ids).await;
            Ok(())
        })
    }

    /// The run's lease ends with the run.
    fn ended(&self, _: &RunRequest) {}
}

/// Give back the claims of runs that will not start after all.
async fn give_back(store: &Postgres, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    if let Err(e) = store.abandon(ids).await {
        tracing::warn!(
            "{} claim(s) not given back ({e}); they expire with their lease",
            ids.len()
        );
    }
}

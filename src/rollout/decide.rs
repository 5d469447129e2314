//! A person's decisions on a rollout: `resume` (a halted one goes on, the
//! failures so far accepted) and `abort` (nothing more starts), each
//! audited with who and why. With shared state a decision through a replica
//! that does not drive the rollout is recorded in its row, and the driver
//! applies it (`fleet`).

use super::{Rollouts, State, Status, fleet, shared};
use crate::audit::{AuditError, RolloutEvent};
use crate::store::Decided;

/// Why a person's decision on a rollout was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("no rollout {0:?} on this daemon (`runwarden rollout list`)")]
    NotFound(String),
    #[error("rollout {id} is {state:?}, not halted: only a halted rollout is resumed")]
    NotHalted { id: String, state: State },
    #[error("rollout {0} is over")]
    Over(String),
    #[error("say why (--reason): the audit log keeps who resumed or aborted a rollout, and why")]
    NoReason,
    #[error("an earlier decision on rollout {0} waits for its driver: try again in a moment")]
    Pending(String),
    #[error("the audit log could not record it, so nothing changed: {0}")]
    Audit(#[from] AuditError),
    #[error("the shared state could not record it, so nothing changed: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// What became of a person's decision.
pub(crate) enum Decision {
    /// Applied here: the rollout now.
    Applied(Status),
    /// Recorded for the replica that drives the rollout, which applies it
    /// within a third of the lease: the rollout as its driver last wrote it.
    Sent {
        status: serde_json::Value,
        driver: String,
    },
}

impl Rollouts {
    /// A person's decision (`resume` or `abort`) on rollout `id`: applied
    /// here when this daemon drives it; with shared state, recorded for
    /// the replica that does (audited here too, with the person).
    pub(crate) async fn decide(
        &self,
        id: &str,
        resume: bool,
        by: &str,
        reason: &str,
    ) -> Result<Decision, Refused> {
        if reason.trim().is_empty() {
            return Err(Refused::NoReason);
        }
        let here = self.get(id).filter(|o| o.driven_here());
        let (Some(pg), None) = (&self.fleet, &here) else {
            return match resume {
                true => self.resume_here(id, by, reason),
                false => self.abort_here(id, by, reason),
            }
            .map(Decision::Applied);
        };
        let mut rows = pg.rollouts_like(id).await?;
        let (Some(row), None) = (rows.pop(), rows.pop()) else {
            return Err(Refused::NotFound(id.to_string()));
        };
        let now = shared(row);
        let full = now["id"].as_str().unwrap_or_default().to_string();
        let runbook = now["runbook"].as_str().unwrap_or_default().to_string();
        let verb = if resume { "resume" } else { "abort" };
        let decision = serde_json::to_string(&fleet::Decision {
            verb: verb.into(),
            by: by.into(),
            reason: reason.into(),
            replica: pg.replica.clone(),
        })
        .unwrap_or_default();
        match pg.rollout_decide(&full, resume, &decision).await? {
            Decided::Waiting { status, driver } => {
                let event = match resume {
                    true => RolloutEvent::Resumed {
                        by: by.to_string(),
                        reason: reason.to_string(),
                    },
                    false => RolloutEvent::Aborted {
                        by: by.to_string(),
                        reason: reason.to_string(),
                        never_started: Vec::new(),
                    },
                };
                if let Err(e) = self.audit.rollout(&full, &runbook, &event) {
                    // Recorded in the database already: the driver applies
                    // it and writes it in its own log.
                    tracing::error!(rollout = %full, "the {verb} of rollout {full} by {by} is sent to replica {driver}, but this replica's log could not record it: {e}");
                }
                tracing::info!(rollout = %full, "rollout {full}: {verb} by {by} sent to replica {driver}, which drives it");
                Ok(Decision::Sent {
                    status: shared((status, driver.clone())),
                    driver,
                })
            }
            Decided::NotFound => Err(Refused::NotFound(id.to_string())),
            Decided::Pending => Err(Refused::Pending(full)),
            Decided::State(state) => {
                let state = serde_json::from_value(serde_json::Value::String(state))
                    .unwrap_or(State::Running);
                Err(match state.is_over() {
                    true => Refused::Over(full),
                    false => Refused::NotHalted { id: full, state },
                })
            }
        }
    }

    /// A person lets halted rollout `id`, driven here, go on: the failures
    /// so far are accepted, `max_failures` counts from now.
    pub(super) fn resume_here(&self, id: &str, by: &str, reason: &str) -> Result<Status, Refused> {
        let one = self
            .get(id)
            .ok_or_else(|| Refused::NotFound(id.to_string()))?;
        if reason.trim().is_empty() {
            return Err(Refused::NoReason);
        }
        let now = one.status();
        if now.state != State::Halted {
            return Err(Refused::NotHalted {
                id: now.id,
                state: now.state,
            });
        }
        let event = RolloutEvent::Resumed {
            by: by.to_string(),
            reason: reason.to_string(),
        };
        self.audit.rollout(&now.id, &now.runbook, &event)?;
        self.metrics
            .rollouts_halted
            .with_label_values(&[&now.runbook])
            .dec();
        self.metrics
            .rollouts
            .with_label_values(&[&now.runbook, "resumed"])
            .inc();
        one.status.send_modify(|s| {
            s.state = State::Running;
            s.reason = None;
            s.accepted = s.failures;
            s.waiting_on = "its next hosts".into();
        });
        tracing::info!(rollout = %now.id, "rollout {} resumed by {by}: {reason}", now.id);
        Ok(one.status())
    }

    /// A person ends rollout `id`, driven here: nothing more starts; runs
    /// in flight finish.
    pub(super) fn abort_here(&self, id: &str, by: &str, reason: &str) -> Result<Status, Refused> {
        let one = self
            .get(id)
            .ok_or_else(|| Refused::NotFound(id.to_string()))?;
        if reason.trim().is_empty() {
            return Err(Refused::NoReason);
        }
        let now = one.status();
        if now.state.is_over() {
            return Err(Refused::Over(now.id));
        }
        let (_, never_started) = now.split();
        let event = RolloutEvent::Aborted {
            by: by.to_string(),
            reason: reason.to_string(),
            never_started,
        };
        self.audit.rollout(&now.id, &now.runbook, &event)?;
        if now.state == State::Halted {
            self.metrics
                .rollouts_halted
                .with_label_values(&[&now.runbook])
                .dec();
        }
        self.metrics
            .rollouts
            .with_label_values(&[&now.runbook, "aborted"])
            .inc();
        one.status.send_modify(|s| {
            s.state = State::Aborted;
            s.reason = Some(format!("aborted by {by}: {reason}"));
            s.waiting_on = "nothing: aborted".into();
            s.next_wave_at = None;
        });
        tracing::warn!(rollout = %now.id, "rollout {} aborted by {by}: {reason}", now.id);
        Ok(one.status())
    }
}

//! L2 approval requests in the shared state: opened by the replica whose
//! run waits, decided through any replica, read back by the first.

use super::{Postgres, StoreError};
use crate::gate::approvals::{Decision, DecisionError, Request, State};

impl Postgres {
    /// Share a request this replica's run waits on.
    pub(crate) async fn publish_approval(
        &self,
        request: &Request,
        expires_at: jiff::Timestamp,
    ) -> Result<(), StoreError> {
        let json = &serde_json::to_value(request).unwrap_or_default();
        let expires = &expires_at.to_string();
        self.with("sharing the approval request", |c| async move {
            c.execute(
                "INSERT INTO runwarden_approvals (id, replica, run_id, request, digest, expires_at)
                 VALUES ($1, $2, $3, $4::text::jsonb, $5, $6::text::timestamptz)",
                &[
                    &request.id,
                    &self.replica,
                    &request.run_id,
                    &json.to_string(),
                    &request.digest,
                    &expires,
                ],
            )
            .await
        })
        .await
        .map(drop)
    }

    /// Record a person's decision, exactly once (see `runwarden_decide`).
    pub(crate) async fn decide_approval(
        &self,
        id: &str,
        d: &Decision<'_>,
    ) -> Result<Result<Request, DecisionError>, StoreError> {
        let (outcome, request): (String, Option<String>) = self
            .with("recording the decision", |c| async move {
                let row = c
                    .query_one(
                        "SELECT outcome, request::text FROM runwarden_decide($1, $2, $3, $4, $5, $6)",
                        &[&id, &d.digest, &d.approve, &d.by, &d.comment, &d.via],
                    )
                    .await?;
                Ok((row.get(0), row.get(1)))
            })
            .await?;
        Ok(match outcome.as_str() {
            "ok" => request
                .and_then(|r| serde_json::from_str(&r).ok())
                .ok_or_else(|| DecisionError::NotFound(id.to_string())),
            "expired" => Err(DecisionError::Expired(id.to_string())),
            "already_decided" => Err(DecisionError::AlreadyDecided(id.to_string())),
            "stale_digest" => Err(DecisionError::StaleDigest),
            _ => Err(DecisionError::NotFound(id.to_string())),
        })
    }

    /// Every request of the fleet from the last day, pending first.
    pub(crate) async fn approvals(&self, id: Option<&str>) -> Result<Vec<Request>, StoreError> {
        self.with("listing approval requests", |c| async move {
            let rows = c
                .query(
                    "SELECT (request || state)::text FROM runwarden_approvals
                     WHERE ($1::text IS NULL OR id = $1) AND expires_at > clock_timestamp() - interval '1 day'
                     ORDER BY state->>'state' <> 'pending', request->>'created_at' LIMIT 500",
                    &[&id],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| serde_json::from_str(r.get::<_, &str>(0)).ok())
                .collect())
        })
        .await
    }

    /// The requests among `ids` (this replica's pending ones) that are no
    /// longer pending in the shared state, with their state.
    pub(crate) async fn settled_approvals(
        &self,
        ids: &[String],
    ) -> Result<Vec<(String, State)>, StoreError> {
        self.with("reading decisions", |c| async move {
            let rows = c
                .query(
                    "SELECT id, state::text FROM runwarden_approvals
                     WHERE id = ANY($1) AND state->>'state' <> 'pending'",
                    &[&ids],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| Some((r.get(0), serde_json::from_str(r.get::<_, &str>(1)).ok()?)))
                .collect())
        })
        .await
    }

    /// Withdraw the pending requests, on any replica, of runs of `runbook`
    /// on `host` that trigger key `key` started (their alert resolved):
    /// the replica whose run waits reads it back within a second. The
    /// requests withdrawn, as they now stand.
    pub(crate) async fn withdraw_approvals(
        &self,
        runbook: &str,
        host: &str,
        key: &str,
        state: &State,
    ) -> Result<Vec<Request>, StoreError> {
        let state = &serde_json::to_string(state).unwrap_or_default();
        self.with("withdrawing approval requests", |c| async move {
            let rows = c
                .query(
                    "UPDATE runwarden_approvals SET state = $4::text::jsonb
                     WHERE state->>'state' = 'pending' AND request->>'runbook' = $1
                       AND request->>'host' = $2 AND request->'keys' ? $3
                     RETURNING (request || state)::text",
                    &[&runbook, &host, &key, &state],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| serde_json::from_str(r.get::<_, &str>(0)).ok())
                .collect())
        })
        .await
    }

    /// A request this replica stopped waiting on (expired, or the run was
    /// cancelled) ends so in the shared state, unless a decision got there first.
    pub(crate) async fn close_approval(&self, id: &str, state: &State) -> Result<(), StoreError> {
        let state = &serde_json::to_string(state).unwrap_or_default();
        self.with("closing the approval request", |c| async move {
            c.execute(
                "UPDATE runwarden_approvals SET state = $2::text::jsonb WHERE id = $1 AND state->>'state' = 'pending'",
                &[&id, &state],
            )
            .await
        })
        .await
        .map(drop)
    }
}

//! A run's lease: fenced before each call, renewed while it runs, handed
//! back or finished at its end, reaped when its replica is gone; the
//! fleet's budget and `max_runs` counted from the runs it records.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::{Postgres, millis, one};
use crate::store::{Reaped, StoreError};

impl Postgres {
    /// Prove the lease and count the call; see `runwarden_fence`.
    #[allow(clippy::too_many_arguments, reason = "one SQL function's parameters")]
    pub(crate) async fn fence(
        &self,
        lease: &crate::store::LeaseId,
        mutating: bool,
        scopes: &[Option<String>],
        limits: &[i64],
        windows: &[i64],
        keep: i64,
    ) -> Result<(String, Option<String>), StoreError> {
        let ms = millis(self.lease);
        let rows = self.with("fencing the call", |c| async move {
            // Typed: one round trip, no separate prepare.
            c
                .query_typed(
                    "SELECT verdict, detail FROM runwarden_fence($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    &[
                        (&lease.runbook, Type::TEXT),
                        (&lease.host, Type::TEXT),
                        (&lease.run_id, Type::TEXT),
                        (&lease.token, Type::INT8),
                        (&ms, Type::INT8),
                        (&self.replica, Type::TEXT),
                        (&mutating, Type::BOOL),
                        (&scopes, Type::TEXT_ARRAY),
                        (&limits, Type::INT8_ARRAY),
                        (&windows, Type::INT8_ARRAY),
                        (&keep, Type::INT8),
                    ],
                )
                .await
        })
        .await?;
        let row = one(rows, "fencing the call")?;
        Ok((row.get(0), row.get(1)))
    }

    /// Renew the lease; `false`: it is not this run's any more. A run
    /// renewed is one this replica has on disk: confirmed, should its
    /// confirmation after the trigger's sync have failed.
    pub(crate) async fn renew(&self, lease: &crate::store::LeaseId) -> Result<bool, StoreError> {
        let ms = millis(self.lease);
        self.with("renewing the lease", |c| async move {
            let rows = c
                .query_typed(
                    "WITH renewed AS (
                         UPDATE runwarden_leases SET expires_at = clock_timestamp() + $5 * interval '1 millisecond'
                         WHERE runbook = $1 AND host = $2 AND token = $3 AND run_id = $4
                           AND expires_at > clock_timestamp()
                         RETURNING run_id)
                     UPDATE runwarden_runs SET heartbeat_at = clock_timestamp(), recorded = true
                     WHERE run_id IN (SELECT run_id FROM renewed) RETURNING 1",
                    &[
                        (&lease.runbook, Type::TEXT),
                        (&lease.host, Type::TEXT),
                        (&lease.token, Type::INT8),
                        (&lease.run_id, Type::TEXT),
                        (&ms, Type::INT8),
                    ],
                )
                .await?;
            Ok(rows.len() == 1)
        })
        .await
    }

    /// A run this replica's stop ended before it made any call goes back to
    /// the fleet's queue, not lost: the old run ends `halted` and `handed
    /// back`, and in the same statement its lease passes (the next token) to
    /// a new queued run `next` with the same trigger, ready for whichever
    /// replica has a free permit first. The host stays held all along, so
    /// no trigger slips in between and nothing is counted twice (a run ended
    /// so never ran: neither cooldown nor `max_runs` counts it). `false`:
    /// the lease was no longer this run's, and nothing was queued. Plain
    /// statements on the tables every release since the queue reads the
    /// same way, so a replica of the previous release takes it as its own.
    pub(crate) async fn hand_back(
        &self,
        lease: &crate::store::LeaseId,
        next: &str,
        request: &str,
    ) -> Result<bool, StoreError> {
        self.with("handing the run back to the fleet's queue", |c| async move {
            let rows = c
                .query_typed(
                    "WITH old AS (
                         UPDATE runwarden_runs SET status = 'not_started', verdict = 'halted',
                                ended_at = clock_timestamp()
                         WHERE run_id = $4 AND status = 'running' RETURNING run_id),
                     moved AS (
                         UPDATE runwarden_leases l
                         SET token = l.token + 1, run_id = $5, replica = NULL,
                             expires_at = 'infinity'::timestamptz
                         FROM old
                         WHERE l.runbook = $1 AND l.host = $2 AND l.token = $3 AND l.run_id = old.run_id
                         RETURNING l.token),
                     queued_run AS (
                         INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status, recorded)
                         SELECT $5, $1, $2, $6, moved.token, 'queued', true FROM moved),
                     queued AS (
                         INSERT INTO runwarden_queue (run_id, runbook, host, request, queued_by, ready)
                         SELECT $5, $1, $2, $7::text::jsonb, $6, true FROM moved
                         RETURNING run_id)
                     SELECT pg_notify('runwarden_queue', '1') FROM queued",
                    &[
                        (&lease.runbook, Type::TEXT),
                        (&lease.host, Type::TEXT),
                        (&lease.token, Type::INT8),
                        (&lease.run_id, Type::TEXT),
                        (&next, Type::TEXT),
                        (&self.replica, Type::TEXT),
                        (&request, Type::TEXT),
                    ],
                )
                .await?;
            Ok(rows.len() == 1)
        })
        .await
    }

    /// The run ended with `verdict`: record it and free the lease (its end
    /// starts the cooldown), unless another claim has taken over.
    pub(crate) async fn finish(
        &self,
        lease: &crate::store::LeaseId,
        verdict: &str,
        audit_head: &str,
    ) -> Result<(), StoreError> {
        self.with("recording the verdict", |c| async move {
            c.execute(
                "WITH ended AS (UPDATE runwarden_runs SET status = 'ended', verdict = $2, audit_head = $3,
                         ended_at = clock_timestamp()
                     WHERE run_id = $1 AND status = 'running' RETURNING run_id)
                 UPDATE runwarden_leases SET expires_at = NULL, run_id = NULL, ended_at = clock_timestamp()
                     WHERE runbook = $4 AND host = $5 AND token = $6",
                &[&lease.run_id, &verdict, &audit_head, &lease.runbook, &lease.host, &lease.token],
            )
            .await
        })
        .await
        .map(drop)
    }

    /// Close every run whose lease expired or was taken over (its replica
    /// died, or lost the database): `interrupted`, closed by this replica.
    /// Rows another replica is closing at the same moment are skipped.
    /// Also removes queued runs never handed over, and says how many runs
    /// wait in the fleet's queue now.
    pub(crate) async fn reap(&self) -> Result<(Vec<Reaped>, i64), StoreError> {
        self.with("closing runs whose lease expired", |c| async move {
            let rows = c
                .query(
                    // A run its replica never confirmed (it stopped before
                    // its disk had the trigger) never ran: `not_started`,
                    // and no cooldown counts from it, so the sender's retry
                    // starts the run.
                    "WITH dead AS (
                         SELECT r.run_id, NOT r.recorded AS unrecorded
                         FROM runwarden_runs r
                         JOIN runwarden_leases l ON l.runbook = r.runbook AND l.host = r.host
                         WHERE r.status = 'running'
                           AND (l.token <> r.token OR l.expires_at IS NULL OR l.expires_at <= clock_timestamp())
                         FOR UPDATE OF r SKIP LOCKED),
                     closed AS (
                         UPDATE runwarden_runs r
                             SET status = CASE WHEN dead.unrecorded THEN 'not_started' ELSE 'interrupted' END,
                                 verdict = CASE WHEN dead.unrecorded THEN NULL ELSE 'interrupted' END,
                                 ended_at = clock_timestamp(), closed_by = $1
                         FROM dead WHERE r.run_id = dead.run_id
                         RETURNING r.run_id, r.runbook, r.host, r.replica, r.token, dead.unrecorded),
                     freed AS (
                         UPDATE runwarden_leases l
                             SET expires_at = NULL, run_id = NULL,
                                 ended_at = CASE WHEN closed.unrecorded THEN l.ended_at ELSE clock_timestamp() END
                         FROM closed WHERE l.runbook = closed.runbook AND l.host = closed.host AND l.token = closed.token
                         RETURNING 1)
                     SELECT run_id, runbook, host, replica FROM closed WHERE NOT unrecorded",
                    &[&self.replica],
                )
                .await?;
            // Queued runs whose admitting replica stopped before its disk
            // had their triggers (their senders were told to retry); then
            // what still waits.
            let queued: i64 = c
                .query_typed(
                    "SELECT runwarden_reap_queue($1), (SELECT count(*) FROM runwarden_queue)",
                    &[(&millis(self.lease), Type::INT8)],
                )
                .await?
                .first()
                .map_or(0, |r| r.get(1));
            let closed = rows
                .iter()
                .map(|r| Reaped {
                    run_id: r.get(0),
                    runbook: r.get(1),
                    host: r.get(2),
                    replica: r.get(3),
                })
                .collect();
            Ok((closed, queued))
        })
        .await
    }

    /// Tier-2 calls counted across the fleet within `window` (of one
    /// runbook, or of all with `None`): the fleet budget's gauge.
    pub(crate) async fn fleet_used(
        &self,
        runbook: Option<&str>,
        window: Duration,
    ) -> Result<i64, StoreError> {
        let ms = millis(window);
        self.with("counting the fleet's calls", |c| async move {
            c.query_one(
                "SELECT count(*) FROM runwarden_fleet_calls
                 WHERE at > clock_timestamp() - $1::bigint * interval '1 millisecond'
                   AND ($2::text IS NULL OR runbook = $2)",
                &[&ms, &runbook],
            )
            .await
            .map(|r| r.get(0))
        })
        .await
    }

    /// The hosts on which `runbook` started `count` runs or more within
    /// `per` (its `max_runs` reached): each host, its runs in the window,
    /// and when the oldest of them started.
    pub(crate) async fn capped(
        &self,
        runbook: &str,
        count: u32,
        per: Duration,
    ) -> Result<Vec<(String, i64, jiff::Timestamp)>, StoreError> {
        let (ms, count) = (millis(per), i64::from(count));
        let rows = self
            .with("counting the fleet's recent runs", |c| async move {
                c.query(
                    "SELECT host, count(*), (extract(epoch FROM min(started_at)) * 1000)::bigint
                     FROM runwarden_runs
                     WHERE runbook = $1 AND recorded AND status <> 'not_started'
                       AND started_at > clock_timestamp() - $2::bigint * interval '1 millisecond'
                     GROUP BY host HAVING count(*) >= $3 ORDER BY host",
                    &[&runbook, &ms, &count],
                )
                .await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let oldest = jiff::Timestamp::from_millisecond(r.get(2)).unwrap_or_default();
                (r.get(0), r.get(1), oldest)
            })
            .collect())
    }

    /// Forget triggers, ended runs and approval requests older than `age`
    /// (the fleet's counters prune themselves in each fence).
    pub(crate) async fn prune(&self, age: Duration) -> Result<(), StoreError> {
        let ms = millis(age);
        self.with("pruning old rows", |c| async move {
            c.query_typed(
                "WITH t AS (DELETE FROM runwarden_triggers
                            WHERE received_at < clock_timestamp() - $1 * interval '1 millisecond'),
                      r AS (DELETE FROM runwarden_runs WHERE status <> 'running'
                            AND ended_at < clock_timestamp() - $1 * interval '1 millisecond'),
                      a AS (DELETE FROM runwarden_approvals
                            WHERE expires_at < clock_timestamp() - $1 * interval '1 millisecond')
                 SELECT 1",
                &[(&ms, Type::INT8)],
            )
            .await
        })
        .await
        .map(drop)
    }

    /// The fleet's runs, newest first: which replica ran each, how it
    /// stands or ended, who closed it.
    pub(crate) async fn fleet_runs(
        &self,
        runbook: Option<&str>,
        host: Option<&str>,
        limit: i64,
    ) -> Result<serde_json::Value, StoreError> {
        let text: String = self
            .with("listing the fleet's runs", |c| async move {
                c.query_typed(
                    "SELECT coalesce(json_agg(r)::text, '[]') FROM (
                         SELECT run_id, runbook, host, replica, status, verdict, started_at,
                                heartbeat_at, ended_at, closed_by, audit_head
                         FROM runwarden_runs
                         WHERE ($1::text IS NULL OR runbook = $1) AND ($2::text IS NULL OR host = $2)
                         ORDER BY started_at DESC LIMIT $3) r",
                    &[(&runbook, Type::TEXT), (&host, Type::TEXT), (&limit, Type::INT8)],
                )
                .await
                .map(|rows| rows.first().map(|r| r.get(0)).unwrap_or_default())
            })
            .await?;
        serde_json::from_str(&text)
            .map_err(|e| StoreError::Database(format!("listing the fleet's runs: {e}")))
    }
}

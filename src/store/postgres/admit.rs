//! The fleet's queue and the rest of admission's storage: a run's
//! confirmation, taking queued runs, the triggers a replica decided alone,
//! claims given back. A batch's own transaction is `batch`.

use tokio_postgres::types::Type;

use super::{Postgres, millis, one};
use crate::store::StoreError;

impl Postgres {
    /// The triggers of runs admitted here are on this machine's disk: a
    /// retry of one is now a duplicate, and those `queued` may be taken
    /// by any replica (see `runwarden_recorded`). Returns how many queued
    /// runs were marked; fewer than given means the rest were removed as
    /// stale (this replica took longer than a lease).
    pub(crate) async fn recorded(
        &self,
        run_ids: &[String],
        queued: &[String],
    ) -> Result<usize, StoreError> {
        self.with("confirming recorded runs", |c| async move {
            c.query_typed(
                "SELECT runwarden_recorded($1, $2)",
                &[(&run_ids, Type::TEXT_ARRAY), (&queued, Type::TEXT_ARRAY)],
            )
            .await
        })
        .await
        .and_then(|rows| {
            let marked: i32 = one(rows, "confirming recorded runs")?.get(0);
            Ok(usize::try_from(marked).unwrap_or(0))
        })
    }

    /// Take up to `limit` queued runs of `runbooks` (see `runwarden_take`):
    /// run id, runbook, host, token, request, the replica that queued it.
    #[allow(clippy::type_complexity, reason = "one row of one SQL function")]
    pub(in crate::store) async fn take_queued(
        &self,
        limit: usize,
        runbooks: Vec<String>,
    ) -> Result<Vec<(String, String, String, i64, String, String)>, StoreError> {
        let (lease, limit) = (millis(self.lease), i32::try_from(limit).unwrap_or(i32::MAX));
        let runbooks = &runbooks;
        let rows = self
            .with("taking queued runs", |c| async move {
                c.query_typed(
                    "SELECT run_id, runbook, host, token, request::text, queued_by
                     FROM runwarden_take($1, $2, $3, $4)",
                    &[
                        (&self.replica, Type::TEXT),
                        (&lease, Type::INT8),
                        (&limit, Type::INT4),
                        (&runbooks, Type::TEXT_ARRAY),
                    ],
                )
                .await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
            .collect())
    }

    /// Record triggers this replica decided alone (the kill switch, out of
    /// scope, no runbook), so the fleet's table holds every trigger's one
    /// outcome, in one round trip.
    pub(crate) async fn record_triggers(
        &self,
        rows: &[crate::store::TriggerRow],
    ) -> Result<(), StoreError> {
        let column =
            |f: fn(&crate::store::TriggerRow) -> String| rows.iter().map(f).collect::<Vec<_>>();
        let (runbooks, hosts, triggers, outcomes) = (
            column(|r| r.runbook.clone()),
            column(|r| r.host.clone()),
            column(|r| r.trigger.to_string()),
            column(|r| r.outcome.to_string()),
        );
        // Arrays of arrays must be rectangular: the keys go as JSON.
        let keys = column(|r| serde_json::to_string(&r.keys).unwrap_or_default());
        let (runbooks, hosts, triggers, keys, outcomes) =
            (&runbooks, &hosts, &triggers, &keys, &outcomes);
        self.with("recording triggers", |c| async move {
            c.query_typed(
                "INSERT INTO runwarden_triggers (replica, runbook, host, trigger, keys, outcome)
                 SELECT $1, r, h, t, ARRAY(SELECT jsonb_array_elements_text(k::jsonb)), o
                 FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS x(r, h, t, k, o)",
                &[
                    (&self.replica, Type::TEXT),
                    (&runbooks, Type::TEXT_ARRAY),
                    (&hosts, Type::TEXT_ARRAY),
                    (&triggers, Type::TEXT_ARRAY),
                    (&keys, Type::TEXT_ARRAY),
                    (&outcomes, Type::TEXT_ARRAY),
                ],
            )
            .await
        })
        .await
        .map(drop)
    }

    /// Give back the claims of runs that were accepted here but could not be
    /// recorded in this machine's audit log: they never start.
    pub(crate) async fn abandon(&self, run_ids: &[String]) -> Result<(), StoreError> {
        self.with("giving back unrecorded claims", |c| async move {
            c.execute(
                "WITH queued AS (DELETE FROM runwarden_queue WHERE run_id = ANY($1)),
                      gone AS (UPDATE runwarden_runs SET status = 'not_started', ended_at = clock_timestamp()
                     WHERE run_id = ANY($1) RETURNING runbook, host, token)
                 UPDATE runwarden_leases l SET expires_at = NULL, run_id = NULL
                     FROM gone WHERE l.runbook = gone.runbook AND l.host = gone.host AND l.token = gone.token",
                &[&run_ids],
            )
            .await
        })
        .await
        .map(drop)
    }
}

//! A run's lease: fenced before each call, renewed while it runs, handed
//! back or finished at its end, reaped when its replica is gone. The fence
//! reports what the rules decide a call on (the fleet's kill switches, the
//! calls in each fleet budget's window) and reserves a tier-2 call; it
//! decides nothing.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::{Postgres, millis, one};
use crate::store::{Budgets, Reaped, StoreError};

impl Postgres {
    /// Prove the lease, renew it, and report what the rules decide a
    /// call on, reserving a tier-2 call under fleet budgets; see
    /// `runwarden_prove`. One round trip.
    pub(crate) async fn prove(
        &self,
        lease: &crate::store::LeaseId,
        mutating: bool,
        budgets: &Budgets,
    ) -> Result<Proved, StoreError> {
        let ms = millis(self.lease);
        let (scopes, windows, keep) = (&budgets.scopes, &budgets.windows, &budgets.keep);
        let rows = self
            .with("fencing the call", |c| async move {
                // Typed: one round trip, no separate prepare.
                c.query_typed(
                    "SELECT lost, switch_scopes, switch_left_ms, switch_details, used, reserved \
                         FROM runwarden_prove($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    &[
                        (&lease.runbook, Type::TEXT),
                        (&lease.host, Type::TEXT),
                        (&lease.run_id, Type::TEXT),
                        (&lease.token, Type::INT8),
                        (&ms, Type::INT8),
                        (&self.replica, Type::TEXT),
                        (&mutating, Type::BOOL),
                        (scopes, Type::TEXT_ARRAY),
                        (windows, Type::INT8_ARRAY),
                        (keep, Type::INT8),
                    ],
                )
                .await
            })
            .await?;
        let row = one(rows, "fencing the call")?;
        let scopes: Option<Vec<String>> = row.get(1);
        let left: Option<Vec<Option<i64>>> = row.get(2);
        let details: Option<Vec<String>> = row.get(3);
        let used: Option<Vec<i64>> = row.get(4);
        Ok(Proved {
            lost: row.get(0),
            switches: scopes
                .unwrap_or_default()
                .into_iter()
                .zip(left.unwrap_or_default())
                .zip(details.unwrap_or_default())
                .map(|((scope, left), detail)| (scope, left, detail))
                .collect(),
            used: used.unwrap_or_default(),
            reserved: row.get(5),
        })
    }

    /// A reserved call the rules refused no longer counts against the
    /// fleet budgets.
    pub(crate) async fn give_back(&self, reserved: i64) -> Result<(), StoreError> {
        self.with("giving back a refused call", |c| async move {
            c.execute_typed(
                "DELETE FROM runwarden_fleet_calls WHERE id = $1",
                &[(&reserved, Type::INT8)],
            )
            .await
        })
        .await
        .map(drop)
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
    /// starts the cooldown, unless `dry_run`: it changed nothing), unless
    /// another claim has taken over.
    pub(crate) async fn finish(
        &self,
        lease: &crate::store::LeaseId,
        verdict: &str,
        audit_head: &str,
        dry_run: bool,
    ) -> Result<(), StoreError> {
        self.with("recording the verdict", |c| async move {
            c.execute(
                "WITH ended AS (UPDATE runwarden_runs SET status = 'ended', verdict = $2, audit_head = $3,
                         ended_at = clock_timestamp()
                     WHERE run_id = $1 AND status = 'running' RETURNING run_id)
                 UPDATE runwarden_leases SET expires_at = NULL, run_id = NULL,
                        ended_at = CASE WHEN $7 THEN ended_at ELSE clock_timestamp() END
                     WHERE runbook = $4 AND host = $5 AND token = $6",
                &[&lease.run_id, &verdict, &audit_head, &lease.runbook, &lease.host, &lease.token, &dry_run],
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

    /// How long ago each run of `runbook` started within `per`, by host
    /// (the fleet's rows, on the database's clock): what
    /// [`crate::rules::admission::capped`] decides `max_runs` on.
    pub(crate) async fn recent_starts(
        &self,
        runbook: &str,
        per: Duration,
    ) -> Result<Vec<(String, Vec<Duration>)>, StoreError> {
        let ms = millis(per);
        let rows = self
            .with("counting the fleet's recent runs", |c| async move {
                c.query(
                    "SELECT host, array_agg((extract(epoch FROM clock_timestamp() - started_at) * 1000)::bigint)
                     FROM runwarden_runs
                     WHERE runbook = $1 AND recorded AND status <> 'not_started'
                       AND started_at > clock_timestamp() - $2::bigint * interval '1 millisecond'
                     GROUP BY host ORDER BY host",
                    &[&runbook, &ms],
                )
                .await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let ago: Vec<i64> = r.get(1);
                let ago = ago
                    .into_iter()
                    .map(|ms| Duration::from_millis(ms.max(0) as u64))
                    .collect();
                (r.get(0), ago)
            })
            .collect())
    }

    /// Forget triggers, ended runs, approval requests and rollouts over older than `age`
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
                            WHERE expires_at < clock_timestamp() - $1 * interval '1 millisecond'),
                      o AS (DELETE FROM runwarden_rollouts WHERE state IN ('aborted', 'finished')
                            AND updated_at < clock_timestamp() - $1 * interval '1 millisecond')
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

/// What the database reports of a call's lease, kill switches and fleet
/// budgets, for the rules to decide on.
#[derive(Debug)]
pub(crate) struct Proved {
    /// Why the lease is not the run's any more; then nothing else was done.
    pub(crate) lost: Option<String>,
    /// The fleet's kill switches engaged for `global` or the runbook:
    /// scope, milliseconds left (`None`: untimed), what a person reads.
    pub(crate) switches: Vec<(String, Option<i64>, String)>,
    /// Each fleet budget's calls in its window before this one, in the
    /// order of [`Budgets`] (empty for a tier-1 call).
    pub(crate) used: Vec<i64>,
    /// The call's reservation, when it counts against fleet budgets.
    pub(crate) reserved: Option<i64>,
}

impl Proved {
    /// What the rules make of it: the refusal, if any. The kill switch
    /// first, then the budgets.
    pub(crate) fn refusal(
        &self,
        runbook: &str,
        budgets: &Budgets,
    ) -> Option<(crate::gate::DenyReason, String)> {
        use crate::gate::DenyReason;
        use crate::rules::{budget, kill_switch};
        let switches: Vec<kill_switch::Switch<'_>> = self
            .switches
            .iter()
            .map(|(scope, left, _)| kill_switch::Switch::of_millis(scope, *left))
            .collect();
        if let Some(i) = kill_switch::stops(&switches, Some(runbook)) {
            return Some((DenyReason::KillSwitch, self.switches[i].2.clone()));
        }
        let windows: Vec<budget::Window<'_>> = budgets
            .each()
            .zip(&self.used)
            .map(|((runbook, budget), used)| budget::Window {
                budget,
                runbook,
                used: usize::try_from(*used).unwrap_or(usize::MAX),
            })
            .collect();
        budget::spend(&windows)
            .err()
            .map(|spent| (DenyReason::FleetBudget, spent.to_string()))
    }
}

/// The fence against a PostgreSQL cluster of its own (the root tier:
/// `--features estate`, as root), beside the previous version's
/// `runwarden_fence`, which decides in SQL: one budget and one kill switch
/// for both during a rolling upgrade, decided alike.
#[cfg(all(test, feature = "estate"))]
mod tests {
    use std::time::Duration;

    use crate::config::runbook::FleetBudget;
    use crate::gate::DenyReason;
    use crate::store::{Budgets, Lease};
    use crate::test_pg as pg;

    /// A fresh (runbook `rb`, `host`) admitted as `run` the previous
    /// version's way (token 1), and this version's lease of it.
    fn claimed(
        pg: &pg::Pg,
        store: &std::sync::Arc<super::Postgres>,
        host: &str,
        run: &str,
    ) -> Lease {
        let outcome = pg.sql(&format!(
            "SELECT outcome FROM runwarden_admit_all(ARRAY['rb'], ARRAY['{host}'], ARRAY['[\"fp:{host}\"]'], ARRAY[NULL::bigint], ARRAY['{run}'], 'old', 30000, ARRAY['alert'], 60000, ARRAY[NULL::integer], ARRAY[NULL::bigint], ARRAY['{{}}'], 1, NULL, false)"
        ));
        assert_eq!(outcome, "started");
        store.lease("rb", host, run, 1)
    }

    /// What the previous version's fence says of a tier-2 call of `run`
    /// on `host` under a fleet budget of three an hour.
    fn old_fence(pg: &pg::Pg, host: &str, run: &str) -> String {
        pg.sql(&format!(
            "SELECT verdict FROM runwarden_fence('rb', '{host}', '{run}', 1, 30000, 'old', true, ARRAY[NULL]::text[], ARRAY[3]::bigint[], ARRAY[3600000]::bigint[], 86400000)"
        ))
    }

    fn counted(pg: &pg::Pg) -> String {
        pg.sql("SELECT count(*) FROM runwarden_fleet_calls")
    }

    const THREE_AN_HOUR: FleetBudget = FleetBudget {
        max_mutations: 3,
        per: Duration::from_secs(3600),
    };

    #[tokio::test]
    async fn one_fleet_budget_for_both_versions_and_a_refused_call_is_given_back() {
        let pg = pg::Pg::start();
        let (_dir, store) = crate::store::migrated(&pg, "new").await;
        let budgets = Budgets::new(Some(THREE_AN_HOUR), "rb", None);
        let old = claimed(&pg, &store, "h1", "old-run");
        drop(old);
        let new = claimed(&pg, &store, "h2", "new-run");
        assert_eq!(old_fence(&pg, "h1", "old-run"), "ok");
        assert_eq!(new.fence(true, &budgets).await, Ok(()));
        // A tier-1 call spends nothing.
        assert_eq!(new.fence(false, &budgets).await, Ok(()));
        assert_eq!(new.fence(true, &budgets).await, Ok(()));
        assert_eq!(counted(&pg), "3");
        let (reason, detail) = new.fence(true, &budgets).await.unwrap_err();
        assert_eq!(reason, DenyReason::FleetBudget);
        assert!(
            detail.contains("every runbook's 3 tier-2 calls in 1h are taken"),
            "{detail}"
        );
        assert_eq!(counted(&pg), "3", "the refused call was given back");
        assert_eq!(old_fence(&pg, "h1", "old-run"), "fleet_budget");
        // The runbook's own budget is asked after runwarden.yaml's.
        let own = Budgets::new(
            None,
            "rb",
            Some(FleetBudget {
                max_mutations: 4,
                ..THREE_AN_HOUR
            }),
        );
        assert_eq!(new.fence(true, &own).await, Ok(()));
        let (_, detail) = new.fence(true, &own).await.unwrap_err();
        assert!(detail.contains("runbook \"rb\"'s"), "{detail}");
        assert_eq!(counted(&pg), "4");
    }

    #[tokio::test]
    async fn the_fleets_kill_switch_stops_a_call_while_in_force_the_global_one_named_first() {
        let pg = pg::Pg::start();
        let (_dir, store) = crate::store::migrated(&pg, "new").await;
        let budgets = Budgets::new(Some(THREE_AN_HOUR), "rb", None);
        let run = claimed(&pg, &store, "h1", "run");
        // Ended, and not yet swept: it stops nothing.
        pg.sql("INSERT INTO runwarden_kill_switch (scope, engaged_by, reason, until) VALUES ('rb', 'ann', 'INC-1', clock_timestamp() - interval '1 second')");
        assert_eq!(run.fence(true, &budgets).await, Ok(()));
        assert_eq!(counted(&pg), "1");
        pg.sql("UPDATE runwarden_kill_switch SET until = clock_timestamp() + interval '1 hour'");
        let (reason, detail) = run.fence(true, &budgets).await.unwrap_err();
        assert_eq!(reason, DenyReason::KillSwitch);
        assert!(
            detail.contains("(rb) by ann") && detail.contains("INC-1"),
            "{detail}"
        );
        assert_eq!(counted(&pg), "1", "a stopped call spends nothing");
        pg.sql("INSERT INTO runwarden_kill_switch (scope, engaged_by, reason) VALUES ('global', 'bob', 'INC-2')");
        let (reason, detail) = run.fence(false, &budgets).await.unwrap_err();
        assert_eq!(reason, DenyReason::KillSwitch);
        assert!(detail.contains("(global) by bob"), "{detail}");
        pg.sql("DELETE FROM runwarden_kill_switch");
        assert_eq!(run.fence(true, &budgets).await, Ok(()));
        assert_eq!(counted(&pg), "2");
    }

    /// A lease taken over proves nothing and reserves nothing.
    #[tokio::test]
    async fn a_lost_lease_reserves_nothing() {
        let pg = pg::Pg::start();
        let (_dir, store) = crate::store::migrated(&pg, "new").await;
        let budgets = Budgets::new(Some(THREE_AN_HOUR), "rb", None);
        let run = claimed(&pg, &store, "h1", "run");
        pg.sql("UPDATE runwarden_leases SET token = 2, run_id = 'other'");
        let (reason, detail) = run.fence(true, &budgets).await.unwrap_err();
        assert_eq!(reason, DenyReason::LeaseLost);
        assert!(detail.contains("taken over"), "{detail}");
        assert_eq!(counted(&pg), "0");
    }
}

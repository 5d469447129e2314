//! Rollouts the fleet shares (`migrations/0013_rollouts.sql`): one row a
//! rollout, driven by one replica under a token that only grows, so a
//! replica that stopped renewing can never write over the one that took
//! the rollout over.
//!
//! The row's `status` is the rollout as its driver last wrote it, a JSON
//! text this module does not read: the rollout module owns its shape.

use tokio_postgres::types::Type;

use super::{Postgres, millis};
use crate::store::StoreError;

/// What became of a rollout's first row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Begun {
    /// Written: this replica drives it, under `token`.
    Started { token: i64 },
    /// Another replica began a rollout for the same schedule fire.
    FireTaken { id: String },
    /// Another rollout of the runbook is not over.
    Going { id: String, state: String },
}

/// A rollout this replica took over from one that stopped renewing it.
#[derive(Debug, Clone)]
pub(crate) struct RolloutTaken {
    pub(crate) id: String,
    pub(crate) token: i64,
    /// Its status, as its last driver wrote it.
    pub(crate) status: String,
    /// A person's decision its last driver had not applied.
    pub(crate) decision: Option<String>,
    /// The replica that drove it.
    pub(crate) was: String,
}

/// What a person's decision taken through this replica met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decided {
    /// Recorded for its driver to apply; the rollout's status as written.
    Waiting { status: String, driver: String },
    /// No rollout has that id (or prefix).
    NotFound,
    /// It is in `state`, which the decision does not apply to.
    State(String),
    /// An earlier decision on it has not been applied yet.
    Pending,
}

/// How a run of the fleet ended, as `runwarden_runs` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunEnd {
    pub(crate) run_id: String,
    /// `ended`, `interrupted` or `not_started`.
    pub(crate) status: String,
    pub(crate) verdict: Option<String>,
}

/// The states a rollout is over in.
const OVER: &str = "('aborted', 'finished')";

impl Postgres {
    /// Write rollout `id`'s first row, driven by this replica; `fire`, the
    /// schedule fire it answers, is taken once for the fleet.
    pub(crate) async fn rollout_begin(
        &self,
        id: &str,
        runbook: &str,
        fire: Option<&str>,
        state: &str,
        status: &str,
    ) -> Result<Begun, StoreError> {
        let lease = millis(self.lease);
        let replica = self.replica.as_str();
        self.with("beginning a rollout", |c| async move {
            let written = c
                .query_typed(
                    "INSERT INTO runwarden_rollouts (id, runbook, fire, state, status, driver, expires_at)
                     VALUES ($1, $2, $3, $4, $5::jsonb, $6, clock_timestamp() + $7 * interval '1 millisecond')
                     ON CONFLICT DO NOTHING RETURNING token",
                    &[
                        (&id, Type::TEXT),
                        (&runbook, Type::TEXT),
                        (&fire, Type::TEXT),
                        (&state, Type::TEXT),
                        (&status, Type::TEXT),
                        (&replica, Type::TEXT),
                        (&lease, Type::INT8),
                    ],
                )
                .await?;
            if let Some(row) = written.first() {
                return Ok(Begun::Started { token: row.get(0) });
            }
            let other = c
                .query_typed(
                    &format!(
                        "SELECT id, state, fire IS NOT DISTINCT FROM $2 AND $2 IS NOT NULL
                         FROM runwarden_rollouts
                         WHERE (fire = $2) OR (runbook = $1 AND state NOT IN {OVER})
                         ORDER BY 3 DESC LIMIT 1"
                    ),
                    &[(&runbook, Type::TEXT), (&fire, Type::TEXT)],
                )
                .await?;
            Ok(match other.first() {
                Some(r) if r.get::<_, bool>(2) => Begun::FireTaken { id: r.get(0) },
                Some(r) => Begun::Going {
                    id: r.get(0),
                    state: r.get(1),
                },
                // The other ended between the two statements.
                None => Begun::Going {
                    id: String::new(),
                    state: "finished".into(),
                },
            })
        })
        .await
    }

    /// Write rollout `id`'s status and renew this replica's hold on it, in
    /// one statement fenced by `token`; `applied`, a decision the driver
    /// has now applied, is cleared. `None`: another replica drives it now.
    /// Otherwise the decision waiting for it, if any.
    pub(crate) async fn rollout_write(
        &self,
        id: &str,
        token: i64,
        state: &str,
        status: &str,
        applied: Option<&str>,
    ) -> Result<Option<Option<String>>, StoreError> {
        let lease = millis(self.lease);
        let replica = self.replica.as_str();
        let rows = self
            .with("writing a rollout's status", |c| async move {
                c.query_typed(
                    "UPDATE runwarden_rollouts
                     SET state = $3, status = $4::jsonb, updated_at = clock_timestamp(),
                         expires_at = clock_timestamp() + $5 * interval '1 millisecond',
                         decision = CASE WHEN decision::text = $6 THEN NULL ELSE decision END
                     WHERE id = $1 AND token = $2 AND driver = $7
                     RETURNING decision::text",
                    &[
                        (&id, Type::TEXT),
                        (&token, Type::INT8),
                        (&state, Type::TEXT),
                        (&status, Type::TEXT),
                        (&lease, Type::INT8),
                        (&applied, Type::TEXT),
                        (&replica, Type::TEXT),
                    ],
                )
                .await
            })
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    /// Take over the unfinished rollouts of `runbooks` whose driver stopped
    /// renewing them (one taker each), this replica their driver now.
    pub(crate) async fn rollouts_take(
        &self,
        runbooks: &[String],
    ) -> Result<Vec<RolloutTaken>, StoreError> {
        let lease = millis(self.lease);
        let replica = self.replica.as_str();
        let rows = self
            .with("taking over rollouts", |c| async move {
                c.query_typed(
                    &format!(
                        "WITH t AS (SELECT id, driver FROM runwarden_rollouts
                                    WHERE state NOT IN {OVER} AND expires_at < clock_timestamp()
                                      AND runbook = ANY($3)
                                    FOR UPDATE SKIP LOCKED)
                         UPDATE runwarden_rollouts r
                         SET driver = $1, token = r.token + 1, updated_at = clock_timestamp(),
                             expires_at = clock_timestamp() + $2 * interval '1 millisecond'
                         FROM t WHERE r.id = t.id
                         RETURNING r.id, r.token, r.status::text, r.decision::text, t.driver"
                    ),
                    &[
                        (&replica, Type::TEXT),
                        (&lease, Type::INT8),
                        (&runbooks, Type::TEXT_ARRAY),
                    ],
                )
                .await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| RolloutTaken {
                id: r.get(0),
                token: r.get(1),
                status: r.get(2),
                decision: r.get(3),
                was: r.get(4),
            })
            .collect())
    }

    /// The fleet's rollouts, newest first (at most `limit`): each one's
    /// status as its driver last wrote it, and its driver.
    pub(crate) async fn rollouts(&self, limit: i64) -> Result<Vec<(String, String)>, StoreError> {
        let rows = self
            .with("listing the fleet's rollouts", |c| async move {
                c.query_typed(
                    "SELECT status::text, driver FROM runwarden_rollouts ORDER BY id DESC LIMIT $1",
                    &[(&limit, Type::INT8)],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// The rollouts whose id starts with `prefix` (at most two: one is an
    /// answer, two an ambiguous prefix): status and driver.
    pub(crate) async fn rollouts_like(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        // Ids are UUIDs: anything else finds nothing (and no LIKE pattern).
        if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Ok(Vec::new());
        }
        let pattern = format!("{prefix}%");
        let pattern = pattern.as_str();
        let rows = self
            .with("reading a rollout", |c| async move {
                c.query_typed(
                    "SELECT status::text, driver FROM runwarden_rollouts WHERE id LIKE $1 ORDER BY id LIMIT 2",
                    &[(&pattern, Type::TEXT)],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Record a person's decision (`decision`, JSON with its `verb`) on
    /// rollout `id` for its driver to apply: `resume` only when halted,
    /// `abort` while not over, one decision at a time.
    pub(crate) async fn rollout_decide(
        &self,
        id: &str,
        resume: bool,
        decision: &str,
    ) -> Result<Decided, StoreError> {
        self.with("recording a decision on a rollout", |c| async move {
            let rows = c
                .query_typed(
                    &format!(
                        "UPDATE runwarden_rollouts SET decision = $2::jsonb, updated_at = clock_timestamp()
                         WHERE id = $1 AND decision IS NULL
                           AND (CASE WHEN $3 THEN state = 'halted' ELSE state NOT IN {OVER} END)
                         RETURNING status::text, driver"
                    ),
                    &[
                        (&id, Type::TEXT),
                        (&decision, Type::TEXT),
                        (&resume, Type::BOOL),
                    ],
                )
                .await?;
            if let Some(r) = rows.first() {
                return Ok(Decided::Waiting {
                    status: r.get(0),
                    driver: r.get(1),
                });
            }
            let now = c
                .query_typed(
                    "SELECT state, decision IS NOT NULL FROM runwarden_rollouts WHERE id = $1",
                    &[(&id, Type::TEXT)],
                )
                .await?;
            Ok(match now.first() {
                None => Decided::NotFound,
                Some(r) if r.get::<_, bool>(1) => Decided::Pending,
                Some(r) => Decided::State(r.get(0)),
            })
        })
        .await
    }

    /// Every trigger of `runbook` that carried `key` (a rollout's), oldest
    /// first: its host, its outcome and the run it started.
    pub(crate) async fn triggers_keyed(
        &self,
        runbook: &str,
        key: &str,
    ) -> Result<Vec<(String, String, Option<String>)>, StoreError> {
        let rows = self
            .with("reading a rollout's triggers", |c| async move {
                c.query_typed(
                    "SELECT host, outcome, run_id FROM runwarden_triggers
                     WHERE runbook = $1 AND keys @> ARRAY[$2] ORDER BY id",
                    &[(&runbook, Type::TEXT), (&key, Type::TEXT)],
                )
                .await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// Those of `run_ids` that are over, wherever they ran.
    pub(crate) async fn runs_ended(&self, run_ids: &[String]) -> Result<Vec<RunEnd>, StoreError> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .with("reading how runs ended", |c| async move {
                c.query_typed(
                    "SELECT run_id, status, verdict FROM runwarden_runs
                     WHERE run_id = ANY($1) AND status NOT IN ('running', 'queued')",
                    &[(&run_ids, Type::TEXT_ARRAY)],
                )
                .await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| RunEnd {
                run_id: r.get(0),
                status: r.get(1),
                verdict: r.get(2),
            })
            .collect())
    }
}

/// Against a real PostgreSQL (the estate tier): the fence, the one
/// taker, decisions and the one-going rule.
#[cfg(all(test, feature = "estate"))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rollout_is_driven_by_one_replica_and_taken_over_once_its_driver_stops() {
        let pg = crate::test_pg::Pg::start();
        let (_da, a) = crate::store::leased(&pg, "a", Duration::from_millis(600)).await;
        let (_db, b) = crate::store::leased(&pg, "b", Duration::from_millis(600)).await;
        let status = r#"{"state":"running"}"#;
        let Begun::Started { token } = a
            .rollout_begin("0001", "weekly", Some("weekly cron:1"), "running", status)
            .await
            .unwrap()
        else {
            panic!("not started");
        };
        // The same fire on another replica, and a second rollout of the runbook.
        assert_eq!(
            b.rollout_begin("0002", "weekly", Some("weekly cron:1"), "running", status)
                .await
                .unwrap(),
            Begun::FireTaken { id: "0001".into() }
        );
        assert_eq!(
            b.rollout_begin("0003", "weekly", None, "running", status)
                .await
                .unwrap(),
            Begun::Going {
                id: "0001".into(),
                state: "running".into()
            }
        );
        // Renewed: nobody takes it.
        assert_eq!(
            a.rollout_write("0001", token, "halted", status, None)
                .await
                .unwrap(),
            Some(None)
        );
        assert!(
            b.rollouts_take(&["weekly".into()])
                .await
                .unwrap()
                .is_empty()
        );
        // A decision through b waits for a; a second one is refused.
        let d = r#"{"verb":"resume","by":"ann","reason":"checked"}"#;
        assert!(matches!(
            b.rollout_decide("0001", true, d).await.unwrap(),
            Decided::Waiting { .. }
        ));
        assert_eq!(
            b.rollout_decide("0001", false, d).await.unwrap(),
            Decided::Pending
        );
        assert_eq!(
            b.rollout_decide("0009", true, d).await.unwrap(),
            Decided::NotFound
        );
        // a stops renewing: b takes it, with the decision a never applied.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let taken = b.rollouts_take(&["weekly".into()]).await.unwrap();
        assert_eq!(taken.len(), 1, "{taken:?}");
        assert_eq!(taken[0].token, token + 1);
        assert_eq!(taken[0].was, a.replica);
        let waiting = taken[0].decision.clone().expect("the decision waits");
        assert!(
            b.rollouts_take(&["weekly".into()])
                .await
                .unwrap()
                .is_empty()
        );
        // a's next write is fenced off; b's clears the decision it applied.
        assert_eq!(
            a.rollout_write("0001", token, "running", status, None)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            b.rollout_write("0001", token + 1, "running", status, Some(&waiting))
                .await
                .unwrap(),
            Some(None)
        );
        // Over: a new rollout of the runbook may begin.
        b.rollout_write("0001", token + 1, "finished", status, None)
            .await
            .unwrap();
        assert_eq!(
            b.rollout_decide("0001", false, d).await.unwrap(),
            Decided::State("finished".into())
        );
        assert!(matches!(
            a.rollout_begin("0004", "weekly", None, "running", status)
                .await
                .unwrap(),
            Begun::Started { .. }
        ));
        assert_eq!(a.rollouts_like("000").await.unwrap().len(), 2);
        assert_eq!(a.rollouts_like("0004").await.unwrap().len(), 1);
        assert!(a.rollouts_like("0%").await.unwrap().is_empty());
    }
}

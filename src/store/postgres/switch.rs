//! The fleet's kill switch (engaged, timed, released, published per
//! replica) and its demotions (a failure recorded, a runbook promoted).

use std::time::Duration;

use super::listen::{demotions_on, switches_on};
use super::{KILL_SWITCH_CHANNEL, Postgres, millis};
use crate::gate::demotion::{Demotion, Failure, PromoteRefused};
use crate::rules::demotion as rules;
use crate::store::StoreError;

impl Postgres {
    /// Engage the fleet's switch for `scope`, for `for_` from now by the
    /// database's clock (`None`: until released), never weakening one in
    /// force: an untimed switch stays untimed, of two timed ones the later
    /// end wins, and the earlier reason is kept. Returns when it ends now
    /// and the database's clock, so the caller can tell its own skew.
    pub(crate) async fn engage(
        &self,
        scope: &str,
        by: &str,
        reason: &str,
        for_: Option<Duration>,
    ) -> Result<Engaged, StoreError> {
        let secs = for_.map(|d| d.as_secs_f64());
        let row = self
            .with("engaging the fleet's kill switch", |c| async move {
                c.query_one(
                    "WITH s AS (INSERT INTO runwarden_kill_switch AS k (scope, engaged_by, reason, until)
                         VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $5::float8))
                         ON CONFLICT (scope) DO UPDATE SET
                             engaged_by = $2,
                             engaged_at = clock_timestamp(),
                             reason = CASE WHEN k.until IS NULL OR k.until > clock_timestamp()
                                 THEN left($3 || ' (earlier: ' || k.engaged_by || ': ' || k.reason || ')', 4000)
                                 ELSE $3 END,
                             until = CASE
                                 WHEN k.until IS NOT NULL AND k.until <= clock_timestamp() THEN EXCLUDED.until
                                 WHEN k.until IS NULL OR EXCLUDED.until IS NULL THEN NULL
                                 ELSE greatest(k.until, EXCLUDED.until) END
                         RETURNING scope, until)
                     SELECT s.until::text, clock_timestamp()::text, pg_notify($4, s.scope) FROM s",
                    &[&scope, &by, &reason, &KILL_SWITCH_CHANNEL, &secs],
                )
                .await
            })
            .await?;
        let until: Option<String> = row.get(0);
        let now: String = row.get(1);
        let parse = |t: &str| {
            t.replace(' ', "T")
                .parse::<jiff::Timestamp>()
                .map_err(|e| StoreError::Database(format!("the database's time {t:?}: {e}")))
        };
        Ok(Engaged {
            until: until.as_deref().map(parse).transpose()?,
            clock: parse(&now)?,
        })
    }

    /// Remove the fleet's timed switches whose time has come; what was
    /// removed (by this replica: of racing replicas, one removes each).
    pub(crate) async fn sweep_expired(
        &self,
    ) -> Result<Vec<crate::gate::killswitch::Expired>, StoreError> {
        self.with("ending the fleet's timed kill switches", |c| async move {
            c.query(
                "WITH s AS (DELETE FROM runwarden_kill_switch WHERE until <= clock_timestamp()
                     RETURNING scope, engaged_by, reason, until::text)
                 SELECT s.*, pg_notify($1, s.scope) FROM s",
                &[&KILL_SWITCH_CHANNEL],
            )
            .await
        })
        .await
        .map(|rows| {
            rows.iter()
                .filter_map(|r| {
                    Some(crate::gate::killswitch::Expired {
                        scope: r.get(0),
                        engaged_by: r.get(1),
                        reason: r.get(2),
                        until: r.get::<_, String>(3).replace(' ', "T").parse().ok()?,
                    })
                })
                .collect()
        })
    }

    /// Publish this replica's own switch files (scope, what they say), so
    /// the others can say what still stops runs here.
    pub(crate) async fn publish_switches(
        &self,
        engaged: &[(String, String)],
    ) -> Result<(), StoreError> {
        let replica = self.replica.clone();
        let scopes: Vec<String> = engaged.iter().map(|(s, _)| s.clone()).collect();
        let details: Vec<String> = engaged.iter().map(|(_, d)| d.clone()).collect();
        self.with("publishing this replica's kill switch", |c| {
            let (replica, scopes, details) = (replica.clone(), scopes.clone(), details.clone());
            async move {
                c.execute(
                    "WITH gone AS (DELETE FROM runwarden_replica_switches WHERE replica = $1)
                     INSERT INTO runwarden_replica_switches (replica, scope, detail)
                     SELECT $1, s, d FROM unnest($2::text[], $3::text[]) AS u(s, d)
                     ON CONFLICT (replica, scope) DO UPDATE SET detail = excluded.detail, seen_at = clock_timestamp()",
                    &[&replica, &scopes, &details],
                )
                .await
            }
        })
        .await
        .map(drop)
    }

    /// Every replica's own switch files, as each last published them.
    pub(crate) async fn replica_switches(
        &self,
    ) -> Result<Vec<crate::store::ReplicaSwitch>, StoreError> {
        self.with("reading the replicas' kill switches", |c| async move {
            c.query(
                "SELECT replica, scope, detail, seen_at::text FROM runwarden_replica_switches ORDER BY replica, scope",
                &[],
            )
            .await
        })
        .await
        .map(|rows| {
            rows.iter()
                .map(|r| crate::store::ReplicaSwitch {
                    replica: r.get(0),
                    scope: r.get(1),
                    detail: format!("{} (published {})", r.get::<_, String>(2), r.get::<_, String>(3)),
                })
                .collect()
        })
    }

    /// Release the fleet's switch for `scope`; `false`: it was not engaged.
    pub(crate) async fn release(&self, scope: &str) -> Result<bool, StoreError> {
        self.with("releasing the fleet's kill switch", |c| async move {
            c.query(
                "WITH s AS (DELETE FROM runwarden_kill_switch WHERE scope = $1 RETURNING scope)
                 SELECT pg_notify($2, scope) FROM s",
                &[&scope, &KILL_SWITCH_CHANNEL],
            )
            .await
            .map(|rows| !rows.is_empty())
        })
        .await
    }

    /// The fleet's engaged switches: scope, and what a person reads.
    pub(crate) async fn switches(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.with("reading the fleet's kill switch", |c| async move {
            switches_on(&c).await
        })
        .await
        .map(|list| {
            list.into_iter()
                .map(|(scope, detail, _)| (scope, detail))
                .collect()
        })
    }

    /// Record a failed run of a runbook with `demote_after`; the demotion
    /// if this failure reached it (of racing replicas, exactly one does).
    /// The database keeps the failure and reports the runbook's; the rule
    /// ([`rules::demotes`]) decides, and a demotion it decides on is kept
    /// unless another replica's was first.
    pub(crate) async fn record_failure(
        &self,
        failure: &Failure,
        rule: crate::config::DemoteAfter,
    ) -> Result<Option<Demotion>, StoreError> {
        let as_json =
            |what: &str, e: serde_json::Error| StoreError::Database(format!("{what} as JSON: {e}"));
        let evidence = serde_json::to_string(failure).map_err(|e| as_json("the failure", e))?;
        let keep = millis(crate::config::MaxRuns::LONGEST);
        let row = self
            .with("recording a failed run", |c| {
                let evidence = evidence.clone();
                async move {
                    c.query_one(
                        "SELECT demoted, run_ids, ago_ms FROM runwarden_failed($1, $2, $3::text::jsonb, $4)",
                        &[&failure.run_id, &failure.runbook, &evidence, &keep],
                    )
                    .await
                }
            })
            .await?;
        let (demoted, run_ids, ago): (bool, Vec<String>, Vec<i64>) =
            (row.get(0), row.get(1), row.get(2));
        let ago: Vec<Duration> = ago
            .iter()
            .map(|ms| Duration::from_millis(u64::try_from(*ms).unwrap_or(0)))
            .collect();
        if !rules::demotes(demoted, &ago, rule) {
            return Ok(None);
        }
        // The evidence: the failures the rule counted, oldest first.
        let counted: Vec<&String> = run_ids
            .iter()
            .zip(&ago)
            .filter(|(_, ago)| rules::counts(**ago, rule))
            .map(|(id, _)| id)
            .collect();
        let kept: String = self
            .with("reading a demotion's evidence", |c| {
                let counted = counted.clone();
                async move {
                    c.query_one(
                        "SELECT coalesce(jsonb_agg(evidence ORDER BY failed_at), '[]')::text \
                         FROM runwarden_failures WHERE run_id = ANY($1)",
                        &[&counted],
                    )
                    .await
                    .map(|r| r.get(0))
                }
            })
            .await?;
        let demotion = Demotion {
            runbook: failure.runbook.clone(),
            since: jiff::Timestamp::now().to_string(),
            by: self.replica.clone(),
            failures: rule.failures,
            per_secs: rule.per.as_secs(),
            evidence: serde_json::from_str(&kept)
                .map_err(|e| as_json("the failures counted", e))?,
        };
        let text = serde_json::to_string(&demotion).map_err(|e| as_json("the demotion", e))?;
        let per = millis(rule.per);
        let first: bool = self
            .with("keeping a demotion", |c| {
                let text = text.clone();
                async move {
                    c.query_one(
                        "SELECT runwarden_demote($1, $2::text::jsonb, $3)",
                        &[&failure.runbook, &text, &per],
                    )
                    .await
                    .map(|r| r.get(0))
                }
            })
            .await?;
        Ok(first.then_some(demotion))
    }

    /// The fleet's demoted runbooks now.
    pub(crate) async fn demotions(
        &self,
    ) -> Result<Vec<crate::gate::demotion::Demotion>, StoreError> {
        self.with("reading the fleet's demotions", |c| async move {
            demotions_on(&c).await
        })
        .await
    }

    /// A person restores `runbook`'s standing approval across the fleet:
    /// refused while its evidence is in its window
    /// ([`Demotion::window_holds`]), unless `force`. The demotion lifted is
    /// the one read: a newer one stays.
    pub(crate) async fn promote(
        &self,
        runbook: &str,
        force: bool,
    ) -> Result<Result<Demotion, PromoteRefused>, StoreError> {
        let text: Option<String> = self
            .with("reading a runbook's demotion", |c| async move {
                c.query_opt(
                    "SELECT demotion::text FROM runwarden_demotions WHERE runbook = $1",
                    &[&runbook],
                )
                .await
                .map(|r| r.map(|r| r.get(0)))
            })
            .await?;
        let Some(text) = text else {
            return Ok(Err(PromoteRefused::NotDemoted(runbook.to_string())));
        };
        let demotion: Demotion = serde_json::from_str(&text).map_err(|e| {
            StoreError::Database(format!("the demotion the database returned: {e}"))
        })?;
        if !force && demotion.window_holds() {
            return Ok(Err(PromoteRefused::WindowHolds(Box::new(demotion))));
        }
        let lifted: bool = self
            .with("promoting a runbook", |c| {
                let text = text.clone();
                async move {
                    c.query_one(
                        "SELECT runwarden_lift($1, $2::text::jsonb)",
                        &[&runbook, &text],
                    )
                    .await
                    .map(|r| r.get(0))
                }
            })
            .await?;
        self.demoted.set(self.demotions().await.unwrap_or_default());
        Ok(match lifted {
            true => Ok(demotion),
            false => Err(PromoteRefused::NotDemoted(runbook.to_string())),
        })
    }
}

/// The fleet's switch as an engage left it.
#[derive(Debug)]
pub(crate) struct Engaged {
    /// When it ends now (`None`: until released), by the database's clock.
    pub(crate) until: Option<jiff::Timestamp>,
    /// The database's clock when it was engaged.
    pub(crate) clock: jiff::Timestamp,
}

/// Demotion against a PostgreSQL cluster of its own (the root tier:
/// `--features estate`, as root), beside the previous version's
/// `runwarden_record_failure` and `runwarden_promote`, which decide in SQL:
/// failures of both count toward one demotion during a rolling upgrade.
#[cfg(all(test, feature = "estate"))]
mod tests {
    use std::time::Duration;

    use crate::config::DemoteAfter;
    use crate::gate::demotion::{Failure, PromoteRefused};
    use crate::test_pg as pg;

    const RULE: DemoteAfter = DemoteAfter {
        failures: 2,
        per: Duration::from_secs(3600),
    };

    fn failure(run: &str) -> Failure {
        Failure {
            run_id: run.into(),
            runbook: "rb".into(),
            host: format!("host-of-{run}"),
            at: jiff::Timestamp::now().to_string(),
            verdict: "failed".into(),
            detail: "not active after the restart".into(),
            calls: Vec::new(),
        }
    }

    /// The previous version records `run` failed: the demotion it
    /// reached, as text, or empty.
    fn old_failure(pg: &pg::Pg, run: &str) -> String {
        let evidence = serde_json::to_string(&failure(run)).unwrap();
        pg.sql(&format!(
            "SELECT runwarden_record_failure('{run}', 'rb', '{evidence}'::jsonb, 2, 3600000, 'old', 2678400000)"
        ))
    }

    #[tokio::test]
    async fn failures_of_both_versions_demote_once_and_a_promotion_waits_for_the_window() {
        let pg = pg::Pg::start();
        let (_dir, store) = crate::store::migrated(&pg, "new").await;
        assert_eq!(old_failure(&pg, "r1"), "");
        let demotion = store
            .record_failure(&failure("r2"), RULE)
            .await
            .unwrap()
            .expect("the second failure within the hour demotes");
        let evidence: Vec<&str> = demotion
            .evidence
            .iter()
            .map(|f| f.run_id.as_str())
            .collect();
        assert_eq!(
            evidence,
            ["r1", "r2"],
            "oldest first, the old version's too"
        );
        assert_eq!(demotion.by, "new");
        // Demoted already: neither version demotes again.
        assert_eq!(old_failure(&pg, "r3"), "");
        assert_eq!(
            store.record_failure(&failure("r4"), RULE).await.unwrap(),
            None
        );
        assert_eq!(
            store.demotions().await.unwrap(),
            std::slice::from_ref(&demotion)
        );
        // The evidence is in its window: both versions refuse, unless forced.
        let held = store.promote("rb", false).await.unwrap().unwrap_err();
        assert!(matches!(held, PromoteRefused::WindowHolds(_)), "{held}");
        assert_eq!(
            pg.sql("SELECT result FROM runwarden_promote('rb', false)"),
            "window"
        );
        assert_eq!(store.promote("rb", true).await.unwrap().unwrap(), demotion);
        assert_eq!(
            pg.sql("SELECT result FROM runwarden_promote('rb', true)"),
            "not_demoted"
        );
        assert!(matches!(
            store.promote("rb", true).await.unwrap(),
            Err(PromoteRefused::NotDemoted(_))
        ));
        // Promoted: the count starts again, for both.
        assert_eq!(
            store.record_failure(&failure("r5"), RULE).await.unwrap(),
            None
        );
        assert_ne!(old_failure(&pg, "r6"), "", "r5 and r6 demote again");
    }

    /// Replicas recording failures at once: exactly one demotes.
    #[tokio::test]
    async fn of_racing_failures_exactly_one_demotes() {
        let pg = pg::Pg::start();
        let (_dir, store) = crate::store::migrated(&pg, "new").await;
        let (_dir2, other) = crate::store::migrated(&pg, "other").await;
        let rule = DemoteAfter {
            failures: 1,
            ..RULE
        };
        let (a, b) = (failure("a"), failure("b"));
        let (x, y) = tokio::join!(
            store.record_failure(&a, rule),
            other.record_failure(&b, rule)
        );
        let demoted = [x.unwrap(), y.unwrap()];
        assert_eq!(demoted.iter().flatten().count(), 1, "{demoted:?}");
        assert_eq!(pg.sql("SELECT count(*) FROM runwarden_demotions"), "1");
    }
}

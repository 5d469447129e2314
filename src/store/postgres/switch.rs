//! The fleet's kill switch (engaged, timed, released, published per
//! replica) and its demotions (a failure recorded, a runbook promoted).

use std::time::Duration;

use super::listen::{demotions_on, switches_on};
use super::{KILL_SWITCH_CHANNEL, Postgres, millis};
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
    pub(crate) async fn record_failure(
        &self,
        failure: &crate::gate::demotion::Failure,
        rule: crate::config::DemoteAfter,
    ) -> Result<Option<crate::gate::demotion::Demotion>, StoreError> {
        let evidence = serde_json::to_string(failure)
            .map_err(|e| StoreError::Database(format!("the failure as JSON: {e}")))?;
        let (failures, per, keep) = (
            rule.failures as i32,
            millis(rule.per),
            millis(crate::config::MaxRuns::LONGEST),
        );
        let replica = self.replica.clone();
        let text: Option<String> = self
            .with("recording a failed run", |c| {
                let (evidence, replica) = (evidence.clone(), replica.clone());
                async move {
                    c.query_one(
                        "SELECT runwarden_record_failure($1, $2, $3::text::jsonb, $4, $5, $6, $7)::text",
                        &[&failure.run_id, &failure.runbook, &evidence, &failures, &per, &replica, &keep],
                    )
                    .await
                    .map(|r| r.get(0))
                }
            })
            .await?;
        text.map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| StoreError::Database(format!("the demotion the database returned: {e}")))
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

    /// A person restores `runbook`'s standing approval across the fleet.
    pub(crate) async fn promote(
        &self,
        runbook: &str,
        force: bool,
    ) -> Result<
        Result<crate::gate::demotion::Demotion, crate::gate::demotion::PromoteRefused>,
        StoreError,
    > {
        use crate::gate::demotion::PromoteRefused;
        let row = self
            .with("promoting a runbook", |c| async move {
                c.query_one(
                    "SELECT result, demotion::text FROM runwarden_promote($1, $2)",
                    &[&runbook, &force],
                )
                .await
            })
            .await?;
        let (result, demotion): (String, Option<String>) = (row.get(0), row.get(1));
        let demotion = demotion
            .map(|t| serde_json::from_str::<crate::gate::demotion::Demotion>(&t))
            .transpose()
            .map_err(|e| {
                StoreError::Database(format!("the demotion the database returned: {e}"))
            })?;
        self.demoted.set(self.demotions().await.unwrap_or_default());
        Ok(match (result.as_str(), demotion) {
            ("promoted", Some(d)) => Ok(d),
            ("window", Some(d)) => Err(PromoteRefused::WindowHolds(Box::new(d))),
            _ => Err(PromoteRefused::NotDemoted(runbook.to_string())),
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

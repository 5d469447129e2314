//! Admission across replicas: a notification's triggers decided under the
//! locks of their (runbook, host) rows in the shared PostgreSQL state, by
//! the same [`rules`] as this machine's own admission, and everything the
//! batch decided (its runs, their leases, each trigger's one outcome, what
//! the replica decided alone) written in the same transaction: two round
//! trips for the whole batch. A started run holds its lease, or waits in
//! the fleet's queue when this replica has no run permit free for it.
//!
//! The rest of what replicas agree on (a person's run's claim, failures
//! toward demotion, approval requests, the fleet's kill switch) goes to
//! the same database through [`Postgres`]'s operations.
//!
//! One file: a batch's reads, the rules' decisions on them and its writes
//! are one transaction under the rows' locks; the SQL and what is decided
//! on its answers read together.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Admitted, ApprovalState, Approvals, Ask, Decided, Decision, DecisionError, DemoteAfter,
    Demotion, Demotions, Failure, KillSwitch, Pending, PromoteRefused, Request, Settings,
    SharedState,
};
use crate::rules::admission::{self as rules, DUPLICATE_WINDOW, Holder};
use crate::rules::{TriggerResult, kill_switch};
use crate::store::StoreError;
use crate::store::{LeaseWrite, PairRow, Postgres, RunWrite, TriggerRow, Writes};
use crate::trigger::RunRequest;

/// The shared state of several daemons: PostgreSQL's.
pub(crate) struct Fleet {
    store: Arc<Postgres>,
    window: Duration,
}

impl Fleet {
    /// The fleet's state in `store`.
    pub(crate) fn new(store: Arc<Postgres>) -> Fleet {
        Fleet {
            store,
            window: DUPLICATE_WINDOW,
        }
    }
}

/// What the fleet made of one ask, before its lease is held.
enum Made {
    Started { token: i64 },
    Queued,
    Refused(TriggerResult),
}

impl SharedState for Fleet {
    fn admit<'a>(
        &'a self,
        asks: &'a [&'a Ask<'a>],
        decided: &'a [Decided<'a>],
        direct: usize,
    ) -> Pending<'a, Vec<Admitted>> {
        Box::pin(self.admit_batch(asks, decided, direct, true))
    }

    fn abandon<'a>(&'a self, started: &'a [(&'a RunRequest, String)]) -> Pending<'a, ()> {
        Box::pin(async move {
            let ids: Vec<String> = started.iter().map(|(_, id)| id.clone()).collect();
            give_back(&self.store, &ids).await;
            Ok(())
        })
    }

    /// See [`Postgres::recorded`]. Runs this replica queued become
    /// takeable: for them it tries for as long as a lease, and runs the
    /// fleet removed meanwhile (this replica took longer than a lease to
    /// record them) will not run, so the sender is told to send again.
    /// When every run is this replica's own, one try: those runs go on
    /// whatever the answer, and until they end a retry of their trigger is
    /// answered `pending` rather than lost.
    fn confirm<'a>(&'a self, started: &'a [String], handed: &'a [String]) -> Pending<'a, ()> {
        Box::pin(async move {
            let store = &self.store;
            if handed.is_empty() {
                if let Err(e) = store.recorded(started, &[]).await {
                    tracing::warn!(
                        "{} run(s) started here could not be confirmed to the fleet; they go on, and a trigger for their hosts is answered `pending` (retry) until they end: {e}",
                        started.len()
                    );
                }
                return Ok(());
            }
            let give_up = tokio::time::Instant::now() + store.lease;
            let marked = loop {
                match store.recorded(started, handed).await {
                    Ok(marked) => break marked,
                    Err(e) if tokio::time::Instant::now() >= give_up => {
                        tracing::error!(
                            "{} queued run(s) could not be handed to the fleet; they are removed after a lease and the sender is told to send again: {e}",
                            handed.len()
                        );
                        return Err(e);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            };
            if marked < handed.len() {
                let e = StoreError::Database(format!(
                    "{} of {} queued run(s) were removed before this replica handed them over (it took longer than a lease to record them); they do not run, and the sender is told to send again",
                    handed.len() - marked,
                    handed.len()
                ));
                tracing::error!("{e}");
                return Err(e);
            }
            Ok(())
        })
    }

    /// The run's lease ends with the run.
    fn ended(&self, _: &RunRequest, _: bool) {}

    fn queues(&self) -> bool {
        true
    }

    /// No cooldown, no trigger keys (so no duplicate window), its trigger
    /// on the person's terminal rather than a sender's retry (nothing to
    /// confirm). `Started` holds the run's lease; anything else says why
    /// it did not start.
    fn claim<'a>(&'a self, req: &'a RunRequest, run_id: &'a str) -> Pending<'a, Admitted> {
        Box::pin(async move {
            let ask = Ask {
                req,
                cooldown: None,
                cap: None,
                run_id: run_id.to_string(),
            };
            let mut admitted = self.admit_batch(&[&ask], &[], 1, false).await?;
            Ok(admitted
                .pop()
                .unwrap_or(Admitted::Refused(TriggerResult::Deduplicated)))
        })
    }

    fn record_failure<'a>(
        &'a self,
        _: &'a Settings,
        failure: Failure,
        rule: DemoteAfter,
    ) -> Pending<'a, Option<Demotion>> {
        Box::pin(async move { self.store.record_failure(&failure, rule).await })
    }

    /// The fleet's demotion lifted, or only this machine's record demotes:
    /// then this machine's goes too (forced: the fleet's word is the one
    /// that weighed the evidence).
    fn promote<'a>(
        &'a self,
        settings: &'a Settings,
        runbook: &'a str,
        force: bool,
    ) -> Pending<'a, Result<Demotion, PromoteRefused>> {
        Box::pin(async move {
            let fleet = self.store.promote(runbook, force).await?;
            if let Err(e) = &fleet
                && !matches!(e, PromoteRefused::NotDemoted(_))
            {
                return Ok(fleet);
            }
            let here = super::local::promote_here(settings, runbook, true).await?;
            Ok(match (fleet, here) {
                (Ok(d), _) | (_, Ok(d)) => Ok(d),
                (Err(e), Err(_)) => Err(e),
            })
        })
    }

    fn share_approval<'a>(&'a self, request: &'a Request) -> Pending<'a, ()> {
        Box::pin(async move {
            let expires = request
                .expires_at
                .parse()
                .unwrap_or_else(|_| jiff::Timestamp::now());
            self.store.publish_approval(request, expires).await
        })
    }

    fn close_approval<'a>(&'a self, request: &'a Request) -> Pending<'a, ()> {
        Box::pin(self.store.close_approval(&request.id, &request.state))
    }

    fn withdraw_approvals<'a>(
        &'a self,
        runbook: &'a str,
        host: &'a str,
        key: &'a str,
        state: &'a ApprovalState,
    ) -> Pending<'a, Vec<Request>> {
        Box::pin(self.store.withdraw_approvals(runbook, host, key, state))
    }

    fn restore(&self, _: &crate::audit::runs::Recovery, _: &std::path::Path) {}

    fn approvals<'a>(
        &'a self,
        _: Option<&'a Approvals>,
        id: Option<&'a str>,
    ) -> Pending<'a, Vec<Request>> {
        Box::pin(self.store.approvals(id))
    }

    fn decide_approval<'a>(
        &'a self,
        _: &'a Approvals,
        id: &'a str,
        d: &'a Decision<'a>,
    ) -> Pending<'a, Result<Request, DecisionError>> {
        Box::pin(async move {
            let comment = crate::gate::approvals::clean_comment(d.comment);
            let d = Decision {
                comment: &comment,
                ..*d
            };
            self.store.decide_approval(id, &d).await
        })
    }

    fn fleet_runs<'a>(
        &'a self,
        runbook: Option<&'a str>,
        host: Option<&'a str>,
        limit: i64,
    ) -> Pending<'a, Option<serde_json::Value>> {
        Box::pin(async move { self.store.fleet_runs(runbook, host, limit).await.map(Some) })
    }

    fn unhealthy(&self) -> Option<String> {
        self.store.unhealthy()
    }

    fn sweep_switches(&self) -> Pending<'_, Vec<crate::gate::killswitch::Expired>> {
        Box::pin(self.store.sweep_expired())
    }

    fn publish_switches<'a>(&'a self, engaged: &'a [(String, String)]) -> Pending<'a, ()> {
        Box::pin(self.store.publish_switches(engaged))
    }

    fn kill_switch(&self, dir: &std::path::Path) -> KillSwitch {
        KillSwitch::new(dir.to_path_buf()).with_fleet(Some(self.store.switch.clone()))
    }

    fn engage_switch<'a>(
        &'a self,
        ks: &'a KillSwitch,
        runbook: Option<&'a str>,
        by: &'a str,
        reason: &'a str,
        for_: Option<Duration>,
    ) -> Pending<'a, crate::gate::killswitch::Switched> {
        Box::pin(async move {
            let scope = runbook.unwrap_or(crate::rules::kill_switch::GLOBAL);
            match self.store.engage(scope, by, reason, for_).await {
                Ok(done) => Ok(crate::gate::killswitch::Switched {
                    scope: scope.to_string(),
                    until: done.until,
                    reach: "fleet",
                    warning: None,
                }),
                // A stop that cannot reach the fleet still stops here.
                Err(e) => {
                    let warning = format!(
                        "the fleet's switch was not reached ({e}): engaged on this replica only; engage it again when the database answers"
                    );
                    super::engage_file(ks, runbook, by, reason, for_, Some(warning)).await
                }
            }
        })
    }

    fn release_switch<'a>(
        &'a self,
        ks: &'a KillSwitch,
        runbook: Option<&'a str>,
    ) -> Pending<'a, bool> {
        Box::pin(async move {
            let here = super::release_file(ks, runbook)?;
            let scope = runbook.unwrap_or(crate::rules::kill_switch::GLOBAL);
            let fleet = self.store.release(scope).await?;
            Ok(here || fleet)
        })
    }

    fn switches<'a>(&'a self, ks: &'a KillSwitch) -> Pending<'a, Vec<(String, String)>> {
        Box::pin(async move {
            super::in_force(ks, Some(&self.store))
                .await
                .map_err(StoreError::Local)
        })
    }

    fn demotions(&self, settings: &Settings) -> Demotions {
        crate::audit::demotions(settings).with_fleet(Some(self.store.demoted.clone()))
    }
}

impl Fleet {
    /// [`SharedState::admit`], and with `confirm` the runs that start wait
    /// for this replica to say their triggers are on its disk
    /// ([`Postgres::recorded`]) before a retry of one is their duplicate.
    ///
    /// A batch PostgreSQL rolled back for a deadlock (its rows are locked
    /// in order, but the fleet's queue takes runs and updates their leases
    /// in its own order) wrote nothing: it is decided again from fresh
    /// rows, a few times, before the sender is told to retry.
    async fn admit_batch(
        &self,
        asks: &[&Ask<'_>],
        decided: &[Decided<'_>],
        direct: usize,
        confirm: bool,
    ) -> Result<Vec<Admitted>, crate::store::StoreError> {
        crate::store::again(|| self.admit_once(asks, decided, direct, confirm)).await
    }

    /// One try of [`admit_batch`](Self::admit_batch).
    async fn admit_once(
        &self,
        asks: &[&Ask<'_>],
        decided: &[Decided<'_>],
        direct: usize,
        confirm: bool,
    ) -> Result<Vec<Admitted>, crate::store::StoreError> {
        if asks.is_empty() {
            // Only what this replica decided alone: one statement records it.
            if !decided.is_empty() {
                self.store.record_triggers(&recorded(decided)).await?;
            }
            return Ok(Vec::new());
        }
        let mut pairs: Vec<(String, String)> = asks
            .iter()
            .map(|a| (a.req.runbook.clone(), a.req.host.clone()))
            .collect();
        pairs.sort();
        pairs.dedup();
        let within = asks
            .iter()
            .filter_map(|a| a.cap.map(|c| c.per))
            .max()
            .unwrap_or(Duration::ZERO);
        let mut batch = self.store.lock_batch(&pairs, fire_of(asks), within).await?;
        let mut writes = Writes {
            confirm,
            ..Writes::default()
        };
        writes.triggers = recorded(decided);
        let made = match batch.fire_taken {
            // Another replica decided this schedule's fire, and
            // recorded its hosts' outcomes.
            true => (0..asks.len())
                .map(|_| Made::Refused(TriggerResult::Deduplicated))
                .collect(),
            false => self.decide(asks, &mut batch.rows, direct, &mut writes),
        };
        batch.write(writes).await?;
        Ok(asks
            .iter()
            .zip(made)
            .map(|(ask, made)| match made {
                Made::Started { token } => Admitted::Started(Some(self.store.lease(
                    &ask.req.runbook,
                    &ask.req.host,
                    &ask.run_id,
                    token,
                ))),
                Made::Queued => Admitted::Queued,
                Made::Refused(result) => Admitted::Refused(result),
            })
            .collect())
    }

    /// Decide `asks` against their locked `rows`, in (runbook, host) order
    /// as the rows were locked, each seeing what the ones before it made;
    /// the first `direct` that start are this replica's to run now, the
    /// rest go to the fleet's queue. Returns one outcome per ask, in the
    /// asks' order, and puts what is to be written in `writes`.
    fn decide(
        &self,
        asks: &[&Ask<'_>],
        rows: &mut [PairRow],
        direct: usize,
        writes: &mut Writes,
    ) -> Vec<Made> {
        let may_queue = direct < asks.len();
        let mut order: Vec<usize> = (0..asks.len()).collect();
        order.sort_by(|&a, &b| {
            let key = |i: usize| (&asks[i].req.runbook, &asks[i].req.host);
            key(a).cmp(&key(b))
        });
        let mut made: Vec<Option<Made>> = (0..asks.len()).map(|_| None).collect();
        let mut leases: BTreeMap<(String, String), LeaseWrite> = BTreeMap::new();
        let mut claimed = 0;
        for i in order {
            let ask = asks[i];
            let (runbook, host) = (&ask.req.runbook, &ask.req.host);
            let Some(row) = rows
                .iter_mut()
                .find(|r| &r.runbook == runbook && &r.host == host)
            else {
                // Every pair was made and locked: a row missing is the
                // database's doing, and nothing starts on it.
                made[i] = Some(Made::Refused(TriggerResult::Pending));
                continue;
            };
            let facts = rules::Facts {
                stopped: stopped(row),
                held: row.held.then_some(match row.unconfirmed {
                    true => Holder::Unconfirmed,
                    false => Holder::Confirmed,
                }),
                ended_ago: row.ended_ago,
                last_started_by: &|k| row.keys.iter().any(|have| have == k),
                started_ago: &row.started_ago,
            };
            let terms = rules::Terms {
                keys: &ask.req.keys,
                cooldown: ask.cooldown,
                cap: ask.cap,
                window: self.window,
            };
            let result = rules::decide(&facts, &terms);
            let outcome = match result {
                None => {
                    let queued = may_queue && claimed >= direct;
                    claimed += usize::from(!queued);
                    row.token += 1;
                    row.held = true;
                    row.unconfirmed = writes.confirm;
                    row.keys = ask.req.keys.clone();
                    leases.insert(
                        (runbook.clone(), host.clone()),
                        LeaseWrite {
                            runbook: runbook.clone(),
                            host: host.clone(),
                            keys: row.keys.clone(),
                            started: Some((row.token, ask.run_id.clone(), queued)),
                        },
                    );
                    writes.runs.push(RunWrite {
                        run_id: ask.run_id.clone(),
                        runbook: runbook.clone(),
                        host: host.clone(),
                        token: row.token,
                        queued: queued.then(|| ask.req.to_queue()),
                    });
                    match queued {
                        true => Made::Queued,
                        false => Made::Started { token: row.token },
                    }
                }
                // A duplicate of the run in flight counts as its trigger.
                Some(TriggerResult::Deduplicated) if row.held => {
                    for k in &ask.req.keys {
                        if !row.keys.contains(k) {
                            row.keys.push(k.clone());
                        }
                    }
                    let lease = leases
                        .entry((runbook.clone(), host.clone()))
                        .or_insert_with(|| LeaseWrite {
                            runbook: runbook.clone(),
                            host: host.clone(),
                            keys: Vec::new(),
                            started: None,
                        });
                    lease.keys = row.keys.clone();
                    Made::Refused(TriggerResult::Deduplicated)
                }
                Some(refused) => Made::Refused(refused),
            };
            // A pending trigger is asked again, or recorded by this
            // replica when it gives up: one row per trigger.
            let (outcome_name, run_id) = match &outcome {
                Made::Started { .. } | Made::Queued => ("started", Some(ask.run_id.clone())),
                Made::Refused(r) => (r.as_str(), None),
            };
            if outcome_name != TriggerResult::Pending.as_str() {
                writes.triggers.push(TriggerRow {
                    runbook: runbook.clone(),
                    host: host.clone(),
                    trigger: ask.req.trigger.as_str().to_string(),
                    keys: ask.req.keys.clone(),
                    outcome: outcome_name,
                    run_id,
                });
            }
            made[i] = Some(outcome);
        }
        writes.leases = leases.into_values().collect();
        made.into_iter()
            .map(|m| m.unwrap_or(Made::Refused(TriggerResult::Deduplicated)))
            .collect()
    }
}

/// Whether the fleet's kill switch stops the runbook of `row`, by the rule
/// ([`kill_switch::stops`]).
fn stopped(row: &PairRow) -> bool {
    let switches: Vec<kill_switch::Switch<'_>> = row
        .switches
        .iter()
        .map(|(scope, left)| kill_switch::Switch::of_millis(scope, *left))
        .collect();
    kill_switch::stops(&switches, Some(&row.runbook)).is_some()
}

/// The outcomes this replica decided alone, as the fleet records them.
fn recorded(decided: &[Decided<'_>]) -> Vec<TriggerRow> {
    decided
        .iter()
        .map(|d| TriggerRow {
            runbook: d.runbook.to_string(),
            host: d.host.to_string(),
            trigger: d.trigger.as_str().to_string(),
            keys: d.keys.to_vec(),
            outcome: d.result.as_str(),
            run_id: None,
        })
        .collect()
}

/// The schedule fire a batch is, when it is one: every ask a `schedule`
/// of one runbook with the same fire key (`cron:TIME`). Every replica
/// fires it; the first to admit it decides all of its hosts.
fn fire_of(asks: &[&Ask<'_>]) -> Option<String> {
    let first = asks.first()?.req;
    let one_fire = asks.iter().all(|a| {
        a.req.trigger == crate::origin::Trigger::Schedule
            && a.req.runbook == first.runbook
            && a.req.keys == first.keys
    });
    (one_fire && first.keys.len() == 1).then(|| format!("{} {}", first.runbook, first.keys[0]))
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

/// The fleet's admission against a PostgreSQL cluster of its own (the root
/// tier: `--features estate`, as root): the table of cases both admissions
/// are held to, and replicas of this version and of the previous one (which
/// decides in `runwarden_admit_all`) deciding for the same hosts during a
/// rolling upgrade.
#[cfg(all(test, feature = "estate"))]
mod tests {

    use super::*;
    use crate::config::MaxRuns;

    use crate::test_pg as pg;

    /// A migrated cluster and this version's admission on it.
    async fn fleet() -> (pg::Pg, tempfile::TempDir, Arc<Postgres>, Fleet) {
        let pg = pg::Pg::start();
        let (dir, store) = crate::store::migrated(&pg, "new").await;
        (pg, dir, store.clone(), Fleet::new(store))
    }

    /// Asks of `reqs`, each with no cooldown or cap, as the scheduler makes them.
    fn asks_of(reqs: &[RunRequest]) -> Vec<Ask<'_>> {
        reqs.iter()
            .map(|req| Ask {
                req,
                cooldown: None,
                cap: None,
                run_id: uuid::Uuid::now_v7().to_string(),
            })
            .collect()
    }

    fn alert(runbook: &str, host: &str, keys: &[String]) -> RunRequest {
        let mut req = RunRequest::cli(runbook.into(), host.into(), false);
        req.trigger = crate::origin::Trigger::Alert;
        req.keys = keys.to_vec();
        req
    }

    /// One ask of this version's admission, as the scheduler makes it.
    async fn admit_one(
        fleet: &Fleet,
        req: &RunRequest,
        cooldown: Option<Duration>,
        cap: Option<MaxRuns>,
    ) -> String {
        let ask = Ask {
            req,
            cooldown,
            cap,
            run_id: uuid::Uuid::now_v7().to_string(),
        };
        match fleet
            .admit_batch(&[&ask], &[], 1, true)
            .await
            .unwrap()
            .pop()
        {
            Some(Admitted::Started(_) | Admitted::Queued) => "started".into(),
            Some(Admitted::Refused(r)) => r.as_str().into(),
            None => panic!("one outcome per ask"),
        }
    }

    /// The previous version's admission of one alert: its SQL function.
    fn admit_the_old_way(pg: &pg::Pg, runbook: &str, host: &str, key: &str, run: &str) -> String {
        pg.sql(&format!(
            "SELECT outcome FROM runwarden_admit_all(ARRAY['{runbook}'], ARRAY['{host}'], ARRAY['[\"{key}\"]'], \
             ARRAY[NULL::bigint], ARRAY['{run}'], 'old', 30000, ARRAY['alert'], 60000, ARRAY[NULL::integer], \
             ARRAY[NULL::bigint], ARRAY['{{}}'], 1, NULL, true)"
        ))
    }

    #[tokio::test]
    async fn the_admission_table_on_postgres_decided_in_rust() {
        let (pg, _dir, _store, fleet) = fleet().await;
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(include_str!("../../tests/fixtures/admission-cases.json"))
                .unwrap();
        assert!(cases.len() >= 10);
        for (i, case) in cases.iter().enumerate() {
            let runbook = pg.seed_admission_case(i, case);
            let keys: Vec<String> = serde_json::from_value(case["keys"].clone()).unwrap();
            let cooldown = case["cooldown_s"].as_u64().map(Duration::from_secs);
            let cap = case["cap"].as_object().map(|c| MaxRuns {
                count: c["count"].as_u64().unwrap() as u32,
                per: Duration::from_secs(c["per_s"].as_u64().unwrap()),
            });
            let got = admit_one(&fleet, &alert(&runbook, "h", &keys), cooldown, cap).await;
            assert_eq!(got, case["expect"].as_str().unwrap(), "{}", case["case"]);
            // Every outcome but `pending` is the fleet's record of the trigger.
            let recorded = pg.sql(&format!(
                "SELECT outcome FROM runwarden_triggers WHERE runbook = '{runbook}'"
            ));
            assert_eq!(recorded, got, "{}", case["case"]);
        }
    }

    /// During a rolling upgrade, replicas of the previous version decide in
    /// SQL and this one in Rust, on the same rows under the same locks: a
    /// run either one admitted and has not confirmed is `pending` to the
    /// other, then a duplicate once confirmed; a schedule's fire one of
    /// them decided is decided for the other too.
    #[tokio::test]
    async fn replicas_of_this_version_and_the_previous_one_admit_one_run_per_host() {
        let (pg, _dir, store, fleet) = fleet().await;
        let a = vec!["fp:a".to_string()];
        // The previous version starts a run; this one hears of it.
        assert_eq!(
            admit_the_old_way(&pg, "rb", "old-first", "fp:a", "old-run"),
            "started"
        );
        let req = alert("rb", "old-first", &a);
        assert_eq!(admit_one(&fleet, &req, None, None).await, "pending");
        pg.sql("SELECT runwarden_recorded(ARRAY['old-run'], ARRAY[]::text[])");
        assert_eq!(admit_one(&fleet, &req, None, None).await, "deduplicated");
        // This version starts a run; the previous one hears of it.
        let req = alert("rb", "new-first", &a);
        let ask = Ask {
            req: &req,
            cooldown: None,
            cap: None,
            run_id: "new-run".into(),
        };
        let started = fleet.admit_batch(&[&ask], &[], 1, true).await.unwrap();
        assert!(
            matches!(started[..], [Admitted::Started(Some(_))]),
            "{started:?}"
        );
        assert_eq!(
            admit_the_old_way(&pg, "rb", "new-first", "fp:b", "old-2"),
            "pending"
        );
        store.recorded(&["new-run".to_string()], &[]).await.unwrap();
        assert_eq!(
            admit_the_old_way(&pg, "rb", "new-first", "fp:b", "old-3"),
            "deduplicated"
        );
        let keys = pg.sql("SELECT keys FROM runwarden_leases WHERE host = 'new-first'");
        assert_eq!(keys, "{fp:a,fp:b}", "the duplicate's key is the run's");
        // A schedule's fire this version decided is decided for the other.
        let fire = vec!["cron:2026-12-05T03:00:00Z".to_string()];
        let mut reqs: Vec<RunRequest> = ["s1", "s2"]
            .iter()
            .map(|h| alert("nightly", h, &fire))
            .collect();
        for r in &mut reqs {
            r.trigger = crate::origin::Trigger::Schedule;
        }
        let asks = asks_of(&reqs);
        let asks: Vec<&Ask> = asks.iter().collect();
        let decided = fleet.admit_batch(&asks, &[], 0, true).await.unwrap();
        assert!(
            decided.iter().all(|d| matches!(d, Admitted::Queued)),
            "a fire goes to the fleet's queue: {decided:?}"
        );
        let old = pg.sql(&format!(
            "SELECT string_agg(outcome, ',') FROM runwarden_admit_all(ARRAY['nightly', 'nightly'], ARRAY['s1', 's2'], \
             ARRAY['[\"{0}\"]', '[\"{0}\"]'], ARRAY[NULL::bigint, NULL], ARRAY['o1', 'o2'], 'old', 30000, \
             ARRAY['schedule', 'schedule'], 60000, ARRAY[NULL::integer, NULL], ARRAY[NULL::bigint, NULL], \
             ARRAY['{{}}', '{{}}'], 0, 'nightly {0}', true)",
            fire[0]
        ));
        assert_eq!(old, "deduplicated,deduplicated");
        let runs = pg.sql("SELECT count(*) FROM runwarden_runs WHERE runbook = 'nightly'");
        assert_eq!(runs, "2", "one run per host");
    }

    /// Admission locks its batch's leases in order, but a run taken from
    /// the fleet's queue locks its own: PostgreSQL may find the two waiting
    /// on each other and roll admission back. The batch is decided again,
    /// not lost, and the sender never hears of it.
    #[tokio::test]
    async fn a_batch_rolled_back_for_a_deadlock_is_decided_again() {
        let (pg, _dir, _store, fleet) = fleet().await;
        pg.sql(
            "INSERT INTO runwarden_leases (runbook, host, token, ended_at)
             VALUES ('rb', 'h1', 1, now() - interval '1 hour'), ('rb', 'h2', 1, now() - interval '1 hour')",
        );
        let admitted = crate::store::crossed(&pg, "h1", "h2", async move {
            let reqs = [
                alert("rb", "h1", &["fp:1".into()]),
                alert("rb", "h2", &["fp:2".into()]),
            ];
            let asks = asks_of(&reqs);
            let asks: Vec<&Ask> = asks.iter().collect();
            fleet.admit_batch(&asks, &[], 2, true).await
        })
        .await;
        let admitted = admitted.expect("decided again, not refused");
        assert!(
            admitted
                .iter()
                .all(|a| matches!(a, Admitted::Started(Some(_)))),
            "{admitted:?}"
        );
        let triggers = pg.sql("SELECT count(*) FROM runwarden_triggers WHERE runbook = 'rb'");
        assert_eq!(triggers, "2", "each trigger recorded once");
    }
}

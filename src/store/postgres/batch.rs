//! Admission's storage in the shared state: a batch's (runbook, host) rows
//! locked and read, then everything the batch decided written, in one
//! transaction on a connection of admission's own. What to write is
//! decided in Rust (`rules::admission`, by `state::Fleet`); PostgreSQL
//! does the locking, the storage and the atomicity.
//!
//! Two round trips, each pipelined: `BEGIN`, the fire's claim, the rows
//! made and locked (in (runbook, host) order, as every replica and the
//! previous versions' `runwarden_admit_all` lock them) and read; then one
//! statement of every write, and `COMMIT`. The read is a statement of its
//! own after the lock, so it sees what the transaction it waited for
//! committed (the run another replica just started, its confirmation).

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use super::{Postgres, millis, op_timeout, unreachable};
use crate::store::StoreError;

/// One (runbook, host) of a batch as the shared state holds it, locked
/// until the batch is written or dropped. Durations are by PostgreSQL's
/// clock.
#[derive(Debug, Clone)]
pub(crate) struct PairRow {
    /// The runbook.
    pub(crate) runbook: String,
    /// The host.
    pub(crate) host: String,
    /// Its lease's token: the next run takes one more.
    pub(crate) token: i64,
    /// A run holds it (its lease has not expired).
    pub(crate) held: bool,
    /// The run that holds it has not been confirmed by its replica.
    pub(crate) unconfirmed: bool,
    /// How long ago its last run ended.
    pub(crate) ended_ago: Option<Duration>,
    /// The keys of the triggers of its current or last run.
    pub(crate) keys: Vec<String>,
    /// The fleet's kill switches engaged for the runbook or globally:
    /// scope, and milliseconds left (`None`: untimed; ended ones stay
    /// until the sweep removes them).
    pub(crate) switches: Vec<(String, Option<i64>)>,
    /// How long ago its recent runs started (those that ran, within the
    /// window asked for).
    pub(crate) started_ago: Vec<Duration>,
}

/// A lease a batch changes: a run started on it, or keys added by a
/// duplicate of the run that holds it.
#[derive(Debug)]
pub(crate) struct LeaseWrite {
    pub(crate) runbook: String,
    pub(crate) host: String,
    /// Its keys from now on.
    pub(crate) keys: Vec<String>,
    /// A run started: its token, its id, and whether the fleet's queue
    /// holds it (no replica yet, no expiry until one takes it).
    pub(crate) started: Option<(i64, String, bool)>,
}

/// A run a batch started.
#[derive(Debug)]
pub(crate) struct RunWrite {
    pub(crate) run_id: String,
    pub(crate) runbook: String,
    pub(crate) host: String,
    pub(crate) token: i64,
    /// What a replica that takes it from the fleet's queue runs; `None`:
    /// this replica runs it.
    pub(crate) queued: Option<String>,
}

/// A trigger's one outcome, for `runwarden_triggers`.
#[derive(Debug)]
pub(crate) struct TriggerRow {
    pub(crate) runbook: String,
    pub(crate) host: String,
    pub(crate) trigger: String,
    pub(crate) keys: Vec<String>,
    pub(crate) outcome: &'static str,
    pub(crate) run_id: Option<String>,
}

/// What a batch writes once it is decided.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    pub(crate) leases: Vec<LeaseWrite>,
    pub(crate) runs: Vec<RunWrite>,
    pub(crate) triggers: Vec<TriggerRow>,
    /// The runs wait for [`Postgres::recorded`] before a retry of their
    /// trigger is their duplicate.
    pub(crate) confirm: bool,
}

/// Admission's connection and its statements, prepared once per
/// connection (each is planned once, not per batch).
pub(crate) struct Prepared {
    client: Client,
    claim: Statement,
    make: Statement,
    lock: Statement,
    read: Statement,
    write: Statement,
}

impl Prepared {
    /// Prepare every statement on `client`: one round trip.
    async fn on(client: Client) -> Result<Prepared, tokio_postgres::Error> {
        use Type as T;
        let pairs = [T::TEXT_ARRAY, T::TEXT_ARRAY];
        let (claim, make, lock, read, write) = tokio::try_join!(
            client.prepare_typed(CLAIM, &[T::TEXT]),
            client.prepare_typed(MAKE, &pairs),
            client.prepare_typed(LOCK, &pairs),
            client.prepare_typed(READ, &[T::TEXT_ARRAY, T::TEXT_ARRAY, T::INT8]),
            client.prepare_typed(WRITE, &WRITE_TYPES),
        )?;
        Ok(Prepared {
            client,
            claim,
            make,
            lock,
            read,
            write,
        })
    }
}

/// A batch's rows, locked: [`Locked::write`] ends it.
pub(crate) struct Locked<'a> {
    store: &'a Postgres,
    conn: tokio::sync::MutexGuard<'a, Option<Prepared>>,
    /// Every (runbook, host) asked for, in (runbook, host) order.
    pub(crate) rows: Vec<PairRow>,
    /// The batch is a schedule's fire another replica already decided.
    pub(crate) fire_taken: bool,
    fire: bool,
}

const CLAIM: &str = "INSERT INTO runwarden_fires (fire) VALUES ($1) ON CONFLICT DO NOTHING";

const MAKE: &str = "INSERT INTO runwarden_leases (runbook, host)
     SELECT * FROM unnest($1::text[], $2::text[]) ORDER BY 1, 2 ON CONFLICT DO NOTHING";

const LOCK: &str = "SELECT 1 FROM runwarden_leases l
     JOIN unnest($1::text[], $2::text[]) AS p(runbook, host) USING (runbook, host)
     ORDER BY l.runbook, l.host FOR UPDATE OF l";

const READ: &str = "SELECT l.runbook, l.host, l.token,
        coalesce(l.expires_at > now_, false),
        coalesce(l.expires_at > now_ AND (
            EXISTS (SELECT 1 FROM runwarden_runs r WHERE r.run_id = l.run_id AND NOT r.recorded)
            OR EXISTS (SELECT 1 FROM runwarden_queue q WHERE q.run_id = l.run_id AND NOT q.ready)), false),
        (extract(epoch FROM now_ - l.ended_at) * 1000)::bigint,
        l.keys,
        ARRAY(SELECT k.scope FROM runwarden_kill_switch k
              WHERE k.scope IN ('global', l.runbook) ORDER BY k.scope),
        ARRAY(SELECT (extract(epoch FROM now_ - r.started_at) * 1000)::bigint FROM runwarden_runs r
              WHERE r.runbook = l.runbook AND r.host = l.host AND r.recorded
                AND r.status <> 'not_started'
                AND r.started_at > now_ - $3 * interval '1 millisecond'),
        ARRAY(SELECT (extract(epoch FROM k.until - now_) * 1000)::bigint FROM runwarden_kill_switch k
              WHERE k.scope IN ('global', l.runbook) ORDER BY k.scope)
     FROM runwarden_leases l
     JOIN unnest($1::text[], $2::text[]) AS p(runbook, host) USING (runbook, host),
          (SELECT clock_timestamp() AS now_) AS c
     ORDER BY l.runbook, l.host";

const WRITE: &str = "WITH leases AS (
        UPDATE runwarden_leases l SET
            keys = ARRAY(SELECT jsonb_array_elements_text(w.keys::jsonb)),
            token = coalesce(w.token, l.token),
            run_id = CASE WHEN w.token IS NULL THEN l.run_id ELSE w.run_id END,
            replica = CASE WHEN w.token IS NULL THEN l.replica WHEN w.queued THEN NULL ELSE $1 END,
            expires_at = CASE WHEN w.token IS NULL THEN l.expires_at
                              WHEN w.queued THEN 'infinity'::timestamptz
                              ELSE clock_timestamp() + $2 * interval '1 millisecond' END
        FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::boolean[])
             AS w(runbook, host, keys, token, run_id, queued)
        WHERE l.runbook = w.runbook AND l.host = w.host),
     runs AS (
        INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status, recorded)
        SELECT id, rb, h, $1, tok, CASE WHEN req IS NULL THEN 'running' ELSE 'queued' END, NOT $9
        FROM unnest($10::text[], $11::text[], $12::text[], $13::bigint[], $14::text[])
             AS x(id, rb, h, tok, req)),
     queue AS (
        INSERT INTO runwarden_queue (run_id, runbook, host, request, queued_by)
        SELECT id, rb, h, req::jsonb, $1
        FROM unnest($10::text[], $11::text[], $12::text[], $14::text[]) AS x(id, rb, h, req)
        WHERE req IS NOT NULL),
     fires AS (
        DELETE FROM runwarden_fires WHERE $21 AND at < clock_timestamp() - interval '1 day')
     INSERT INTO runwarden_triggers (replica, runbook, host, trigger, keys, outcome, run_id)
     SELECT $1, rb, h, t, ARRAY(SELECT jsonb_array_elements_text(k::jsonb)), o, id
     FROM unnest($15::text[], $16::text[], $17::text[], $18::text[], $19::text[], $20::text[])
          AS x(rb, h, t, k, o, id)";

/// The types of [`WRITE`]'s parameters.
const WRITE_TYPES: [Type; 21] = [
    Type::TEXT,
    Type::INT8,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::BOOL_ARRAY,
    Type::BOOL,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::BOOL,
];

impl Postgres {
    /// Lock and read the rows of `pairs` (each made when missing) for a
    /// batch's decisions; with `fire`, first claim that schedule fire for
    /// this batch (when another replica has, nothing is locked).
    /// `started_within`: how far back runs' starts are read (the longest
    /// `max_runs` window asked about).
    pub(crate) async fn lock_batch(
        &self,
        pairs: &[(String, String)],
        fire: Option<String>,
        started_within: Duration,
    ) -> Result<Locked<'_>, StoreError> {
        let mut conn = self.admission.lock().await;
        let limit = op_timeout(self.lease);
        let opened = tokio::time::timeout(limit, async {
            if conn.as_ref().is_none_or(|p| p.client.is_closed()) {
                let client = self.connect().await?;
                let prepared = Prepared::on(client)
                    .await
                    .map_err(|e| self.failed("preparing admission's statements", &e))?;
                *conn = Some(prepared);
            }
            let Some(c) = conn.as_ref() else {
                return Err(StoreError::Unreachable("no connection".into()));
            };
            read_locked(c, pairs, fire.as_deref(), started_within)
                .await
                .map_err(|e| self.failed("deciding the triggers", &e))
        })
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Unreachable(
                "deciding the triggers: timed out".into(),
            ))
        });
        match opened {
            Ok((rows, fire_taken)) => Ok(Locked {
                store: self,
                conn,
                rows,
                fire_taken,
                fire: fire.is_some(),
            }),
            Err(e) => {
                // The transaction may be open: the connection goes with it.
                *conn = None;
                self.note_failure(&e);
                Err(e)
            }
        }
    }
}

/// `BEGIN`, the fire's claim, the rows made, locked and read: one round trip.
async fn read_locked(
    p: &Prepared,
    pairs: &[(String, String)],
    fire: Option<&str>,
    started_within: Duration,
) -> Result<(Vec<PairRow>, bool), tokio_postgres::Error> {
    let c = &p.client;
    let runbooks: Vec<&str> = pairs.iter().map(|(r, _)| r.as_str()).collect();
    let hosts: Vec<&str> = pairs.iter().map(|(_, h)| h.as_str()).collect();
    let within = millis(started_within);
    let params: [&(dyn ToSql + Sync); 3] = [&runbooks, &hosts, &within];
    let make = c.execute(&p.make, &params[..2]);
    let lock = c.query(&p.lock, &params[..2]);
    let read = c.query(&p.read, &params);
    let claim = async {
        match fire {
            Some(fire) => c.execute(&p.claim, &[&fire]).await.map(|n| n == 0),
            None => Ok(false),
        }
    };
    let (_, fire_taken, _, _, rows) =
        tokio::try_join!(c.batch_execute("BEGIN"), claim, make, lock, read)?;
    let ms = |v: Option<i64>| v.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    let rows = rows
        .iter()
        .map(|r| PairRow {
            runbook: r.get(0),
            host: r.get(1),
            token: r.get(2),
            held: r.get(3),
            unconfirmed: r.get(4),
            ended_ago: ms(r.get(5)),
            keys: r.get(6),
            switches: r
                .get::<_, Vec<String>>(7)
                .into_iter()
                .zip(r.get::<_, Vec<Option<i64>>>(9))
                .collect(),
            started_ago: r
                .get::<_, Vec<i64>>(8)
                .into_iter()
                .filter_map(|v| ms(Some(v)))
                .collect(),
        })
        .collect();
    Ok((rows, fire_taken))
}

impl Locked<'_> {
    /// Write what the batch decided and commit: one round trip. On an
    /// error nothing is written (the transaction rolls back with its
    /// connection).
    pub(crate) async fn write(mut self, w: Writes) -> Result<(), StoreError> {
        let store = self.store;
        let limit = op_timeout(store.lease);
        let written = match self.conn.as_ref() {
            Some(c) => tokio::time::timeout(limit, write_all(c, store, &w, self.fire))
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Unreachable(
                        "recording the triggers: timed out".into(),
                    ))
                }),
            None => Err(StoreError::Unreachable("no connection".into())),
        };
        if let Err(e) = &written {
            *self.conn = None;
            store.note_failure(e);
        }
        written
    }
}

/// The one statement of every write, then `COMMIT`, pipelined.
async fn write_all(
    p: &Prepared,
    store: &Postgres,
    w: &Writes,
    fire: bool,
) -> Result<(), StoreError> {
    let json = |keys: &Vec<String>| serde_json::to_string(keys).unwrap_or_default();
    let lease_ms = millis(store.lease);
    let l = &w.leases;
    let (l_rb, l_h, l_keys): (Vec<&str>, Vec<&str>, Vec<String>) = (
        l.iter().map(|x| x.runbook.as_str()).collect(),
        l.iter().map(|x| x.host.as_str()).collect(),
        l.iter().map(|x| json(&x.keys)).collect(),
    );
    let l_token: Vec<Option<i64>> = l.iter().map(|x| x.started.as_ref().map(|s| s.0)).collect();
    let l_run: Vec<Option<&str>> = l
        .iter()
        .map(|x| x.started.as_ref().map(|s| s.1.as_str()))
        .collect();
    let l_queued: Vec<bool> = l
        .iter()
        .map(|x| x.started.as_ref().is_some_and(|s| s.2))
        .collect();
    let r = &w.runs;
    let r_id: Vec<&str> = r.iter().map(|x| x.run_id.as_str()).collect();
    let r_rb: Vec<&str> = r.iter().map(|x| x.runbook.as_str()).collect();
    let r_h: Vec<&str> = r.iter().map(|x| x.host.as_str()).collect();
    let r_tok: Vec<i64> = r.iter().map(|x| x.token).collect();
    let r_req: Vec<Option<&str>> = r.iter().map(|x| x.queued.as_deref()).collect();
    let t = &w.triggers;
    let t_rb: Vec<&str> = t.iter().map(|x| x.runbook.as_str()).collect();
    let t_h: Vec<&str> = t.iter().map(|x| x.host.as_str()).collect();
    let t_t: Vec<&str> = t.iter().map(|x| x.trigger.as_str()).collect();
    let t_k: Vec<String> = t.iter().map(|x| json(&x.keys)).collect();
    let t_o: Vec<&str> = t.iter().map(|x| x.outcome).collect();
    let t_id: Vec<Option<&str>> = t.iter().map(|x| x.run_id.as_deref()).collect();
    let params: [&(dyn ToSql + Sync); 21] = [
        &store.replica,
        &lease_ms,
        &l_rb,
        &l_h,
        &l_keys,
        &l_token,
        &l_run,
        &l_queued,
        &w.confirm,
        &r_id,
        &r_rb,
        &r_h,
        &r_tok,
        &r_req,
        &t_rb,
        &t_h,
        &t_t,
        &t_k,
        &t_o,
        &t_id,
        &fire,
    ];
    let c = &p.client;
    let committed = tokio::try_join!(c.execute(&p.write, &params), c.batch_execute("COMMIT"));
    committed
        .map(drop)
        .map_err(|e| store.failed("recording the triggers", &e))
}

impl Postgres {
    /// An error of the database's, as a [`StoreError`] that says `what`.
    pub(super) fn failed(&self, what: &str, e: &tokio_postgres::Error) -> StoreError {
        use tokio_postgres::error::SqlState;
        let said = format!("{what}: {}", crate::error_chain(e));
        let contended = [
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::T_R_SERIALIZATION_FAILURE,
        ];
        match e.code() {
            Some(code) if contended.contains(code) => StoreError::Contended(said),
            _ if unreachable(e) => StoreError::Unreachable(said),
            _ => StoreError::Database(said),
        }
    }

    /// Note an operation of admission's own connection that failed.
    fn note_failure(&self, e: &StoreError) {
        if let StoreError::Unreachable(why) = e {
            self.note(Some(why.clone()));
        }
    }
}

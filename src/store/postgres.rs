//! The PostgreSQL side of shared state: one client per daemon, every
//! decision in one SQL function call (one round trip), so no two replicas
//! can interleave between a check and its record.
//!
//! The functions themselves live in `migrations/`, which `runwarden db
//! migrate` applies and every daemon checks at start-up. A lost connection
//! is dropped and made again on the next use; until then every operation
//! fails, which the callers turn into "no call" (fencing) and 503
//! (triggers).
//!
//! Connections use TLS when the URL asks for it (`sslmode=require`) or the
//! server offers it (the default, `prefer`), verified against
//! `state.postgres.ca_file` or the system's authorities; a certificate that
//! does not verify is a failed connection, never a plain one.
//!
//! It is long because each operation carries its SQL text
//! beside the code that binds it; split, a reader would page between them.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{FleetSwitch, Reaped, StoreError};
use crate::config::SharedState;

/// What [`Postgres::check_schema`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    /// This build's own schema version.
    Current(i32),
    /// One version ahead (a rolling upgrade in progress): usable.
    OneAhead(i32),
}

/// The schema this build needs, with the files that bring a database to it.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../migrations/0001_shared_state.sql")),
    (2, include_str!("../../migrations/0002_approvals.sql")),
    (
        3,
        include_str!("../../migrations/0003_duplicate_window.sql"),
    ),
    (4, include_str!("../../migrations/0004_admit_all.sql")),
    (5, include_str!("../../migrations/0005_timed_switch.sql")),
    (6, include_str!("../../migrations/0006_admit_window.sql")),
    (7, include_str!("../../migrations/0007_max_runs.sql")),
    (8, include_str!("../../migrations/0008_work_queue.sql")),
    (9, include_str!("../../migrations/0009_demotion.sql")),
    (10, include_str!("../../migrations/0010_schedule_fires.sql")),
    (
        11,
        include_str!("../../migrations/0011_unrecorded_runs.sql"),
    ),
];

/// The notification channel of the fleet's kill switch.
const KILL_SWITCH_CHANNEL: &str = "runwarden_kill_switch";

/// How long one migration may take.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// The notification channel of demotions and promotions.
const DEMOTION_CHANNEL: &str = "runwarden_demotion";

/// The notification channel of the fleet's queue: runs became takeable.
const QUEUE_CHANNEL: &str = "runwarden_queue";

/// One daemon's (or one command's) connection to the shared state.
pub(crate) struct Postgres {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    /// How long a claim lives without renewal.
    pub(crate) lease: Duration,
    /// This daemon's name among the replicas.
    pub(crate) replica: String,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// Why the last operation did not reach the database; `None` when it did.
    unhealthy: Mutex<Option<String>>,
    /// The fleet's kill switch, as last heard.
    pub(crate) switch: Arc<FleetSwitch>,
    /// The fleet's demoted runbooks, as last heard.
    pub(crate) demoted: Arc<crate::gate::demotion::FleetDemotions>,
    /// Woken when runs in the fleet's queue became takeable.
    pub(crate) queue_ready: tokio::sync::Notify,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("Postgres")
            .field("replica", &self.replica)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// The TLS a connection offers: the authorities of `ca_file` (PEM), or the
/// system's.
fn tls(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, StoreError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(file) => {
            let say = |what: String| {
                StoreError::Config(format!("state.postgres.ca_file {}: {what}", file.display()))
            };
            let certs = CertificateDer::pem_file_iter(file)
                .map_err(|e| say(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| say(e.to_string()))?;
            if certs.is_empty() {
                return Err(say("no PEM certificate in it".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| say(e.to_string()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // One unreadable system certificate is no reason to trust none.
                let _ = roots.add(cert);
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| StoreError::Config(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// Read a libpq URL from its file, which only its owner may read.
fn read_url(file: &Path) -> Result<tokio_postgres::Config, StoreError> {
    let say = |what: String| StoreError::Config(format!("{}: {what}", file.display()));
    // Owner-only, a regular file, checked on the open file: as every secret.
    let text = crate::secret::read_file(file, "state.postgres.url_file").map_err(|e| match file
        .exists()
    {
        true => StoreError::Config(e.to_string()),
        false => say(format!(
            "{e}; write the PostgreSQL URL (postgresql://runwarden:...@host/db) into it, mode 0600"
        )),
    })?;
    // The error names what is wrong, never the text (it may hold a password).
    tokio_postgres::Config::from_str(text.trim())
        .map_err(|e| say(format!("not a PostgreSQL URL or key=value string: {e}")))
}

impl Postgres {
    /// The store `state.postgres` names; nothing is connected yet.
    pub(crate) fn open(shared: &SharedState, replica: &str) -> Result<Postgres, StoreError> {
        let mut config = read_url(&shared.url_file)?;
        let op = op_timeout(shared.lease);
        config.connect_timeout(op);
        config.application_name(format!("runwarden {replica}"));
        Ok(Postgres {
            config,
            tls: tls(shared.ca_file.as_deref())?,
            lease: shared.lease,
            replica: replica.to_string(),
            client: Default::default(),
            unhealthy: Mutex::new(Some("not connected yet".into())),
            switch: Default::default(),
            queue_ready: Default::default(),
            demoted: Default::default(),
        })
    }

    /// The store `settings` name (`state.postgres`), if they name one.
    pub(crate) fn from_settings(
        settings: &crate::config::Settings,
    ) -> Result<Option<Arc<Postgres>>, StoreError> {
        settings
            .postgres
            .as_ref()
            .map(|shared| Postgres::open(shared, &settings.replica).map(Arc::new))
            .transpose()
    }

    /// Why the last operation did not reach the database; `None` when it did.
    pub(crate) fn unhealthy(&self) -> Option<String> {
        self.unhealthy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note(&self, unhealthy: Option<String>) {
        *self.unhealthy.lock().unwrap_or_else(|p| p.into_inner()) = unhealthy;
    }

    async fn client(&self) -> Result<Arc<Client>, StoreError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        *slot = None;
        let (client, connection) = tokio::time::timeout(
            op_timeout(self.lease),
            self.config.connect(self.tls.clone()),
        )
        .await
        .map_err(|_| StoreError::Unreachable("connecting timed out".into()))?
        .map_err(|e| StoreError::Unreachable(crate::error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL connection ended: {e}");
            }
        });
        let client = Arc::new(client);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Run one operation against the database, within the operation
    /// timeout; a failure that is not the database's answer drops the
    /// connection, so the next operation makes a new one.
    pub(super) async fn with<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.within(op_timeout(self.lease), what, f).await
    }

    /// [`with`](Self::with), within `limit`.
    async fn within<T, F, Fut>(&self, limit: Duration, what: &str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let result = match self.client().await {
            Ok(client) => match tokio::time::timeout(limit, f(client)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) if unreachable(&e) => Err(StoreError::Unreachable(format!(
                    "{what}: {}",
                    crate::error_chain(&e)
                ))),
                Ok(Err(e)) => Err(StoreError::Database(format!(
                    "{what}: {}",
                    crate::error_chain(&e)
                ))),
                Err(_) => Err(StoreError::Unreachable(format!("{what}: timed out"))),
            },
            Err(e) => Err(e),
        };
        match &result {
            Err(StoreError::Unreachable(why)) => {
                *self.client.lock().await = None;
                self.note(Some(why.clone()));
            }
            _ => self.note(None),
        }
        result
    }

    /// Apply every migration the database lacks, in order, each in its own
    /// transaction. Returns the versions applied.
    pub(crate) async fn migrate(&self) -> Result<Vec<i32>, StoreError> {
        let have = self.version().await?;
        let mut applied = Vec::new();
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > have) {
            let body = format!("BEGIN;\n{sql}\nCOMMIT;");
            // Not a run's operation: a busy server may take its time over DDL.
            self.within(MIGRATION_TIMEOUT, "migrating", |c| async move {
                c.batch_execute(&body).await
            })
            .await?;
            applied.push(*version);
        }
        Ok(applied)
    }

    /// The schema version of the database (0: none yet).
    pub(crate) async fn version(&self) -> Result<i32, StoreError> {
        self.with("reading the schema version", |c| async move {
            let exists = c
                .query_one("SELECT to_regclass('runwarden_schema') IS NOT NULL", &[])
                .await?
                .get::<_, bool>(0);
            if !exists {
                return Ok(0);
            }
            c.query_one(
                "SELECT coalesce(max(version), 0) FROM runwarden_schema",
                &[],
            )
            .await
            .map(|r| r.get(0))
        })
        .await
    }

    /// Refuse a database this build cannot work with, saying what to run.
    ///
    /// Migrations are additive for one version: a schema one version newer
    /// than this build's only adds what this build never reads, so a
    /// replica keeps working (and starts) while its peers are upgraded
    /// after `db migrate`; it says so. Two versions newer, or older, it
    /// refuses, naming what to do. The result is the schema's version.
    pub(crate) async fn check_schema(&self) -> Result<Schema, StoreError> {
        let want = MIGRATIONS.last().map_or(0, |(v, _)| *v);
        match self.version().await? {
            v if v == want => Ok(Schema::Current(v)),
            v if v == want + 1 => Ok(Schema::OneAhead(v)),
            v if v < want => Err(StoreError::Config(format!(
                "the database's schema is version {v}, this runwarden needs {want}: run `runwarden db migrate` (as a role that may create tables)"
            ))),
            v => Err(StoreError::Config(format!(
                "the database's schema is version {v}, two or more ahead of this runwarden's ({want}): upgrade runwarden on this machine to a version that knows schema {}",
                v - 1
            ))),
        }
    }

    /// Decide a notification's triggers across the fleet, in one round
    /// trip and one transaction; see `runwarden_admit_all`. They go sorted
    /// by (runbook, host), so two replicas lock rows in the same order; the
    /// outcomes come back in the order given. With `confirm`, the runs
    /// that start wait for [`recorded`](Self::recorded): until then a
    /// trigger for their host is `pending`, not a duplicate.
    pub(super) async fn admit_all(
        &self,
        items: &[super::Admit],
        window: Duration,
        direct: Option<usize>,
        confirm: bool,
    ) -> Result<Vec<(String, Option<i64>, bool)>, StoreError> {
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by(|&a, &b| {
            (&items[a].runbook, &items[a].host).cmp(&(&items[b].runbook, &items[b].host))
        });
        let column = |f: &dyn Fn(&super::Admit) -> String| {
            order.iter().map(|&i| f(&items[i])).collect::<Vec<_>>()
        };
        let runbooks = column(&|a| a.runbook.clone());
        let hosts = column(&|a| a.host.clone());
        let keys = column(&|a| serde_json::to_string(&a.keys).unwrap_or_default());
        let run_ids = column(&|a| a.run_id.clone());
        let triggers = column(&|a| a.trigger.to_string());
        let requests = column(&|a| a.request.clone());
        let direct = direct.map(|d| i32::try_from(d).unwrap_or(i32::MAX));
        let cooldowns: Vec<Option<i64>> = order
            .iter()
            .map(|&i| items[i].cooldown.map(millis))
            .collect();
        let cap_counts: Vec<Option<i32>> = order
            .iter()
            .map(|&i| {
                items[i]
                    .cap
                    .map(|c| i32::try_from(c.count).unwrap_or(i32::MAX))
            })
            .collect();
        let caps_ms: Vec<Option<i64>> = order
            .iter()
            .map(|&i| items[i].cap.map(|c| millis(c.per)))
            .collect();
        let (lease, window) = (millis(self.lease), millis(window));
        let fire = fire_of(items);
        let rows = self
            .with("recording the triggers", |c| async move {
                c.query_typed(
                    "SELECT n, outcome, token, queued FROM runwarden_admit_all($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
                    &[
                        (&runbooks, Type::TEXT_ARRAY),
                        (&hosts, Type::TEXT_ARRAY),
                        (&keys, Type::TEXT_ARRAY),
                        (&cooldowns, Type::INT8_ARRAY),
                        (&run_ids, Type::TEXT_ARRAY),
                        (&self.replica, Type::TEXT),
                        (&lease, Type::INT8),
                        (&triggers, Type::TEXT_ARRAY),
                        (&window, Type::INT8),
                        (&cap_counts, Type::INT4_ARRAY),
                        (&caps_ms, Type::INT8_ARRAY),
                        (&requests, Type::TEXT_ARRAY),
                        (&direct, Type::INT4),
                        (&fire, Type::TEXT),
                        (&confirm, Type::BOOL),
                    ],
                )
                .await
            })
            .await?;
        if rows.len() != items.len() {
            return Err(StoreError::Database(format!(
                "recording the triggers: {} outcomes for {} triggers",
                rows.len(),
                items.len()
            )));
        }
        let mut out = vec![(String::new(), None, false); items.len()];
        for row in rows {
            let n: i32 = row.get(0);
            let i = usize::try_from(n - 1)
                .ok()
                .and_then(|k| order.get(k).copied())
                .ok_or_else(|| {
                    StoreError::Database(format!("recording the triggers: no trigger {n}"))
                })?;
            out[i] = (row.get(1), row.get(2), row.get(3));
        }
        Ok(out)
    }

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
        let (ids, queued) = (run_ids.to_vec(), queued.to_vec());
        self.with("confirming recorded runs", |c| async move {
            c.query_typed(
                "SELECT runwarden_recorded($1, $2)",
                &[(&ids, Type::TEXT_ARRAY), (&queued, Type::TEXT_ARRAY)],
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
    pub(super) async fn take_queued(
        &self,
        limit: usize,
        runbooks: Vec<String>,
    ) -> Result<Vec<(String, String, String, i64, String, String)>, StoreError> {
        let (lease, limit) = (millis(self.lease), i32::try_from(limit).unwrap_or(i32::MAX));
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
    pub(crate) async fn record_triggers(&self, rows: &[super::Recorded]) -> Result<(), StoreError> {
        let column = |f: fn(&super::Recorded) -> String| rows.iter().map(f).collect::<Vec<_>>();
        let (runbooks, hosts, triggers, outcomes) = (
            column(|r| r.runbook.clone()),
            column(|r| r.host.clone()),
            column(|r| r.trigger.to_string()),
            column(|r| r.outcome.to_string()),
        );
        // Arrays of arrays must be rectangular: the keys go as JSON.
        let keys = column(|r| serde_json::to_string(&r.keys).unwrap_or_default());
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
        let ids = run_ids.to_vec();
        self.with("giving back unrecorded claims", |c| async move {
            c.execute(
                "WITH queued AS (DELETE FROM runwarden_queue WHERE run_id = ANY($1)),
                      gone AS (UPDATE runwarden_runs SET status = 'not_started', ended_at = clock_timestamp()
                     WHERE run_id = ANY($1) RETURNING runbook, host, token)
                 UPDATE runwarden_leases l SET expires_at = NULL, run_id = NULL
                     FROM gone WHERE l.runbook = gone.runbook AND l.host = gone.host AND l.token = gone.token",
                &[&ids],
            )
            .await
        })
        .await
        .map(drop)
    }

    /// Prove the lease and count the call; see `runwarden_fence`.
    #[allow(clippy::too_many_arguments, reason = "one SQL function's parameters")]
    pub(crate) async fn fence(
        &self,
        lease: &super::LeaseId,
        mutating: bool,
        scopes: &[Option<String>],
        limits: &[i64],
        windows: &[i64],
        keep: i64,
    ) -> Result<(String, Option<String>), StoreError> {
        let ms = millis(self.lease);
        let (scopes, limits, windows) = (scopes.to_vec(), limits.to_vec(), windows.to_vec());
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
    pub(crate) async fn renew(&self, lease: &super::LeaseId) -> Result<bool, StoreError> {
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
        lease: &super::LeaseId,
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
        lease: &super::LeaseId,
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
    pub(crate) async fn replica_switches(&self) -> Result<Vec<super::ReplicaSwitch>, StoreError> {
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
                .map(|r| super::ReplicaSwitch {
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

    /// Keep [`Postgres::switch`] current: LISTEN on its own connection,
    /// re-read the table on every notification and every few seconds (a
    /// notification sent while the connection was down is not lost), and
    /// connect again after a failure. Ends when `stop` turns true.
    pub(crate) async fn listen(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.listen_once(&mut stop).await {
                tracing::warn!(
                    "the fleet's kill switch cannot be heard ({e}); retrying in 1s (calls are still fenced against the database)"
                );
            }
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn listen_once(
        self: &Arc<Self>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        let unreachable =
            |e: tokio_postgres::Error| StoreError::Unreachable(crate::error_chain(&e));
        let (client, mut connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(unreachable)?;
        let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let queue = self.clone();
        let driver = tokio::spawn(async move {
            while let Some(Ok(m)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match m {
                    AsyncMessage::Notification(n) if n.channel() == QUEUE_CHANNEL => {
                        queue.queue_ready.notify_one();
                    }
                    AsyncMessage::Notification(_) if tx.send(()).is_err() => break,
                    _ => {}
                }
            }
        });
        let _stop_driver = AbortOnDrop(driver);
        client
            .batch_execute(&format!(
                "LISTEN {KILL_SWITCH_CHANNEL}; LISTEN {QUEUE_CHANNEL}; LISTEN {DEMOTION_CHANNEL}"
            ))
            .await
            .map_err(unreachable)?;
        loop {
            let engaged = switches_on(&client).await.map_err(unreachable)?;
            self.switch.set_untils(
                engaged
                    .iter()
                    .filter_map(|(scope, _, until)| Some((scope.clone(), (*until)?)))
                    .collect(),
            );
            self.switch.set(
                engaged
                    .into_iter()
                    .map(|(scope, detail, _)| (scope, detail))
                    .collect(),
            );
            self.demoted
                .set(demotions_on(&client).await.map_err(unreachable)?);
            tokio::select! {
                n = heard.recv() => if n.is_none() {
                    return Err(StoreError::Unreachable("the listening connection closed".into()));
                },
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = stop.changed() => return Ok(()),
            }
        }
    }
}

/// The fleet's engaged switches: scope, what a person reads, and when a
/// timed one ends (Unix seconds). One whose time has come is not engaged,
/// though its row stays until a replica removes it.
async fn switches_on(
    c: &Client,
) -> Result<Vec<(String, String, Option<f64>)>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT scope, format('engaged for the fleet by %s at %s: %s%s', engaged_by, engaged_at, reason,
                    CASE WHEN until IS NULL THEN '' ELSE format('; until %s (%s left)', until,
                         date_trunc('second', until - clock_timestamp())) END),
                    extract(epoch FROM until)::float8
             FROM runwarden_kill_switch WHERE until IS NULL OR until > clock_timestamp() ORDER BY scope",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// The fleet's demotions. A row that does not read as one still demotes
/// (fail closed), with what is known of it.
async fn demotions_on(
    c: &Client,
) -> Result<Vec<crate::gate::demotion::Demotion>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT runbook, demotion::text FROM runwarden_demotions ORDER BY runbook",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let runbook: String = r.get(0);
            serde_json::from_str(r.get::<_, &str>(1)).unwrap_or_else(|e| {
                crate::gate::demotion::Demotion::unreadable(
                    &runbook,
                    format!("a row of runwarden_demotions that does not read ({e})"),
                )
            })
        })
        .collect())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The schedule fire a batch is, when it is one: every trigger a
/// `schedule` of one runbook with the same fire key (`cron:TIME`). Every
/// replica fires it; the first to admit it decides all of its hosts.
fn fire_of(items: &[super::Admit]) -> Option<String> {
    let first = items.first()?;
    let one_fire = items
        .iter()
        .all(|a| a.trigger == "schedule" && a.runbook == first.runbook && a.keys == first.keys);
    (one_fire && first.keys.len() == 1).then(|| format!("{} {}", first.runbook, first.keys[0]))
}

/// The one row a function with OUT parameters returns.
fn one(rows: Vec<Row>, what: &str) -> Result<Row, StoreError> {
    rows.into_iter()
        .next()
        .ok_or_else(|| StoreError::Database(format!("{what}: the function returned no row")))
}

/// Whether an error is the connection's (the database may be fine again
/// after a reconnect), not the database's answer or a type mismatch.
fn unreachable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// How long one operation may take: a third of the lease, so a renewal
/// that hangs still leaves time for the next before the lease runs out.
fn op_timeout(lease: Duration) -> Duration {
    (lease / 3).min(Duration::from_secs(5))
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The fleet's switch as an engage left it.
#[derive(Debug)]
pub(crate) struct Engaged {
    /// When it ends now (`None`: until released), by the database's clock.
    pub(crate) until: Option<jiff::Timestamp>,
    /// The database's clock when it was engaged.
    pub(crate) clock: jiff::Timestamp,
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// The list is written by hand: every file under migrations/ is in it,
    /// in order, and records its own version.
    #[test]
    fn every_migration_file_is_applied_in_order_and_records_its_version() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files.len(), MIGRATIONS.len(), "{files:?}");
        for (i, ((version, sql), file)) in MIGRATIONS.iter().zip(&files).enumerate() {
            assert_eq!(*version, i as i32 + 1);
            assert!(file.starts_with(&format!("{version:04}_")), "{file}");
            assert_eq!(
                &std::fs::read_to_string(dir.join(file)).unwrap(),
                sql,
                "{file}"
            );
            assert!(
                sql.contains(&format!(
                    "INSERT INTO runwarden_schema (version) VALUES ({version});"
                )),
                "{file} does not record its version"
            );
        }
    }
}

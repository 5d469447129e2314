//! The PostgreSQL side of shared state: one client per daemon (and one of
//! admission's own, whose transaction spans two round trips), every check
//! and its record in one transaction, so no two replicas can interleave
//! between them.//!
//! The schema and the functions the fences call live in `migrations/`, which `runwarden db
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
//! Each operation carries its SQL text beside the code that binds it, one
//! file per part of the state: admission and the queue, leases, the
//! fleet's switch and demotions, and listening for their changes.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::{Client, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

mod admit;
mod batch;
mod lease;
mod listen;
mod rollouts;
mod switch;

pub(crate) use batch::{LeaseWrite, PairRow, RunWrite, TriggerRow, Writes};
pub(crate) use rollouts::{Begun, Decided, RolloutTaken};

use super::{FleetSwitch, StoreError};
use crate::config::PostgresSettings;

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
    (1, include_str!("../../../migrations/0001_shared_state.sql")),
    (2, include_str!("../../../migrations/0002_approvals.sql")),
    (
        3,
        include_str!("../../../migrations/0003_duplicate_window.sql"),
    ),
    (4, include_str!("../../../migrations/0004_admit_all.sql")),
    (5, include_str!("../../../migrations/0005_timed_switch.sql")),
    (6, include_str!("../../../migrations/0006_admit_window.sql")),
    (7, include_str!("../../../migrations/0007_max_runs.sql")),
    (8, include_str!("../../../migrations/0008_work_queue.sql")),
    (9, include_str!("../../../migrations/0009_demotion.sql")),
    (
        10,
        include_str!("../../../migrations/0010_schedule_fires.sql"),
    ),
    (
        11,
        include_str!("../../../migrations/0011_unrecorded_runs.sql"),
    ),
    (
        12,
        include_str!("../../../migrations/0012_rules_in_rust.sql"),
    ),
    (13, include_str!("../../../migrations/0013_rollouts.sql")),
    (14, include_str!("../../../migrations/0014_decided_via.sql")),
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
    /// Admission's own connection: a batch's transaction spans two round
    /// trips, which no other operation may interleave with.
    admission: tokio::sync::Mutex<Option<batch::Prepared>>,
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
    pub(crate) fn open(shared: &PostgresSettings, replica: &str) -> Result<Postgres, StoreError> {
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
            admission: Default::default(),
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
        let client = Arc::new(self.connect().await?);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// A new connection, its driver spawned.
    async fn connect(&self) -> Result<Client, StoreError> {
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
        Ok(client)
    }

    /// Run one operation against the database, within the operation
    /// timeout; a failure that is not the database's answer drops the
    /// connection, so the next operation makes a new one.
    pub(super) async fn with<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.within(op_timeout(self.lease), what, f).await
    }

    /// [`with`](Self::with), within `limit`. Every operation is one
    /// transaction, tried again when PostgreSQL rolled it back for
    /// contention ([`again`]).
    async fn within<T, F, Fut>(&self, limit: Duration, what: &str, f: F) -> Result<T, StoreError>
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        again(|| async {
            let result = match self.client().await {
                Ok(client) => match tokio::time::timeout(limit, f(client)).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(self.failed(what, &e)),
                    Err(_) => Err(StoreError::Unreachable(format!("{what}: timed out"))),
                },
                Err(e) => Err(e),
            };
            match &result {
                Err(StoreError::Unreachable(why)) => {
                    *self.client.lock().await = None;
                    self.note(Some(why.clone()));
                }
                Err(StoreError::Contended(_)) => {}
                _ => self.note(None),
            }
            result
        })
        .await
    }

    /// Apply every migration the database lacks, in order, each in its own
    /// transaction. Returns the versions applied.
    pub(crate) async fn migrate(&self) -> Result<Vec<i32>, StoreError> {
        let have = self.version().await?;
        let mut applied = Vec::new();
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > have) {
            let body = &format!("BEGIN;\n{sql}\nCOMMIT;");
            // Not a run's operation: a busy server may take its time over DDL.
            self.within(MIGRATION_TIMEOUT, "migrating", |c| async move {
                c.batch_execute(body).await
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

/// A transaction PostgreSQL rolled back because it waited on another
/// that waited on it (a deadlock: rows are locked in order within
/// runwarden's own statements, but not across every release's and
/// function's) wrote nothing: `op` is tried again, a few times and a few
/// milliseconds apart, before its caller hears of it.
pub(crate) async fn again<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    const TRIES: u64 = 5;
    let mut tried = 1;
    loop {
        match op().await {
            Err(StoreError::Contended(why)) if tried < TRIES => {
                tracing::debug!("tried again: {why}");
                tokio::time::sleep(Duration::from_millis(tried * 3)).await;
                tried += 1;
            }
            done => return done,
        }
    }
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// This release's store as replica `replica` on `pg`, migrated (the
    /// directory holds its `state.postgres` URL file).
    #[cfg(feature = "estate")]
    pub(crate) async fn migrated(
        pg: &crate::test_pg::Pg,
        replica: &str,
    ) -> (tempfile::TempDir, std::sync::Arc<super::Postgres>) {
        leased(pg, replica, std::time::Duration::from_secs(30)).await
    }

    /// [`migrated`], its claims living `lease`.
    #[cfg(feature = "estate")]
    pub(crate) async fn leased(
        pg: &crate::test_pg::Pg,
        replica: &str,
        lease: std::time::Duration,
    ) -> (tempfile::TempDir, std::sync::Arc<super::Postgres>) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("url");
        std::fs::write(&url, pg.url()).unwrap();
        std::fs::set_permissions(&url, std::fs::Permissions::from_mode(0o600)).unwrap();
        let shared = crate::config::PostgresSettings {
            url_file: url,
            lease,
            ca_file: None,
        };
        let store = std::sync::Arc::new(super::Postgres::open(&shared, replica).unwrap());
        store.migrate().await.unwrap();
        (dir, store)
    }

    /// A transaction of another client's that crosses `this`, already
    /// under way, as a run taken from the fleet's queue may: it holds the
    /// lease of (`rb`, `second`), waits until `this` waits on it, then asks
    /// for (`rb`, `first`), which `this` holds. PostgreSQL finds the two
    /// waiting on each other; `this` waited first, so its deadlock check
    /// (after `deadlock_timeout`) is the one that rolls a transaction back.
    #[cfg(feature = "estate")]
    pub(crate) async fn crossed<T: Send + 'static>(
        pg: &crate::test_pg::Pg,
        first: &str,
        second: &str,
        this: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let (other, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let lock = |host: &str| {
            format!(
                "SELECT 1 FROM runwarden_leases WHERE runbook = 'rb' AND host = '{host}' FOR UPDATE"
            )
        };
        other.batch_execute("BEGIN").await.unwrap();
        other.batch_execute(&lock(second)).await.unwrap();
        let this = tokio::spawn(this);
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while pg.sql(waiting) != "1" {
            assert!(
                std::time::Instant::now() < deadline,
                "it never waited on {second}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        other.batch_execute(&lock(first)).await.unwrap();
        other.batch_execute("COMMIT").await.unwrap();
        let done = this.await.unwrap();
        let deadlocks =
            pg.sql("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()");
        assert_ne!(deadlocks, "0", "the two never waited on each other");
        done
    }

    /// An operation PostgreSQL rolled back for a deadlock wrote nothing:
    /// it is tried again, and its caller (a call's fence, a run's
    /// confirmation, a claim given back) never hears of it.
    #[cfg(feature = "estate")]
    #[tokio::test]
    async fn an_operation_rolled_back_for_a_deadlock_is_tried_again() {
        let pg = crate::test_pg::Pg::start();
        let (_dir, store) = migrated(&pg, "r").await;
        pg.sql(
            "INSERT INTO runwarden_leases (runbook, host, token) VALUES ('rb', 'h1', 1), ('rb', 'h2', 1)",
        );
        // One transaction that takes h1, then h2.
        let op = store.clone();
        let done = crossed(&pg, "h1", "h2", async move {
            op.with("taking two leases", |c| async move {
                c.batch_execute(
                    "UPDATE runwarden_leases SET token = token + 1 WHERE host = 'h1';
                     UPDATE runwarden_leases SET token = token + 1 WHERE host = 'h2'",
                )
                .await
            })
            .await
        })
        .await;
        assert!(done.is_ok(), "{done:?}");
        let tokens =
            pg.sql("SELECT string_agg(token::text, ',' ORDER BY host) FROM runwarden_leases");
        assert_eq!(tokens, "2,2", "written once, whole");
    }
}

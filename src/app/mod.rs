//! `runwarden serve`: wiring and lifecycle of the daemon.
//!
//! Start: load the config (the same loader as `check`), open the audit log,
//! close runs a killed process left open (verdict `interrupted`) and restore
//! cooldowns, from one read of the audit log, then start
//! the workers: the HTTP server, the cron worker, the kill-switch watcher and
//! the config reloader, and with shared state those of `store::workers`.
//! Stop (the `shutdown` future: SIGTERM/SIGINT in the binary, anything in
//! tests): stop accepting triggers, let in-flight runs finish their current
//! call and stop, bounded by `shutdown_grace`, then return.
//!
//! This is the one place that knows whether the state is this machine's or
//! a fleet's (`state::chosen`): the scheduler, the runs and the API hold a
//! `SharedState`, and only the fleet's own workers are given PostgreSQL.
//! Every worker is wired here; the workers that belong to a concept live
//! with it.
//!
//! One file: the daemon's start and stop mirror each other (what starts
//! first stops last), which reads best in one place; the workers themselves
//! live in their modules.

mod switches;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use notify::Watcher;
use tokio::sync::{mpsc, watch};

use crate::audit::AuditLog;
use crate::config::Config;
use crate::http::{AppState, WebhookToken, router};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::trigger::cron;

/// What `runwarden serve` was told on its command line.
pub struct ServeOptions {
    /// The configuration directory.
    pub config_dir: PathBuf,
    /// Overrides `listen` from runwarden.yaml.
    pub listen: Option<SocketAddr>,
}

/// What a daemon that is ready says of itself.
#[derive(Debug, Clone, Copy)]
pub struct Listening {
    /// The bound address.
    pub addr: SocketAddr,
    /// How many runbooks it loaded.
    pub(crate) runbooks: usize,
    /// How many hosts.
    pub(crate) hosts: usize,
}

/// Make the run locks' files of alert-triggered runbooks ahead of their
/// first alert, in the background (see [`crate::runlock::make_ahead`]).
fn make_lock_files_ahead(config: Arc<Config>) {
    tokio::task::spawn_blocking(move || {
        let pairs = config
            .runbooks
            .values()
            .filter(|r| r.on_alert.is_some())
            .flat_map(|r| r.hosts.iter().map(|h| (r.name.as_str(), &**h)));
        let state = &config.settings.state_dir;
        match crate::runlock::make_ahead(state, pairs) {
            Ok(0) => {}
            Ok(n) => tracing::debug!("made {n} run lock file(s) ahead of their first alert"),
            Err(e) => tracing::warn!(
                "cannot make run lock files ahead in {}: {e}; each is made when its run starts",
                state.join("locks").display()
            ),
        }
    });
}

/// Compile every constant this binary compiles lazily (patterns, schemas;
/// see [`crate::compiled`]): `check` and `serve` ask before anything else,
/// so a build that carries a broken one never starts, and says which.
pub fn compile_constants() -> Result<(), crate::compiled::CompileError> {
    crate::claims::patterns()?;
    crate::tools::declared::safe_pattern()?;
    crate::tools::compile_schemas()
}

/// Run the daemon until `shutdown` resolves. `ready` hears once everything
/// listens and every signal handler is installed.
pub async fn serve(
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<Listening>>,
) -> anyhow::Result<()> {
    // Resolved once: the watcher compares the paths inotify reports (real,
    // absolute ones) with it, and a relative `--config .` must not miss them.
    let opts = ServeOptions {
        config_dir: std::fs::canonicalize(&opts.config_dir).unwrap_or(opts.config_dir),
        ..opts
    };
    let config_watch = ConfigWatch::start(&opts.config_dir);
    let (config, listen, token) = loaded(&opts)?;
    let audit = Arc::new(AuditLog::open_with(
        &config.settings.audit_log,
        config.settings.audit_rotation.clone(),
    )?);
    // The config was parsed on several threads; hand their freed buffers back.
    // SAFETY: malloc_trim only releases free memory to the system.
    unsafe {
        nix::libc::malloc_trim(0);
    }
    let metrics = Arc::new(Metrics::new(prometheus::Registry::new()));
    metrics.init_series(&config);
    let (config_tx, config_rx) = watch::channel(config.clone());
    let (stop_tx, stop_rx) = watch::channel(false);

    let token = Arc::new(std::sync::RwLock::new(match token {
        Some(t) => WebhookToken::Bearer(t),
        None => WebhookToken::None,
    }));
    let access = match &config.settings.principals_file {
        Some(f) => Some(Arc::new(crate::access::Access::load(f)?)),
        None => None,
    };
    // L2 approvals, once a principals file says who may decide.
    let approvals = access.as_ref().map(|_| {
        Arc::new(crate::gate::approvals::Approvals::new(
            config.settings.approval_timeout,
        ))
    });
    let store = crate::store::workers::shared_state(&config).await?;
    // The one place that knows which: everything else holds a SharedState.
    let shared = crate::state::chosen(store.clone());
    let scheduler = Scheduler::new(
        config_rx.clone(),
        audit.clone(),
        metrics.clone(),
        stop_rx.clone(),
        approvals.clone(),
        shared.clone(),
    );
    recover(&scheduler).await?;
    // Silences of runs the last process left, now closed: expired. Only
    // looked for when a runbook silences (the log's last day is read).
    if config.runbooks.values().any(|r| r.silence.is_some()) {
        tokio::spawn(crate::silence::expire_left(audit.clone()));
    }
    let rollouts = crate::rollout::Rollouts::new(
        scheduler.clone(),
        audit.clone(),
        metrics.clone(),
        config_rx.clone(),
        store.clone(),
    );
    let going_on = rollouts
        .recover()
        .context("reading the audit log for the rollouts the last process left")?;
    if going_on > 0 {
        tracing::info!("{going_on} rollout(s) the last process left go on where they were");
    }
    make_lock_files_ahead(config.clone());

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;

    let mut workers = tokio::task::JoinSet::new();
    if let Some(store) = scheduler.approvals.clone() {
        workers.spawn(approval_age_worker(store, metrics.clone(), stop_rx.clone()));
    }
    workers.spawn(cron::worker(
        config_rx.clone(),
        crate::rollout::Fanout(rollouts.clone()),
        metrics.clone(),
        stop_rx.clone(),
    ));
    workers.spawn(switches::worker(
        config_rx.clone(),
        shared,
        audit.clone(),
        metrics.clone(),
        stop_rx.clone(),
    ));
    if let Some(pg) = store.clone() {
        workers.spawn(crate::rollout::takeover_worker(
            rollouts.clone(),
            pg,
            stop_rx.clone(),
        ));
    }
    let shared_with = (&scheduler, &audit, &metrics);
    fleet_workers(&mut workers, store, &config_rx, shared_with, &stop_rx);
    // Installed before we say we are ready, so an early SIGHUP cannot kill the process.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot handle SIGHUP")?;
    workers.spawn(reload_worker(
        opts.config_dir.clone(),
        config_tx,
        Secrets {
            token: token.clone(),
            access: access.clone(),
            loopback: listen.ip().is_loopback(),
        },
        metrics.clone(),
        hup,
        stop_rx.clone(),
        config_watch,
    ));

    let mcp = crate::mcp::http::endpoint(
        Arc::new(crate::mcp::http::Daemon {
            config: config_rx.clone(),
            scheduler: scheduler.clone(),
            open: metrics.mcp_sessions.clone(),
            refused: metrics.mcp_refused.clone(),
        }),
        config.settings.mcp_idle_timeout,
        config.settings.mcp_limits.clone(),
    );
    let state = AppState {
        config: config_rx,
        scheduler: scheduler.clone(),
        rollouts,
        metrics,
        audit,
        token,
        access,
        mcp: mcp.clone(),
        listen: bound,
    };
    let server = tokio::spawn(crate::http::serve(listener, router(state), stop_rx.clone()));
    // Everything is listening and every signal handler is installed.
    let listening = Listening {
        addr: bound,
        runbooks: config.runbooks.len(),
        hosts: config.hosts.len(),
    };
    announce(listening, ready, &mut workers, &stop_rx);

    shutdown.await;
    wind_down(&config, &scheduler, &stop_tx, &mcp).await;
    let _ = server.await;
    workers.shutdown().await;
    Ok(())
}

/// Say the daemon is ready: to `ready` (tests), and to systemd
/// (`READY=1`, and its watchdog's pings from now on).
fn announce(
    listening: Listening,
    ready: Option<tokio::sync::oneshot::Sender<Listening>>,
    workers: &mut tokio::task::JoinSet<()>,
    stop_rx: &watch::Receiver<bool>,
) {
    if let Some(tx) = ready {
        let _ = tx.send(listening);
    }
    service_manager::ready(listening.addr);
    if let Some(every) = service_manager::watchdog_interval() {
        workers.spawn(service_manager::watchdog(every, stop_rx.clone()));
    }
}

/// The configuration `serve` starts with, where it listens and the
/// webhook's token: refused (before anything opens) when it would listen
/// beyond loopback with no token.
fn loaded(opts: &ServeOptions) -> anyhow::Result<(Arc<Config>, SocketAddr, Option<Vec<u8>>)> {
    let config = Arc::new(Config::load(&opts.config_dir)?);
    for w in config.serve_problems(opts.listen)? {
        tracing::warn!("{w}");
    }
    let listen = opts.listen.unwrap_or(config.settings.listen);
    let token = match &config.settings.webhook_token_file {
        Some(f) => Some(read_token(f)?),
        None => None,
    };
    if !listen.ip().is_loopback() && token.is_none() {
        bail!(
            "refusing to listen on {listen} without a webhook token: set webhook_token_file in runwarden.yaml, or listen on 127.0.0.1"
        );
    }
    Ok((config, listen, token))
}

/// Close the runs a killed process left open (verdict `interrupted`),
/// restore admission's state from the same read of the audit log, and on
/// one machine start again the runs the last stop handed back before they
/// proposed anything (their triggers were answered `started`; a fleet's
/// queue holds them instead).
async fn recover(scheduler: &Arc<Scheduler>) -> anyhow::Result<()> {
    let (interrupted, again) = scheduler
        .recover()
        .context("reading the audit log for interrupted runs and cooldowns")?;
    if interrupted > 0 {
        tracing::warn!(
            "{interrupted} run(s) were interrupted by the last stop; see `runwarden audit show RUN_ID`"
        );
    }
    if !again.is_empty() && !scheduler.state().queues() {
        let n = again.len();
        match scheduler.submit_all(again).await {
            Ok(outcomes) => tracing::info!(
                "{n} run(s) the last stop handed back start again: {} started",
                outcomes
                    .iter()
                    .filter(|o| o.result == crate::rules::TriggerResult::Started)
                    .count()
            ),
            Err(e) => {
                tracing::error!("{n} run(s) the last stop handed back could not be started: {e}")
            }
        }
    }
    Ok(())
}

/// The fleet's gauges (`store::workers::fleet_worker`, which says there
/// is no fleet too), and with shared state a replica's own workers: LISTEN
/// for the fleet's changes, take runs from its queue, keep approval
/// requests in step, and close runs whose replica died (their lease
/// expired).
fn fleet_workers(
    workers: &mut tokio::task::JoinSet<()>,
    store: Option<Arc<crate::store::Postgres>>,
    config_rx: &watch::Receiver<Arc<Config>>,
    (scheduler, audit, metrics): (&Arc<Scheduler>, &Arc<AuditLog>, &Arc<Metrics>),
    stop_rx: &watch::Receiver<bool>,
) {
    workers.spawn(crate::store::workers::fleet_worker(
        config_rx.clone(),
        store.clone(),
        metrics.clone(),
        stop_rx.clone(),
    ));
    let Some(store) = store else {
        return;
    };
    workers.spawn(store.clone().listen(stop_rx.clone()));
    workers.spawn(
        scheduler
            .clone()
            .take_queued(store.clone(), stop_rx.clone()),
    );
    if let Some(approvals) = scheduler.approvals.clone() {
        workers.spawn(crate::store::workers::approval_sync_worker(
            store.clone(),
            approvals,
            stop_rx.clone(),
        ));
    }
    let (closer, audit) = (scheduler.clone(), audit.clone());
    workers.spawn(crate::store::workers::reap_worker(
        store,
        move |run| closer.closed_elsewhere(run, &audit),
        metrics.clone(),
        stop_rx.clone(),
    ));
}

/// Stop: no new triggers, in-flight runs stop at their next call (bounded
/// by `shutdown_grace`), agents' sessions end so the server can stop.
async fn wind_down(
    config: &Config,
    scheduler: &Scheduler,
    stop_tx: &watch::Sender<bool>,
    mcp: &crate::mcp::http::Endpoint,
) {
    service_manager::stopping();
    tracing::info!("shutting down: no new triggers; waiting for in-flight runs to stop");
    let _ = stop_tx.send(true);
    let grace = config.settings.shutdown_grace;
    if !scheduler.wait_idle(grace).await {
        tracing::warn!(
            "runs still in flight after {grace:?}; exiting anyway (they will be reported as interrupted)"
        );
    }
    // Agents' sessions hold streams open: ended, they let the server stop.
    mcp.close_all().await;
}

fn read_token(file: &Path) -> anyhow::Result<Vec<u8>> {
    Ok(crate::secret::read_token(file, "webhook_token_file")?.into_bytes())
}

/// Keep `runwarden_approval_oldest_pending_seconds` current: how long the
/// oldest request still pending has waited for a person.
async fn approval_age_worker(
    store: Arc<crate::gate::approvals::Approvals>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let now = jiff::Timestamp::now();
        let oldest = store
            .list()
            .iter()
            .filter(|r| r.state == crate::gate::approvals::State::Pending)
            .filter_map(|r| r.created_at.parse::<jiff::Timestamp>().ok())
            .min();
        let waited = oldest.map_or(0.0, |t| now.duration_since(t).as_secs_f64().max(0.0));
        metrics.approval_oldest_pending.set(waited);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reload on SIGHUP and when files under runbooks/ or hosts/ change. A valid
/// config replaces the old one for the next run; an invalid one is rejected
/// whole and the old one stays.
/// The secrets `serve` holds that a reload re-reads.
struct Secrets {
    token: Arc<std::sync::RwLock<WebhookToken>>,
    access: Option<Arc<crate::access::Access>>,
    /// Whether the daemon listens on loopback (where no token is allowed).
    loopback: bool,
}

impl Secrets {
    /// Re-read the token and approvers files the new config names. A file
    /// that cannot be accepted fails closed (no token is taken, nobody can
    /// approve) rather than keeping an old secret its operator meant to
    /// replace; each problem comes back by name, and the reload counts as
    /// failed.
    fn reload(&self, config: &Config) -> Vec<String> {
        let mut problems = Vec::new();
        let token = match &config.settings.webhook_token_file {
            Some(f) => match read_token(f) {
                Ok(t) => {
                    tracing::info!("webhook token re-read from {}", f.display());
                    WebhookToken::Bearer(t)
                }
                Err(e) => {
                    problems.push(format!(
                        "webhook token refused, no token is taken until it is fixed and runwarden reloads (the API answers 503): {e:#}"
                    ));
                    WebhookToken::Refused
                }
            },
            None if self.loopback => WebhookToken::None,
            None => {
                let why = "webhook_token_file was removed, but runwarden listens beyond loopback (restart to change `listen`)";
                problems.push(format!("{why}; no token is taken until it is set again"));
                WebhookToken::Refused
            }
        };
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = token;
        match (&self.access, &config.settings.principals_file) {
            (Some(a), Some(f)) => match a.reload() {
                Ok(n) => tracing::info!("principals re-read from {}: {n} principal(s)", f.display()),
                Err(e) => problems.push(format!(
                    "principals file refused, no principal's token is taken and nobody can approve until it is fixed and runwarden reloads (systemctl reload runwarden): {e}"
                )),
            },
            (None, Some(_)) | (Some(_), None) => tracing::warn!(
                "principals_file was added or removed: that takes a restart of runwarden serve"
            ),
            (None, None) => {}
        }
        problems
    }
}

/// The configuration directory under watch: set up before the config is
/// first loaded, so no change made after that load is missed.
struct ConfigWatch {
    _watcher: Option<notify::RecommendedWatcher>,
    changed: mpsc::Receiver<()>,
    /// The files' fingerprint when the config in force was read.
    in_force: String,
}

impl ConfigWatch {
    fn start(dir: &Path) -> ConfigWatch {
        let (tx, changed) = mpsc::channel::<()>(1);
        let watched = dir.to_path_buf();
        let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if e.is_ok_and(|e| is_config_change(&watched, &e)) {
                let _ = tx.try_send(());
            }
        })
        .ok();
        if let Some(w) = watcher.as_mut() {
            for sub in CONFIG_DIRS {
                let _ = w.watch(&dir.join(sub), notify::RecursiveMode::NonRecursive);
            }
            let _ = w.watch(dir, notify::RecursiveMode::NonRecursive);
        }
        ConfigWatch {
            _watcher: watcher,
            changed,
            in_force: fingerprint(dir),
        }
    }
}

async fn reload_worker(
    dir: PathBuf,
    config: watch::Sender<Arc<Config>>,
    secrets: Secrets,
    metrics: Arc<Metrics>,
    mut hup: tokio::signal::unix::Signal,
    mut stop: watch::Receiver<bool>,
    watch: ConfigWatch,
) {
    let ConfigWatch {
        _watcher,
        changed: mut rx,
        mut in_force,
    } = watch;
    // Reading the files is blocking I/O: it never runs on a runtime worker.
    let read = |dir: &PathBuf| {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || fingerprint(&dir))
    };
    let load = |dir: &PathBuf| {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || Config::load(&dir))
    };
    loop {
        let explicit = tokio::select! {
            _ = rx.recv() => {
                // Editors write in several steps (a temporary file, then a
                // rename): wait until the directory has been quiet a moment.
                loop {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if rx.try_recv().is_err() {
                        break;
                    }
                }
                false
            }
            _ = hup.recv() => true,
            _ = stop.changed() => return,
        };
        let now = read(&dir).await.unwrap_or_default();
        if !explicit && now == in_force {
            continue; // touched, not changed
        }
        let loaded = match load(&dir).await {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!("configuration not reloaded: the loader failed: {e}");
                continue;
            }
        };
        match loaded {
            Ok(new) => {
                in_force = now;
                let problems = secrets.reload(&new);
                metrics.init_series(&new);
                needs_restart(&config.borrow().settings, &new.settings);
                let new = Arc::new(new);
                make_lock_files_ahead(new.clone());
                config.send_replace(new);
                let why = if explicit { "SIGHUP" } else { "a file changed" };
                if problems.is_empty() {
                    metrics.config_reloads.with_label_values(&["success"]).inc();
                    metrics.config_last_reload_successful.set(1);
                    tracing::info!("configuration reloaded from {} ({why})", dir.display());
                } else {
                    metrics.config_reloads.with_label_values(&["failure"]).inc();
                    metrics.config_last_reload_successful.set(0);
                    for p in problems {
                        tracing::error!(
                            "configuration reloaded from {} ({why}), but {p}",
                            dir.display()
                        );
                    }
                }
            }
            Err(e) => {
                // Not again until the files change once more.
                in_force = now;
                metrics.config_reloads.with_label_values(&["failure"]).inc();
                metrics.config_last_reload_successful.set(0);
                tracing::error!("configuration rejected, the previous one stays in force:\n{e}");
            }
        }
    }
}

/// Whether an inotify event is a change to the configuration: a YAML file
/// under runbooks/ or hosts/, or runwarden.yaml, created, written, renamed
/// or removed. Opening and reading files (which every reload does itself)
/// is not a change, nor is anything under state/.
/// The directories of YAML files a reload reads (each file one runbook,
/// host or declared tool).
const CONFIG_DIRS: [&str; 3] = ["runbooks", "hosts", "tools"];

fn is_config_change(dir: &Path, e: &notify::Event) -> bool {
    if !is_change(e)
        || matches!(
            e.kind,
            notify::EventKind::Modify(notify::event::ModifyKind::Metadata(_))
        )
    {
        return false;
    }
    e.paths.iter().any(|p| {
        let yaml = matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml"));
        let parent = p.parent();
        (yaml && CONFIG_DIRS.iter().any(|sub| parent == Some(&dir.join(sub))))
            || *p == dir.join("runwarden.yaml")
    })
}

/// Whether an inotify event changed something: a file created, written,
/// renamed, removed or its metadata changed; not opened, read or closed.
fn is_change(e: &notify::Event) -> bool {
    use notify::EventKind;
    matches!(
        e.kind,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
    )
}

/// sha256 of every configuration file's name and bytes: equal fingerprints
/// mean nothing changed, whatever inotify said.
fn fingerprint(dir: &Path) -> String {
    use sha2::Digest;
    let mut files = vec![dir.join("runwarden.yaml")];
    for sub in CONFIG_DIRS {
        if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
            files.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml"))
            }));
        }
    }
    files.sort();
    let mut h = sha2::Sha256::new();
    for f in files {
        h.update(f.as_os_str().as_encoded_bytes());
        h.update([0]);
        // Never blocks on a FIFO or a device: what is not a regular file
        // is hashed as its name alone, and the loader refuses it by name.
        let mut bytes = Vec::new();
        if let Ok(file) = crate::files::open_regular(&f, true) {
            use std::io::Read;
            if file.take(8 << 20).read_to_end(&mut bytes).is_ok() {
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(&bytes);
            }
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Log, by name, each changed setting that only a restart applies.
fn needs_restart(old: &crate::config::Settings, new: &crate::config::Settings) {
    let changed = [
        ("listen", old.listen != new.listen),
        ("audit_log", old.audit_log != new.audit_log),
        ("audit_rotation", old.audit_rotation != new.audit_rotation),
        (
            "kill_switch_dir",
            old.kill_switch_dir != new.kill_switch_dir,
        ),
        ("state_dir", old.state_dir != new.state_dir),
    ];
    for (name, _) in changed.iter().filter(|(_, c)| *c) {
        tracing::warn!(
            "`{name}` changed in runwarden.yaml: that takes a restart of runwarden serve; the old value stays in force until then"
        );
    }
}

/// systemd's side of `Type=notify` (sd_notify(3)): ready once everything
/// listens, stopping at shutdown, and the watchdog's heartbeat from the
/// runtime that serves triggers, so a wedged daemon is restarted. Outside
/// systemd (no `NOTIFY_SOCKET`) every call does nothing.
mod service_manager {
    use sd_notify::NotifyState;
    use std::time::Duration;

    pub(crate) fn ready(bound: std::net::SocketAddr) {
        let status = format!("listening on {bound}");
        let _ = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    pub(crate) fn stopping() {
        let _ = sd_notify::notify(false, &[NotifyState::Stopping]);
    }

    /// Half of `WatchdogSec=` when the unit sets one for this process.
    pub(crate) fn watchdog_interval() -> Option<Duration> {
        let mut usec = 0;
        sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2))
    }

    pub(crate) async fn watchdog(every: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let _ = sd_notify::notify(false, &[NotifyState::Watchdog]);
                }
                _ = stop.changed() => return,
            }
        }
    }
}

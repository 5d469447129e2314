//! `runwarden serve`: wiring and lifecycle of the daemon.
//!
//! Start: load the config (the same loader as `check`), open the audit log,
//! close runs a killed process left open (verdict `interrupted`), then start
//! the workers: the HTTP server, the cron worker, the kill-switch watcher and
//! the config reloader. Stop (the `shutdown` future: SIGTERM/SIGINT in the
//! binary, anything in tests): stop accepting triggers, let in-flight runs
//! finish their current call and stop, bounded by `shutdown_grace`, then
//! return.

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
use crate::gate::KillSwitch;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::trigger::cron;

pub struct ServeOptions {
    pub config_dir: PathBuf,
    /// Overrides `listen` from runwarden.yaml.
    pub listen: Option<SocketAddr>,
}

/// Run the daemon until `shutdown` resolves. `ready` receives the bound address.
pub async fn serve(
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<()> {
    let config = Arc::new(Config::load(&opts.config_dir).map_err(|e| anyhow::anyhow!("{e}"))?);
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
    let audit = Arc::new(AuditLog::open(&config.settings.audit_log)?);
    // The config was parsed on several threads; hand their freed buffers back.
    // SAFETY: malloc_trim only releases free memory to the system.
    unsafe {
        nix::libc::malloc_trim(0);
    }
    let metrics = Arc::new(Metrics::new(prometheus::Registry::new()));
    metrics.init_series(&config);
    let (config_tx, config_rx) = watch::channel(config.clone());
    let (stop_tx, stop_rx) = watch::channel(false);

    let token = Arc::new(std::sync::RwLock::new(token));
    let approvals = match &config.settings.approvers_file {
        Some(f) => Some(Arc::new(
            crate::gate::approvals::Approvals::load(f, config.settings.approval_timeout)
                .map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let scheduler = Scheduler::new(
        config_rx.clone(),
        audit.clone(),
        metrics.clone(),
        stop_rx.clone(),
        approvals.clone(),
    );
    let interrupted = scheduler
        .close_interrupted()
        .context("reading the audit log for interrupted runs")?;
    if interrupted > 0 {
        tracing::warn!(
            "{interrupted} run(s) were interrupted by the last stop; see `runwarden audit show RUN_ID`"
        );
    }

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;

    let mut workers = tokio::task::JoinSet::new();
    workers.spawn(cron::worker(
        config_rx.clone(),
        scheduler.clone(),
        metrics.clone(),
        stop_rx.clone(),
    ));
    workers.spawn(killswitch_worker(
        config_rx.clone(),
        metrics.clone(),
        stop_rx.clone(),
    ));
    // Installed before we say we are ready, so an early SIGHUP cannot kill the process.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot handle SIGHUP")?;
    workers.spawn(reload_worker(
        opts.config_dir.clone(),
        config_tx,
        Secrets {
            token: token.clone(),
            approvals,
            loopback: listen.ip().is_loopback(),
        },
        metrics.clone(),
        hup,
        stop_rx.clone(),
    ));

    let state = AppState {
        config: config_rx,
        scheduler: scheduler.clone(),
        metrics,
        audit,
        token,
    };
    let server = tokio::spawn(crate::http::serve(listener, router(state), stop_rx.clone()));
    // Everything is listening and every signal handler is installed.
    println!(
        "runwarden: listening on {bound}; {} runbook(s), {} host(s)",
        config.runbooks.len(),
        config.hosts.len()
    );
    if let Some(tx) = ready {
        let _ = tx.send(bound);
    }

    shutdown.await;
    tracing::info!("shutting down: no new triggers; waiting for in-flight runs to stop");
    let _ = stop_tx.send(true);
    let grace = config.settings.shutdown_grace;
    if !scheduler.wait_idle(grace).await {
        tracing::warn!(
            "runs still in flight after {grace:?}; exiting anyway (they will be reported as interrupted)"
        );
    }
    let _ = server.await;
    workers.shutdown().await;
    Ok(())
}

fn read_token(file: &Path) -> anyhow::Result<Vec<u8>> {
    let text = crate::secret::read_file(file, "webhook_token_file").map_err(anyhow::Error::msg)?;
    let token = text.trim();
    if token.len() < 16 {
        bail!(
            "the webhook token in {} is shorter than 16 characters",
            file.display()
        );
    }
    Ok(token.as_bytes().to_vec())
}

/// Keep `runwarden_kill_switch_engaged` current. inotify events can be
/// dropped, so every event (and a slow timer) means "look again"; the gate's
/// own check before every call stays the backstop.
async fn killswitch_worker(
    config: watch::Receiver<Arc<Config>>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let dir = config.borrow().settings.kill_switch_dir.clone();
    let mut watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
        let _ = tx.try_send(());
    })
    .ok();
    if let Some(w) = watcher.as_mut()
        && let Err(e) = w.watch(&dir, notify::RecursiveMode::NonRecursive)
    {
        tracing::warn!(
            "cannot watch the kill-switch directory {}: {e} (the gate still checks it before every call; raise fs.inotify.max_user_watches if this says so)",
            dir.display()
        );
    }
    let ks = KillSwitch::new(dir);
    loop {
        // The gate's own checks, so the gauge and the gate never disagree
        // (a dangling `ENGAGED` link stops every call, and shows as 1).
        let engaged_global = ks.check_global().is_err();
        metrics
            .kill_switch_engaged
            .with_label_values(&["global"])
            .set(engaged_global as i64);
        // The runbooks of the config in force now, not of the one at start-up.
        let runbooks: Vec<String> = config.borrow().runbooks.keys().cloned().collect();
        for rb in &runbooks {
            let on = ks.runbook_file_engaged(rb);
            metrics
                .kill_switch_engaged
                .with_label_values(&[rb])
                .set(on as i64);
        }
        tokio::select! {
            _ = rx.recv() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reload on SIGHUP and when files under runbooks/ or hosts/ change. A valid
/// config replaces the old one for the next run; an invalid one is rejected
/// whole and the old one stays.
/// The secrets `serve` holds that a SIGHUP re-reads.
struct Secrets {
    token: Arc<std::sync::RwLock<Option<Vec<u8>>>>,
    approvals: Option<Arc<crate::gate::approvals::Approvals>>,
    /// Whether the daemon listens on loopback (where no token is allowed).
    loopback: bool,
}

impl Secrets {
    /// Re-read the token and approvers files the new config names; on any
    /// problem the old secret stays and the problem is logged by name.
    fn reload(&self, config: &Config) {
        match &config.settings.webhook_token_file {
            Some(f) => match read_token(f) {
                Ok(t) => {
                    *self.token.write().unwrap_or_else(|p| p.into_inner()) = Some(t);
                    tracing::info!("webhook token re-read from {}", f.display());
                }
                Err(e) => tracing::error!("webhook token not reloaded, the old one stays: {e:#}"),
            },
            None if self.loopback => {
                *self.token.write().unwrap_or_else(|p| p.into_inner()) = None;
            }
            None => tracing::error!(
                "webhook_token_file was removed, but runwarden listens beyond loopback: the old token stays (restart to change `listen`)"
            ),
        }
        match (&self.approvals, &config.settings.approvers_file) {
            (Some(a), Some(f)) => match a.reload(f) {
                Ok(n) => tracing::info!("approvers re-read from {}: {n} approver(s)", f.display()),
                Err(e) => tracing::error!("approvers not reloaded, the old list stays: {e}"),
            },
            (None, Some(_)) | (Some(_), None) => tracing::warn!(
                "approvers_file was added or removed: that takes a restart of runwarden serve"
            ),
            (None, None) => {}
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
) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let fs_tx = tx.clone();
    let mut watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
        let _ = fs_tx.try_send(());
    })
    .ok();
    if let Some(w) = watcher.as_mut() {
        for sub in ["runbooks", "hosts"] {
            let _ = w.watch(&dir.join(sub), notify::RecursiveMode::NonRecursive);
        }
    }
    loop {
        tokio::select! {
            _ = rx.recv() => {
                // Editors write in several steps: let them finish.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = hup.recv() => {}
            _ = stop.changed() => return,
        }
        match Config::load(&dir) {
            Ok(new) => {
                secrets.reload(&new);
                metrics.init_series(&new);
                config.send_replace(Arc::new(new));
                metrics.config_reloads.with_label_values(&["success"]).inc();
                metrics.config_last_reload_successful.set(1);
                tracing::info!("configuration reloaded from {}", dir.display());
            }
            Err(e) => {
                metrics.config_reloads.with_label_values(&["failure"]).inc();
                metrics.config_last_reload_successful.set(0);
                tracing::error!("configuration rejected, the previous one stays in force:\n{e}");
            }
        }
    }
}

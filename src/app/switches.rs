//! The kill-switch watcher: keeps `runwarden_kill_switch_*` current and
//! ends timed switches at their time.
//!
//! inotify events can be dropped, so every event (and a slow timer) means
//! "look again"; the gate's own check before every call stays the
//! backstop. Each look ends the timed switches whose time has come (this
//! machine's files, and with shared state the fleet's rows), with an audit
//! line naming who engaged each and why; publishes this replica's own
//! switch files to the shared state (so `status` and `release` on any
//! replica can say what still stops runs here); and sets each scope's
//! gauges from the gate's own checks, so the gauge and the gate never
//! disagree.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher;
use tokio::sync::{mpsc, watch};

use crate::audit::AuditLog;
use crate::config::Config;
use crate::gate::KillSwitch;
use crate::gate::killswitch::Expired;
use crate::metrics::Metrics;
use crate::state::SharedState;

/// How often the watcher looks without being told of a change.
const RELOOK: Duration = Duration::from_secs(5);

/// Watch the kill switch until `stop` changes.
pub(super) async fn worker(
    config: watch::Receiver<Arc<Config>>,
    state: Arc<dyn SharedState>,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let dir = config.borrow().settings.kill_switch_dir.clone();
    let (tx, mut rx) = mpsc::channel::<()>(1);
    // Dropped with this function: the directory is watched while it runs.
    let _watcher = watch_dir(&dir, tx);
    let mut watch = SwitchWatch {
        ks: state.kill_switch(&dir),
        state,
        audit,
        metrics,
        was: HashMap::new(),
        published: None,
    };
    loop {
        watch.sweep().await;
        let mut ends = watch.show_global();
        // The runbooks of the config in force now, not of the one at start-up.
        let runbooks: Vec<String> = config.borrow().runbooks.keys().cloned().collect();
        for rb in &runbooks {
            ends.extend(watch.show_runbook(rb));
        }
        let wait = next_look(ends, watch.ks.fleet().and_then(|f| f.next_end()));
        let fleet = watch.ks.fleet().cloned();
        let fleet_changed = async {
            match &fleet {
                Some(f) => f.changed.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = rx.recv() => {}
            _ = fleet_changed => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Tell `tx` of every change in `dir` (not of opens and reads: each look
/// opens the directory, and would wake the watcher again at once).
fn watch_dir(dir: &std::path::Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.as_ref().map_or(true, super::is_change) {
            let _ = tx.try_send(());
        }
    })
    .ok();
    if let Some(w) = watcher.as_mut()
        && let Err(e) = w.watch(dir, notify::RecursiveMode::NonRecursive)
    {
        tracing::warn!(
            "cannot watch the kill-switch directory {}: {e} (the gate still checks it before every call; raise fs.inotify.max_user_watches if this says so)",
            dir.display()
        );
    }
    watcher
}

/// When to look again: on a change to the directory or to the fleet's
/// switch (woken), when the first timed switch of `ends` (or the fleet's,
/// `fleet_end` in Unix seconds) ends, and every [`RELOOK`].
fn next_look(ends: Vec<jiff::Timestamp>, fleet_end: Option<f64>) -> Duration {
    let now = jiff::Timestamp::now();
    let fleet_end =
        fleet_end.and_then(|t| jiff::Timestamp::from_millisecond((t * 1000.0) as i64).ok());
    ends.into_iter()
        .chain(fleet_end)
        .filter_map(|t| Duration::try_from(t.duration_since(now)).ok())
        .filter(|d| !d.is_zero())
        .min()
        .map_or(RELOOK, |d| (d + Duration::from_millis(50)).min(RELOOK))
}

/// What the watcher keeps between looks.
struct SwitchWatch {
    /// The gate's own view: this machine's files and the fleet's switch.
    ks: KillSwitch,
    state: Arc<dyn SharedState>,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    /// Whether each scope was engaged at the last look (its changes are logged).
    was: HashMap<String, bool>,
    /// What this replica last published of its own switch files: written
    /// again only when it changes (not a database write every few seconds).
    published: Option<Vec<(String, String)>>,
}

impl SwitchWatch {
    /// End the timed switches whose time has come, then publish this
    /// replica's own files if they changed.
    async fn sweep(&mut self) {
        let files = self.ks.clone();
        for e in tokio::task::spawn_blocking(move || files.sweep_expired())
            .await
            .unwrap_or_default()
        {
            self.ended(e, "file");
        }
        match self.state.sweep_switches().await {
            Ok(list) => list.into_iter().for_each(|e| self.ended(e, "fleet")),
            Err(e) => tracing::debug!("timed fleet switches not looked at: {e}"),
        }
        if let Ok(mine) = self.ks.status()
            && self.published.as_ref() != Some(&mine)
        {
            match self.state.publish_switches(&mine).await {
                Ok(()) => self.published = Some(mine),
                Err(e) => tracing::debug!("this replica's switch files not published: {e}"),
            }
        }
    }

    /// A timed switch that ended at its time: logged and audited.
    fn ended(&self, ended: Expired, source: &str) {
        tracing::warn!(
            scope = %ended.scope,
            "kill switch released itself at its time ({}): engaged by {} ({}: {})",
            ended.until,
            ended.engaged_by,
            source,
            ended.reason
        );
        if let Err(e) = self.audit.kill_switch_ended(&ended, source) {
            tracing::error!("the kill switch's end could not be audited: {e}");
        }
    }

    /// Log a scope's change, and a switch already engaged when the daemon starts.
    fn log_change(&mut self, scope: &str, on: bool, why: impl FnOnce() -> String) {
        match (self.was.insert(scope.to_string(), on), on) {
            (Some(false) | None, true) => tracing::warn!(scope, "kill switch engaged: {}", why()),
            (Some(true), false) => tracing::info!(scope, "kill switch released"),
            _ => {}
        }
    }

    /// The global switch's gauges (`global`, and the fleet's `fleet`):
    /// when this machine's timed one ends, if it is engaged.
    fn show_global(&mut self) -> Vec<jiff::Timestamp> {
        // A dangling `ENGAGED` link stops every call, and shows as 1.
        let global = self.ks.check_global();
        let on = global.is_err();
        self.log_change("global", on, || {
            global.err().map(|e| e.to_string()).unwrap_or_default()
        });
        let until = self.ks.until(None).filter(|_| on);
        self.set("global", on, engaged_at(&self.ks, None, on), until);
        self.show_fleet("fleet", "global");
        until.into_iter().collect()
    }

    /// A runbook's gauges: its file (`RUNBOOK`), and the fleet's switch for
    /// it (`fleet:RUNBOOK`); when its timed file ends, if it is engaged.
    fn show_runbook(&mut self, rb: &str) -> Option<jiff::Timestamp> {
        self.show_fleet(&format!("fleet:{rb}"), rb);
        let on = self.ks.runbook_file_engaged(rb);
        let file = self.ks.file_of(Some(rb));
        self.log_change(rb, on, || file.display().to_string());
        let until = self.ks.until(Some(rb)).filter(|_| on);
        self.set(rb, on, engaged_at(&self.ks, Some(rb), on), until);
        until
    }

    /// The fleet's own switch for `scope` (shared state), on every replica
    /// whichever one engaged it, as series `label`.
    fn show_fleet(&mut self, label: &str, scope: &str) {
        let Some(fleet) = self.ks.fleet().cloned() else {
            return;
        };
        let on = fleet.engaged(scope);
        self.log_change(label, on, || "engaged for the fleet (shared state)".into());
        let m = &self.metrics;
        m.kill_switch_engaged
            .with_label_values(&[label])
            .set(on as i64);
        m.kill_switch_until
            .with_label_values(&[label])
            .set(fleet.until(scope).filter(|_| on).unwrap_or(0.0));
    }

    /// One of this machine's scopes' gauges.
    fn set(&self, label: &str, on: bool, since: f64, until: Option<jiff::Timestamp>) {
        let m = &self.metrics;
        m.kill_switch_engaged
            .with_label_values(&[label])
            .set(on as i64);
        m.kill_switch_since.with_label_values(&[label]).set(since);
        m.kill_switch_until
            .with_label_values(&[label])
            .set(until.map_or(0.0, |t| t.as_second() as f64));
    }
}

/// Since when a switch is engaged (its file's time, a dangling link's own),
/// for on-call's "since when"; 0 while released.
fn engaged_at(ks: &KillSwitch, runbook: Option<&str>, on: bool) -> f64 {
    if !on {
        return 0.0;
    }
    std::fs::symlink_metadata(ks.file_of(runbook))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

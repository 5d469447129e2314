//! `recycle_worker_pool`: replace a pool's workers through its master, then
//! verify that every old worker is gone, new ones serve, and the health check passes.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::registry::{Change, Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process, http, poll, privileged, service};
use crate::host::Host;
use crate::host::{PoolMaster, Recycle};
use crate::process::Argv;

/// Longest wait for old workers to leave after the recycle.
const VERIFY_WAIT: Duration = Duration::from_secs(15);

/// Stands for the master's pid in a planned argv: it is only known at run time.
pub(super) const MASTER_PID: &str = "<master pid>";

/// The argv of the recycle; with a signal the master pid is only known at run time.
pub(crate) fn planned_argv(host: &Host, pool: &str) -> Vec<Argv> {
    let p = &host.worker_pools[pool];
    match (&p.master, p.recycle) {
        (PoolMaster::Unit(unit), Recycle::Reload) => {
            vec![service::change_argv(host, "reload", unit)]
        }
        (_, Recycle::Signal(sig)) => vec![signal_argv(host, sig.name(), MASTER_PID)],
        (PoolMaster::PidFile { .. }, Recycle::Reload) => Vec::new(),
    }
}

fn signal_argv(host: &Host, signal: &str, pid: &str) -> Argv {
    privileged(
        host,
        Argv::new(&host.binaries.kill).args(["-s", signal, "--", pid]),
    )
}

async fn master_pid(ctx: &Ctx<'_>, master: &PoolMaster) -> Result<u32, ToolResult> {
    let pid = match master {
        PoolMaster::PidFile { file, executable } => {
            let pid = trusted_pid_file(file)?;
            if !runs(pid, executable) {
                return Err(ToolResult::failed(format!(
                    "pid file {} names process {pid}, which is not {}: nothing was signalled (a stale or planted pid file)",
                    file.display(),
                    executable.display()
                )));
            }
            pid
        }
        PoolMaster::Unit(unit) => {
            let out = ctx
                .run(&service::show_argv(ctx.host, unit))
                .await
                .map_err(ToolResult::failed)?;
            let state = service::UnitState::parse(&out.stdout_text());
            state.main_pid() as u32
        }
    };
    if pid <= 1 || !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(ToolResult::failed(format!(
            "the pool's master process ({pid}) is not running"
        )));
    }
    Ok(pid)
}

/// The pid in a pid file that only root can have written: the file and its
/// directory owned by root and writable by nobody else (a sticky directory
/// such as /run's may be shared, since only the file's owner can replace it).
fn trusted_pid_file(file: &Path) -> Result<u32, ToolResult> {
    use std::os::unix::fs::MetadataExt;
    let shown = file.display();
    let meta = std::fs::symlink_metadata(file)
        .map_err(|e| ToolResult::failed(format!("cannot read pid file {shown}: {e}")))?;
    if !meta.is_file() {
        return Err(ToolResult::failed(format!(
            "pid file {shown} is not a regular file"
        )));
    }
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(ToolResult::failed(format!(
            "pid file {shown} can be written by someone other than root (owner uid {}, mode {:03o}); nothing was signalled",
            meta.uid(),
            meta.mode() & 0o777
        )));
    }
    let dir = file.parent().unwrap_or(Path::new("/"));
    let d = std::fs::metadata(dir)
        .map_err(|e| ToolResult::failed(format!("cannot read {}: {e}", dir.display())))?;
    let sticky = d.mode() & 0o1000 != 0;
    if d.uid() != 0 || (d.mode() & 0o022 != 0 && !sticky) {
        return Err(ToolResult::failed(format!(
            "pid file {shown} is in {}, where someone other than root can replace it; nothing was signalled",
            dir.display()
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| ToolResult::failed(format!("cannot read pid file {shown}: {e}")))?;
    text.trim()
        .parse::<u32>()
        .map_err(|_| ToolResult::failed(format!("pid file {shown} does not hold a pid")))
}

/// Whether process `pid` runs `program`: its executable, or, for an
/// interpreted program (gunicorn under python3), the script it was started with.
fn runs(pid: u32, program: &Path) -> bool {
    if std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == program) {
        return true;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let want = program.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).take(2).any(|arg| arg == want)
}

/// Children of `pid`, from /proc (works the same on the runner and on an agent host).
pub(crate) fn children(pid: u32) -> BTreeSet<u32> {
    let mut kids = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return kids;
    };
    for entry in dir.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The command name may hold spaces and parentheses: fields start after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next();
        if f.next().and_then(|p| p.parse::<u32>().ok()) == Some(pid) && state != Some("Z") {
            kids.insert(child);
        }
    }
    kids
}

pub(crate) async fn recycle(ctx: &Ctx<'_>, name: &str) -> ToolResult {
    let pool = &ctx.host.worker_pools[name];
    let master = match master_pid(ctx, &pool.master).await {
        Ok(p) => p,
        Err(e) => {
            return ToolResult {
                verified: Some(false),
                ..e
            };
        }
    };
    let before = children(master);
    let argv = match (&pool.master, pool.recycle) {
        (PoolMaster::Unit(unit), Recycle::Reload) => service::change_argv(ctx.host, "reload", unit),
        (_, Recycle::Signal(sig)) => signal_argv(ctx.host, sig.name(), &master.to_string()),
        (PoolMaster::PidFile { .. }, Recycle::Reload) => {
            return ToolResult::failed("reload needs a unit");
        }
    };
    let out = match ctx.run(&argv).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let mut result = from_process(
        &out,
        json!({ "pool": name, "master_pid": master, "workers_before": before }),
    );
    if result.outcome != Outcome::Ok {
        result.verified = Some(false);
        return result;
    }
    let until = (tokio::time::Instant::now() + VERIFY_WAIT).min(ctx.deadline);
    let replaced = poll(until, Duration::from_millis(100), || async {
        let now = children(master);
        (!now.is_empty() && now.is_disjoint(&before)).then_some(now)
    })
    .await;
    let master_alive = Path::new(&format!("/proc/{master}")).exists();
    let health = match &pool.health_check {
        Some(check) => Some(http::probe(&ctx.host.health_checks[check], until).await),
        None => None,
    };
    let healthy = health.as_ref().is_none_or(|h| h["healthy"] == true);
    let verified = replaced.is_some() && master_alive && healthy;
    result.data["workers_after"] = json!(replaced.clone().unwrap_or_else(|| children(master)));
    result.data["master_alive"] = json!(master_alive);
    result.data["health"] = health.unwrap_or(serde_json::Value::Null);
    result.data["evidence"] = json!(match (&replaced, master_alive, healthy) {
        (Some(now), true, true) => format!(
            "{} old worker(s) replaced by {}; master {master} unchanged; healthy",
            before.len(),
            now.len()
        ),
        (None, _, _) => "not verified: the old workers were not all replaced in time".to_string(),
        (_, false, _) => format!("not verified: master {master} is gone"),
        (_, _, false) => "not verified: the health check failed after the recycle".to_string(),
    });
    result.verified = Some(verified);
    if !verified {
        result.outcome = Outcome::Error;
        result.error = Some(format!(
            "recycle of pool {name} ran but could not be verified"
        ));
    }
    result
}

/// `recycle_worker_pool`: new workers for an allowed pool, from its master.
pub(crate) struct RecycleWorkerPool;

impl Tool for RecycleWorkerPool {
    const NAME: &'static str = "recycle_worker_pool";
    const TIER: Tier = Tier::Change;
    const DESCRIPTION: &'static str = "Replace the workers of an allowed pool (reload or signal to its master), then verify new workers and health.";
    type Args = PoolArgs;
    type Resolved = Change<String>;

    fn resolve(a: PoolArgs, host: &Host, _: PathMode) -> Result<Change<String>, ArgError> {
        let pool = allowed_key(&a.pool, &host.worker_pools, "worker_pools")?;
        Ok(Change::new(pool, &a.reason))
    }

    fn args_json(c: &Change<String>) -> serde_json::Value {
        json!({ "pool": c.target })
    }

    fn reason(c: &Change<String>) -> Option<&str> {
        Some(&c.reason)
    }

    fn argv(c: &Change<String>, host: &Host) -> Vec<Argv> {
        planned_argv(host, &c.target)
    }

    async fn run(ctx: &Ctx<'_>, c: &Change<String>) -> ToolResult {
        recycle(ctx, &c.target).await
    }

    fn targets(host: &Host) -> Option<(&'static str, Vec<String>)> {
        Some(("pool", host.worker_pools.keys().cloned().collect()))
    }
}

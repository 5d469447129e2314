//! The static tool registry: every operation runwarden can perform.
//!
//! A tool is a narrow typed operation with a fixed [`Tier`], an argument type
//! (its JSON schema is generated from that type, see [`args`]), an argv
//! builder and an output parser. The tier is a property of the tool in code
//! ([`ToolId::tier`]); nothing read at run time can change it.
//!
//! Tier 3 (destructive, irreversible) does not exist here. There is no shell
//! tool and no generic command tool; a runbook can only *suggest* a tier-3
//! command as text for a person.
//!
//! Calls go through two stages: [`resolve`] turns untrusted JSON arguments into
//! an [`Action`] whose every value is checked against the host's allowlists,
//! and [`execute`] runs an action on the machine it is called on.

pub mod args;
mod cert;
mod disk;
mod http;
mod journal;
mod logs;
mod pool;
mod process;
mod service;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::Host;
use crate::executor::process::{Argv, Limits, ProcessOutput};
use args::*;

/// What a tool may do to a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// Only observes; runs without approval.
    Observe = 1,
    /// Makes a reversible change; needs standing approval (L3) or is only proposed (L1).
    Change = 2,
}

impl Tier {
    pub fn number(self) -> u8 {
        self as u8
    }
}

macro_rules! registry {
    ($($variant:ident => $name:literal, $tier:ident, $args:ty, $desc:literal;)*) => {
        /// Every tool that exists.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum ToolId { $($variant),* }

        impl ToolId {
            pub const ALL: &'static [ToolId] = &[$(ToolId::$variant),*];

            pub fn name(self) -> &'static str {
                match self { $(ToolId::$variant => $name),* }
            }

            /// The tier, fixed in code.
            pub fn tier(self) -> Tier {
                match self { $(ToolId::$variant => Tier::$tier),* }
            }

            pub fn description(self) -> &'static str {
                match self { $(ToolId::$variant => $desc),* }
            }

            /// How a tier-2 tool checks its own effect (from its description).
            pub fn verification(self) -> Option<&'static str> {
                self.description()
                    .split_once("then verify")
                    .map(|(_, v)| v.trim_start_matches(':').trim().trim_end_matches('.'))
            }

            pub fn from_name(name: &str) -> Option<ToolId> {
                match name { $($name => Some(ToolId::$variant),)* _ => None }
            }

            /// The JSON schema of the arguments, generated from the type that checks them.
            pub fn schema(self) -> Value {
                match self { $(ToolId::$variant => schema_of::<$args>()),* }
            }

            fn check_typed(self, args: &Value) -> Result<(), String> {
                match self {
                    $(ToolId::$variant => parse::<$args>(args).map(|_| ())),*
                }
            }
        }
    };
}

registry! {
    DiskUsage => "disk_usage", Observe, DiskUsageArgs,
        "Filesystem usage of an allowed path: use_pct, size/used/avail bytes, filesystem, mount point, and the largest entries one level down (bounded in time; largest_truncated says when cut).";
    ServiceStatus => "service_status", Observe, UnitArgs,
        "State of an allowed systemd unit: load/active/sub state, main pid, since when, last result, restarts.";
    ReadJournal => "read_journal", Observe, JournalArgs,
        "Recent journal entries of an allowed unit at or above a priority. At most 80 lines, newest last; truncated says when cut.";
    ListProcesses => "list_processes", Observe, ProcessArgs,
        "The top processes by cpu, memory or age: pid, ppid, user, state, cpu%, rss, elapsed seconds, command name.";
    CertExpiry => "cert_expiry", Observe, NameArgs,
        "Expiry of an allowed certificate file: not_after, days_left, subject, issuer.";
    HttpCheck => "http_check", Observe, NameArgs,
        "GET an allowed loopback health-check URL with a hard timeout: healthy, status, latency, body excerpt.";
    RestartService => "restart_service", Change, UnitChangeArgs,
        "Restart an allowed systemd unit, then verify it is active again with a new main pid.";
    ReloadService => "reload_service", Change, UnitChangeArgs,
        "Reload an allowed systemd unit, then verify it is still active with the same main pid.";
    RotateLogs => "rotate_logs", Change, RotateArgs,
        "Force logrotate on an allowed configuration, then verify: exit status, no error lines, state file updated.";
    RecycleWorkerPool => "recycle_worker_pool", Change, PoolArgs,
        "Replace the workers of an allowed pool (reload or signal to its master), then verify new workers and health.";
    RenewCertificate => "renew_certificate", Change, RenewArgs,
        "Run the host's renewal command for an allowed certificate, then verify the new not_after is later than the old.";
}

fn schema_of<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap_or(Value::Null);
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
        obj.remove("description");
    }
    schema
}

fn parse<T: serde::de::DeserializeOwned>(args: &Value) -> Result<T, String> {
    let args = if args.is_null() {
        json!({})
    } else {
        args.clone()
    };
    serde_json::from_value(args).map_err(|e| e.to_string())
}

/// Check arguments against a tool's type before any host is known (config load).
/// With templated values, only the field names can be checked now.
pub fn check_shape(tool: ToolId, args: &Value, templated: bool) -> Result<(), String> {
    if !templated {
        return tool.check_typed(args);
    }
    let schema = tool.schema();
    let props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let given = args.as_object().cloned().unwrap_or_default();
    if let Some(k) = given.keys().find(|k| !props.contains_key(*k)) {
        let known: Vec<&str> = props.keys().map(String::as_str).collect();
        return Err(format!("unknown field `{k}`, expected one of {known:?}"));
    }
    for r in schema["required"].as_array().into_iter().flatten() {
        if let Some(r) = r.as_str()
            && !given.contains_key(r)
        {
            return Err(format!("missing field `{r}`"));
        }
    }
    Ok(())
}

/// How paths are checked: on the machine that will run the call, or by their text only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMode {
    /// Resolve symlinks and `..` on this machine, then check what they point to.
    Resolve,
    /// Check the text only (the call runs elsewhere; that side resolves again).
    Lexical,
}

/// A call whose every argument was checked against the host: the only input
/// [`execute`] accepts. Opaque: only [`resolve`] makes one, so no code
/// outside this module can hand-build a call the allowlists never saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Action(Resolved);

/// What an [`Action`] holds; private to the tools.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::tools) enum Resolved {
    DiskUsage {
        path: PathBuf,
    },
    ServiceStatus {
        unit: String,
    },
    ReadJournal {
        unit: String,
        since: Since,
        priority: Priority,
    },
    ListProcesses {
        sort: ProcessSort,
        limit: usize,
    },
    CertExpiry {
        name: String,
    },
    HttpCheck {
        name: String,
    },
    RestartService {
        unit: String,
        reason: String,
    },
    ReloadService {
        unit: String,
        reason: String,
    },
    RotateLogs {
        config: PathBuf,
        reason: String,
    },
    RecycleWorkerPool {
        pool: String,
        reason: String,
    },
    RenewCertificate {
        name: String,
        reason: String,
    },
}

impl Action {
    pub fn tool(&self) -> ToolId {
        match &self.0 {
            Resolved::DiskUsage { .. } => ToolId::DiskUsage,
            Resolved::ServiceStatus { .. } => ToolId::ServiceStatus,
            Resolved::ReadJournal { .. } => ToolId::ReadJournal,
            Resolved::ListProcesses { .. } => ToolId::ListProcesses,
            Resolved::CertExpiry { .. } => ToolId::CertExpiry,
            Resolved::HttpCheck { .. } => ToolId::HttpCheck,
            Resolved::RestartService { .. } => ToolId::RestartService,
            Resolved::ReloadService { .. } => ToolId::ReloadService,
            Resolved::RotateLogs { .. } => ToolId::RotateLogs,
            Resolved::RecycleWorkerPool { .. } => ToolId::RecycleWorkerPool,
            Resolved::RenewCertificate { .. } => ToolId::RenewCertificate,
        }
    }

    pub fn tier(&self) -> Tier {
        self.tool().tier()
    }

    pub fn reason(&self) -> Option<&str> {
        match &self.0 {
            Resolved::RestartService { reason, .. }
            | Resolved::ReloadService { reason, .. }
            | Resolved::RotateLogs { reason, .. }
            | Resolved::RecycleWorkerPool { reason, .. }
            | Resolved::RenewCertificate { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The resolved arguments, as recorded in the audit log (the reason has its own field).
    pub fn args_json(&self) -> Value {
        match &self.0 {
            Resolved::DiskUsage { path } => json!({ "path": path }),
            Resolved::ServiceStatus { unit } => json!({ "unit": unit }),
            Resolved::ReadJournal {
                unit,
                since,
                priority,
            } => {
                json!({ "unit": unit, "since": since, "priority": priority })
            }
            Resolved::ListProcesses { sort, limit } => json!({ "sort": sort, "limit": limit }),
            Resolved::CertExpiry { name } | Resolved::HttpCheck { name } => json!({ "name": name }),
            Resolved::RestartService { unit, .. } | Resolved::ReloadService { unit, .. } => {
                json!({ "unit": unit })
            }
            Resolved::RotateLogs { config, .. } => json!({ "config": config }),
            Resolved::RecycleWorkerPool { pool, .. } => json!({ "pool": pool }),
            Resolved::RenewCertificate { name, .. } => json!({ "name": name }),
        }
    }

    /// The commands a tier-2 action runs, exactly as it would spawn them (for `--dry-run`).
    pub fn planned_argv(&self, host: &Host) -> Vec<Argv> {
        match &self.0 {
            Resolved::RestartService { unit, .. } => {
                vec![service::change_argv(host, "restart", unit)]
            }
            Resolved::ReloadService { unit, .. } => {
                vec![service::change_argv(host, "reload", unit)]
            }
            Resolved::RotateLogs { config, .. } => vec![logs::argv(host, config)],
            Resolved::RecycleWorkerPool { pool, .. } => pool::planned_argv(host, pool),
            Resolved::RenewCertificate { name, .. } => {
                cert::renew_argv(host, name).into_iter().collect()
            }
            Resolved::DiskUsage { path } => disk::argv(host, path).into(),
            Resolved::ServiceStatus { unit } => vec![service::show_argv(host, unit)],
            Resolved::ReadJournal {
                unit,
                since,
                priority,
            } => vec![journal::argv(host, unit, *since, *priority)],
            Resolved::ListProcesses { sort, .. } => vec![process::argv(host, *sort)],
            Resolved::CertExpiry { .. } | Resolved::HttpCheck { .. } => Vec::new(),
        }
    }
}

/// Check untrusted arguments for `tool` against `host`'s allowlists.
///
/// The error is a sentence a planner (or a model) can act on; it quotes
/// untrusted values only escaped and cut short.
pub fn resolve(tool: ToolId, args: &Value, host: &Host, mode: PathMode) -> Result<Action, String> {
    Ok(Action(match tool {
        ToolId::DiskUsage => {
            let a: DiskUsageArgs = parse(args)?;
            Resolved::DiskUsage {
                path: allowed_path(a.path.as_str(), &host.paths, mode, "paths")?,
            }
        }
        ToolId::ServiceStatus => {
            let a: UnitArgs = parse(args)?;
            Resolved::ServiceStatus {
                unit: allowed_unit(&a.unit, host, false)?,
            }
        }
        ToolId::ReadJournal => {
            let a: JournalArgs = parse(args)?;
            Resolved::ReadJournal {
                unit: allowed_unit(&a.unit, host, true)?,
                since: a.since,
                priority: a.priority,
            }
        }
        ToolId::ListProcesses => {
            let a: ProcessArgs = parse(args)?;
            Resolved::ListProcesses {
                sort: a.sort,
                limit: a.limit.get(),
            }
        }
        ToolId::CertExpiry => {
            let a: NameArgs = parse(args)?;
            Resolved::CertExpiry {
                name: allowed_key(&a.name, &host.certificates, "certificates")?,
            }
        }
        ToolId::HttpCheck => {
            let a: NameArgs = parse(args)?;
            Resolved::HttpCheck {
                name: allowed_key(&a.name, &host.health_checks, "health_checks")?,
            }
        }
        ToolId::RestartService | ToolId::ReloadService => {
            let a: UnitChangeArgs = parse(args)?;
            let unit = allowed_unit(&a.unit, host, false)?;
            let reason = a.reason.as_str().trim().to_string();
            if tool == ToolId::RestartService {
                Resolved::RestartService { unit, reason }
            } else {
                Resolved::ReloadService { unit, reason }
            }
        }
        ToolId::RotateLogs => {
            let a: RotateArgs = parse(args)?;
            Resolved::RotateLogs {
                config: allowed_file(
                    a.config.as_str(),
                    &host.logrotate_configs,
                    mode,
                    "logrotate_configs",
                )?,
                reason: a.reason.as_str().trim().to_string(),
            }
        }
        ToolId::RecycleWorkerPool => {
            let a: PoolArgs = parse(args)?;
            Resolved::RecycleWorkerPool {
                pool: allowed_key(&a.pool, &host.worker_pools, "worker_pools")?,
                reason: a.reason.as_str().trim().to_string(),
            }
        }
        ToolId::RenewCertificate => {
            let a: RenewArgs = parse(args)?;
            let name = allowed_key(&a.name, &host.certificates, "certificates")?;
            if host.certificates[&name].renew.is_none() {
                return Err(format!(
                    "certificate \"{name}\" has no `renew` command in the host file"
                ));
            }
            Resolved::RenewCertificate {
                name,
                reason: a.reason.as_str().trim().to_string(),
            }
        }
    }))
}

fn allowed_unit(unit: &UnitName, host: &Host, journal: bool) -> Result<String, String> {
    let u = unit.as_str();
    if host.units.contains(u) || (journal && host.journals.contains(u)) {
        return Ok(u.to_string());
    }
    let mut allowed: Vec<&str> = host.units.iter().map(String::as_str).collect();
    if journal {
        allowed.extend(host.journals.iter().map(String::as_str));
    }
    Err(format!(
        "unit {} is not allowed on host \"{}\" (allowed: {allowed:?})",
        shown(u),
        host.name
    ))
}

fn allowed_key<V>(
    name: &EntryName,
    map: &std::collections::BTreeMap<String, V>,
    field: &str,
) -> Result<String, String> {
    if map.contains_key(name.as_str()) {
        Ok(name.as_str().to_string())
    } else {
        let known: Vec<&str> = map.keys().map(String::as_str).collect();
        Err(format!(
            "{} is not defined under {field} on this host (defined: {known:?})",
            shown(name.as_str())
        ))
    }
}

/// A path that must be one of `allowed` or below one of them, after
/// resolution. Resolved (local) paths must also stay on the filesystem of the
/// allowed entry they fall under: a bind mount of /etc placed inside an
/// allowed directory resolves to a path below it, but is another mount.
pub fn allowed_path(
    raw: &str,
    allowed: &[PathBuf],
    mode: PathMode,
    field: &str,
) -> Result<PathBuf, String> {
    let resolved = resolve_path(raw, mode)?;
    let under = allowed
        .iter()
        .map(|a| match mode {
            PathMode::Resolve => std::fs::canonicalize(a).unwrap_or_else(|_| a.clone()),
            PathMode::Lexical => a.clone(),
        })
        .filter(|a| resolved.starts_with(a))
        .max_by_key(|a| a.components().count());
    match under {
        Some(a)
            if mode == PathMode::Resolve
                && a != resolved
                && mount_of(&a) != mount_of(&resolved) =>
        {
            Err(format!(
                "path {} crosses a mount point below the allowed {} (list the mount point in the host's {field} if it may be examined)",
                shown(raw),
                a.display()
            ))
        }
        Some(_) => Ok(resolved),
        None => Err(not_allowed(raw, &resolved, allowed, field)),
    }
}

/// Which mount a path is on (statx's mount id; the device number where
/// the kernel has no mount ids). `None` when it cannot be told.
fn mount_of(path: &Path) -> Option<u64> {
    use nix::libc;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx writes into the zeroed buffer it is given; the path is NUL-terminated.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut buf,
        )
    };
    if rc != 0 {
        return None;
    }
    if buf.stx_mask & libc::STATX_MNT_ID != 0 {
        Some(buf.stx_mnt_id)
    } else {
        Some(((buf.stx_dev_major as u64) << 32) | buf.stx_dev_minor as u64)
    }
}

/// A file that must be exactly one of `allowed`, after resolution.
fn allowed_file(
    raw: &str,
    allowed: &[PathBuf],
    mode: PathMode,
    field: &str,
) -> Result<PathBuf, String> {
    let resolved = resolve_path(raw, mode)?;
    let hit = allowed.iter().any(|a| match mode {
        PathMode::Resolve => std::fs::canonicalize(a).is_ok_and(|a| a == resolved),
        PathMode::Lexical => *a == resolved,
    });
    if hit {
        Ok(resolved)
    } else {
        Err(not_allowed(raw, &resolved, allowed, field))
    }
}

fn resolve_path(raw: &str, mode: PathMode) -> Result<PathBuf, String> {
    let p = Path::new(raw);
    match mode {
        PathMode::Resolve => {
            std::fs::canonicalize(p).map_err(|e| format!("cannot resolve path {}: {e}", shown(raw)))
        }
        PathMode::Lexical => {
            if p.components().any(|c| c == std::path::Component::ParentDir) {
                return Err(format!("path {} contains `..`", shown(raw)));
            }
            Ok(p.components().collect())
        }
    }
}

fn not_allowed(raw: &str, resolved: &Path, allowed: &[PathBuf], field: &str) -> String {
    let via = if Path::new(raw) == resolved {
        String::new()
    } else {
        format!(" (it resolves to {})", shown(&resolved.to_string_lossy()))
    };
    format!(
        "path {}{via} is not allowed by the host's {field}: {allowed:?}",
        shown(raw)
    )
}

/// How a call ended, as far as the tool is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Error,
    Timeout,
}

impl Outcome {
    /// As written in audit lines and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
        }
    }
}

/// What a tool reports: parsed fields, never raw text alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolResult {
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub data: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Some output was cut to fit the caps.
    pub truncated: bool,
    /// Tier-2 only: the tool's own check of its effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    pub duration_ms: u64,
    /// The commands the call ran, program first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<Vec<String>>,
}

impl ToolResult {
    pub fn failed(error: impl Into<String>) -> ToolResult {
        ToolResult {
            outcome: Outcome::Error,
            exit_code: None,
            data: Value::Null,
            error: Some(error.into()),
            truncated: false,
            verified: None,
            duration_ms: 0,
            argv: Vec::new(),
        }
    }

    /// A successful observation.
    pub fn observed(data: Value) -> ToolResult {
        ToolResult {
            outcome: Outcome::Ok,
            data,
            error: None,
            ..ToolResult::failed("")
        }
    }

    /// The view a `when` condition or a later step sees: the data fields plus the outcome.
    /// The call did what it was asked, and a change verified.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Ok && self.verified != Some(false)
    }

    pub fn view(&self) -> Value {
        let mut v = match &self.data {
            Value::Object(m) => Value::Object(m.clone()),
            Value::Null => json!({}),
            other => json!({ "value": other }),
        };
        let m = v.as_object_mut().expect("object");
        m.insert("outcome".into(), json!(self.outcome));
        m.insert("ok".into(), json!(self.outcome == Outcome::Ok));
        m.insert("truncated".into(), json!(self.truncated));
        if let Some(e) = &self.error {
            m.insert("error".into(), json!(e));
        }
        if let Some(v) = self.verified {
            m.insert("verified".into(), json!(v));
        }
        v
    }
}

/// Everything a tool needs to run on this machine.
pub struct Ctx<'a> {
    pub host: &'a Host,
    /// The call must be over by then (tool timeout and run budget, whichever is first).
    pub deadline: tokio::time::Instant,
    pub output_cap: usize,
    pub kill_grace: Duration,
    ran: std::sync::Mutex<Vec<Vec<String>>>,
}

/// Cap on each of stdout and stderr of a spawned tool.
pub const OUTPUT_CAP: usize = 1 << 20;
/// Time between SIGTERM and SIGKILL of a tool's process group.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

impl<'a> Ctx<'a> {
    pub(crate) fn new(host: &'a Host, deadline: tokio::time::Instant) -> Ctx<'a> {
        Ctx {
            host,
            deadline,
            output_cap: OUTPUT_CAP,
            kill_grace: KILL_GRACE,
            ran: Default::default(),
        }
    }

    fn limits(&self, deadline: tokio::time::Instant) -> Limits {
        Limits {
            deadline: deadline.min(self.deadline),
            output_cap: self.output_cap,
            kill_grace: self.kill_grace,
            jail: self.host.jail.clone(),
        }
    }

    /// Spawn one argv (no shell), recording it for the result.
    pub(crate) async fn run(&self, argv: &Argv) -> Result<ProcessOutput, String> {
        self.run_until(argv, self.deadline).await
    }

    pub(crate) async fn run_until(
        &self,
        argv: &Argv,
        deadline: tokio::time::Instant,
    ) -> Result<ProcessOutput, String> {
        self.ran.lock().expect("ctx lock").push(argv.to_vec());
        crate::executor::process::run(argv, &self.limits(deadline))
            .await
            .map_err(|e| e.to_string())
    }

    fn take_argv(&self) -> Vec<Vec<String>> {
        std::mem::take(&mut *self.ran.lock().expect("ctx lock"))
    }
}

/// Wrap a mutating command in `sudo -n` when the host says so (never a shell).
pub fn privileged(host: &Host, argv: Argv) -> Argv {
    if host.sudo {
        argv.with_prefix(&host.binaries.sudo, &["-n", "--"])
    } else {
        argv
    }
}

/// Run a resolved action on this machine and report what happened.
pub(crate) async fn execute(action: &Action, ctx: &Ctx<'_>) -> ToolResult {
    let started = Instant::now();
    let mut result = match &action.0 {
        Resolved::DiskUsage { path } => disk::disk_usage(ctx, path).await,
        Resolved::ServiceStatus { unit } => service::status(ctx, unit).await,
        Resolved::ReadJournal {
            unit,
            since,
            priority,
        } => journal::read(ctx, unit, *since, *priority).await,
        Resolved::ListProcesses { sort, limit } => process::list(ctx, *sort, *limit).await,
        Resolved::CertExpiry { name } => cert::expiry(ctx, name).await,
        Resolved::HttpCheck { name } => http::check(ctx, name).await,
        Resolved::RestartService { unit, .. } => service::restart(ctx, unit).await,
        Resolved::ReloadService { unit, .. } => service::reload(ctx, unit).await,
        Resolved::RotateLogs { config, .. } => logs::rotate(ctx, config).await,
        Resolved::RecycleWorkerPool { pool, .. } => pool::recycle(ctx, pool).await,
        Resolved::RenewCertificate { name, .. } => cert::renew(ctx, name).await,
    };
    result.duration_ms = started.elapsed().as_millis() as u64;
    result.argv = ctx.take_argv();
    if action.tier() == Tier::Change && result.verified.is_none() {
        result.verified = Some(false);
    }
    result
}

/// A result from one finished process: outcome from its exit, data from `parse`.
pub(crate) fn from_process(out: &ProcessOutput, data: Value) -> ToolResult {
    let outcome = if out.timed_out {
        Outcome::Timeout
    } else if out.exit_code == Some(0) {
        Outcome::Ok
    } else {
        Outcome::Error
    };
    let error = match outcome {
        Outcome::Ok => None,
        Outcome::Timeout => Some(format!(
            "timed out after {} ms; process group killed",
            out.duration.as_millis()
        )),
        Outcome::Error => Some(out.failure_text()),
    };
    ToolResult {
        outcome,
        exit_code: out.exit_code,
        data,
        error,
        truncated: out.stdout_truncated || out.stderr_truncated,
        verified: None,
        duration_ms: 0,
        argv: Vec::new(),
    }
}

/// Poll `check` until it returns Some or `until` passes.
pub(crate) async fn poll<T, F, Fut>(
    until: tokio::time::Instant,
    every: Duration,
    mut check: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() + every > until {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `disk_usage` measures what the gate checked: a path swapped for a
    /// symlink after the check (its last component, or a middle one) is
    /// refused, not measured.
    #[test]
    fn a_path_swapped_after_the_gate_checked_it_is_not_measured() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let outside = dir.path().join("outside");
        for d in [
            allowed.join("last"),
            allowed.join("mid/inner"),
            outside.join("inner"),
        ] {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::write(outside.join("inner/secret-name"), "x").unwrap();
        std::fs::create_dir_all(dir.path().join("hosts")).unwrap();
        std::fs::write(
            dir.path().join("hosts/h.yaml"),
            format!(
                "name: h\nconnection: local\npaths: [{}]\n",
                allowed.display()
            ),
        )
        .unwrap();
        let config = crate::config::Config::load(dir.path()).unwrap();
        let host = config.hosts["h"].clone();
        std::fs::create_dir_all(&host.jail).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let run = |path: &std::path::Path, swap: &dyn Fn()| {
            let action = resolve(
                ToolId::DiskUsage,
                &serde_json::json!({ "path": path }),
                &host,
                PathMode::Resolve,
            )
            .expect("the gate allows it");
            swap();
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            rt.block_on(async { execute(&action, &Ctx::new(&host, deadline)).await })
        };
        // Untouched: measured, entries named by the checked path.
        let ok = run(&allowed.join("mid"), &|| {});
        assert_eq!(ok.outcome, Outcome::Ok, "{ok:?}");
        assert_eq!(
            ok.data["largest"][0]["path"],
            allowed.join("mid/inner").display().to_string()
        );
        // The last component replaced by a symlink out, after the check.
        let last = run(&allowed.join("last"), &|| {
            std::fs::remove_dir(allowed.join("last")).unwrap();
            std::os::unix::fs::symlink(&outside, allowed.join("last")).unwrap();
        });
        assert_eq!(last.outcome, Outcome::Error, "{last:?}");
        // A middle component replaced, after the check.
        let mid = run(&allowed.join("mid/inner"), &|| {
            std::fs::rename(allowed.join("mid"), allowed.join("mid-old")).unwrap();
            std::os::unix::fs::symlink(&outside, allowed.join("mid")).unwrap();
        });
        assert_eq!(mid.outcome, Outcome::Error, "{mid:?}");
        assert!(
            mid.error
                .as_deref()
                .unwrap()
                .contains("changed after it was checked"),
            "{mid:?}"
        );
        for r in [&last, &mid] {
            assert!(
                !serde_json::to_string(r).unwrap().contains("secret-name"),
                "nothing outside was read"
            );
            assert!(r.argv.is_empty(), "df and du never ran: {:?}", r.argv);
        }
    }

    #[test]
    fn every_tool_has_an_object_schema_and_tier_two_needs_a_reason() {
        for t in ToolId::ALL {
            let s = t.schema();
            assert_eq!(s["type"], "object", "{}", t.name());
            assert_eq!(s["additionalProperties"], false, "{}", t.name());
            let required: Vec<&str> = s["required"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            assert_eq!(
                required.contains(&"reason"),
                t.tier() == Tier::Change,
                "{}",
                t.name()
            );
            assert_eq!(ToolId::from_name(t.name()), Some(*t));
        }
        assert_eq!(ToolId::from_name("run_shell"), None);
    }

    #[test]
    fn schema_enums_match_the_types() {
        let s = ToolId::ReadJournal.schema();
        let since: Vec<String> =
            serde_json::from_value(s["properties"]["since"]["enum"].clone()).unwrap();
        assert_eq!(since, ["15m", "1h", "6h", "1d"]);
        for v in since {
            assert!(parse::<JournalArgs>(&json!({"unit": "a.service", "since": v})).is_ok());
        }
        assert!(parse::<JournalArgs>(&json!({"unit": "a.service", "since": "2y"})).is_err());
    }

    #[test]
    fn shape_check_catches_unknown_and_missing_fields() {
        assert!(check_shape(ToolId::DiskUsage, &json!({"path": "/"}), false).is_ok());
        let e = check_shape(
            ToolId::DiskUsage,
            &json!({"path": "/", "recursive": true}),
            false,
        )
        .unwrap_err();
        assert!(e.contains("unknown field `recursive`"), "{e}");
        let e = check_shape(ToolId::DiskUsage, &json!({"mount": "{{ x }}"}), true).unwrap_err();
        assert!(e.contains("unknown field `mount`"), "{e}");
        let e = check_shape(ToolId::RotateLogs, &json!({"reason": "x"}), true).unwrap_err();
        assert!(e.contains("missing field `config`"), "{e}");
    }
}

//! Loading and validating the configuration directory.
//!
//! ```text
//! DIR/runwarden.yaml     settings (optional)
//! DIR/hosts/*.yaml       one host per file
//! DIR/runbooks/*.yaml    one runbook per file
//! DIR/tools/*.yaml       one declared tool per file
//! ```
//!
//! Every file is read and parsed into the raw structs of `raw`, then turned
//! into the validated [`Host`] and [`Runbook`] types, checked against each
//! other (a runbook's hosts must exist, its tools must be known and of the
//! right tier). All problems are collected and reported together as
//! `FILE:LINE:COLUMN: message`; a config with any problem is rejected whole,
//! so nothing is ever half-loaded. `runwarden check` and every other command
//! call this same loader.
//!
//! Why one file (a tenth of it its tests): loading is
//! one transaction (every file read, every cross-reference checked, then the
//! whole config or none), and the settings it validates sit next to the
//! loader that resolves them. What a YAML slip is told (unknown keys, with a
//! did-you-mean) lives with the diagnostics, in `diag`.

mod diag;
pub(crate) mod host;
pub mod matchers;
pub(crate) mod model;
mod raw;
pub(crate) mod runbook;
pub(crate) mod tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_saphyr::Spanned;
use sha2::{Digest, Sha256};

use crate::host::safe_name;
pub use crate::host::{Connection, Host};
pub(crate) use diag::{ConfigError, Diagnostic, did_you_mean};
pub(crate) use model::{ApiKey, ModelEndpoint};
pub(crate) use runbook::{Autonomy, DemoteAfter, MaxRuns, OnResolved, PlannedBy, Runbook};

use diag::Diagnostics;

/// Config files larger than this are refused before parsing.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// `audit_head:` in runwarden.yaml: where each run's audit head goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuditHead {
    /// Unset: the system journal where this machine has one, else nowhere
    /// (a machine without journald never fails to ship what it cannot).
    Auto,
    /// `journal`: the system journal, a failure counted and alerted on.
    Journal,
    /// `none`: nowhere (heads are pinned by hand).
    None,
}

impl AuditHead {
    /// Whether heads are sent to the journal here.
    pub(crate) fn ships(self) -> bool {
        match self {
            AuditHead::Auto => crate::logging::journal_socket_exists(),
            AuditHead::Journal => true,
            AuditHead::None => false,
        }
    }
}

/// Settings of the runner, with paths resolved against the config directory.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The hash-chained audit log (`state/audit.jsonl` by default).
    pub audit_log: PathBuf,
    /// When the log closes a segment, and how long segments stay.
    pub audit_rotation: Rotation,
    /// Whether each run's audit head goes to the system journal (see the
    /// audit module's `head`).
    pub(crate) audit_head: AuditHead,
    /// The key that signs each tier-2 permit sent to a managed host.
    pub(crate) permit_key_file: PathBuf,
    /// Where the kill switch's files live.
    pub(crate) kill_switch_dir: PathBuf,
    /// Where runwarden keeps its state: locks, approvals, the permit key.
    pub(crate) state_dir: PathBuf,
    /// Where `serve` listens; loopback unless a webhook token is configured.
    pub(crate) listen: std::net::SocketAddr,
    /// The time zone schedules are read in.
    pub(crate) timezone: jiff::tz::TimeZone,
    /// Runs in flight at once, across all runbooks and hosts.
    pub(crate) max_concurrent_runs: usize,
    /// Bearer token for `POST /api/v1/alerts` (Alertmanager's `credentials_file` format).
    pub(crate) webhook_token_file: Option<PathBuf>,
    /// How long `serve` waits for in-flight runs on SIGTERM.
    pub(crate) shutdown_grace: Duration,
    /// `NAME TOKEN` lines: the people who may approve L2 calls.
    pub(crate) approvers_file: Option<PathBuf>,
    /// How long an approval request waits before it counts as denied.
    pub(crate) approval_timeout: Duration,
    /// Where each new approval request is POSTed (chat-ops).
    pub(crate) approval_webhook: Option<String>,
    /// The model planner's endpoint; runbooks' `agent` goals need it.
    pub(crate) model: Option<ModelEndpoint>,
    /// Tier-2 calls across every run on this machine, within a window.
    pub(crate) fleet_budget: Option<runbook::FleetBudget>,
    /// `state.postgres`: state shared by several daemons; `None`: this machine's own.
    pub(crate) postgres: Option<SharedState>,
    /// This daemon's name among several: `replica`, or the hostname.
    pub(crate) replica: String,
    /// The bearer token of the daemon's `/mcp` (owner-only); `None`: no `/mcp` (404).
    pub(crate) mcp_token_file: Option<PathBuf>,
    /// How long an MCP session of the daemon may be idle before it ends.
    pub(crate) mcp_idle_timeout: Duration,
}

/// `audit_rotation:`: when the audit log's current file becomes a segment,
/// and how long segments stay (the audit module's `segments` says how).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    /// Close the current file once it holds this many bytes.
    pub max_bytes: u64,
    /// ...or once its first line is this old.
    pub max_age: Option<Duration>,
    /// Remove closed segments whose last line is older than this (`None`: keep all).
    pub keep: Option<Duration>,
    /// Remove the oldest closed segments while the history (closed
    /// segments and the current file) holds more bytes than this (`None`:
    /// no bound on size).
    pub max_total: Option<u64>,
}

impl Default for Rotation {
    /// 16 MiB or 7 days a segment (a few days of a busy fleet; what start-up
    /// reads at most), kept 400 days (a year of history, and a month to archive it).
    fn default() -> Self {
        Rotation {
            max_bytes: 16 << 20,
            max_age: Some(Duration::from_secs(7 * 86_400)),
            keep: Some(Duration::from_secs(400 * 86_400)),
            max_total: None,
        }
    }
}

/// `state.postgres` of runwarden.yaml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedState {
    /// The file that holds the libpq URL (the URL is a secret; the file is 0600).
    pub(crate) url_file: PathBuf,
    /// How long a replica's claim on a (runbook, host) lives without renewal.
    pub(crate) lease: Duration,
    /// The certificate authorities (PEM) a TLS connection trusts; `None`:
    /// the system's.
    pub(crate) ca_file: Option<PathBuf>,
}

/// The port `serve` listens on by default (not one of the usual exporter ports).
pub(crate) const DEFAULT_LISTEN: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9731);

/// A complete, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The configuration directory every relative path is read against.
    pub(crate) dir: PathBuf,
    /// runwarden.yaml.
    pub settings: Settings,
    /// runbooks/, by name.
    pub(crate) runbooks: BTreeMap<String, Arc<Runbook>>,
    /// hosts/, by name.
    pub hosts: BTreeMap<String, Arc<Host>>,
    /// Every tool: the built-ins and those declared in tools/.
    pub(crate) tools: crate::tools::Tools,
}

impl Config {
    /// Load and validate everything under `dir`; any problem rejects the whole config.
    pub fn load(dir: &Path) -> Result<Config, ConfigError> {
        let mut diags = Diagnostics::default();
        if !dir.is_dir() {
            diags.file(
                dir,
                "the configuration directory does not exist: give --config DIR, a directory with runbooks/ and hosts/",
            );
            return Err(ConfigError(diags.into_vec()));
        }
        let settings = load_settings(dir, &mut diags);
        let tools = tools::load(dir, &mut diags);
        let host_files = yaml_files(&dir.join("hosts"), &mut diags);
        let runbook_files = yaml_files(&dir.join("runbooks"), &mut diags);
        if host_files.is_empty() && runbook_files.is_empty() && diags.is_empty() {
            diags.file(
                dir,
                "no runbook and no host here (runbooks/*.yaml, hosts/*.yaml): nothing to run; is --config the right directory?",
            );
        }

        let mut hosts = BTreeMap::new();
        // Every name seen, valid or not, and its file: for "defined twice" and dangling-name checks.
        let mut host_names: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (file, parsed, text) in parse_files::<raw::Host>(dir, &host_files, &mut diags) {
            let file = &file;
            let Some((raw, _)) = parsed else {
                let Some(text) = text else { continue };
                // Keep the name known so runbooks naming it do not report it as undefined too.
                if let Ok(raw::NameOnly { name: Some(name) }) = serde_saphyr::from_str(&text) {
                    host_names.entry(name).or_insert_with(|| file.clone());
                }
                continue;
            };
            let name = raw.name.clone();
            if let Some(other) = host_names.insert(name.value.clone(), file.clone()) {
                let msg = format!(
                    "host \"{}\" is defined twice (also in {})",
                    name.value,
                    other.display()
                );
                diags.at(file, name.referenced, msg);
                continue;
            }
            if let Some(host) = host::validate(raw, file, dir, &mut diags) {
                hosts.insert(host.name.clone(), Arc::new(host));
            }
        }

        let known_hosts: BTreeMap<String, Arc<str>> = host_names
            .keys()
            .map(|h| (h.clone(), Arc::from(h.as_str())))
            .collect();
        let mut runbooks: BTreeMap<String, Arc<Runbook>> = BTreeMap::new();
        let mut runbook_names: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (file, parsed, _) in parse_files::<raw::Runbook>(dir, &runbook_files, &mut diags) {
            let file = &file;
            let Some((raw, version)) = parsed else {
                continue;
            };
            let name = raw.name.clone();
            if let Some(other) = runbook_names.insert(name.value.clone(), file.clone()) {
                let msg = format!(
                    "runbook \"{}\" is defined twice (also in {})",
                    name.value,
                    other.display()
                );
                diags.at(file, name.referenced, msg);
                continue;
            }
            let model = settings.model.is_some();
            if let Some(rb) =
                runbook::validate(raw, file, version, &known_hosts, &tools, model, &mut diags)
            {
                runbooks.insert(rb.name.clone(), Arc::new(rb));
            }
        }

        if !diags.is_empty() {
            return Err(ConfigError(diags.into_vec()));
        }
        Ok(Config {
            dir: dir.to_path_buf(),
            settings,
            runbooks,
            hosts,
            tools,
        })
    }
}

/// Read `DIR/runwarden.yaml` alone. The kill-switch commands need only this,
/// and must work while a runbook or host file is half edited.
fn load_settings(dir: &Path, diags: &mut Diagnostics) -> Settings {
    let settings_file = dir.join("runwarden.yaml");
    let settings = match read_file(&settings_file, dir, diags, true) {
        Some((text, _)) => parse::<raw::Settings>(&settings_file, &text, diags).unwrap_or_default(),
        None => raw::Settings::default(),
    };
    let resolve = |v: &Option<Spanned<String>>, default: &str| -> PathBuf {
        let p = v.as_ref().map(|s| s.value.as_str()).unwrap_or(default);
        dir.join(p)
    };
    let listen = match &settings.listen {
        Some(l) => l.value.parse().unwrap_or_else(|e| {
            diags.at(
                &settings_file,
                l.referenced,
                format!(
                    "listen \"{}\" is not an address: {e}; write e.g. 127.0.0.1:9731",
                    l.value
                ),
            );
            DEFAULT_LISTEN
        }),
        None => DEFAULT_LISTEN,
    };
    let timezone_name = settings
        .timezone
        .as_ref()
        .map_or("UTC".to_string(), |t| t.value.clone());
    // UTC (the default) needs no look into the time-zone database, which
    // costs every command a walk of its directories.
    let timezone = match timezone_name.as_str() {
        "UTC" | "Etc/UTC" => Ok(jiff::tz::TimeZone::UTC),
        name => jiff::tz::TimeZone::get(name),
    };
    let timezone = timezone.unwrap_or_else(|e| {
            if let Some(t) = &settings.timezone {
                diags.at(&settings_file, t.referenced, format!("timezone \"{}\" is not known: {e}; use an IANA name such as UTC or Europe/Berlin", t.value));
            }
            jiff::tz::TimeZone::UTC
        });
    let max_concurrent_runs = match &settings.max_concurrent_runs {
        Some(n) if n.value == 0 || n.value > 1000 => {
            diags.at(
                &settings_file,
                n.referenced,
                "max_concurrent_runs must be between 1 and 1000",
            );
            1
        }
        Some(n) => n.value as usize,
        None => 4,
    };
    let audit_rotation = audit_rotation(settings.audit_rotation.as_ref(), &settings_file, diags);
    let shutdown_grace = settings
        .shutdown_grace
        .as_ref()
        .and_then(|g| duration(g, "shutdown_grace", &settings_file, diags))
        .unwrap_or(Duration::from_secs(30));
    let approval_timeout = settings
        .approval_timeout
        .as_ref()
        .and_then(|t| duration(t, "approval_timeout", &settings_file, diags))
        .unwrap_or(Duration::from_secs(300));
    if let Some(url) = &settings.approval_webhook
        && reqwest::Url::parse(&url.value).is_err()
    {
        diags.at(
            &settings_file,
            url.referenced,
            format!("approval_webhook \"{}\" is not a URL", url.value),
        );
    }
    let model = settings
        .model
        .as_ref()
        .and_then(|m| model::validate(&m.value, &settings_file, dir, diags));
    let fleet_budget = settings
        .fleet_budget
        .as_ref()
        .and_then(|f| runbook::fleet_budget(f, &settings_file, diags));
    let postgres = settings
        .state
        .as_ref()
        .and_then(|s| s.postgres.as_ref())
        .map(|pg| SharedState {
            url_file: dir.join(&pg.url_file.value),
            ca_file: pg.ca_file.as_ref().map(|f| dir.join(&f.value)),
            lease: pg
                .lease
                .as_ref()
                .and_then(|l| duration(l, "state.postgres.lease", &settings_file, diags))
                .filter(|l| {
                    let ok = (Duration::from_secs(3)..=Duration::from_secs(600)).contains(l);
                    if !ok && let Some(at) = &pg.lease {
                        diags.at(&settings_file, at.referenced, "state.postgres.lease must be between 3s and 10m: a shorter one expires between two renewals, a longer one keeps a dead replica's runs for that long");
                    }
                    ok
                })
                .unwrap_or(Duration::from_secs(15)),
        });
    let replica = match &settings.replica {
        Some(r) if !safe_name(&r.value) => {
            diags.at(
                &settings_file,
                r.referenced,
                format!("replica \"{}\" must be a lowercase name of letters, digits, '-' or '_' (it labels runs and leases)", r.value),
            );
            String::new()
        }
        Some(r) => r.value.clone(),
        None => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| {
                h.to_lowercase()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .take(64)
                    .collect()
            })
            .unwrap_or_else(|| "localhost".into()),
    };
    let mcp_idle_timeout = settings
        .mcp_idle_timeout
        .as_ref()
        .and_then(|t| duration(t, "mcp_idle_timeout", &settings_file, diags))
        .unwrap_or(Duration::from_secs(600));
    Settings {
        mcp_token_file: settings.mcp_token_file.as_ref().map(|f| dir.join(&f.value)),
        mcp_idle_timeout,
        model,
        fleet_budget,
        postgres,
        replica,
        approvers_file: settings.approvers_file.as_ref().map(|f| dir.join(&f.value)),
        approval_timeout,
        approval_webhook: settings.approval_webhook.as_ref().map(|u| u.value.clone()),
        audit_log: resolve(&settings.audit_log, "state/audit.jsonl"),
        audit_rotation,
        audit_head: match &settings.audit_head {
            None => AuditHead::Auto,
            Some(v) if v.value == "journal" => AuditHead::Journal,
            Some(v) if v.value == "none" => AuditHead::None,
            Some(v) => {
                diags.at(
                    &settings_file,
                    v.referenced,
                    format!(
                        "audit_head \"{}\" is not known: use `journal` (each run's head goes to the system journal) or `none`",
                        v.value
                    ),
                );
                AuditHead::None
            }
        },
        kill_switch_dir: resolve(&settings.kill_switch_dir, "kill-switch"),
        permit_key_file: resolve(&settings.permit_key_file, "state/permit.key"),
        state_dir: resolve(&settings.state_dir, "state"),
        listen,
        timezone,
        max_concurrent_runs,
        webhook_token_file: settings
            .webhook_token_file
            .as_ref()
            .map(|f| dir.join(&f.value)),
        shutdown_grace,
    }
}

impl Settings {
    /// The settings of `dir`, however its runbooks and hosts are: exactly
    /// what `serve` would use, or the problems of runwarden.yaml.
    pub(crate) fn load(dir: &Path) -> Result<Settings, ConfigError> {
        let mut diags = Diagnostics::default();
        let settings = load_settings(dir, &mut diags);
        if diags.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError(diags.into_vec()))
        }
    }
}

/// The names the runbook files under `DIR/runbooks/` give themselves, read
/// leniently (a file with other problems still names its runbook): what a
/// `--runbook` argument may be while the configuration is being edited.
pub(crate) fn runbook_names(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut diags = Diagnostics::default();
    let mut names = std::collections::BTreeSet::new();
    for file in yaml_files(&dir.join("runbooks"), &mut diags) {
        let Some((text, _)) = read_file(&file, dir, &mut diags, false) else {
            continue;
        };
        if let Ok(raw::NameOnly { name: Some(name) }) = serde_saphyr::from_str(&text)
            && safe_name(&name)
        {
            names.insert(name);
        }
    }
    names
}

impl Config {
    /// What `serve` needs beyond a valid configuration, checked the same way
    /// by `check`: a token wherever it listens beyond loopback, secret files
    /// it can read (and nobody else can), an approver for every L2 runbook,
    /// `listen` overrides the file's. Ok holds warnings: SSH files a remote
    /// host names that are not there (serve starts, and calls to that host
    /// fail until they are).
    pub(crate) fn serve_problems(
        &self,
        listen: Option<std::net::SocketAddr>,
    ) -> Result<Vec<Diagnostic>, ConfigError> {
        let mut diags = Diagnostics::default();
        let settings_file = self.dir.join("runwarden.yaml");
        let s = &self.settings;
        let listen = listen.unwrap_or(s.listen);
        match &s.webhook_token_file {
            None if !listen.ip().is_loopback() => diags.file(
                &settings_file,
                format!("refusing to listen on {listen} without a webhook token: set webhook_token_file in runwarden.yaml, or listen on 127.0.0.1"),
            ),
            None => {}
            Some(_) => {}
        }
        for (file, what) in [
            (&s.webhook_token_file, "webhook_token_file"),
            (&s.mcp_token_file, "mcp_token_file"),
        ] {
            if let Some(Err(e)) = file.as_ref().map(|f| crate::secret::read_token(f, what)) {
                diags.file(&settings_file, e.to_string());
            }
        }
        match &s.approvers_file {
            Some(f) => {
                if let Err(e) = crate::secret::read_approvers(f) {
                    diags.file(&settings_file, e.to_string());
                }
            }
            None => {
                for rb in self
                    .runbooks
                    .values()
                    .filter(|r| r.autonomy == Autonomy::L2)
                {
                    diags.file(
                        &rb.source,
                        format!("runbook \"{}\" is autonomy L2, but runwarden.yaml sets no approvers_file: under serve every tier-2 call would be denied (no_approver)", rb.name),
                    );
                }
            }
        }
        let mut warnings = Diagnostics::default();
        if s.audit_head == AuditHead::Journal && !crate::logging::journal_socket_exists() {
            warnings.file(
                &settings_file,
                format!(
                    "audit_head: journal, but this machine has no system journal ({} is missing): every run's head fails to ship and RunwardenAuditHeadFailing fires; leave audit_head unset (the journal where there is one) or set audit_head: none, and pin heads with `audit verify --head`",
                    crate::logging::JOURNAL_SOCKET
                ),
            );
        }
        if let crate::sandbox::Status::Unavailable(why) = crate::sandbox::status() {
            let declared = self
                .tools
                .declared()
                .filter(|d| d.tier == crate::tools::Tier::Observe)
                .count();
            warnings.file(
                &settings_file,
                format!(
                    "Landlock is not available here ({why}): tier-1 processes start without it (built-ins still run; {declared} declared tier-1 tool(s) refuse on local hosts without `unsandboxed_tier1: allow`)"
                ),
            );
        }
        for h in self.hosts.values() {
            if let Connection::Ssh(ssh) = &h.connection {
                for (field, path) in [
                    ("ssh.identity", &ssh.identity),
                    ("ssh.known_hosts", &ssh.known_hosts),
                ] {
                    match std::fs::File::open(path) {
                        Err(e) if h.example => tracing::info!(
                            "host \"{}\" is an example (example: true in {}): {field} {}: {e}; calls to it fail until you set it up",
                            h.name,
                            h.source.display(),
                            path.display()
                        ),
                        Err(e) => warnings.file(
                            &h.source,
                            format!(
                                "{field} {}: {e}; every call to host \"{}\" fails until it is there",
                                path.display(),
                                h.name
                            ),
                        ),
                        Ok(_) => {}
                    }
                }
            }
        }
        if diags.is_empty() {
            Ok(warnings.into_vec())
        } else {
            Err(ConfigError(diags.into_vec()))
        }
    }
}

impl Config {
    /// Every literal argument of every step, against every host its
    /// runbook names, as the gate will check it (paths lexically: the host
    /// may be another machine): a misspelt unit or a path outside a host's
    /// `paths` is said by `check` with the step's place, not found by the
    /// weekly run that is denied. Templated arguments are known only at
    /// run time. `check`'s alone: runbooks times hosts is work a daemon's
    /// start and every reload need not do (30 ms at 200 x 500).
    pub(crate) fn literal_arguments(&self) -> Vec<Diagnostic> {
        let mut warnings = Diagnostics::default();
        for rb in self.runbooks.values() {
            for step in &rb.steps {
                let runbook::StepAction::Call { tool, args, .. } = &step.action else {
                    continue;
                };
                if args
                    .values()
                    .any(|v| v.as_str().is_some_and(runbook::is_template))
                {
                    continue;
                }
                let mut probe: serde_json::Map<String, serde_json::Value> =
                    args.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                if tool.tier() == crate::tools::Tier::Change {
                    probe.insert("reason".into(), "check".into());
                }
                let probe = serde_json::Value::Object(probe);
                for name in &rb.hosts {
                    let Some(host) = self.hosts.get(&**name) else {
                        continue;
                    };
                    if let Err(e) =
                        crate::tools::resolve(tool, &probe, host, crate::tools::PathMode::Lexical)
                    {
                        warnings.push(Diagnostic {
                            file: rb.source.clone(),
                            line: step.line,
                            column: step.column,
                            message: format!(
                                "step {} ({}) would be denied on host \"{}\" ({}): {e}",
                                step.id,
                                tool.name(),
                                host.name,
                                host.source.display()
                            ),
                        });
                    }
                }
            }
        }
        warnings.into_vec()
    }
}

/// Load one host file on its own (the agent's policy on a managed host).
pub(crate) fn load_host_file(file: &Path, dir: &Path) -> Result<Host, ConfigError> {
    let mut diags = Diagnostics::default();
    let host = read_file(file, dir, &mut diags, false)
        .and_then(|(text, _)| parse::<raw::Host>(file, &text, &mut diags))
        .and_then(|raw| host::validate(raw, file, dir, &mut diags));
    match host {
        Some(h) if diags.is_empty() => Ok(h),
        _ => Err(ConfigError(diags.into_vec())),
    }
}

/// sha256 of a config file's bytes, in hex: the version the audit log records.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The tools declared in `dir/tools/` alone (a host agent's, beside its policy).
pub(crate) fn load_tools(dir: &Path) -> Result<crate::tools::Tools, ConfigError> {
    let mut diags = Diagnostics::default();
    let tools = tools::load(dir, &mut diags);
    match diags.is_empty() {
        true => Ok(tools),
        false => Err(ConfigError(diags.into_vec())),
    }
}

/// A file's parse: the raw value and its version (sha256), and the text when
/// parsing failed (for a second, lenient look at it).
type Parsed<T> = (PathBuf, Option<(T, String)>, Option<String>);

/// Read and parse files on every core (large estates have hundreds), keeping
/// the files' order and all their problems.
fn parse_files<T: serde::de::DeserializeOwned + Send>(
    root: &Path,
    files: &[PathBuf],
    diags: &mut Diagnostics,
) -> Vec<Parsed<T>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let chunk = files.len().div_ceil(workers).max(16);
    let parts: Vec<(Vec<Parsed<T>>, Diagnostics)> = std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut d = Diagnostics::default();
                    let out = part
                        .iter()
                        .map(|file| match read_file(file, root, &mut d, false) {
                            None => (file.clone(), None, None),
                            Some((text, version)) => match parse::<T>(file, &text, &mut d) {
                                Some(raw) => (file.clone(), Some((raw, version)), None),
                                None => (file.clone(), None, Some(text)),
                            },
                        })
                        .collect();
                    (out, d)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all = Vec::with_capacity(files.len());
    for (out, d) in parts {
        diags.extend(d);
        all.extend(out);
    }
    all
}

fn yaml_files(dir: &Path, diags: &mut Diagnostics) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            diags.file(dir, format!("cannot list directory: {e}"));
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    files
}

/// Read a config file: bounded size, UTF-8, and its sha256 (the version
/// recorded in the audit log). A symlink is followed only to a file inside
/// `root` (the configuration directory): a host file that links to
/// /etc/shadow must not be read, since errors quote what they could not parse.
fn read_file(
    file: &Path,
    root: &Path,
    diags: &mut Diagnostics,
    optional: bool,
) -> Option<(String, String)> {
    use std::io::Read;
    // What is opened: the file itself, or the target of a symlink that
    // stays inside the configuration directory (opened by its real path,
    // with no link followed on the way).
    let target = match std::fs::symlink_metadata(file) {
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            diags.file(file, format!("cannot read: {e}"));
            return None;
        }
        Ok(m) if m.file_type().is_symlink() => {
            let target = std::fs::canonicalize(file);
            let inside = std::fs::canonicalize(root)
                .ok()
                .zip(target.as_ref().ok())
                .is_some_and(|(r, t)| t.starts_with(r));
            match target {
                Ok(t) if inside => t,
                target => {
                    let to = target.map_or_else(|e| e.to_string(), |t| t.display().to_string());
                    diags.file(
                        file,
                        format!(
                            "is a symlink to {to}, outside the configuration directory {}; refused (copy the file in, or link to one inside)",
                            root.display()
                        ),
                    );
                    return None;
                }
            }
        }
        Ok(_) => file.to_path_buf(),
    };
    let mut f = match crate::files::open_regular(&target, false) {
        Ok(f) => f,
        Err(e @ crate::files::OpenError::NotRegular(_)) => {
            diags.file(file, format!("{e}; refused (config files are YAML files)"));
            return None;
        }
        Err(e) => {
            diags.file(file, format!("cannot read: {e}"));
            return None;
        }
    };
    match f.metadata() {
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            diags.file(
                file,
                format!(
                    "file is {} bytes; config files are limited to {MAX_FILE_BYTES} bytes",
                    m.len()
                ),
            );
            return None;
        }
        Ok(_) => {}
        Err(e) => {
            diags.file(file, format!("cannot read: {e}"));
            return None;
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = (&mut f).take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        diags.file(file, format!("cannot read: {e}"));
        return None;
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        diags.file(
            file,
            format!("file grew past {MAX_FILE_BYTES} bytes while being read"),
        );
        return None;
    }
    let version = sha256_hex(&bytes);
    match String::from_utf8(bytes) {
        Ok(text) => Some((text, version)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(&e.into_bytes()[..at]).into_owned();
            let line = text.matches('\n').count() as u32 + 1;
            let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
            diags.push(Diagnostic {
                file: file.to_path_buf(),
                line,
                column,
                message: "file is not valid UTF-8".into(),
            });
            None
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
    diags: &mut Diagnostics,
) -> Option<T> {
    match serde_saphyr::from_str::<T>(text) {
        Ok(v) => Some(v),
        Err(e) => {
            let loc = e.location().unwrap_or(serde_saphyr::Location::UNKNOWN);
            let msg = e.without_snippet().to_string();
            let msg = if msg.contains("budget breached") {
                format!(
                    "the document is too large once its aliases are expanded ({}); refused (a YAML alias bomb?)",
                    strip_location(&msg)
                        .trim_start_matches("budget breached: ")
                        .to_lowercase()
                )
            } else {
                strip_location(&msg)
            };
            let line = loc.line() as usize;
            if diag::unknown_field_expected(&msg).is_some() {
                diag::unknown_fields::<T>(file, text, msg, loc, diags);
                return None;
            }
            if msg.starts_with("duplicate mapping key") {
                diags.at(file, loc, duplicate_key(text, &msg, loc));
                return None;
            }
            let msg = if msg.contains("tabs disallowed") {
                format!(
                    "{msg}: YAML indents with spaces only; replace the tab at the start of line {line} with spaces"
                )
            } else if msg.contains("did not find expected key")
                || msg.contains("mapping values are not allowed")
            {
                format!(
                    "{msg}: check this line's indentation against the lines above it (YAML nests by the number of spaces)"
                )
            } else if msg.contains("cannot start with '-'") {
                format!(
                    "{msg}: quote it (\"-\"), as a list element that is a lone dash, e.g. socat's stdin, must be in YAML's flow [ ] lists"
                )
            } else {
                msg
            };
            diags.at(file, loc, msg);
            None
        }
    }
}

/// `duplicate key K (first at line N)`: the key a mapping holds twice,
/// from the YAML crate's own message, and the earlier line where the same
/// key starts at the same column.
fn duplicate_key(text: &str, msg: &str, loc: serde_saphyr::Location) -> String {
    let key = msg
        .strip_prefix("duplicate mapping key: ")
        .and_then(|k| k.split(", set ").next())
        .map(str::trim)
        .unwrap_or("");
    if key.is_empty() {
        return "duplicate key: this mapping holds a key twice; keep one".into();
    }
    let (line, column) = (loc.line() as usize, loc.column() as usize);
    let first = text
        .lines()
        .take(line.saturating_sub(1))
        .enumerate()
        .find_map(|(i, l)| {
            let t = l.trim_start();
            let at = l.len() - t.len() + 1;
            let k = t
                .split_once(':')?
                .0
                .trim()
                .trim_matches(|c| c == '"' || c == '\'');
            (at == column && k == key).then_some(i + 1)
        });
    match first {
        Some(n) => format!("duplicate key {key} (first at line {n}); keep one"),
        None => format!("duplicate key {key}; keep one"),
    }
}

/// serde-saphyr may prefix its message with its own "line N column M"; we print our own.
fn strip_location(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or(msg).trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.find(" at line ") {
        Some(i) => first[..i].to_string(),
        None => first.to_string(),
    }
}

fn abs_path(v: &Spanned<String>, field: &str, file: &Path, diags: &mut Diagnostics) -> PathBuf {
    let p = PathBuf::from(&v.value);
    if !p.is_absolute() {
        diags.at(
            file,
            v.referenced,
            format!(
                "{field}: \"{}\" is not an absolute path",
                v.value.escape_debug()
            ),
        );
    } else if v.value.contains('\0') {
        diags.at(
            file,
            v.referenced,
            format!("{field}: path contains a NUL byte"),
        );
    } else if p.components().any(|c| c == std::path::Component::ParentDir) {
        diags.at(
            file,
            v.referenced,
            format!(
                "{field}: \"{}\" contains `..`; write the path it means",
                v.value
            ),
        );
    }
    p
}

/// `audit_rotation:`: each field defaults on its own; `max_age` and `keep`
/// also take `never` (no rotation by age; keep every segment).
fn audit_rotation(
    raw: Option<&raw::AuditRotation>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Rotation {
    let mut r = Rotation::default();
    let Some(raw) = raw else {
        return r;
    };
    if let Some(size) = &raw.max_size {
        match bytes(&size.value) {
            Some(b) if (4 << 10..=1 << 40).contains(&b) => r.max_bytes = b,
            _ => diags.at(
                file,
                size.referenced,
                format!(
                    "audit_rotation.max_size \"{}\" is not a size between 4KiB and 1TiB: write e.g. 16MiB (the default; a daemon's start reads the current segment whole)",
                    size.value
                ),
            ),
        }
    }
    let never = |v: &Spanned<String>, field: &str, diags: &mut Diagnostics| match v.value.as_str() {
        "never" => Ok(None),
        _ => duration(v, field, file, diags).map(Some).ok_or(()),
    };
    if let Some(age) = &raw.max_age
        && let Ok(d) = never(age, "audit_rotation.max_age", diags)
    {
        r.max_age = d;
    }
    if let Some(keep) = &raw.keep
        && let Ok(d) = never(keep, "audit_rotation.keep", diags)
    {
        if d.is_some_and(|d| d < Duration::from_secs(86_400)) {
            diags.at(
                file,
                keep.referenced,
                "audit_rotation.keep must be at least 1d (or `never`): it is how long the record of what ran is kept",
            );
        }
        r.keep = d;
    }
    if let Some(total) = &raw.max_total {
        match total.value.as_str() {
            "never" => r.max_total = None,
            text => match bytes(text) {
                Some(b) if b >= 4 * r.max_bytes => r.max_total = Some(b),
                _ => diags.at(
                    file,
                    total.referenced,
                    format!(
                        "audit_rotation.max_total \"{}\" is not a size of at least 4 segments (4 x max_size): write e.g. 10GiB, or `never`",
                        total.value
                    ),
                ),
            },
        }
    }
    r
}

/// `16MiB`, `512KiB`, `1GiB` or a number of bytes.
fn bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits].parse().ok()?;
    let shift = match text[digits..].trim() {
        "" | "B" => 0,
        "KiB" | "K" => 10,
        "MiB" | "M" => 20,
        "GiB" | "G" => 30,
        "TiB" | "T" => 40,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

pub(crate) fn duration(
    v: &Spanned<String>,
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Duration> {
    match humantime::parse_duration(&v.value) {
        Ok(d) if !d.is_zero() => Some(d),
        Ok(_) => {
            diags.at(
                file,
                v.referenced,
                format!("{field} must be longer than zero"),
            );
            None
        }
        Err(e) => {
            diags.at(
                file,
                v.referenced,
                format!(
                    "{field} \"{}\" is not a duration ({e}); write e.g. 30s, 10m or 1h",
                    v.value
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `check` says of the YAML slips a person makes: a tab, a key
    /// indented one space too far, and misspelt keys (all of the file's at
    /// once, in every mapping, each with a did-you-mean).
    #[test]
    fn yaml_slips_get_a_hint_and_every_unknown_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["hosts", "runbooks"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(
            dir.path().join("hosts/h.yaml"),
            "name: h\nconnection: local\npaths: [/tmp]\n",
        )
        .unwrap();
        let head = "description: t\nhosts: [h]\nautonomy: L1\n";
        for (name, body) in [
            ("tab", "tools:\n\tobserve: [disk_usage]\n"),
            (
                "indent",
                "tools:\n  observe: [disk_usage]\n   approve: []\n",
            ),
            (
                "typos",
                "schedul: \"@daily\"\ncooldwn: 1h\ntools:\n  observe: [disk_usage]\n  aprove: []\n",
            ),
        ] {
            std::fs::write(
                dir.path().join(format!("runbooks/{name}.yaml")),
                format!("name: {name}\n{head}{body}"),
            )
            .unwrap();
        }
        let err = Config::load(dir.path()).expect_err("three broken runbooks");
        let text = err.to_string();
        let said = |file: &str, line: u32| -> String {
            err.0
                .iter()
                .filter(|d| d.file.ends_with(file) && d.line == line)
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
                .join(" | ")
        };
        assert!(
            said("tab.yaml", 6).contains("replace the tab at the start of line 6 with spaces"),
            "{text}"
        );
        assert!(
            said("indent.yaml", 7).contains("check this line's indentation"),
            "{text}"
        );
        assert!(
            said("typos.yaml", 5).contains("unknown field `schedul` (did you mean \"schedule\"?)"),
            "{text}"
        );
        assert!(
            said("typos.yaml", 6).contains("unknown field `cooldwn` (did you mean \"cooldown\"?)"),
            "{text}"
        );
        // And the one in the nested `tools` mapping, in the same pass.
        assert!(
            said("typos.yaml", 9).contains("unknown field `aprove` (did you mean \"approve\"?)"),
            "{text}"
        );
    }

    /// `audit_rotation:` takes sizes and durations as a person writes them,
    /// `never`, and names each bad value with its line.
    #[test]
    fn audit_rotation_reads_sizes_and_durations_and_names_each_bad_value() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = |body: &str| std::fs::write(dir.path().join("runwarden.yaml"), body).unwrap();
        yaml("audit_rotation:\n  max_size: 512KiB\n  max_age: 1d\n  keep: never\n");
        let r = Settings::load(dir.path()).unwrap().audit_rotation;
        assert_eq!(
            r,
            Rotation {
                max_bytes: 512 << 10,
                max_age: Some(Duration::from_secs(86_400)),
                keep: None,
                max_total: None,
            }
        );
        yaml("audit_head: none\n");
        assert_eq!(
            Settings::load(dir.path()).unwrap().audit_rotation,
            Rotation::default()
        );
        yaml("audit_rotation:\n  max_size: 16 parsecs\n  max_age: soon\n  keep: 1h\n");
        let err = Settings::load(dir.path()).unwrap_err();
        let lines: Vec<(u32, &str)> = err.0.iter().map(|d| (d.line, d.message.as_str())).collect();
        assert!(
            matches!(lines[..], [(2, a), (3, b), (4, c)]
            if a.contains("max_size \"16 parsecs\" is not a size")
            && b.contains("max_age \"soon\" is not a duration")
            && c.contains("keep must be at least 1d")),
            "{lines:?}"
        );
    }
}

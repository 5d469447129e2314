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
//! Loading is one transaction (every file read, every cross-reference
//! checked, then the whole config or none), and it lives here; reading a
//! file (bounded, parsed with its locations) is `read`, `runwarden.yaml`'s
//! settings are `settings`, and what a YAML slip is told (unknown keys,
//! with a did-you-mean) lives with the diagnostics, in `diag`.
//!
//! One file: loading is all or nothing, so the walk over the directory, the
//! cross-checks between files and the one `Config` they make stay together;
//! each kind of file is read in a file of its own.

mod diag;
pub(crate) mod host;
pub mod matchers;
pub(crate) mod model;
mod peers;
mod raw;
mod read;
pub(crate) mod runbook;
mod settings;
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
pub(crate) use runbook::{
    AlertClears, Autonomy, Canary, DemoteAfter, MaxRuns, OnResolved, PlannedBy, Reach, Rollout,
    Runbook, Silence,
};

use diag::Diagnostics;
use read::{parse, parse_files, read_file, yaml_files};
use settings::load_settings;

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
    /// Who may do what through the daemon (see [`crate::access`]): a
    /// principals file, or the older approvers file of `NAME TOKEN` lines.
    pub(crate) principals_file: Option<PathBuf>,
    /// How long an approval request waits before it counts as denied.
    pub(crate) approval_timeout: Duration,
    /// Where each new approval request is POSTed (chat-ops).
    pub(crate) approval_webhook: Option<String>,
    /// The secret (owner-only) that signs each approval webhook POST
    /// (`X-Runwarden-Signature`, see [`crate::hmac`]).
    pub(crate) approval_webhook_secret_file: Option<PathBuf>,
    /// Where people and bridges reach the daemon (`http://HOST:PORT`, no
    /// trailing path): the approve and deny links of a request. Default:
    /// `http://LISTEN`.
    pub(crate) external_url: Option<String>,
    /// The model planner's endpoint; runbooks' `agent` goals need it.
    pub(crate) model: Option<ModelEndpoint>,
    /// Tier-2 calls across every run on this machine, within a window.
    pub(crate) fleet_budget: Option<runbook::FleetBudget>,
    /// `state.postgres`: state shared by several daemons; `None`: this machine's own.
    pub(crate) postgres: Option<PostgresSettings>,
    /// This daemon's name among several: `replica`, or the hostname.
    pub(crate) replica: String,
    /// The bearer token of the daemon's `/mcp` (owner-only); `None`: no `/mcp` (404).
    pub(crate) mcp_token_file: Option<PathBuf>,
    /// How long an MCP session of the daemon may be idle before it ends.
    pub(crate) mcp_idle_timeout: Duration,
    /// The daemon's `/mcp` bounds: sessions at once, the handshake's
    /// time to a first call, the names it answers to.
    pub(crate) mcp_limits: McpLimits,
    /// The Prometheus that evaluates the alerting rules (`done_when`).
    pub(crate) prometheus: Option<crate::prometheus::Endpoint>,
    /// Slack (`chat.slack`): approval requests posted there, and its
    /// clicks and `/runwarden stop` taken at `/api/v1/chat/slack`.
    pub(crate) slack: Option<SlackSettings>,
}

/// `chat.slack` in runwarden.yaml.
#[derive(Debug, Clone)]
pub(crate) struct SlackSettings {
    /// The app's signing secret (owner-only): its first line, and the one
    /// before it on a second line during a rotation.
    pub(crate) signing_secret_file: PathBuf,
    /// The bot's token (`xoxb-...`, owner-only).
    pub(crate) bot_token_file: PathBuf,
    /// Where requests are posted (a channel id, `C0123ABCD`).
    pub(crate) channel: String,
    /// Slack's Web API (default `https://slack.com/api`).
    pub(crate) api_url: String,
}

/// How far the daemon's `/mcp` lets its clients go: no client can grow
/// the daemon without bound, nor reach it through another site's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct McpLimits {
    /// Sessions open at once (`mcp_max_sessions`); a handshake past it is
    /// answered 429 with `Retry-After`.
    pub(crate) max_sessions: usize,
    /// A session that has made no tool call this long after its handshake
    /// ends (`mcp_handshake_timeout`).
    pub(crate) handshake_timeout: Duration,
    /// The names `Host` may carry (`mcp_allowed_hosts`); `None`: the
    /// listen address and localhost's names.
    pub(crate) allowed_hosts: Option<Vec<String>>,
}

impl McpLimits {
    /// `mcp_max_sessions` when runwarden.yaml does not set it: every run
    /// slot many times over, a few MB of memory.
    pub(crate) const DEFAULT_MAX_SESSIONS: usize = 64;

    /// Whether `host` (a `Host` header's name, its port and brackets
    /// taken off) may reach `/mcp` of a daemon listening on `listen`.
    pub(crate) fn allows_host(&self, host: &str, listen: std::net::SocketAddr) -> bool {
        let host = host.to_ascii_lowercase();
        match &self.allowed_hosts {
            Some(names) => names.iter().any(|n| n.eq_ignore_ascii_case(&host)),
            None => {
                ["localhost", "127.0.0.1", "::1"].contains(&host.as_str())
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip == listen.ip())
            }
        }
    }
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
pub(crate) struct PostgresSettings {
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
            let around = runbook::Around {
                model: settings.model.is_some(),
                prometheus: settings.prometheus.is_some(),
            };
            if let Some(rb) =
                runbook::validate(raw, file, version, &known_hosts, &tools, around, &mut diags)
            {
                runbooks.insert(rb.name.clone(), Arc::new(rb));
            }
        }

        missing_vars(&runbooks, &hosts, &mut diags);
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

/// The names the runbook files under `DIR/runbooks/` give themselves, read
/// leniently (a file with other problems still names its runbook): what a
/// `--runbook` argument may be while the configuration is being edited.
/// Each host of a runbook has every `vars:` entry the runbook's declared
/// tools use as `{{ host.NAME }}`: else the tool could never run there, so
/// the host file is told what to add.
fn missing_vars(
    runbooks: &BTreeMap<String, Arc<Runbook>>,
    hosts: &BTreeMap<String, Arc<Host>>,
    diags: &mut Diagnostics,
) {
    let mut said = std::collections::BTreeSet::new();
    for rb in runbooks.values() {
        let declared = rb
            .observe
            .iter()
            .chain(rb.approve.iter())
            .filter_map(crate::tools::ToolId::declared);
        for tool in declared {
            let in_stdin = tool.stdin_host_vars();
            for var in tool.host_vars() {
                for host in rb.hosts.iter().filter_map(|h| hosts.get(&**h)) {
                    if let Some(crate::host::Var::String(s)) = host.vars.get(var)
                        && in_stdin.contains(var)
                        && s.contains(crate::tools::declared::STDIN_SEPARATORS)
                        && said.insert((host.name.clone(), var))
                    {
                        diags.file(
                            &host.source,
                            format!(
                                "vars.{var}: {s:?} holds `;`, and tool {} (of runbook {}) puts {{{{ host.{var} }}}} into its stdin, where `;` starts a second command: remove it",
                                tool.name, rb.name
                            ),
                        );
                    }
                    if host.vars.contains_key(var) || !said.insert((host.name.clone(), var)) {
                        continue;
                    }
                    diags.file(
                        &host.source,
                        format!(
                            "no vars.{var}: tool {} (of runbook {}) uses {{{{ host.{var} }}}}; add e.g. `vars: {{ {var}: {{ path: ... }} }}` (or `string:`, `integer:`)",
                            tool.name, rb.name
                        ),
                    );
                }
            }
        }
    }
}

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
            (
                &s.approval_webhook_secret_file,
                "approval_webhook_secret_file",
            ),
            (
                &s.slack.as_ref().map(|s| s.bot_token_file.clone()),
                "chat.slack.bot_token_file",
            ),
        ] {
            if let Some(Err(e)) = file.as_ref().map(|f| crate::secret::read_token(f, what)) {
                diags.file(&settings_file, e.to_string());
            }
        }
        match &s.principals_file {
            Some(f) => {
                if let Err(e) = crate::access::file::read(f) {
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
                        format!("runbook \"{}\" is autonomy L2, but runwarden.yaml sets no principals_file: under serve every tier-2 call would be denied (no_approver)", rb.name),
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
                    "the tier-1 observer's sandbox is missing layers here ({why}): built-in tier-1 tools run with the layers there are; {declared} declared tier-1 tool(s) refuse on local hosts without `unsandboxed_tier1: allow`"
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
        let mut denied = Diagnostics::default();
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
                        denied.push(Diagnostic {
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
        denied.into_vec()
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

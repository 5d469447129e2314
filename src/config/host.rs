//! A named target and the allowlists its tool arguments resolve against.
//!
//! Tool arguments are names or values checked against these lists, never
//! free strings: a runbook or a model cannot reach a unit, path, URL or
//! command that the host file does not name.
//!
//! Why one file of about 550 lines: the validated host, its validation and
//! the lists a policy agent compares are one thing, and the field docs are
//! the host file's reference (it is tested through the loader, `check`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::diag::Diagnostics;
use super::raw;
use super::{abs_path, duration, safe_name};

/// A validated host file.
#[derive(Debug, Clone)]
pub struct Host {
    /// The host's name: its file's stem, and what runbooks and alerts name.
    pub name: String,
    /// How tools reach it.
    pub connection: Connection,
    /// Shipped as an example: its missing SSH files are a note, not a warning.
    pub example: bool,
    /// Run mutating commands through `sudo -n` (never through a shell).
    pub sudo: bool,
    /// Working directory of every spawned tool: a directory with nothing in it.
    pub jail: PathBuf,
    /// Upper bound for one tool call; the run's own time budget may cut it shorter.
    pub tool_timeout: Duration,
    /// How long `disk_usage`'s `du` may look for the largest entries (a cold
    /// cache on a big filesystem needs more); past it the answer is partial.
    pub du_budget: Duration,
    /// Allowlist: the systemd units service tools may name.
    pub units: BTreeSet<String>,
    /// Allowlist: the units whose journal `read_journal` may read (the service units are included).
    pub journals: BTreeSet<String>,
    /// Allowlist: the directories `disk_usage` may measure (and everything under them).
    pub paths: Vec<PathBuf>,
    /// Allowlist: the logrotate configurations `rotate_logs` may run.
    pub logrotate_configs: Vec<PathBuf>,
    /// logrotate's state file, when not the Debian default.
    pub logrotate_state: Option<PathBuf>,
    /// Allowlist: the certificates tools may read or renew, by name.
    pub certificates: BTreeMap<String, Certificate>,
    /// Allowlist: the URLs `http_check` may fetch, by name (loopback only).
    pub health_checks: BTreeMap<String, String>,
    /// Allowlist: the worker pools `recycle_worker_pool` may recycle, by name.
    pub worker_pools: BTreeMap<String, WorkerPool>,
    /// The absolute path of each program tools spawn.
    pub binaries: Binaries,
    /// The file this host came from (for messages).
    pub source: PathBuf,
    /// In an agent's policy: the runner's Ed25519 key (hex) that must sign
    /// every tier-2 call (see [`crate::gate::signed`]).
    pub permit_public_key: Option<String>,
}

/// How tools reach a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Tools run in this process's own account, on this machine.
    Local,
    /// Over SSH, to the host's `runwarden agent`.
    Ssh(Ssh),
    /// This machine, through its own agent on a unix socket: the privileged
    /// path of a daemon that runs unprivileged (see [`crate::executor::socket`]).
    Agent(PathBuf),
}

/// How to reach a remote host; the runner never accepts a host key on first use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ssh {
    /// The host name or address to connect to.
    pub address: String,
    /// The SSH port.
    pub port: u16,
    /// The remote account, whose forced command is `runwarden agent --stdio`.
    pub user: String,
    /// The private key (the only one offered).
    pub identity: PathBuf,
    /// The known_hosts file holding this host's key (no global one is read).
    pub known_hosts: PathBuf,
    /// A run's calls share one connection (an OpenSSH control master) and one
    /// agent session; `false`: a new connection for every call.
    pub multiplex: bool,
}

/// A certificate the host allows tools to read or renew.
#[derive(Debug, Clone)]
pub struct Certificate {
    /// The PEM file.
    pub path: PathBuf,
    /// The unit that serves this certificate (reloaded after a renewal).
    pub unit: Option<String>,
    /// The renewal command as argv, absolute program first. Written by the operator.
    pub renew: Option<Vec<String>>,
}

/// A worker pool the host allows `recycle_worker_pool` to recycle.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    /// Where its master process is found.
    pub master: PoolMaster,
    /// How it is told to replace its workers.
    pub recycle: Recycle,
    /// Name of a health check in the same host file.
    pub health_check: Option<String>,
}

/// Where the pool's master process is found.
#[derive(Debug, Clone)]
pub enum PoolMaster {
    /// The systemd unit whose main process is the master.
    Unit(String),
    /// A pid file, and the program the pid must be running: the pid in the
    /// file is checked against it (and the file's owner and mode) before any
    /// signal is sent, so a stale or planted pid file signals nothing else.
    PidFile {
        /// The pid file.
        file: PathBuf,
        /// The program that pid must be running.
        executable: PathBuf,
    },
}

/// How a pool master is told to replace its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recycle {
    /// `systemctl reload UNIT`.
    Reload,
    /// Send this signal to the master process.
    Signal(PoolSignal),
}

/// The signals a pool master understands as "replace your workers".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSignal {
    /// SIGHUP.
    Hup,
    /// SIGUSR2.
    Usr2,
}

impl PoolSignal {
    /// The signal's name, as `kill -s` takes it.
    pub fn name(self) -> &'static str {
        match self {
            PoolSignal::Hup => "HUP",
            PoolSignal::Usr2 => "USR2",
        }
    }
}

/// Absolute paths of every program a tool may spawn (Debian defaults).
#[derive(Debug, Clone)]
pub struct Binaries {
    /// systemctl.
    pub systemctl: PathBuf,
    /// journalctl.
    pub journalctl: PathBuf,
    /// logrotate.
    pub logrotate: PathBuf,
    /// df (coreutils).
    pub df: PathBuf,
    /// du (coreutils).
    pub du: PathBuf,
    /// ps (procps).
    pub ps: PathBuf,
    /// kill (procps).
    pub kill: PathBuf,
    /// sudo, for hosts with `sudo: true`.
    pub sudo: PathBuf,
    /// The OpenSSH client (runner side of `connection: ssh`).
    pub ssh: PathBuf,
}

impl Default for Binaries {
    fn default() -> Self {
        Binaries {
            systemctl: "/usr/bin/systemctl".into(),
            journalctl: "/usr/bin/journalctl".into(),
            logrotate: "/usr/sbin/logrotate".into(),
            df: "/usr/bin/df".into(),
            du: "/usr/bin/du".into(),
            ps: "/usr/bin/ps".into(),
            kill: "/usr/bin/kill".into(),
            sudo: "/usr/bin/sudo".into(),
            ssh: "/usr/bin/ssh".into(),
        }
    }
}

const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_DU_BUDGET: Duration = Duration::from_secs(3);
const UNIT_SUFFIXES: &[&str] = &[
    ".service", ".socket", ".timer", ".target", ".path", ".mount", ".slice", ".scope",
];

/// A systemd unit name as runwarden accepts it: no escapes, no shell metacharacters.
pub fn is_unit_name(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    s.len() <= 255
        && first.is_ascii_alphanumeric()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | ':'))
        && UNIT_SUFFIXES.iter().any(|suffix| s.ends_with(suffix))
}

pub(super) fn validate(
    raw: raw::Host,
    file: &Path,
    config_dir: &Path,
    diags: &mut Diagnostics,
) -> Option<Host> {
    let before = diags.len();
    let name = raw.name.value.clone();
    if !safe_name(&name) {
        diags.at(
            file,
            raw.name.referenced,
            format!("host name \"{name}\" must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit"),
        );
    }
    let connection = match raw.connection.value {
        raw::Connection::Local => Connection::Local,
        raw::Connection::Agent(socket) => {
            Connection::Agent(abs_path(&socket, "connection.agent", file, diags))
        }
        raw::Connection::Ssh(ssh) => {
            if ssh.address.value.is_empty()
                || ssh.address.value.starts_with('-')
                || ssh
                    .address
                    .value
                    .contains(|c: char| c.is_whitespace() || c == '@')
            {
                diags.at(
                    file,
                    ssh.address.referenced,
                    "ssh.address must be a host name or an IP address",
                );
            }
            if !safe_name(&ssh.user.value) {
                diags.at(
                    file,
                    ssh.user.referenced,
                    "ssh.user must be a plain account name",
                );
            }
            Connection::Ssh(Ssh {
                address: ssh.address.value.clone(),
                port: ssh.port.unwrap_or(22),
                user: ssh.user.value.clone(),
                identity: abs_path(&ssh.identity, "ssh.identity", file, diags),
                known_hosts: abs_path(&ssh.known_hosts, "ssh.known_hosts", file, diags),
                multiplex: ssh.multiplex.unwrap_or(true),
            })
        }
    };
    let jail = match &raw.jail {
        Some(j) => abs_path(j, "jail", file, diags),
        None => config_dir.join("state/jail"),
    };
    let permit_public_key = raw.permit_public_key.as_ref().map(|k| {
        let key = k.value.trim().to_ascii_lowercase();
        if !crate::gate::signed::is_public_key(&key) {
            diags.at(
                file,
                k.referenced,
                "permit_public_key must be the runner's Ed25519 public key in hex (64 characters), as `runwarden install print` gives it",
            );
        }
        key
    });
    let tool_timeout = raw
        .tool_timeout
        .as_ref()
        .and_then(|t| duration(t, "tool_timeout", file, diags))
        .unwrap_or(DEFAULT_TOOL_TIMEOUT);
    let du_budget = raw
        .du_budget
        .as_ref()
        .and_then(|t| duration(t, "du_budget", file, diags))
        .unwrap_or(DEFAULT_DU_BUDGET);

    let units = unit_set(&raw.units, "units", file, diags);
    let journals = unit_set(&raw.journals, "journals", file, diags);
    let paths = raw
        .paths
        .iter()
        .map(|p| abs_path(p, "paths", file, diags))
        .collect();
    let logrotate_configs = raw
        .logrotate_configs
        .iter()
        .map(|p| abs_path(p, "logrotate_configs", file, diags))
        .collect();
    let logrotate_state = raw
        .logrotate_state
        .as_ref()
        .map(|p| abs_path(p, "logrotate_state", file, diags));

    let mut certificates = BTreeMap::new();
    for (cname, c) in &raw.certificates {
        check_key(cname, "certificates", c.referenced, file, diags);
        let unit = c.value.unit.as_ref().map(|u| {
            if !is_unit_name(&u.value) {
                diags.at(file, u.referenced, bad_unit_message(&u.value));
            }
            u.value.clone()
        });
        let renew = c.value.renew.as_ref().map(|argv| {
            match argv.value.first() {
                Some(p) if Path::new(p).is_absolute() => {}
                _ => diags.at(
                    file,
                    argv.referenced,
                    format!("certificates.{cname}.renew must be an argv list whose first element is an absolute program path, e.g. [/usr/bin/certbot, renew, --cert-name, {cname}]"),
                ),
            }
            if argv.value.iter().any(|a| a.contains('\0')) {
                diags.at(file, argv.referenced, "renew arguments must not contain NUL bytes");
            }
            argv.value.clone()
        });
        certificates.insert(
            cname.clone(),
            Certificate {
                path: abs_path(&c.value.path, "certificates.path", file, diags),
                unit,
                renew,
            },
        );
    }

    let mut health_checks = BTreeMap::new();
    for (hname, url) in &raw.health_checks {
        check_key(hname, "health_checks", url.referenced, file, diags);
        if let Err(why) = loopback_url(&url.value) {
            diags.at(
                file,
                url.referenced,
                format!("health_checks.{hname}: {why}"),
            );
        }
        health_checks.insert(hname.clone(), url.value.clone());
    }

    let mut worker_pools = BTreeMap::new();
    for (pname, p) in &raw.worker_pools {
        check_key(pname, "worker_pools", p.referenced, file, diags);
        let pool = &p.value;
        let master = match (&pool.unit, &pool.pid_file) {
            (Some(u), None) => {
                if !is_unit_name(&u.value) {
                    diags.at(file, u.referenced, bad_unit_message(&u.value));
                }
                PoolMaster::Unit(u.value.clone())
            }
            (None, Some(f)) => {
                let pid_file = abs_path(f, "worker_pools.pid_file", file, diags);
                let executable = match &pool.executable {
                    Some(x) => abs_path(x, "worker_pools.executable", file, diags),
                    None => {
                        diags.at(
                            file,
                            f.referenced,
                            format!("worker_pools.{pname}: with `pid_file`, name the master's program too (`executable: /usr/bin/gunicorn`): the pid in the file is checked against it before any signal"),
                        );
                        PathBuf::new()
                    }
                };
                PoolMaster::PidFile {
                    file: pid_file,
                    executable,
                }
            }
            _ => {
                diags.at(
                    file,
                    p.referenced,
                    format!("worker_pools.{pname}: give exactly one of `unit` or `pid_file` to find the master process"),
                );
                PoolMaster::PidFile {
                    file: PathBuf::new(),
                    executable: PathBuf::new(),
                }
            }
        };
        let recycle = match &pool.recycle.value {
            raw::Recycle::Reload => {
                if !matches!(master, PoolMaster::Unit(_)) {
                    diags.at(
                        file,
                        pool.recycle.referenced,
                        format!("worker_pools.{pname}: `recycle: reload` needs `unit`; with a pid_file use `recycle: {{signal: HUP}}`"),
                    );
                }
                Recycle::Reload
            }
            raw::Recycle::Signal(s) => match s.trim_start_matches("SIG") {
                "HUP" => Recycle::Signal(PoolSignal::Hup),
                "USR2" => Recycle::Signal(PoolSignal::Usr2),
                other => {
                    diags.at(
                        file,
                        pool.recycle.referenced,
                        format!("worker_pools.{pname}: signal \"{other}\" is not a recycle signal; use HUP (nginx, gunicorn) or USR2 (php-fpm)"),
                    );
                    Recycle::Signal(PoolSignal::Hup)
                }
            },
        };
        let health_check = pool.health_check.as_ref().map(|h| {
            if !raw.health_checks.contains_key(&h.value) {
                diags.at(
                    file,
                    h.referenced,
                    format!("worker_pools.{pname}.health_check \"{}\" is not defined under health_checks", h.value),
                );
            }
            h.value.clone()
        });
        worker_pools.insert(
            pname.clone(),
            WorkerPool {
                master,
                recycle,
                health_check,
            },
        );
    }

    let defaults = Binaries::default();
    let b = &raw.binaries;
    let bin = |v: &Option<serde_saphyr::Spanned<String>>,
               default: &PathBuf,
               diags: &mut Diagnostics| match v {
        Some(p) => abs_path(p, "binaries", file, diags),
        None => default.clone(),
    };
    let binaries = Binaries {
        systemctl: bin(&b.systemctl, &defaults.systemctl, diags),
        journalctl: bin(&b.journalctl, &defaults.journalctl, diags),
        logrotate: bin(&b.logrotate, &defaults.logrotate, diags),
        df: bin(&b.df, &defaults.df, diags),
        du: bin(&b.du, &defaults.du, diags),
        ps: bin(&b.ps, &defaults.ps, diags),
        kill: bin(&b.kill, &defaults.kill, diags),
        sudo: bin(&b.sudo, &defaults.sudo, diags),
        ssh: bin(&b.ssh, &defaults.ssh, diags),
    };

    if diags.len() != before {
        return None;
    }
    Some(Host {
        name,
        connection,
        example: raw.example,
        sudo: raw.sudo,
        jail,
        tool_timeout,
        du_budget,
        units,
        journals,
        paths,
        logrotate_configs,
        logrotate_state,
        certificates,
        health_checks,
        worker_pools,
        binaries,
        source: file.to_path_buf(),
        permit_public_key,
    })
}

fn unit_set(
    list: &[serde_saphyr::Spanned<String>],
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for u in list {
        if !is_unit_name(&u.value) {
            diags.at(
                file,
                u.referenced,
                format!("{field}: {}", bad_unit_message(&u.value)),
            );
        } else if !set.insert(u.value.clone()) {
            diags.at(
                file,
                u.referenced,
                format!("{field}: \"{}\" is listed twice", u.value),
            );
        }
    }
    set
}

fn bad_unit_message(u: &str) -> String {
    crate::tools::args::UnitName::new(u.to_string())
        .err()
        .unwrap_or_default()
}

fn check_key(
    key: &str,
    field: &str,
    loc: serde_saphyr::Location,
    file: &Path,
    diags: &mut Diagnostics,
) {
    if !safe_name(key) {
        diags.at(
            file,
            loc,
            format!(
                "{field}: name \"{}\" must be 1-64 characters of a-z, 0-9, '-' or '_'",
                key.escape_debug()
            ),
        );
    }
}

/// Health checks run on the host itself; only loopback HTTP URLs are allowed.
pub fn loopback_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("\"{url}\" is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("\"{url}\" must be an http:// or https:// URL"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("credentials do not belong in a health-check URL".into());
    }
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    if !loopback {
        return Err(format!(
            "\"{url}\" is not a loopback URL: health checks run on the host itself (127.0.0.1, ::1 or localhost)"
        ));
    }
    Ok(())
}

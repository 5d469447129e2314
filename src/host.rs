//! A named host: how tools reach it and what they may touch there.
//!
//! Tool arguments are names or values checked against these allowlists,
//! never free strings: a runbook or a model cannot reach a unit, path, URL
//! or command that the host file does not name. The types live here, below
//! the tools that resolve against them; reading and checking a host file is
//! the configuration's job (`config::host`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

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
    /// every tier-2 call (see `signing`).
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
    /// path of a daemon that runs unprivileged (the executor's `socket`).
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

/// Names that end up in metric labels, file names and audit lines.
pub(crate) fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

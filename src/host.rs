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
    pub(crate) name: String,
    /// How tools reach it.
    pub(crate) connection: Connection,
    /// Shipped as an example: its missing SSH files are a note, not a warning.
    pub(crate) example: bool,
    /// Run mutating commands through `sudo -n` (never through a shell).
    pub(crate) sudo: bool,
    /// Working directory of every spawned tool: a directory with nothing in it.
    pub(crate) jail: PathBuf,
    /// As an agent's policy: where this host records the permits it spent,
    /// one record for every agent on it (`spent_permits:`; beside the jail
    /// by default).
    pub(crate) spent_permits: PathBuf,
    /// Upper bound for one tool call; the run's own time budget may cut it shorter.
    pub(crate) tool_timeout: Duration,
    /// How long `disk_usage`'s `du` may look for the largest entries (a cold
    /// cache on a big filesystem needs more); past it the answer is partial.
    pub(crate) du_budget: Duration,
    /// Allowlist: the systemd units service tools may name.
    pub units: BTreeSet<String>,
    /// Allowlist: the units whose journal `read_journal` may read (the service units are included).
    pub(crate) journals: BTreeSet<String>,
    /// Allowlist: the directories `disk_usage` may measure (and everything under them).
    pub paths: Vec<PathBuf>,
    /// Values of this host its declared tools use as `{{ host.NAME }}`
    /// (a socket's path, a port, an instance name), each checked for its
    /// type: one tool file serves hosts that differ in them.
    pub(crate) vars: BTreeMap<String, Var>,
    /// Allowlist: the logrotate configurations `rotate_logs` may run.
    pub(crate) logrotate_configs: Vec<PathBuf>,
    /// logrotate's state file, when not the Debian default.
    pub(crate) logrotate_state: Option<PathBuf>,
    /// Allowlist: the certificates tools may read or renew, by name.
    pub(crate) certificates: BTreeMap<String, Certificate>,
    /// Allowlist: the URLs `http_check` may fetch, by name (loopback only).
    pub(crate) health_checks: BTreeMap<String, String>,
    /// Allowlist: the worker pools `recycle_worker_pool` may recycle, by name.
    pub(crate) worker_pools: BTreeMap<String, WorkerPool>,
    /// Allowlists for declared tools, by name (`allow: { haproxy_backends:
    /// [web, api] }`): an `allowlist` argument takes a value of its list.
    pub(crate) allow: BTreeMap<String, Vec<String>>,
    /// `unsandboxed_tier1: allow`: where Landlock is missing, declared
    /// tier-1 tools run without it (built-ins always do).
    pub(crate) unsandboxed_tier1: bool,
    /// The absolute path of each program tools spawn.
    pub(crate) binaries: Binaries,
    /// The file this host came from (for messages).
    pub(crate) source: PathBuf,
    /// In an agent's policy: the runner's Ed25519 key (hex) that must sign
    /// every tier-2 call (see `signing`).
    pub(crate) permit_public_key: Option<String>,
}

/// One of a host's `vars:`, checked for its type when the file loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Var {
    /// An absolute path with no `..`.
    Path(String),
    /// 1-255 characters, not starting with `-`, nothing invisible.
    String(String),
    /// A whole number.
    Integer(i64),
}

impl Var {
    /// What a tool's argv gets for `{{ host.NAME }}`.
    pub(crate) fn text(&self) -> String {
        match self {
            Var::Path(s) | Var::String(s) => s.clone(),
            Var::Integer(n) => n.to_string(),
        }
    }

    /// As a host file writes it: `{ path: "/run/x.sock" }`.
    pub(crate) fn written(&self) -> String {
        match self {
            Var::Path(p) => format!("{{ path: {} }}", quoted(p)),
            Var::String(s) => format!("{{ string: {} }}", quoted(s)),
            Var::Integer(n) => format!("{{ integer: {n} }}"),
        }
    }
}

/// One kind of allowlist a host file holds, declared once: the agent's
/// report of its policy (and so `host check` and `check`), the task a model
/// is given and the policy `install print` writes all read [`ALLOWLISTS`],
/// so a kind is in every one of them or in none.
pub(crate) struct AllowlistKind {
    /// The host file's field.
    pub(crate) field: &'static str,
    /// What a model is told the list holds.
    pub(crate) told: &'static str,
    /// Its lists: one, named `field`; or, for `allow`, one per name under
    /// it (`allow.NAME`). Each entry is what an argument may give.
    pub(crate) lists: fn(&Host) -> Lists,
    /// The field as a host file writes it (YAML lines; none when empty).
    pub(crate) written: fn(&Host) -> String,
}

/// A kind's lists, by name, each with its entries.
pub(crate) type Lists = Vec<(String, Vec<String>)>;

/// One list named `field`.
fn one(field: &str, entries: impl IntoIterator<Item = String>) -> Lists {
    vec![(field.to_string(), entries.into_iter().collect())]
}

fn shown(paths: &[PathBuf]) -> impl Iterator<Item = String> + '_ {
    paths.iter().map(|p| p.display().to_string())
}

/// A string as YAML writes it (JSON's quoting is YAML's).
pub(crate) fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A list as YAML's flow style writes it, each item quoted.
pub(crate) fn flow_list(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| quoted(&s)).collect();
    format!("[{}]", items.join(", "))
}

/// `field: [..]`, always (an empty list says the host allows none).
fn written_list(field: &str, entries: impl IntoIterator<Item = String>) -> String {
    format!("{field}: {}\n", flow_list(entries))
}

/// `field:` and an indented entry per name; nothing when there is none.
fn written_map<V>(
    field: &str,
    map: &BTreeMap<String, V>,
    entry: impl Fn(&str, &V) -> String,
) -> String {
    if map.is_empty() {
        return String::new();
    }
    let entries: String = map.iter().map(|(name, v)| entry(name, v)).collect();
    format!("{field}:\n{entries}")
}

/// Every kind of allowlist, in the order a host file lists them.
pub(crate) const ALLOWLISTS: [AllowlistKind; 8] = [
    AllowlistKind {
        field: "paths",
        told: "paths (and what is under them)",
        lists: |h| one("paths", shown(&h.paths)),
        written: |h| written_list("paths", shown(&h.paths)),
    },
    AllowlistKind {
        field: "units",
        told: "units",
        lists: |h| one("units", h.units.iter().cloned()),
        written: |h| written_list("units", h.units.iter().cloned()),
    },
    AllowlistKind {
        field: "journals",
        // A unit of `units` may have its journal read too: not repeated.
        told: "journals",
        lists: |h| one("journals", h.journals.difference(&h.units).cloned()),
        written: |h| written_list("journals", h.journals.iter().cloned()),
    },
    AllowlistKind {
        field: "logrotate_configs",
        told: "logrotate configs",
        lists: |h| one("logrotate_configs", shown(&h.logrotate_configs)),
        written: |h| written_list("logrotate_configs", shown(&h.logrotate_configs)),
    },
    AllowlistKind {
        field: "certificates",
        told: "certificates",
        lists: |h| one("certificates", h.certificates.keys().cloned()),
        written: |h| {
            written_map("certificates", &h.certificates, |name, c| {
                let mut s = format!(
                    "  {name}:\n    path: {}\n",
                    quoted(&c.path.display().to_string())
                );
                if let Some(u) = &c.unit {
                    s += &format!("    unit: {}\n", quoted(u));
                }
                if let Some(r) = &c.renew {
                    s += &format!("    renew: {}\n", flow_list(r.iter().cloned()));
                }
                s
            })
        },
    },
    AllowlistKind {
        field: "health_checks",
        told: "health checks",
        lists: |h| one("health_checks", h.health_checks.keys().cloned()),
        written: |h| {
            written_map("health_checks", &h.health_checks, |name, url| {
                format!("  {name}: {}\n", quoted(url))
            })
        },
    },
    AllowlistKind {
        field: "worker_pools",
        told: "worker pools",
        lists: |h| one("worker_pools", h.worker_pools.keys().cloned()),
        written: |h| written_map("worker_pools", &h.worker_pools, WorkerPool::written),
    },
    AllowlistKind {
        field: "allow",
        told: "allow",
        lists: |h| {
            h.allow
                .iter()
                .map(|(name, values)| (format!("allow.{name}"), values.clone()))
                .collect()
        },
        written: |h| {
            written_map("allow", &h.allow, |name, values| {
                format!("  {name}: {}\n", flow_list(values.iter().cloned()))
            })
        },
    },
];

/// One list of a host's allowlists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allowlist {
    /// Its name: the host file's field, or `allow.NAME`.
    pub(crate) list: String,
    /// What a model is told it holds (a declared tool's list: its name).
    pub(crate) told: String,
    /// What an argument may give.
    pub(crate) entries: Vec<String>,
}

impl Host {
    /// Every list of every kind of allowlist, in [`ALLOWLISTS`]' order.
    pub(crate) fn allowlists(&self) -> Vec<Allowlist> {
        ALLOWLISTS
            .iter()
            .flat_map(|kind| {
                (kind.lists)(self)
                    .into_iter()
                    .map(|(list, entries)| Allowlist {
                        told: match list == kind.field {
                            true => kind.told.to_string(),
                            false => list.clone(),
                        },
                        list,
                        entries,
                    })
            })
            .collect()
    }
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
    pub(crate) address: String,
    /// The SSH port.
    pub(crate) port: u16,
    /// The remote account, whose forced command is `runwarden agent --stdio`.
    pub(crate) user: String,
    /// The private key (the only one offered).
    pub(crate) identity: PathBuf,
    /// The known_hosts file holding this host's key (no global one is read).
    pub(crate) known_hosts: PathBuf,
    /// A run's calls share one connection (an OpenSSH control master) and one
    /// agent session; `false`: a new connection for every call.
    pub(crate) multiplex: bool,
}

/// A certificate the host allows tools to read or renew.
#[derive(Debug, Clone)]
pub(crate) struct Certificate {
    /// The PEM file.
    pub(crate) path: PathBuf,
    /// The unit that serves this certificate (reloaded after a renewal).
    pub(crate) unit: Option<String>,
    /// The renewal command as argv, absolute program first. Written by the operator.
    pub(crate) renew: Option<Vec<String>>,
}

/// A worker pool the host allows `recycle_worker_pool` to recycle.
#[derive(Debug, Clone)]
pub(crate) struct WorkerPool {
    /// Where its master process is found.
    pub(crate) master: PoolMaster,
    /// How it is told to replace its workers.
    pub(crate) recycle: Recycle,
    /// Name of a health check in the same host file.
    pub(crate) health_check: Option<String>,
}

impl WorkerPool {
    /// The pool as a host file writes it, under `worker_pools:`.
    fn written(name: &str, pool: &WorkerPool) -> String {
        let mut s = format!("  {name}:\n");
        match &pool.master {
            PoolMaster::Unit(u) => s += &format!("    unit: {}\n", quoted(u)),
            PoolMaster::PidFile { file, executable } => {
                s += &format!("    pid_file: {}\n", quoted(&file.display().to_string()));
                s += &format!(
                    "    executable: {}\n",
                    quoted(&executable.display().to_string())
                );
            }
        }
        match pool.recycle {
            Recycle::Reload => s += "    recycle: reload\n",
            Recycle::Signal(sig) => s += &format!("    recycle: {{ signal: {} }}\n", sig.name()),
        }
        if let Some(h) = &pool.health_check {
            s += &format!("    health_check: {h}\n");
        }
        s
    }
}

/// Where the pool's master process is found.
#[derive(Debug, Clone)]
pub(crate) enum PoolMaster {
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
pub(crate) enum Recycle {
    /// `systemctl reload UNIT`.
    Reload,
    /// Send this signal to the master process.
    Signal(PoolSignal),
}

/// The signals a pool master understands as "replace your workers".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolSignal {
    /// SIGHUP.
    Hup,
    /// SIGUSR2.
    Usr2,
}

impl PoolSignal {
    /// The signal's name, as `kill -s` takes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PoolSignal::Hup => "HUP",
            PoolSignal::Usr2 => "USR2",
        }
    }
}

/// Absolute paths of every program a tool may spawn (Debian defaults).
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    /// systemctl.
    pub(crate) systemctl: PathBuf,
    /// journalctl.
    pub(crate) journalctl: PathBuf,
    /// logrotate.
    pub(crate) logrotate: PathBuf,
    /// df (coreutils).
    pub(crate) df: PathBuf,
    /// du (coreutils).
    pub(crate) du: PathBuf,
    /// ps (procps).
    pub(crate) ps: PathBuf,
    /// kill (procps).
    pub(crate) kill: PathBuf,
    /// sudo, for hosts with `sudo: true`.
    pub(crate) sudo: PathBuf,
    /// The OpenSSH client (runner side of `connection: ssh`).
    pub(crate) ssh: PathBuf,
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
pub(crate) fn is_unit_name(s: &str) -> bool {
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

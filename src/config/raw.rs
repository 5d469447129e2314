//! The files as written: serde structs that mirror the YAML one to one.
//!
//! Every struct denies unknown fields, so a typo is an error with a location
//! instead of a silently ignored key. Values that later checks may reject are
//! kept [`Spanned`] so the error can point at them. Nothing outside
//! [`crate::config`] sees these types.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

type S<T> = Spanned<T>;

/// Just the name of a file that failed to parse, so one broken host file
/// does not also make every runbook that names it fail.
#[derive(Debug, Deserialize)]
pub struct NameOnly {
    pub name: Option<String>,
}

/// `runwarden.yaml`: settings of the runner itself (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub audit_log: Option<S<String>>,
    /// Where each run's audit head is sent: `journal` (default) or `none`.
    pub audit_head: Option<S<String>>,
    /// The key that signs tier-2 permits for managed hosts.
    pub permit_key_file: Option<S<String>>,
    pub kill_switch_dir: Option<S<String>>,
    pub state_dir: Option<S<String>>,
    pub listen: Option<S<String>>,
    pub timezone: Option<S<String>>,
    pub max_concurrent_runs: Option<S<u32>>,
    pub webhook_token_file: Option<S<String>>,
    pub shutdown_grace: Option<S<String>>,
    pub approvers_file: Option<S<String>>,
    pub approval_timeout: Option<S<String>>,
    pub approval_webhook: Option<S<String>>,
    pub model: Option<S<Model>>,
    pub fleet_budget: Option<FleetBudget>,
    /// Where state shared by several daemons lives (`postgres:`).
    pub state: Option<State>,
    /// This daemon's name among several (default: the hostname).
    pub replica: Option<S<String>>,
}

/// `state:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    pub postgres: Option<Postgres>,
}

/// `state.postgres:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Postgres {
    pub url_file: S<String>,
    pub lease: Option<S<String>>,
    pub ca_file: Option<S<String>>,
}

/// `fleet_budget:` in runwarden.yaml or a runbook: tier-2 calls across
/// every run, within a sliding window.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetBudget {
    pub max_mutations: S<u32>,
    pub per: S<String>,
}

/// `model:` in runwarden.yaml: an OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub endpoint: S<String>,
    pub name: S<String>,
    pub api_key_env: Option<S<String>>,
    pub api_key_file: Option<S<String>>,
    pub timeout: Option<S<String>>,
    pub temperature: Option<S<f32>>,
    pub retries: Option<S<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runbook {
    pub name: S<String>,
    pub description: String,
    pub hosts: S<Vec<S<String>>>,
    pub autonomy: S<String>,
    pub schedule: Option<S<String>>,
    pub on_alert: Option<OnAlert>,
    pub cooldown: Option<S<String>>,
    #[serde(default)]
    pub tools: Tools,
    #[serde(default)]
    pub budget: Budget,
    pub fleet_budget: Option<FleetBudget>,
    #[serde(default)]
    pub steps: Vec<S<Step>>,
    pub agent: Option<S<Agent>>,
}

/// `agent:` in a runbook: a goal for the model planner.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub goal: S<String>,
    pub model: Option<S<String>>,
    pub max_steps: Option<S<u32>>,
    #[serde(default)]
    pub after_steps: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnAlert {
    pub matchers: Vec<S<String>>,
    pub host_label: S<String>,
    /// Label value -> host name, for values that are not `HOST` or `HOST:PORT`.
    #[serde(default)]
    pub host_map: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    #[serde(default)]
    pub observe: Vec<S<String>>,
    #[serde(default)]
    pub approve: Vec<S<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub max_steps: Option<S<u32>>,
    pub max_mutations: Option<S<u32>>,
    pub max_duration: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub id: Option<S<String>>,
    pub call: Option<S<String>>,
    #[serde(default)]
    pub args: BTreeMap<String, S<serde_json::Value>>,
    pub when: Option<S<String>>,
    pub reason: Option<S<String>>,
    pub suggest: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: S<String>,
    pub connection: S<Connection>,
    /// A host file shipped as an example (its SSH files are not expected here).
    #[serde(default)]
    pub example: bool,
    #[serde(default)]
    pub sudo: bool,
    pub jail: Option<S<String>>,
    /// Agent policies: the runner's public key that signs tier-2 permits.
    pub permit_public_key: Option<S<String>>,
    pub tool_timeout: Option<S<String>>,
    /// disk_usage: how long `du` may look for the largest entries.
    pub du_budget: Option<S<String>>,
    #[serde(default)]
    pub units: Vec<S<String>>,
    #[serde(default)]
    pub journals: Vec<S<String>>,
    #[serde(default)]
    pub paths: Vec<S<String>>,
    #[serde(default)]
    pub logrotate_configs: Vec<S<String>>,
    pub logrotate_state: Option<S<String>>,
    #[serde(default)]
    pub certificates: BTreeMap<String, S<Certificate>>,
    #[serde(default)]
    pub health_checks: BTreeMap<String, S<String>>,
    #[serde(default)]
    pub worker_pools: BTreeMap<String, S<WorkerPool>>,
    #[serde(default)]
    pub binaries: Binaries,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Connection {
    Local,
    Ssh(Box<Ssh>),
    /// The unix socket of this machine's own agent (`runwarden-agent.socket`).
    Agent(S<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ssh {
    pub address: S<String>,
    pub port: Option<u16>,
    pub user: S<String>,
    pub identity: S<String>,
    pub known_hosts: S<String>,
    /// One connection and agent session per run; false: one per call. Default true.
    pub multiplex: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    pub path: S<String>,
    pub unit: Option<S<String>>,
    pub renew: Option<S<Vec<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerPool {
    pub unit: Option<S<String>>,
    pub pid_file: Option<S<String>>,
    /// With `pid_file`: the program the master runs (checked before a signal).
    pub executable: Option<S<String>>,
    pub recycle: S<Recycle>,
    pub health_check: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Recycle {
    Reload,
    Signal(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binaries {
    pub systemctl: Option<S<String>>,
    pub journalctl: Option<S<String>>,
    pub logrotate: Option<S<String>>,
    pub df: Option<S<String>>,
    pub du: Option<S<String>>,
    pub ps: Option<S<String>>,
    pub kill: Option<S<String>>,
    pub sudo: Option<S<String>>,
    pub ssh: Option<S<String>>,
}

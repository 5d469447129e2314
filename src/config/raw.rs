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
pub(crate) struct NameOnly {
    pub(crate) name: Option<String>,
}

/// `runwarden.yaml`: settings of the runner itself (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    pub audit_log: Option<S<String>>,
    /// When the audit log closes a segment, and how long segments stay.
    pub(crate) audit_rotation: Option<AuditRotation>,
    /// Where each run's audit head is sent: `journal` (default) or `none`.
    pub(crate) audit_head: Option<S<String>>,
    /// The key that signs tier-2 permits for managed hosts.
    pub(crate) permit_key_file: Option<S<String>>,
    pub(crate) kill_switch_dir: Option<S<String>>,
    pub(crate) state_dir: Option<S<String>>,
    pub(crate) listen: Option<S<String>>,
    pub(crate) timezone: Option<S<String>>,
    pub(crate) max_concurrent_runs: Option<S<u32>>,
    pub(crate) webhook_token_file: Option<S<String>>,
    pub(crate) shutdown_grace: Option<S<String>>,
    /// Who may do what (`principals:`), or the older approvers file.
    pub(crate) principals_file: Option<S<String>>,
    /// The older name of `principals_file`.
    pub(crate) approvers_file: Option<S<String>>,
    pub(crate) approval_timeout: Option<S<String>>,
    pub(crate) approval_webhook: Option<S<String>>,
    /// The secret that signs each approval webhook POST.
    pub(crate) approval_webhook_secret_file: Option<S<String>>,
    /// The URL people and bridges reach the daemon at (approve/deny links).
    pub(crate) external_url: Option<S<String>>,
    pub(crate) model: Option<S<Model>>,
    pub(crate) fleet_budget: Option<FleetBudget>,
    /// Where state shared by several daemons lives (`postgres:`).
    pub(crate) state: Option<State>,
    /// Where people are told and answer (`slack:`).
    pub(crate) chat: Option<Chat>,
    /// This daemon's name among several (default: the hostname).
    pub(crate) replica: Option<S<String>>,
    /// The bearer token of the daemon's `/mcp` (none: no `/mcp`).
    pub(crate) mcp_token_file: Option<S<String>>,
    /// How long an MCP session may be idle before it ends.
    pub(crate) mcp_idle_timeout: Option<S<String>>,
    /// How many MCP sessions may be open at once.
    pub(crate) mcp_max_sessions: Option<S<u32>>,
    /// How long a session may go without a tool call after its handshake.
    pub(crate) mcp_handshake_timeout: Option<S<String>>,
    /// The names `/mcp` answers to in `Host`.
    pub(crate) mcp_allowed_hosts: Option<Vec<S<String>>>,
    /// The Prometheus that evaluates the alerting rules.
    pub(crate) prometheus: Option<Prometheus>,
}

/// `prometheus:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Prometheus {
    pub(crate) url: S<String>,
    pub(crate) bearer_token_file: Option<S<String>>,
    pub(crate) timeout: Option<S<String>>,
}

/// `done_when:` in a runbook: what a run must see before it is `ok`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DoneWhen {
    pub(crate) alert_clears: S<AlertClears>,
}

/// `done_when.alert_clears:` in a runbook.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AlertClears {
    pub(crate) within: S<String>,
    #[serde(default)]
    pub(crate) ignore_labels: Vec<S<String>>,
    pub(crate) absent_evaluations: Option<S<u32>>,
    pub(crate) recurrence: Option<S<String>>,
}

/// `audit_rotation:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditRotation {
    pub(crate) max_size: Option<S<String>>,
    pub(crate) max_age: Option<S<String>>,
    pub(crate) keep: Option<S<String>>,
    pub(crate) max_total: Option<S<String>>,
}

/// `state:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct State {
    pub(crate) postgres: Option<Postgres>,
}

/// `chat:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Chat {
    pub(crate) slack: Option<S<Slack>>,
}

/// `chat.slack:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Slack {
    pub(crate) signing_secret_file: S<String>,
    pub(crate) bot_token_file: S<String>,
    pub(crate) channel: S<String>,
    pub(crate) api_url: Option<S<String>>,
}

/// `state.postgres:` in runwarden.yaml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Postgres {
    pub(crate) url_file: S<String>,
    pub(crate) lease: Option<S<String>>,
    pub(crate) ca_file: Option<S<String>>,
}

/// `max_runs:` in a runbook: runs on one host within a window.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MaxRuns {
    pub(crate) count: S<u32>,
    pub(crate) per: S<String>,
}

/// `demote_after:` in a runbook: failed runs (fleet-wide) that take its
/// standing approval away.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DemoteAfter {
    pub(crate) failures: S<u32>,
    pub(crate) per: S<String>,
}

/// `fleet_budget:` in runwarden.yaml or a runbook: tier-2 calls across
/// every run, within a sliding window.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FleetBudget {
    pub(crate) max_mutations: S<u32>,
    pub(crate) per: S<String>,
}

/// `model:` in runwarden.yaml: an OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Model {
    pub(crate) endpoint: S<String>,
    pub(crate) name: S<String>,
    pub(crate) api_key_env: Option<S<String>>,
    pub(crate) api_key_file: Option<S<String>>,
    pub(crate) timeout: Option<S<String>>,
    /// Longest silence between two chunks of a streamed answer.
    pub(crate) idle_timeout: Option<S<String>>,
    pub(crate) temperature: Option<S<f32>>,
    pub(crate) retries: Option<S<u32>>,
    /// Most tokens one answer may have (the request's `max_tokens`).
    pub(crate) max_tokens: Option<S<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Runbook {
    pub(crate) name: S<String>,
    pub(crate) description: String,
    pub(crate) hosts: S<Vec<S<String>>>,
    pub(crate) autonomy: S<String>,
    pub(crate) schedule: Option<S<String>>,
    pub(crate) on_alert: Option<OnAlert>,
    pub(crate) cooldown: Option<S<String>>,
    pub(crate) max_runs: Option<MaxRuns>,
    pub(crate) demote_after: Option<DemoteAfter>,
    #[serde(default)]
    pub(crate) on_resolved: Option<S<String>>,
    #[serde(default)]
    pub(crate) tools: Tools,
    #[serde(default)]
    pub(crate) budget: Budget,
    pub(crate) fleet_budget: Option<FleetBudget>,
    #[serde(default)]
    pub(crate) steps: Vec<S<Step>>,
    pub(crate) agent: Option<S<Agent>>,
    /// `steps` or `model`: who picks the calls.
    pub(crate) planner: Option<S<String>>,
    pub(crate) done_when: Option<DoneWhen>,
    /// How a fan-out reaches its hosts: a canary, then waves.
    pub(crate) rollout: Option<S<Rollout>>,
    /// An Alertmanager silence held while a host's changes are made.
    pub(crate) silence: Option<S<Silence>>,
    /// Whoever started a run may not approve its calls.
    pub(crate) four_eyes: Option<S<bool>>,
}

/// `silence:` in a runbook.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Silence {
    pub(crate) alertmanager: S<String>,
    #[serde(default)]
    pub(crate) matchers: Vec<S<String>>,
    pub(crate) host_label: Option<S<String>>,
    #[serde(rename = "for")]
    pub(crate) longest: S<String>,
}

/// `rollout:` in a runbook.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rollout {
    pub(crate) canary: Option<S<Canary>>,
    #[serde(default)]
    pub(crate) waves: Vec<S<CountOrShare>>,
    pub(crate) pause: Option<S<String>>,
    pub(crate) max_failures: Option<S<u32>>,
    pub(crate) guard: Option<S<String>>,
}

/// `rollout.canary:` a count of the first hosts, or the hosts by name.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Canary {
    Count(u32),
    Hosts(Vec<S<String>>),
}

/// A wave's size: a count of hosts, or `"N%"` of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum CountOrShare {
    Count(u32),
    Text(String),
}

/// `agent:` in a runbook: a goal for the model planner.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Agent {
    pub(crate) goal: S<String>,
    pub(crate) model: Option<S<String>>,
    pub(crate) max_steps: Option<S<u32>>,
    #[serde(default)]
    pub(crate) after_steps: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OnAlert {
    pub(crate) matchers: Vec<S<String>>,
    pub(crate) host_label: S<String>,
    /// Label value -> host name, for values that are not `HOST` or `HOST:PORT`.
    #[serde(default)]
    pub(crate) host_map: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tools {
    #[serde(default)]
    pub(crate) observe: Vec<S<String>>,
    #[serde(default)]
    pub(crate) approve: Vec<S<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Budget {
    pub(crate) max_steps: Option<S<u32>>,
    pub(crate) max_mutations: Option<S<u32>>,
    pub(crate) max_duration: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    pub(crate) id: Option<S<String>>,
    pub(crate) call: Option<S<String>>,
    #[serde(default)]
    pub(crate) args: BTreeMap<String, S<serde_json::Value>>,
    pub(crate) when: Option<S<String>>,
    pub(crate) reason: Option<S<String>>,
    pub(crate) suggest: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub(crate) name: S<String>,
    pub(crate) connection: S<Connection>,
    /// A host file shipped as an example (its SSH files are not expected here).
    #[serde(default)]
    pub(crate) example: bool,
    #[serde(default)]
    pub(crate) sudo: bool,
    pub(crate) jail: Option<S<String>>,
    /// Agent policies: the one record of spent permits for every agent on the host.
    pub(crate) spent_permits: Option<S<String>>,
    /// Agent policies: the runner's public key that signs tier-2 permits.
    pub(crate) permit_public_key: Option<S<String>>,
    pub(crate) tool_timeout: Option<S<String>>,
    /// disk_usage: how long `du` may look for the largest entries.
    pub(crate) du_budget: Option<S<String>>,
    #[serde(default)]
    pub units: Vec<S<String>>,
    #[serde(default)]
    pub(crate) journals: Vec<S<String>>,
    #[serde(default)]
    pub paths: Vec<S<String>>,
    #[serde(default)]
    pub(crate) logrotate_configs: Vec<S<String>>,
    pub(crate) logrotate_state: Option<S<String>>,
    #[serde(default)]
    pub(crate) certificates: BTreeMap<String, S<Certificate>>,
    #[serde(default)]
    pub(crate) health_checks: BTreeMap<String, S<String>>,
    #[serde(default)]
    pub(crate) worker_pools: BTreeMap<String, S<WorkerPool>>,
    /// Declared tools' `allowlist` arguments: named lists of values.
    #[serde(default)]
    pub(crate) allow: BTreeMap<String, S<Vec<S<String>>>>,
    /// `allow`: declared tier-1 tools run where Landlock is missing.
    pub(crate) unsandboxed_tier1: Option<S<String>>,
    #[serde(default)]
    pub(crate) binaries: Binaries,
    /// Values of this host that declared tools use as `{{ host.NAME }}`.
    #[serde(default)]
    pub(crate) vars: BTreeMap<String, S<Var>>,
}

/// One of a host's `vars:`, with its type: `{ path: /run/x.sock }`,
/// `{ string: web }` or `{ integer: 8404 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Var {
    pub(crate) path: Option<String>,
    pub(crate) string: Option<String>,
    pub(crate) integer: Option<i64>,
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
pub(crate) struct Ssh {
    pub(crate) address: S<String>,
    pub(crate) port: Option<u16>,
    pub(crate) user: S<String>,
    pub(crate) identity: S<String>,
    pub(crate) known_hosts: S<String>,
    /// One connection and agent session per run; false: one per call. Default true.
    pub(crate) multiplex: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Certificate {
    pub(crate) path: S<String>,
    pub(crate) unit: Option<S<String>>,
    pub(crate) renew: Option<S<Vec<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerPool {
    pub(crate) unit: Option<S<String>>,
    pub(crate) pid_file: Option<S<String>>,
    /// With `pid_file`: the program the master runs (checked before a signal).
    pub(crate) executable: Option<S<String>>,
    pub(crate) recycle: S<Recycle>,
    pub(crate) health_check: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Recycle {
    Reload,
    Signal(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Binaries {
    pub(crate) systemctl: Option<S<String>>,
    pub(crate) journalctl: Option<S<String>>,
    pub(crate) logrotate: Option<S<String>>,
    pub(crate) df: Option<S<String>>,
    pub(crate) du: Option<S<String>>,
    pub(crate) ps: Option<S<String>>,
    pub(crate) kill: Option<S<String>>,
    pub(crate) sudo: Option<S<String>>,
    pub(crate) ssh: Option<S<String>>,
}

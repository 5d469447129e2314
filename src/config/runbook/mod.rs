//! A runbook: which hosts it may touch, which tools it may call (and with
//! what standing approval), what it may spend, and the steps it runs.
//!
//! The raw form, its validation (each diagnostic naming file, line and
//! field) and the validated form are one schema, kept together so a field
//! is added in one place; a step's own check (its call, arguments, `when`
//! and templates) is `steps`.
//!
//! One file: the raw form, its validation and the validated form of every
//! field sit side by side, so a field is added in one place.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_saphyr::Spanned;

mod done_when;
mod rollout;
mod silence;
mod steps;

pub(crate) use done_when::AlertClears;
pub(crate) use rollout::{Canary, Reach, Rollout};
pub(crate) use silence::Silence;
use steps::validate_step;

use super::diag::{Diagnostics, did_you_mean};
use super::duration;
use super::raw;
use crate::host::safe_name;
use crate::tools::{Tier, ToolId};

/// How much a runbook may change on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Autonomy {
    /// Tier-2 calls are recorded as proposals and never run.
    L1,
    /// Each tier-2 call waits for a person's approval (`runwarden serve` with approvers).
    L2,
    /// Standing approval for exactly the tier-2 tools listed under `tools.approve`.
    L3,
}

impl Autonomy {
    /// `L1`, `L2` or `L3`, as runbooks and reports write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Autonomy::L1 => "L1",
            Autonomy::L2 => "L2",
            Autonomy::L3 => "L3",
        }
    }
}

/// `max_runs:` in a runbook, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaxRuns {
    /// Runs started on the host within `per`, any trigger.
    pub(crate) count: u32,
    /// The window, at most [`MaxRuns::LONGEST`].
    pub(crate) per: Duration,
}

impl MaxRuns {
    /// The longest window: what a daemon reads back at start (the newest
    /// segment, and what the segment line carries) covers a week.
    pub(crate) const LONGEST: Duration = Duration::from_secs(7 * 86_400);
}

/// A window of runs counted from history (`max_runs.per`,
/// `demote_after.per`): 1m to [`MaxRuns::LONGEST`], which is what a
/// daemon reads back at start.
fn window(
    raw: &Spanned<String>,
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Duration> {
    let per = duration(raw, field, file, diags)?;
    if per < Duration::from_secs(60) || per > MaxRuns::LONGEST {
        diags.at(
            file,
            raw.referenced,
            format!("{field} \"{}\" must be between 1m and 7d", raw.value),
        );
        return None;
    }
    Some(per)
}

fn max_runs(raw: &raw::MaxRuns, file: &Path, diags: &mut Diagnostics) -> Option<MaxRuns> {
    let per = window(&raw.per, "max_runs.per", file, diags)?;
    if raw.count.value == 0 {
        diags.at(
            file,
            raw.count.referenced,
            "max_runs.count must be at least 1 (to stop a runbook from running, remove its triggers or engage its kill switch)",
        );
        return None;
    }
    Some(MaxRuns {
        count: raw.count.value,
        per,
    })
}

/// `demote_after:` in a runbook, validated: this many failed runs within
/// `per`, counted across every host and replica, take the runbook's
/// standing approval away (the gate's `demotion` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DemoteAfter {
    /// Failed runs that demote it.
    pub(crate) failures: u32,
    /// The window, at most [`MaxRuns::LONGEST`].
    pub(crate) per: Duration,
}

fn demote_after(
    raw: &raw::DemoteAfter,
    autonomy: Option<Autonomy>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<DemoteAfter> {
    let per = window(&raw.per, "demote_after.per", file, diags)?;
    if raw.failures.value == 0 {
        diags.at(
            file,
            raw.failures.referenced,
            "demote_after.failures must be at least 1",
        );
        return None;
    }
    if autonomy.is_some_and(|a| a != Autonomy::L3) {
        diags.at(
            file,
            raw.failures.referenced,
            "demote_after takes standing approval away, and only an L3 runbook holds it: remove demote_after, or set autonomy: L3",
        );
        return None;
    }
    Some(DemoteAfter {
        failures: raw.failures.value,
        per,
    })
}

/// Tier-2 calls across every run (and every process on this machine)
/// within a sliding window: `fleet_budget:` in runwarden.yaml, or in a
/// runbook for its own calls. Kept by the gate's fleet budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FleetBudget {
    /// Tier-2 calls allowed within the window.
    pub(crate) max_mutations: u32,
    /// The window.
    pub(crate) per: Duration,
}

/// The most tier-2 calls a fleet budget may allow per window.
const MAX_FLEET_MUTATIONS: u32 = 100_000;

/// `fleet_budget:` of runwarden.yaml or a runbook, checked.
pub(crate) fn fleet_budget(
    raw: &raw::FleetBudget,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<FleetBudget> {
    let max = &raw.max_mutations;
    if max.value > MAX_FLEET_MUTATIONS {
        diags.at(
            file,
            max.referenced,
            format!("fleet_budget.max_mutations must be at most {MAX_FLEET_MUTATIONS}"),
        );
    }
    let per = duration(&raw.per, "fleet_budget.per", file, diags)?;
    if per > Duration::from_secs(31 * 24 * 3600) {
        diags.at(
            file,
            raw.per.referenced,
            "fleet_budget.per must be at most 31d",
        );
        return None;
    }
    Some(FleetBudget {
        max_mutations: max.value,
        per,
    })
}

/// What one run may spend; past any of it the gate refuses the next call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Calls a run may make (denied ones count).
    pub(crate) max_steps: u32,
    /// Tier-2 calls a run may make.
    pub(crate) max_mutations: u32,
    /// Wall time of the whole run.
    pub(crate) max_duration: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_steps: 12,
            max_mutations: 3,
            max_duration: Duration::from_secs(600),
        }
    }
}

/// Which Alertmanager alerts start this runbook, and on which host.
#[derive(Debug, Clone)]
pub(crate) struct OnAlert {
    /// Every matcher must hold for an alert to match (Alertmanager's syntax).
    pub(crate) matchers: Vec<super::matchers::Matcher>,
    /// The label naming the host (default `instance`).
    pub(crate) host_label: String,
    /// Label values mapped to host names, where they differ.
    pub(crate) host_map: BTreeMap<String, String>,
}

impl OnAlert {
    /// The named host an alert's label value refers to: the mapped name, or the value without `:PORT`.
    pub(crate) fn host_of(&self, labels: &BTreeMap<String, String>) -> Option<String> {
        let v = labels.get(&self.host_label)?;
        if let Some(h) = self.host_map.get(v) {
            return Some(h.clone());
        }
        let host = match v.rsplit_once(':') {
            Some((h, port)) if !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()) => h,
            _ => v.as_str(),
        };
        Some(host.to_string())
    }
}

/// One deterministic step, as written (templates are rendered at run time).
#[derive(Debug, Clone)]
pub(crate) struct Step {
    /// The name later steps use (`steps.ID.field`); defaults to `step<N>`.
    pub(crate) id: String,
    /// A template; the step is skipped when it renders false.
    pub(crate) when: Option<String>,
    /// The line of the runbook file the step starts on (for messages).
    pub(crate) line: u32,
    /// Its column there.
    pub(crate) column: u32,
    /// What the step does.
    pub(crate) action: StepAction,
}

/// What one step does.
#[derive(Debug, Clone)]
pub(crate) enum StepAction {
    /// Propose one call to the gate.
    Call {
        /// The tool, from the registry.
        tool: ToolId,
        /// Argument values; strings may be minijinja templates.
        args: BTreeMap<String, serde_json::Value>,
        /// Required for tier-2 calls; a template.
        reason: Option<String>,
    },
    /// A tier-3 command for a person to run; recorded, never executed.
    Suggest(String),
}

/// `planner:` in a runbook: who picks its calls. A runbook is planned by a
/// model only when it says so (or has no steps to run): a `model:` section
/// added to runwarden.yaml never turns a runbook's written steps, and the
/// standing approval they hold, over to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlannedBy {
    /// Its `steps` (the default for a runbook that has steps).
    Steps,
    /// A model toward its `agent.goal` (the default for a runbook with
    /// only a goal).
    Model,
    /// An outside agent over MCP (`planner: mcp`), toward its `agent.goal`
    /// when it has one: the runbook is the scope the agent works in, and
    /// only an agent's session starts a run of it.
    Mcp,
}

impl PlannedBy {
    /// As `planner:` writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PlannedBy::Steps => "steps",
            PlannedBy::Model => "model",
            PlannedBy::Mcp => "mcp",
        }
    }
}

/// A goal for the model planner: it picks calls inside the runbook's scope.
#[derive(Debug, Clone)]
pub(crate) struct Agent {
    /// What to find out, what a good fix is, what must not be done; shown to the model.
    pub(crate) goal: String,
    /// Overrides `model.name` of runwarden.yaml for this runbook.
    pub(crate) model: Option<String>,
    /// Calls the model may propose, inside the runbook's `budget.max_steps`.
    pub(crate) max_steps: u32,
    /// Run the `steps` first and hand their findings to the model.
    pub(crate) after_steps: bool,
}

/// `on_resolved:` in a runbook: what Alertmanager's `resolved` for the
/// alert that started a run does to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum OnResolved {
    /// Its L2 approval requests still waiting are withdrawn: nobody is
    /// asked to approve a fix for a problem that went away. A run already
    /// making calls goes on.
    #[default]
    WithdrawApprovals,
    /// Nothing: the run goes on, and its requests wait for a person.
    Ignore,
}

/// A validated runbook.
#[derive(Debug, Clone)]
pub(crate) struct Runbook {
    /// The runbook's name: its file's stem.
    pub(crate) name: String,
    /// One line for people: what it is for.
    pub(crate) description: String,
    /// Shared with the host map: large estates name hundreds of hosts in many runbooks.
    pub(crate) hosts: Vec<std::sync::Arc<str>>,
    /// How much it may change on its own.
    pub(crate) autonomy: Autonomy,
    /// A cron expression (5 or 6 fields) in the configured time zone.
    pub(crate) schedule: Option<String>,
    /// Which alerts start it.
    pub(crate) on_alert: Option<OnAlert>,
    /// How long after a run on a host before a trigger may start another there.
    pub(crate) cooldown: Option<Duration>,
    /// At most this many runs on one host within a window: a trigger past
    /// it is `capped` (a fix that keeps being needed is a person's problem).
    pub(crate) max_runs: Option<MaxRuns>,
    /// What a `resolved` notification of the alert that started a run does.
    pub(crate) on_resolved: OnResolved,
    /// Failed runs within a window (fleet-wide) after which the runbook
    /// loses its standing approval until a person restores it.
    pub(crate) demote_after: Option<DemoteAfter>,
    /// Tier-1 tools the runbook may call.
    pub(crate) observe: BTreeSet<ToolId>,
    /// Tier-2 tools: standing approval at L3, proposals only at L1.
    pub(crate) approve: BTreeSet<ToolId>,
    /// What one run may spend.
    pub(crate) budget: Budget,
    /// Tier-2 calls of all this runbook's runs, within a window.
    pub(crate) fleet_budget: Option<FleetBudget>,
    /// The deterministic steps, in order.
    pub(crate) steps: Vec<Step>,
    /// A goal for the model planner, when the runbook has one.
    pub(crate) agent: Option<Agent>,
    /// Who picks its calls when nobody asks otherwise (`planner:`).
    pub(crate) planner: PlannedBy,
    /// When a run started by an alert is done: its alert cleared.
    pub(crate) done_when: Option<AlertClears>,
    /// How a fan-out reaches the hosts: canaries, then waves.
    pub(crate) rollout: Option<Rollout>,
    /// The Alertmanager silence a run holds while it changes its host.
    pub(crate) silence: Option<Silence>,
    /// Whoever started a run (a principal, through the API or `/mcp`) may
    /// not approve its calls: another person must.
    pub(crate) four_eyes: bool,
    /// sha256 of the file's bytes: which version of the runbook a run used.
    pub(crate) version: String,
    /// The file this runbook came from (for messages).
    pub(crate) source: PathBuf,
}

impl Runbook {
    /// Whether the runbook lists `tool` (to observe or to change).
    pub(crate) fn allows_tool(&self, tool: &ToolId) -> bool {
        self.observe.contains(tool) || self.approve.contains(tool)
    }

    /// The tool of that name, if the runbook lists it: the one its file was
    /// checked against (a declared tool's version with it).
    pub(crate) fn tool(&self, name: &str) -> Option<&ToolId> {
        self.observe
            .iter()
            .chain(self.approve.iter())
            .find(|t| t.name() == name)
    }

    /// Whether the runbook names `host`.
    pub(crate) fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| &**h == host)
    }
}

/// A schedule is 5-field crontab syntax (6 with seconds first, or a
/// `@daily`-style shortcut), every number in range for its field, and it
/// fires at some time: a
/// schedule that cannot (`0 3 31 2 *`) is as wrong as one that does not
/// parse, since nothing would ever run. The error is text the loader
/// reports at the runbook's `schedule` line.
fn check_schedule(text: &str) -> Result<(), String> {
    const FIELDS: [(&str, u32, u32); 6] = [
        ("second", 0, 59),
        ("minute", 0, 59),
        ("hour", 0, 23),
        ("day of month", 1, 31),
        ("month", 1, 12),
        ("day of week", 0, 7),
    ];
    if !text.trim_start().starts_with('@') {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let names = match fields.len() {
            5 => &FIELDS[1..],
            6 => &FIELDS[..],
            n => {
                return Err(format!(
                    "has {n} fields, not 5 (minute hour day-of-month month day-of-week) or 6 (seconds first); no years"
                ));
            }
        };
        for (field, &(name, lo, hi)) in fields.iter().zip(names) {
            for part in field.split(',') {
                // `a-b/step`: the range's numbers must be in range; the step is a count.
                let range = part.split('/').next().unwrap_or("");
                for n in range.split('-').filter_map(|n| n.parse::<u32>().ok()) {
                    if n < lo || n > hi {
                        return Err(format!("has {name} {n}, out of range {lo}-{hi}"));
                    }
                }
            }
        }
    }
    let cron = croner::parser::CronParser::new()
        .parse(text)
        .map_err(|e| format!("does not parse: {e}"))?;
    // Whether it ever fires does not depend on the zone: UTC spares the
    // system zone's lookup (a walk of the time-zone database).
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    cron.find_next_occurrence(&now, false)
        .map(|_| ())
        .map_err(|_| "can never fire (no such date)".to_string())
}

/// The template engine shared by `when` conditions and templated values.
/// Strict undefined: a misspelt `steps.root.use_pct` is an error, not a silent false.
pub(crate) fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_recursion_limit(32);
    env
}

/// Whether a string holds minijinja syntax (and is rendered at run time).
pub(crate) fn is_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// What a runbook is checked against besides its own file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Around {
    /// runwarden.yaml has a `model:`.
    pub(crate) model: bool,
    /// runwarden.yaml has a `prometheus:`.
    pub(crate) prometheus: bool,
}

/// The most steps a runbook may have: `budget.max_steps` is at most 1000.
const MAX_STEPS: usize = 1000;

pub(super) fn validate(
    raw: raw::Runbook,
    file: &Path,
    version: String,
    hosts: &BTreeMap<String, std::sync::Arc<str>>,
    tools: &crate::tools::Tools,
    around: Around,
    diags: &mut Diagnostics,
) -> Option<Runbook> {
    let model_configured = around.model;
    let before = diags.len();
    let name = raw.name.value.clone();
    if !safe_name(&name) {
        diags.at(
            file,
            raw.name.referenced,
            format!("runbook name \"{name}\" must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit (it names metrics and kill-switch files)"),
        );
    }

    let autonomy = autonomy(&raw, file, diags);
    let on_resolved = on_resolved(&raw, file, diags);
    let host_names = runbook_hosts(&raw, hosts, file, diags);
    let observe = tool_list(&raw.tools.observe, Tier::Observe, tools, file, diags);
    let approve = tool_list(&raw.tools.approve, Tier::Change, tools, file, diags);

    if let Some(s) = &raw.schedule
        && let Err(e) = check_schedule(&s.value)
    {
        diags.at(
            file,
            s.referenced,
            format!(
                "schedule \"{}\" {e}; use 5-field crontab syntax such as \"0 3 * * 1\" or @daily",
                s.value
            ),
        );
    }
    let cooldown = raw
        .cooldown
        .as_ref()
        .and_then(|c| duration(c, "cooldown", file, diags));
    let max_runs = raw.max_runs.as_ref().and_then(|m| max_runs(m, file, diags));
    let demote_after = raw
        .demote_after
        .as_ref()
        .and_then(|d| demote_after(d, autonomy, file, diags));
    let on_alert = on_alert(&raw, hosts, file, diags);
    let budget = budget(&raw, file, diags);
    let done_when = done_when::validate(&raw, budget.max_duration, around.prometheus, file, diags);
    let rollout = rollout::validate(
        &raw,
        rollout::Needs {
            hosts: &host_names,
            prometheus: around.prometheus,
        },
        file,
        diags,
    );
    let silence = silence::validate(&raw, file, diags);
    let four_eyes = raw.four_eyes.as_ref().is_some_and(|f| f.value);
    if let Some(f) = raw.four_eyes.as_ref().filter(|f| f.value)
        && autonomy != Some(Autonomy::L2)
        && raw.demote_after.is_none()
    {
        diags.at(
            file,
            f.referenced,
            "four_eyes: true, but no call of this runbook waits for a person: it takes autonomy: L2 (or demote_after, whose demotion makes it wait)",
        );
    }
    let steps = steps(&raw, file, tools, (&observe, &approve), diags)?;
    let agent = agent(&raw, &budget, model_configured, file, diags);
    let planner = planner(&raw, agent.as_ref(), model_configured, file, diags);
    if raw.steps.is_empty() && agent.is_none() && planner != PlannedBy::Mcp {
        diags.at(
            file,
            raw.name.referenced,
            "the runbook has neither steps nor an agent goal: it would do nothing",
        );
    }

    if diags.len() != before {
        return None;
    }
    Some(Runbook {
        name,
        description: raw.description,
        hosts: host_names,
        autonomy: autonomy?,
        schedule: raw.schedule.map(|s| s.value),
        on_alert,
        cooldown,
        max_runs,
        on_resolved,
        demote_after,
        observe,
        approve,
        budget,
        fleet_budget: raw
            .fleet_budget
            .as_ref()
            .and_then(|f| fleet_budget(f, file, diags)),
        steps,
        agent,
        planner,
        done_when,
        rollout,
        silence,
        four_eyes,
        version,
        source: file.to_path_buf(),
    })
}

/// `autonomy:` (L1, L2 or L3).
fn autonomy(raw: &raw::Runbook, file: &Path, diags: &mut Diagnostics) -> Option<Autonomy> {
    match raw.autonomy.value.as_str() {
        "L1" => Some(Autonomy::L1),
        "L3" => Some(Autonomy::L3),
        "L2" => Some(Autonomy::L2),
        other => {
            diags.at(
                file,
                raw.autonomy.referenced,
                format!(
                    "autonomy \"{other}\" is not one of L1 (propose only), L2 (a person approves each change) or L3 (standing approval)"
                ),
            );
            None
        }
    }
}

/// `on_resolved:` (what a resolved alert does to its run's approvals).
fn on_resolved(raw: &raw::Runbook, file: &Path, diags: &mut Diagnostics) -> OnResolved {
    match raw.on_resolved.as_ref().map(|s| s.value.as_str()) {
        None | Some("withdraw_approvals") => OnResolved::WithdrawApprovals,
        Some("ignore") => OnResolved::Ignore,
        Some(other) => {
            if let Some(s) = &raw.on_resolved {
                diags.at(
                    file,
                    s.referenced,
                    format!(
                        "on_resolved \"{other}\" is not one of withdraw_approvals (the default: a resolved alert withdraws its run's approval requests) or ignore"
                    ),
                );
            }
            OnResolved::default()
        }
    }
}

/// `hosts:`: each defined in hosts/, none twice; their names as the
/// config holds them.
fn runbook_hosts(
    raw: &raw::Runbook,
    hosts: &BTreeMap<String, std::sync::Arc<str>>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Vec<std::sync::Arc<str>> {
    let mut host_names = Vec::new();
    let mut seen = std::collections::HashSet::new();
    if raw.hosts.value.is_empty() {
        diags.at(
            file,
            raw.hosts.referenced,
            "hosts is empty: name at least one host from hosts/",
        );
    }
    for h in &raw.hosts.value {
        if !seen.insert(h.value.as_str()) {
            diags.at(
                file,
                h.referenced,
                format!("host \"{}\" is listed twice", h.value),
            );
        } else if !hosts.contains_key(&h.value) {
            diags.at(
                file,
                h.referenced,
                format!(
                    "host \"{}\" is not defined in hosts/{}",
                    h.value,
                    did_you_mean(&h.value, hosts.keys().map(String::as_str))
                ),
            );
        }
        host_names.push(
            hosts
                .get(&h.value)
                .cloned()
                .unwrap_or_else(|| h.value.as_str().into()),
        );
    }
    host_names
}

/// `on_alert:`: its matchers parsed, its host map's hosts defined.
fn on_alert(
    raw: &raw::Runbook,
    hosts: &BTreeMap<String, std::sync::Arc<str>>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<OnAlert> {
    raw.on_alert.as_ref().map(|a| {
        let mut matchers = Vec::new();
        for m in &a.matchers {
            match super::matchers::Matcher::parse(&m.value) {
                Ok(m) => matchers.push(m),
                Err(e) => diags.at(file, m.referenced, e),
            }
        }
        if a.matchers.is_empty() {
            diags.at(
                file,
                a.host_label.referenced,
                "on_alert.matchers is empty: it would match every alert",
            );
        }
        for (value, host) in &a.host_map {
            if !hosts.contains_key(host) {
                diags.at(
                    file,
                    a.host_label.referenced,
                    format!(
                        "on_alert.host_map: {value:?} maps to host \"{host}\", which is not defined"
                    ),
                );
            }
        }
        OnAlert {
            matchers,
            host_label: a.host_label.value.clone(),
            host_map: a.host_map.clone(),
        }
    })
}

/// `budget:`, each limit within its bounds; the defaults where unset.
fn budget(raw: &raw::Runbook, file: &Path, diags: &mut Diagnostics) -> Budget {
    let mut budget = Budget::default();
    if let Some(s) = &raw.budget.max_steps {
        if s.value == 0 || s.value > 1000 {
            diags.at(
                file,
                s.referenced,
                "budget.max_steps must be between 1 and 1000",
            );
        }
        budget.max_steps = s.value;
    }
    if let Some(m) = &raw.budget.max_mutations {
        if m.value > 100 {
            diags.at(
                file,
                m.referenced,
                "budget.max_mutations must be at most 100",
            );
        }
        budget.max_mutations = m.value;
    }
    if let Some(d) = &raw.budget.max_duration
        && let Some(d) = duration(d, "budget.max_duration", file, diags)
    {
        budget.max_duration = d;
    }
    budget
}

/// `steps:`, each checked against the runbook's tool lists; `None` when
/// there are more than any budget could run.
fn steps(
    raw: &raw::Runbook,
    file: &Path,
    tools: &crate::tools::Tools,
    (observe, approve): (&BTreeSet<ToolId>, &BTreeSet<ToolId>),
    diags: &mut Diagnostics,
) -> Option<Vec<Step>> {
    if raw.steps.len() > MAX_STEPS {
        diags.at(
            file,
            raw.name.referenced,
            format!(
                "{} steps; a runbook has at most {MAX_STEPS} (no budget can run more)",
                raw.steps.len()
            ),
        );
        return None;
    }
    let env = template_env();
    let mut ids = BTreeSet::new();
    let mut steps = Vec::new();
    for (i, step) in raw.steps.iter().enumerate() {
        if let Some(s) = validate_step(
            i, step, file, tools, observe, approve, &env, &mut ids, diags,
        ) {
            steps.push(s);
        }
    }
    Some(steps)
}

/// `agent:`: a goal, steps within the budget, and a planner that can
/// work toward it.
fn agent(
    raw: &raw::Runbook,
    budget: &Budget,
    model_configured: bool,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Agent> {
    raw.agent.as_ref().map(|a| {
        let max_steps = a.value.max_steps.as_ref().map_or(budget.max_steps, |m| {
            if m.value == 0 || m.value > budget.max_steps {
                diags.at(
                    file,
                    m.referenced,
                    format!(
                        "agent.max_steps must be between 1 and budget.max_steps ({})",
                        budget.max_steps
                    ),
                );
            }
            m.value
        });
        if a.value.goal.value.trim().is_empty() {
            diags.at(
                file,
                a.value.goal.referenced,
                "agent.goal is empty: say what to find out, what a good fix is and what must not be done",
            );
        }
        let by_agent = raw.planner.as_ref().is_some_and(|p| p.value == "mcp");
        if raw.steps.is_empty() && !model_configured && !by_agent {
            diags.at(
                file,
                a.referenced,
                "this runbook has only an agent goal, and runwarden.yaml configures no model: add a `model:` section or give the runbook steps",
            );
        }
        if a.value.after_steps && raw.steps.is_empty() {
            diags.at(
                file,
                a.referenced,
                "agent.after_steps is set but the runbook has no steps",
            );
        }
        if a.value.after_steps && raw.planner.as_ref().is_none_or(|p| p.value != "model") {
            diags.at(
                file,
                a.referenced,
                "agent.after_steps hands the steps' findings to a model: say `planner: model` to have this runbook planned by one",
            );
        }
        Agent {
            goal: a.value.goal.value.clone(),
            model: a.value.model.as_ref().map(|m| m.value.clone()),
            max_steps,
            after_steps: a.value.after_steps,
        }
    })
}

/// `planner:` (steps, model or mcp), and whether the runbook has what
/// that planner needs.
fn planner(
    raw: &raw::Runbook,
    agent: Option<&Agent>,
    model_configured: bool,
    file: &Path,
    diags: &mut Diagnostics,
) -> PlannedBy {
    match raw.planner.as_ref() {
        None if raw.steps.is_empty() => PlannedBy::Model,
        None => PlannedBy::Steps,
        Some(p) => match p.value.as_str() {
            "steps" if raw.steps.is_empty() => {
                diags.at(
                    file,
                    p.referenced,
                    "planner: steps, but the runbook has no steps",
                );
                PlannedBy::Steps
            }
            "steps" => PlannedBy::Steps,
            "model" if agent.is_none() => {
                diags.at(
                    file,
                    p.referenced,
                    "planner: model, but the runbook has no `agent:` goal for a model to work toward",
                );
                PlannedBy::Model
            }
            "model" if !model_configured => {
                diags.at(
                    file,
                    p.referenced,
                    "planner: model, and runwarden.yaml configures no model: add a `model:` section, or say `planner: steps`",
                );
                PlannedBy::Model
            }
            "model" => PlannedBy::Model,
            "mcp" => {
                if let Some(step) = raw.steps.first() {
                    diags.at(
                        file,
                        step.referenced,
                        "planner: mcp, but the runbook has steps: an agent plans every call of its runs, so they would never run (remove them, or plan the runbook by its steps)",
                    );
                }
                for (what, at) in [
                    ("schedule", raw.schedule.as_ref().map(|s| s.referenced)),
                    (
                        "on_alert",
                        raw.on_alert.as_ref().map(|a| a.host_label.referenced),
                    ),
                ] {
                    if let Some(at) = at {
                        diags.at(
                            file,
                            at,
                            format!("planner: mcp, but the runbook has `{what}:`: only an agent's MCP session starts its runs (remove `{what}:`)"),
                        );
                    }
                }
                PlannedBy::Mcp
            }
            other => {
                diags.at(
                    file,
                    p.referenced,
                    format!(
                        "planner: {:?} is not `steps`, `model` or `mcp`",
                        other.escape_debug().to_string()
                    ),
                );
                PlannedBy::Steps
            }
        },
    }
}

fn tool_list(
    list: &[Spanned<String>],
    tier: Tier,
    tools: &crate::tools::Tools,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeSet<ToolId> {
    let mut set = BTreeSet::new();
    for t in list {
        match tools.get(&t.value) {
            // Its file's own error says why: no second one here.
            None if tools.is_broken(&t.value) => {}
            None => diags.at(file, t.referenced, unknown_tool(&t.value, tools)),
            Some(id) if id.tier() != tier => {
                let msg = match tier {
                    Tier::Observe => format!(
                        "\"{}\" is a tier-2 tool (it changes the host); list it under tools.approve, not tools.observe",
                        t.value
                    ),
                    Tier::Change => format!(
                        "\"{}\" is a tier-1 tool (it only observes); list it under tools.observe, not tools.approve",
                        t.value
                    ),
                };
                diags.at(file, t.referenced, msg);
            }
            Some(id) => {
                if !set.insert(id) {
                    diags.at(
                        file,
                        t.referenced,
                        format!("\"{}\" is listed twice", t.value),
                    );
                }
            }
        }
    }
    set
}

fn unknown_tool(name: &str, tools: &crate::tools::Tools) -> String {
    format!(
        "unknown tool \"{}\"{}; `runwarden tools` lists them (tier-3 operations are never tools: write them as `suggest:` steps)",
        name.escape_debug(),
        did_you_mean(
            name,
            tools
                .all()
                .map(|t| t.name().to_string())
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str)
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A schedule that cannot run says why, naming the field: too many or
    /// too few fields, a number out of its field's range, a date that never
    /// comes; what crontab accepts passes.
    #[test]
    fn schedules_that_would_never_run_are_refused_naming_why() {
        for (text, why) in [
            ("0 3 31 2 *", "can never fire"),
            ("0 0 3 * * * 2030", "has 7 fields, not 5"),
            ("61 0 3 * * 1", "has second 61, out of range 0-59"),
            ("61 * * *", "has 4 fields, not 5"),
            ("61 * * * *", "has minute 61, out of range 0-59"),
            ("0 24 * * *", "has hour 24, out of range 0-23"),
            ("0 0 0 * *", "has day of month 0, out of range 1-31"),
            ("0 0 * 13 *", "has month 13, out of range 1-12"),
            ("0 0 * * 1-9", "has day of week 9, out of range 0-7"),
        ] {
            let e = check_schedule(text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
        for ok in [
            "*/5 * * * *",
            "0 3 * * 1",
            "0 0 29 2 *",
            "30 2 1-7 * 0",
            "@daily",
            "* * * * * *",
            "*/2 * * * * *",
            "0 9-17/2 * * mon-fri",
        ] {
            assert_eq!(check_schedule(ok), Ok(()), "{ok}");
        }
    }
}

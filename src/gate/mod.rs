//! The gate: the single choke point every call passes through.
//!
//! The whole order reads top to bottom in [`Gate::check`]:
//!
//! 1. kill switch (wins over everything, fails closed);
//! 2. scope: the tool is one the runbook lists;
//! 3. scope: the host is one the runbook names;
//! 4. arguments: the tool's own type, then the host's allowlists;
//! 5. approval: tier 1 runs freely; tier 2 needs the runbook's standing
//!    approval (L3), waits for a person (L2: [`Decision::Hold`], then
//!    [`Gate::approved`]) or becomes a proposal that never runs (L1); an
//!    L3 runbook whose fixes kept failing is demoted to L2 here
//!    ([`demotion`]);
//! 6. budget: steps, wall time, mutations.
//!
//! A refusal is a value ([`Denial`]) with a named [`DenyReason`] that doubles
//! as a metric label, never a panic. An allowed call is a [`Permit`], which
//! only this module can make; the executor will not run anything without one.
//! The audit intent line and the dispatch come after the gate, in
//! the run loop; between them the kill switch gets a last look
//! ([`Gate::last_look`]), since a stalled disk can hold an intent line for
//! seconds.
//!
//! One file: the gate's check reads top to bottom in
//! one function, and splitting it would hide the order that is the point;
//! about a third of the file is its unit tests.

pub(crate) mod approvals;
pub(crate) mod budget;
pub(crate) mod demotion;
pub(crate) mod fleet;
pub(crate) mod killswitch;

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::config::{Autonomy, Host, Runbook};
use crate::tools::{self, Action, PathMode, Tier, ToolId};
pub(crate) use budget::Budget;
pub(crate) use demotion::Demotions;
pub(crate) use killswitch::KillSwitch;

/// A call as a planner proposes it: untrusted until the gate has seen it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProposedCall {
    /// The step number in the run (1-based).
    pub(crate) step: u32,
    /// The tool's name, as proposed (perhaps no tool at all).
    pub(crate) tool: String,
    /// Arguments as given; a tier-2 call carries its `reason` here.
    pub(crate) args: Value,
}

/// Who allowed a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovedBy {
    /// Tier 1: observing needs no approval.
    Auto,
    /// Tier 2: the runbook's standing approval (L3).
    Standing(String),
    /// Tier 2: a named person approved this very call (L2).
    Person(String),
}

impl fmt::Display for ApprovedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApprovedBy::Auto => write!(f, "auto"),
            ApprovedBy::Standing(rb) => write!(f, "standing:{rb}"),
            ApprovedBy::Person(name) => write!(f, "person:{name}"),
        }
    }
}

impl std::str::FromStr for ApprovedBy {
    type Err = crate::text::NotOfForm;

    /// The form [`fmt::Display`] writes (`auto`, `standing:RUNBOOK`, `person:NAME`).
    fn from_str(s: &str) -> Result<ApprovedBy, Self::Err> {
        match s.split_once(':') {
            None if s == "auto" => Ok(ApprovedBy::Auto),
            Some(("standing", rb)) if !rb.is_empty() => Ok(ApprovedBy::Standing(rb.into())),
            Some(("person", name)) if !name.is_empty() => Ok(ApprovedBy::Person(name.into())),
            _ => Err(crate::text::NotOfForm::new(
                s,
                "not `auto`, `standing:RUNBOOK` or `person:NAME`",
            )),
        }
    }
}

/// Permission to run one resolved call. Only [`Gate::check`] makes these.
#[derive(Debug)]
pub struct Permit {
    step: u32,
    action: Action,
    approved_by: ApprovedBy,
}

impl Permit {
    /// The step it was checked for.
    pub(crate) fn step(&self) -> u32 {
        self.step
    }
    /// The call it allows, resolved against the host.
    pub(crate) fn action(&self) -> &Action {
        &self.action
    }
    /// Who allowed it.
    pub(crate) fn approved_by(&self) -> &ApprovedBy {
        &self.approved_by
    }
}

/// An L1 tier-2 call: recorded for a person, never run (it has no [`Permit`]).
#[derive(Debug)]
pub(crate) struct Proposal {
    step: u32,
    action: Action,
}

impl Proposal {
    /// The step it was checked for.
    pub(crate) fn step(&self) -> u32 {
        self.step
    }
    /// The call, resolved against the host.
    pub(crate) fn action(&self) -> &Action {
        &self.action
    }
}

/// An L2 tier-2 call waiting for a person: only the gate's full check makes
/// one, and only [`Gate::approved`] turns it into a [`Permit`].
#[derive(Debug)]
pub struct Hold {
    step: u32,
    action: Action,
    /// Why an L3 runbook's call waits for a person: its demotion.
    demoted: Option<String>,
}

impl Hold {
    /// The step it was checked for.
    pub(crate) fn step(&self) -> u32 {
        self.step
    }
    /// The call, resolved against the host.
    pub(crate) fn action(&self) -> &Action {
        &self.action
    }
    /// `Some(why)` when the runbook is L3 but was demoted (see [`demotion`]).
    pub(crate) fn demoted(&self) -> Option<&str> {
        self.demoted.as_deref()
    }
}

/// Why the gate refused a call. The names are metric labels and audit values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DenyReason {
    /// The kill switch is engaged (everything, or this runbook).
    KillSwitch,
    /// No tool by that name.
    UnknownTool,
    /// The runbook does not list the tool.
    ToolOutOfScope,
    /// The runbook does not name the host.
    HostOutOfScope,
    /// The arguments are not the tool's, or the host's allowlists refuse them.
    InvalidArguments,
    /// A tier-2 call without approval (L3 without the tool under `tools.approve`).
    NotApproved,
    /// The run's `max_steps` is spent.
    StepLimit,
    /// The run's `max_duration` is spent.
    TimeBudget,
    /// The run's `max_mutations` is spent.
    MutationBudget,
    /// A `fleet_budget` (every run's tier-2 calls in a window) is spent.
    FleetBudget,
    /// L2: a person denied the call.
    ApprovalDenied,
    /// L2: nobody decided in time.
    ApprovalExpired,
    /// L2: no approver can be asked (the command line, or no approvers file).
    NoApprover,
    /// L2: the daemon shut down while the call waited for a person.
    Shutdown,
    /// The run no longer holds its (runbook, host) lease in the shared
    /// state, or cannot prove it does: another replica may have taken over.
    LeaseLost,
    /// L2: the alert that started the run resolved while the call waited
    /// for a person; the request was withdrawn (`on_resolved`).
    AlertResolved,
    /// L2: the agent that asked for the call (over MCP) went away while it
    /// waited for a person; the request was withdrawn.
    AgentGone,
}

impl DenyReason {
    /// The reason as metric labels and audit lines spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DenyReason::KillSwitch => "kill_switch",
            DenyReason::UnknownTool => "unknown_tool",
            DenyReason::ToolOutOfScope => "tool_out_of_scope",
            DenyReason::HostOutOfScope => "host_out_of_scope",
            DenyReason::InvalidArguments => "invalid_arguments",
            DenyReason::NotApproved => "not_approved",
            DenyReason::StepLimit => "step_limit",
            DenyReason::TimeBudget => "time_budget",
            DenyReason::MutationBudget => "mutation_budget",
            DenyReason::FleetBudget => "fleet_budget",
            DenyReason::ApprovalDenied => "approval_denied",
            DenyReason::ApprovalExpired => "approval_expired",
            DenyReason::NoApprover => "no_approver",
            DenyReason::Shutdown => "shutdown",
            DenyReason::LeaseLost => "lease_lost",
            DenyReason::AlertResolved => "alert_resolved",
            DenyReason::AgentGone => "agent_gone",
        }
    }

    /// Whether the run must stop here: nothing after this call could be allowed.
    pub(crate) fn stops_run(self) -> bool {
        matches!(
            self,
            DenyReason::KillSwitch
                | DenyReason::StepLimit
                | DenyReason::TimeBudget
                | DenyReason::Shutdown
                | DenyReason::LeaseLost
                | DenyReason::AlertResolved
                | DenyReason::AgentGone
        )
    }
}

impl From<DenyReason> for crate::verdict::Verdict {
    /// What a refusal makes of the run, when it is the worst thing that happened.
    fn from(reason: DenyReason) -> crate::verdict::Verdict {
        use crate::verdict::Verdict;
        match reason {
            // Stopped from outside the run: the switch, the daemon's stop,
            // the agent that planned it leaving.
            DenyReason::KillSwitch | DenyReason::Shutdown | DenyReason::AgentGone => {
                Verdict::Halted
            }
            DenyReason::StepLimit => Verdict::StepLimit,
            // Another replica may hold the run now: this one ends as a
            // replica that stopped does.
            DenyReason::LeaseLost => Verdict::Interrupted,
            DenyReason::TimeBudget | DenyReason::MutationBudget | DenyReason::FleetBudget => {
                Verdict::BudgetExhausted
            }
            _ => Verdict::Denied,
        }
    }
}

/// A refused call, and why.
#[derive(Debug, Clone)]
pub(crate) struct Denial {
    /// The step it was proposed as.
    pub(crate) step: u32,
    /// The kind of refusal.
    pub(crate) reason: DenyReason,
    /// What exactly was wrong, for a person.
    pub(crate) detail: String,
    /// The tool, when the name was a known one.
    pub(crate) tool: Option<ToolId>,
    /// A path in the arguments was refused: the planner is told only that.
    pub(crate) path_refused: bool,
}

impl Denial {
    /// A refusal of step `step` for `reason`.
    pub(crate) fn new(step: u32, reason: DenyReason, detail: impl Into<String>) -> Denial {
        Denial {
            step,
            reason,
            detail: detail.into(),
            tool: None,
            path_refused: false,
        }
    }

    /// The same refusal, of a call of `tool`.
    pub(crate) fn of(mut self, tool: ToolId) -> Denial {
        self.tool = Some(tool);
        self
    }

    /// What the planner is told. A refused path says only that it is outside
    /// the allowlists: whether it exists, or where a link on the host points,
    /// stays in the audit line for a person.
    pub(crate) fn for_planner(&self) -> String {
        if self.path_refused {
            return format!(
                "denied: {}: a path in the arguments is outside the host's allowlists",
                self.reason.as_str()
            );
        }
        self.to_string()
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "denied: {}: {}", self.reason.as_str(), self.detail)
    }
}

/// What the gate made of a proposed call.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Run it: the permit goes to the intent line.
    Allow(Permit),
    /// L1: record it for a person; never run.
    Propose(Proposal),
    /// L2: ask a person, then call [`Gate::approved`].
    Hold(Hold),
    /// Refuse it.
    Deny(Denial),
}

/// The gate of one run: its runbook, its host, the switch and the budget it counts.
pub(crate) struct Gate {
    runbook: Arc<Runbook>,
    host: Arc<Host>,
    killswitch: KillSwitch,
    demotions: Demotions,
    budget: Budget,
    path_mode: PathMode,
    /// The fleet budgets, and whether permitted calls count (not in a dry run).
    fleet: Option<(fleet::BudgetLedger, bool)>,
}

impl Gate {
    /// The gate for one run of `runbook` on `host`, with a fresh budget.
    pub(crate) fn new(
        runbook: Arc<Runbook>,
        host: Arc<Host>,
        killswitch: KillSwitch,
        demotions: Demotions,
    ) -> Gate {
        let path_mode = match host.connection {
            crate::config::Connection::Local => PathMode::Resolve,
            crate::config::Connection::Ssh(_) | crate::config::Connection::Agent(_) => {
                PathMode::Lexical
            }
        };
        Gate {
            budget: Budget::new(runbook.budget),
            runbook,
            host,
            killswitch,
            demotions,
            path_mode,
            fleet: None,
        }
    }

    /// Count tier-2 calls against `fleet` too; `count: false` (a dry run,
    /// which changes nothing) only checks it.
    pub(crate) fn with_fleet(mut self, fleet: Option<fleet::BudgetLedger>, count: bool) -> Gate {
        self.fleet = fleet.map(|f| (f, count));
        self
    }

    /// The fleet budgets' say on one more tier-2 call; `count` takes it.
    fn fleet_take(&self, count: bool) -> Result<(), (DenyReason, String)> {
        match &self.fleet {
            Some((fleet, counts)) => fleet
                .take(count && *counts)
                .map_err(|why| (DenyReason::FleetBudget, why.to_string())),
            None => Ok(()),
        }
    }

    /// What the run has spent so far.
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// From here on, at most `more` further calls (never past `budget.max_steps`):
    /// the model planner's `agent.max_steps`.
    pub(crate) fn limit_steps(&mut self, more: u32) {
        self.budget.limit_steps(more);
    }

    /// A model's turn that proposed nothing it could run (cut at
    /// `max_tokens`) spends a step; `Err` once that is past `max_steps`.
    pub(crate) fn count_turn_without_call(&mut self) -> Result<(), StepsSpent> {
        self.budget.count_step();
        self.budget
            .step_check()
            .map_err(|_| StepsSpent(self.budget.max_steps()))
    }

    /// Decide one call. Every call counts toward `max_steps`, whatever the decision.
    ///
    /// One function, in the order the checks are made (kill switch, scope,
    /// arguments, approval, budget): the order is the safety property, and
    /// it reads top to bottom here rather than across helpers.
    pub(crate) fn check(&mut self, call: &ProposedCall) -> Decision {
        self.budget.count_step();
        let deny = |reason, detail: String, tool| {
            Decision::Deny(Denial {
                tool,
                ..Denial::new(call.step, reason, detail)
            })
        };

        // The tool the name means: the one the runbook lists (a declared
        // tool at the version the runbook was loaded with), else a built-in.
        let known = self
            .runbook
            .tool(&call.tool)
            .cloned()
            .or_else(|| tools::Builtin::from_name(&call.tool).map(ToolId::from));
        // 1. The kill switch wins over every other rule.
        if let Err(engaged) = self.killswitch.check(&self.runbook.name) {
            return deny(DenyReason::KillSwitch, engaged.to_string(), known);
        }
        // A call past `max_steps` is refused whatever it asks for: a planner
        // stuck on a tool it does not have must not keep the run going.
        if let Err((reason, detail)) = self.budget.step_check() {
            return deny(reason, detail, known);
        }
        // 2. The tool must exist and be one the runbook lists.
        let Some(tool) = known else {
            return deny(
                DenyReason::UnknownTool,
                format!(
                    "there is no tool {} in runbook \"{}\"'s scope",
                    tools::args::shown(&call.tool),
                    self.runbook.name
                ),
                None,
            );
        };
        if !self.runbook.allows_tool(&tool) {
            return deny(
                DenyReason::ToolOutOfScope,
                format!(
                    "runbook \"{}\" does not allow {}",
                    self.runbook.name,
                    tool.name()
                ),
                Some(tool),
            );
        }
        // 3. The host must be one the runbook names.
        if !self.runbook.allows_host(&self.host.name) {
            return deny(
                DenyReason::HostOutOfScope,
                format!(
                    "runbook \"{}\" may not touch host \"{}\"",
                    self.runbook.name, self.host.name
                ),
                Some(tool),
            );
        }
        // 4. Arguments: their shape, the tool's type, then the host's allowlists.
        if let Err(e) = argument_shape(&call.args) {
            return deny(DenyReason::InvalidArguments, e, Some(tool));
        }
        let action = match tools::resolve(&tool, &call.args, &self.host, self.path_mode) {
            Ok(a) => a,
            Err(e) => {
                let path_refused = matches!(e, tools::args::ArgError::Path(_));
                return Decision::Deny(Denial {
                    path_refused,
                    ..Denial::new(call.step, DenyReason::InvalidArguments, e.to_string()).of(tool)
                });
            }
        };
        // 5. Approval. An L3 runbook whose fixes kept failing has lost its
        // standing approval: its tier-2 calls wait for a person (L2).
        let demoted = match (tool.tier(), self.runbook.autonomy) {
            (Tier::Change, Autonomy::L3) => self.demotions.check(&self.runbook.name),
            _ => None,
        };
        let autonomy = match demoted {
            Some(_) => Autonomy::L2,
            None => self.runbook.autonomy,
        };
        let approval = match tool.tier() {
            Tier::Observe => Some(ApprovedBy::Auto),
            Tier::Change => match autonomy {
                Autonomy::L3 if self.runbook.approve.contains(&tool) => {
                    Some(ApprovedBy::Standing(self.runbook.name.clone()))
                }
                Autonomy::L3 => {
                    return deny(
                        DenyReason::NotApproved,
                        format!(
                            "runbook \"{}\" holds no standing approval for {}",
                            self.runbook.name,
                            tool.name()
                        ),
                        Some(tool),
                    );
                }
                Autonomy::L1 | Autonomy::L2 => None,
            },
        };
        // 6. Budget.
        let mutating = approval.is_some() && tool.tier() == Tier::Change;
        if let Err((reason, detail)) = self.budget.check(mutating) {
            return deny(reason, detail, Some(tool));
        }
        if approval.is_none() && autonomy == Autonomy::L2 {
            // Ask only for a call that could run if approved.
            if let Err((reason, detail)) = self
                .budget
                .check(true)
                .and_then(|()| self.fleet_take(false))
            {
                return deny(reason, detail, Some(tool));
            }
            return Decision::Hold(Hold {
                step: call.step,
                action,
                demoted,
            });
        }
        match approval {
            None => Decision::Propose(Proposal {
                step: call.step,
                action,
            }),
            Some(approved_by) => {
                if mutating {
                    // Last: a call the fleet counts is one that is permitted.
                    if let Err((reason, detail)) = self.fleet_take(true) {
                        return deny(reason, detail, Some(tool));
                    }
                    self.budget.count_mutation();
                }
                Decision::Allow(Permit {
                    step: call.step,
                    action,
                    approved_by,
                })
            }
        }
    }
}

impl Gate {
    /// Before every request to the model planner: the kill switch, the time
    /// budget and the ceiling on requests apply to thinking as they do to
    /// calls, so a model that never proposes a runnable call still ends.
    pub(crate) fn admit_model_request(&mut self) -> Result<(), Denial> {
        let step = self.budget.steps();
        let deny = |reason, detail: String| Denial::new(step, reason, detail);
        if let Err(engaged) = self.killswitch.check(&self.runbook.name) {
            return Err(deny(DenyReason::KillSwitch, engaged.to_string()));
        }
        if let Err((reason, detail)) = self.budget.time_check() {
            return Err(deny(reason, detail));
        }
        self.budget
            .count_model_request()
            .map_err(|(reason, detail)| deny(reason, detail))
    }

    /// The last look before a permitted call goes out, once its intent
    /// line is on disk (which a stalled disk can make take seconds): the
    /// kill switch wins over everything, a permit granted before it was
    /// engaged included.
    pub(crate) fn last_look(&self, step: u32, tool: &ToolId) -> Result<(), Denial> {
        self.killswitch
            .check(&self.runbook.name)
            .map_err(|engaged| {
                Denial::new(step, DenyReason::KillSwitch, engaged.to_string()).of(tool.clone())
            })
    }

    /// A person approved a held call: the kill switch and the budget are
    /// checked again (time has passed), then the call is permitted.
    pub(crate) fn approved(&mut self, hold: Hold, by: String) -> Result<Permit, Denial> {
        let tool = hold.action.tool();
        if let Err(engaged) = self.killswitch.check(&self.runbook.name) {
            let detail = engaged.to_string();
            return Err(Denial::new(hold.step, DenyReason::KillSwitch, detail).of(tool));
        }
        if let Err((reason, detail)) = self.budget.check(true).and_then(|()| self.fleet_take(true))
        {
            return Err(Denial::new(hold.step, reason, detail).of(tool));
        }
        self.budget.count_mutation();
        Ok(Permit {
            step: hold.step,
            action: hold.action,
            approved_by: ApprovedBy::Person(by),
        })
    }
}

/// Tool arguments are one flat object of short values; anything nested or
/// large is refused before it is parsed further or written to the log.
pub(crate) const MAX_ARGUMENT_DEPTH: usize = 8;
/// The largest arguments a call may carry, serialized (16 KiB).
pub(crate) const MAX_ARGUMENT_BYTES: usize = 16 << 10;

/// A run's `max_steps` is spent: the run ends `step_limit`.
#[derive(Debug, thiserror::Error)]
#[error("max_steps {0} reached")]
pub(crate) struct StepsSpent(pub(crate) u32);

/// Arguments too deep or too large to be looked at further. The error is
/// an `invalid_arguments` denial's detail, read by a planner and a person;
/// no caller branches on it, so it stays text.
fn argument_shape(args: &Value) -> Result<(), String> {
    // Named fields only: an array would be read by position against the schema.
    if !(args.is_object() || args.is_null()) {
        return Err(format!(
            "arguments must be a JSON object of named fields, not {}",
            match args {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                _ => "a boolean",
            }
        ));
    }
    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    // Depth first: it is bounded by the parser, and serializing is then safe.
    let d = depth(args);
    if d > MAX_ARGUMENT_DEPTH {
        return Err(format!(
            "arguments nest {d} levels deep; a tool takes one object of plain values"
        ));
    }
    let len = args.to_string().len();
    if len > MAX_ARGUMENT_BYTES {
        return Err(format!(
            "arguments are {len} bytes; at most {MAX_ARGUMENT_BYTES} are accepted"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A gate over a real config directory: runbook `rb` (autonomy given) on host `web`.
    fn gate(autonomy: &str, host: &str, engaged: bool) -> (tempfile::TempDir, Gate) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("hosts")).unwrap();
        std::fs::create_dir_all(p.join("runbooks")).unwrap();
        std::fs::create_dir_all(p.join("kill-switch")).unwrap();
        for h in ["web", "db"] {
            std::fs::write(
                p.join(format!("hosts/{h}.yaml")),
                format!("name: {h}\nconnection: local\npaths: [/tmp]\nunits: [nginx.service]\nlogrotate_configs: [/etc/logrotate.conf]\n"),
            )
            .unwrap();
        }
        std::fs::write(
            p.join("runbooks/rb.yaml"),
            format!("name: rb\ndescription: t\nhosts: [web]\nautonomy: {autonomy}\ntools:\n  observe: [service_status, disk_usage]\n  approve: [restart_service]\nbudget: {{ max_steps: 5, max_mutations: 2 }}\nsteps: [{{ call: disk_usage, args: {{ path: /tmp }} }}]\n"),
        )
        .unwrap();
        if engaged {
            std::fs::write(p.join("kill-switch/ENGAGED"), "").unwrap();
        }
        let cfg = crate::config::Config::load(p).unwrap();
        let g = Gate::new(
            cfg.runbooks["rb"].clone(),
            cfg.hosts[host].clone(),
            KillSwitch::new(p.join("kill-switch")),
            Demotions::new(&p.join("state")),
        );
        (dir, g)
    }

    /// A demoted L3 runbook: its tier-2 calls wait for a person and say
    /// why; its tier-1 calls still run; a promotion gives the standing
    /// approval back to the very next call of the same run.
    #[test]
    fn a_demoted_runbook_holds_its_changes_for_a_person_and_still_looks() {
        let restart = || {
            call(
                "restart_service",
                json!({"unit": "nginx.service", "reason": "stuck"}),
            )
        };
        let look = || call("service_status", json!({"unit": "nginx.service"}));
        let (d, mut g) = gate("L3", "web", false);
        let state = d.path().join("state");
        assert!(matches!(g.check(&restart()), Decision::Allow(_)));
        let rule = crate::config::DemoteAfter {
            failures: 1,
            per: std::time::Duration::from_secs(3600),
        };
        let failed = demotion::Failure {
            run_id: "r1".into(),
            runbook: "rb".into(),
            host: "web".into(),
            at: jiff::Timestamp::now().to_string(),
            verdict: "failed".into(),
            detail: "not active".into(),
            calls: Vec::new(),
        };
        demotion::record_local(&state, rule, failed, "m")
            .unwrap()
            .expect("demoted");
        match g.check(&restart()) {
            Decision::Hold(h) => assert!(h.demoted().unwrap().contains("demoted to L2")),
            other => panic!("a demoted runbook's change waits for a person: {other:?}"),
        }
        assert!(matches!(g.check(&look()), Decision::Allow(_)));
        demotion::promote_local(&Demotions::new(&state), "rb", true).unwrap();
        assert!(matches!(g.check(&restart()), Decision::Allow(_)));
    }

    fn call(tool: &str, args: Value) -> ProposedCall {
        ProposedCall {
            step: 1,
            tool: tool.into(),
            args,
        }
    }

    fn denied(d: Decision) -> DenyReason {
        match d {
            Decision::Deny(d) => d.reason,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    /// The fleet budget counts permitted tier-2 calls only: not tier 1, not
    /// a dry run, not a call put to a person until a person approves it;
    /// and a call is put to a person only while the budget could take it.
    #[test]
    fn the_fleet_budget_counts_what_is_permitted_and_nothing_else() {
        let one = crate::config::runbook::FleetBudget {
            max_mutations: 1,
            per: std::time::Duration::from_secs(3600),
        };
        let restart = || {
            call(
                "restart_service",
                json!({"unit": "nginx.service", "reason": "stuck"}),
            )
        };
        let look = || call("service_status", json!({"unit": "nginx.service"}));
        let (d, g) = gate("L3", "web", false);
        let state = d.path().join("state");
        let fleet = || fleet::BudgetLedger::new(&state, Some(one), "rb", None);
        // A dry run sees the budget and takes nothing from it.
        let mut dry = g.with_fleet(fleet(), false);
        assert!(matches!(dry.check(&restart()), Decision::Allow(_)));
        assert!(matches!(dry.check(&restart()), Decision::Allow(_)));
        // For real: tier 1 is not counted, the first change is, the second is refused.
        let (_d2, g) = gate("L3", "web", false);
        let mut real = g.with_fleet(fleet(), true);
        assert!(matches!(real.check(&look()), Decision::Allow(_)));
        assert!(matches!(real.check(&restart()), Decision::Allow(_)));
        assert_eq!(denied(real.check(&restart())), DenyReason::FleetBudget);
        assert!(matches!(real.check(&look()), Decision::Allow(_)));

        // L2: a spent budget is never put to a person; an open one is
        // counted when the person approves, and holds for the next approval.
        let (d, g) = gate("L2", "web", false);
        let state = d.path().join("state");
        let fleet = || fleet::BudgetLedger::new(&state, Some(one), "rb", None);
        let mut l2 = g.with_fleet(fleet(), true);
        let Decision::Hold(first) = l2.check(&restart()) else {
            panic!("an open budget is put to a person")
        };
        let Decision::Hold(second) = l2.check(&restart()) else {
            panic!("asking takes nothing from the budget")
        };
        assert!(l2.approved(first, "alice".into()).is_ok());
        assert_eq!(
            l2.approved(second, "bob".into()).unwrap_err().reason,
            DenyReason::FleetBudget
        );
        assert_eq!(denied(l2.check(&restart())), DenyReason::FleetBudget);
    }

    #[test]
    fn kill_switch_wins_over_every_other_rule() {
        let (_d, mut g) = gate("L3", "db", true);
        assert_eq!(
            denied(g.check(&call("run_shell", json!({"cmd": "reboot"})))),
            DenyReason::KillSwitch
        );
    }

    #[test]
    fn scope_then_arguments_then_approval() {
        let (_d, mut g) = gate("L3", "web", false);
        assert_eq!(
            denied(g.check(&call("run_shell", json!({})))),
            DenyReason::UnknownTool
        );
        assert_eq!(
            denied(g.check(&call("read_journal", json!({"unit": "nginx.service"})))),
            DenyReason::ToolOutOfScope
        );
        let (_d, mut other) = gate("L3", "db", false);
        assert_eq!(
            denied(other.check(&call("service_status", json!({"unit": "nginx.service"})))),
            DenyReason::HostOutOfScope
        );
        match g.check(&call(
            "restart_service",
            json!({"unit": "nginx.service", "reason": "stuck"}),
        )) {
            Decision::Allow(p) => assert_eq!(p.approved_by().to_string(), "standing:rb"),
            other => panic!("{other:?}"),
        }
        match g.check(&call("service_status", json!({"unit": "nginx.service"}))) {
            Decision::Allow(p) => assert_eq!(p.approved_by().to_string(), "auto"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hostile_arguments_are_refused() {
        // More attempts than max_steps: each gets a fresh run's budget, since
        // a call past the step limit is refused as `step_limit` first.
        let fresh = || gate("L3", "web", false);
        let long = "a".repeat(10_000);
        for args in [
            json!({"unit": "nginx.service; rm -rf /"}),
            json!({"unit": "../../etc/shadow"}),
            json!({"unit": "nginx.service\u{0}"}),
            json!({"unit": long}),
            json!({"unit": "nginx\u{2024}service"}),
            json!({"unit": "ngіnx.service"}),
            json!({"unit": "nginx.service", "force": true}),
            json!({"unit": 7}),
            json!({"unit": "sshd.service"}),
            json!("nginx.service"),
        ] {
            let (_d, mut g) = fresh();
            assert_eq!(
                denied(g.check(&call("service_status", args.clone()))),
                DenyReason::InvalidArguments,
                "{args}"
            );
        }
        for path in [
            "../../etc/shadow",
            "/etc/shadow",
            "/tmp/../etc",
            "/tmp\u{0}/x",
        ] {
            let (_d, mut g) = fresh();
            let d = g.check(&call("disk_usage", json!({ "path": path })));
            assert_eq!(denied(d), DenyReason::InvalidArguments, "{path}");
        }
        let (_d, mut g) = fresh();
        let no_reason = call("restart_service", json!({"unit": "nginx.service"}));
        assert_eq!(
            denied(g.check(&no_reason)),
            DenyReason::InvalidArguments,
            "a tier-2 call needs a reason (arguments are checked before the budget)"
        );
    }

    #[test]
    fn a_call_past_max_steps_is_a_step_limit_whatever_it_asks_for() {
        let (_d, mut g) = gate("L3", "web", false);
        for _ in 0..5 {
            g.check(&call("nope", json!({})));
        }
        for (tool, args) in [
            ("nope", json!({})),
            ("read_journal", json!({})),
            ("disk_usage", json!({"path": "/etc"})),
            ("service_status", json!({"unit": "nginx.service"})),
        ] {
            assert_eq!(
                denied(g.check(&call(tool, args))),
                DenyReason::StepLimit,
                "{tool}"
            );
        }
    }

    #[test]
    fn model_requests_are_counted_and_capped() {
        let (_d, mut g) = gate("L3", "web", false);
        g.limit_steps(2);
        for _ in 0..3 {
            assert!(g.admit_model_request().is_ok());
        }
        let d = g.admit_model_request().unwrap_err();
        assert_eq!(d.reason, DenyReason::StepLimit);
        let (_d, mut engaged) = gate("L3", "web", true);
        assert_eq!(
            engaged.admit_model_request().unwrap_err().reason,
            DenyReason::KillSwitch
        );
    }

    #[test]
    fn arguments_nested_or_large_are_refused_before_the_tool_sees_them() {
        let deep = (0..20).fold(json!("/tmp"), |v, _| json!([v]));
        for args in [
            json!({ "path": deep }),
            json!({ "path": "/tmp", "x": "a".repeat(20_000) }),
        ] {
            let (_d, mut g) = gate("L3", "web", false);
            assert_eq!(
                denied(g.check(&call("disk_usage", args))),
                DenyReason::InvalidArguments
            );
        }
    }

    #[test]
    fn arguments_must_be_named() {
        for args in [json!(["/tmp"]), json!("/tmp"), json!(7), json!(true)] {
            let (_d, mut g) = gate("L3", "web", false);
            assert_eq!(
                denied(g.check(&call("disk_usage", args.clone()))),
                DenyReason::InvalidArguments,
                "{args}"
            );
        }
    }

    #[test]
    fn l1_proposes_and_never_permits() {
        let (_d, mut g) = gate("L1", "web", false);
        assert!(matches!(
            g.check(&call(
                "restart_service",
                json!({"unit": "nginx.service", "reason": "x"})
            )),
            Decision::Propose(_)
        ));
        assert_eq!(g.budget().mutations(), 0);
    }

    #[test]
    fn budgets_count_every_call_and_every_mutation() {
        let (_d, mut g) = gate("L3", "web", false);
        let restart = call(
            "restart_service",
            json!({"unit": "nginx.service", "reason": "x"}),
        );
        assert!(matches!(g.check(&restart), Decision::Allow(_)));
        assert!(matches!(g.check(&restart), Decision::Allow(_)));
        assert_eq!(denied(g.check(&restart)), DenyReason::MutationBudget);
        assert_eq!(
            denied(g.check(&call("nope", json!({})))),
            DenyReason::UnknownTool
        );
        assert!(matches!(
            g.check(&call("service_status", json!({"unit": "nginx.service"}))),
            Decision::Allow(_)
        ));
        assert_eq!(g.budget().steps(), 5);
        assert_eq!(
            denied(g.check(&call("service_status", json!({"unit": "nginx.service"})))),
            DenyReason::StepLimit
        );
    }
}

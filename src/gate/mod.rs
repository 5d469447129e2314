//! The gate: the single choke point every call passes through.
//!
//! The whole order reads top to bottom in [`Gate::check`]:
//!
//! 1. kill switch (wins over everything, fails closed);
//! 2. scope: the tool is one the runbook lists;
//! 3. scope: the host is one the runbook names;
//! 4. arguments: the tool's own type, then the host's allowlists;
//! 5. approval: tier 1 runs freely; tier 2 needs the runbook's standing
//!    approval (L3) or becomes a proposal that never runs (L1);
//! 6. budget: steps, wall time, mutations.
//!
//! A refusal is a value ([`Denial`]) with a named [`DenyReason`] that doubles
//! as a metric label, never a panic. An allowed call is a [`Permit`], which
//! only this module can make; the executor will not run anything without one.
//! The audit intent line and the dispatch come after the gate, in
//! [`crate::run`].

pub mod budget;
pub mod killswitch;

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::config::{Autonomy, Host, Runbook};
use crate::tools::{self, Action, PathMode, Tier, ToolId};
pub use budget::Budget;
pub use killswitch::KillSwitch;

/// A call as a planner proposes it: untrusted until the gate has seen it.
#[derive(Debug, Clone, Serialize)]
pub struct ProposedCall {
    pub step: u32,
    pub tool: String,
    /// Arguments as given; a tier-2 call carries its `reason` here.
    pub args: Value,
}

/// Who allowed a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovedBy {
    /// Tier 1: observing needs no approval.
    Auto,
    /// Tier 2: the runbook's standing approval (L3).
    Standing(String),
}

impl fmt::Display for ApprovedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApprovedBy::Auto => write!(f, "auto"),
            ApprovedBy::Standing(rb) => write!(f, "standing:{rb}"),
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
    pub fn step(&self) -> u32 {
        self.step
    }
    pub fn action(&self) -> &Action {
        &self.action
    }
    pub fn approved_by(&self) -> &ApprovedBy {
        &self.approved_by
    }
}

/// An L1 tier-2 call: recorded for a person, never run (it has no [`Permit`]).
#[derive(Debug)]
pub struct Proposal {
    pub step: u32,
    pub action: Action,
}

/// Why the gate refused a call. The names are metric labels and audit values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyReason {
    KillSwitch,
    UnknownTool,
    ToolOutOfScope,
    HostOutOfScope,
    InvalidArguments,
    NotApproved,
    StepLimit,
    TimeBudget,
    MutationBudget,
}

impl DenyReason {
    pub fn as_str(self) -> &'static str {
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
        }
    }

    /// Whether the run must stop here: nothing after this call could be allowed.
    pub fn stops_run(self) -> bool {
        matches!(
            self,
            DenyReason::KillSwitch | DenyReason::StepLimit | DenyReason::TimeBudget
        )
    }
}

#[derive(Debug, Clone)]
pub struct Denial {
    pub step: u32,
    pub reason: DenyReason,
    pub detail: String,
    /// The tool, when the name was a known one.
    pub tool: Option<ToolId>,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "denied: {}: {}", self.reason.as_str(), self.detail)
    }
}

#[derive(Debug)]
pub enum Decision {
    Allow(Permit),
    Propose(Proposal),
    Deny(Denial),
}

/// The gate of one run: its runbook, its host, the switch and the budget it counts.
pub struct Gate {
    runbook: Arc<Runbook>,
    host: Arc<Host>,
    killswitch: KillSwitch,
    budget: Budget,
    path_mode: PathMode,
}

impl Gate {
    pub fn new(runbook: Arc<Runbook>, host: Arc<Host>, killswitch: KillSwitch) -> Gate {
        let path_mode = match host.connection {
            crate::config::Connection::Local => PathMode::Resolve,
            crate::config::Connection::Ssh(_) => PathMode::Lexical,
        };
        Gate {
            budget: Budget::new(runbook.budget),
            runbook,
            host,
            killswitch,
            path_mode,
        }
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Decide one call. Every call counts toward `max_steps`, whatever the decision.
    pub fn check(&mut self, call: &ProposedCall) -> Decision {
        self.budget.count_step();
        let deny = |reason, detail: String, tool| {
            Decision::Deny(Denial {
                step: call.step,
                reason,
                detail,
                tool,
            })
        };

        // 1. The kill switch wins over every other rule.
        if let Err(engaged) = self.killswitch.check(&self.runbook.name) {
            return deny(
                DenyReason::KillSwitch,
                engaged.to_string(),
                ToolId::from_name(&call.tool),
            );
        }
        // 2. The tool must exist and be one the runbook lists.
        let Some(tool) = ToolId::from_name(&call.tool) else {
            return deny(
                DenyReason::UnknownTool,
                format!("there is no tool {}", tools::args::shown(&call.tool)),
                None,
            );
        };
        if !self.runbook.allows_tool(tool) {
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
        // 4. Arguments: the tool's type, then the host's allowlists.
        let action = match tools::resolve(tool, &call.args, &self.host, self.path_mode) {
            Ok(a) => a,
            Err(e) => return deny(DenyReason::InvalidArguments, e, Some(tool)),
        };
        // 5. Approval.
        let approval = match tool.tier() {
            Tier::Observe => Some(ApprovedBy::Auto),
            Tier::Change => match self.runbook.autonomy {
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
                Autonomy::L1 => None,
            },
        };
        // 6. Budget.
        let mutating = approval.is_some() && tool.tier() == Tier::Change;
        if let Err((reason, detail)) = self.budget.check(mutating) {
            return deny(reason, detail, Some(tool));
        }
        match approval {
            None => Decision::Propose(Proposal {
                step: call.step,
                action,
            }),
            Some(approved_by) => {
                if mutating {
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

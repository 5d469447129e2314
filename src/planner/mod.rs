//! Planners pick the next call from what the run has seen. A planner only
//! proposes: everything it returns goes through the gate.
//!
//! A run has the runbook's deterministic [`StepsPlanner`], the
//! [`ModelPlanner`] (an LLM working toward the runbook's `agent.goal`), or
//! both in that order (`agent.after_steps`), the model then starting from
//! the steps' findings.

pub(crate) mod agent;
pub(crate) mod model;
pub mod openai;
pub(crate) mod steps;

use serde_json::{Map, Value};

pub(crate) use crate::audit::ModelTurn;
use crate::gate::{Denial, ProposedCall};
pub(crate) use agent::{AgentPlanner, Asked};
pub(crate) use model::ModelPlanner;
pub(crate) use steps::StepsPlanner;

/// What the planner wants next.
#[derive(Debug)]
pub(crate) enum Next {
    /// Propose this call to the gate.
    Call {
        /// The step's id.
        id: String,
        /// The call, untrusted until the gate has seen it.
        call: ProposedCall,
    },
    /// A step whose `when` was false.
    Skip {
        /// The step's id.
        id: String,
        /// The condition, as written.
        when: String,
    },
    /// A tier-3 command for a person, never executed.
    Suggest {
        /// The step's id.
        id: String,
        /// The command, rendered.
        text: String,
        /// A model wrote it (`SUGGEST:`), not the runbook: its own words,
        /// unverified.
        by_model: bool,
    },
    /// The model answered one request (its calls, if any, come next).
    Turn(Box<ModelTurn>),
    /// Nothing more to do: the run ends here.
    Finish,
    /// The planner cannot go on (a `when` or template failed, the model
    /// endpoint failed or answered garbage): the run is broken.
    Fail(String),
    /// The gate refused the next model request (kill switch, time budget,
    /// the ceiling on requests): the run stops.
    Stopped(Denial),
}

/// Asked before every model request; an error stops the run instead.
pub(crate) type Admit<'a> = &'a mut (dyn FnMut() -> Result<(), Denial> + Send);

/// What the run has seen so far, as planners and templates read it.
#[derive(Debug, Default)]
pub(crate) struct Transcript {
    /// `steps.ID` -> the result view of that step.
    pub(crate) steps: Map<String, Value>,
}

/// Which planner a run asks for.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PlannerChoice {
    /// What the runbook's `planner:` says: the model when it says `model`
    /// (after the steps with `agent.after_steps`), else the steps.
    #[default]
    Auto,
    /// Only the runbook's steps, whatever its agent goal.
    Steps,
    /// The model (an error without an agent goal or a configured model).
    Model,
}

/// The steps, then the model, whichever the run has; or an outside agent.
pub(crate) struct Planner {
    steps: Option<StepsPlanner>,
    model: Option<ModelPlanner>,
    agent: Option<AgentPlanner>,
    name: &'static str,
}

impl Planner {
    /// A planner of the runbook's steps, a model, or the steps first and then the model.
    pub(crate) fn new(steps: Option<StepsPlanner>, model: Option<ModelPlanner>) -> Planner {
        let name = match (&steps, &model) {
            (Some(_), Some(_)) => "steps+model",
            (None, Some(_)) => "model",
            _ => "steps",
        };
        Planner {
            steps,
            model,
            agent: None,
            name,
        }
    }

    /// A planner that is an outside agent's calls (over MCP).
    pub(crate) fn agent(agent: AgentPlanner) -> Planner {
        Planner {
            steps: None,
            model: None,
            agent: Some(agent),
            name: "mcp",
        }
    }

    /// `steps` or `model`: which one is planning now.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// The model's name, when a model plans part of the run.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_ref().map(ModelPlanner::model)
    }

    /// Once, when the model starts: how many calls it may propose from here.
    pub(crate) fn take_step_limit(&mut self) -> Option<u32> {
        if self.steps.is_some() {
            return None;
        }
        self.model.as_mut()?.take_step_limit()
    }

    /// The next thing to do; `admit` is asked before every model request.
    pub(crate) async fn next(&mut self, transcript: &Transcript, admit: Admit<'_>) -> Next {
        crate::fault::point(crate::fault::Stage::Planner);
        if let Some(agent) = &mut self.agent {
            return agent.next(transcript).await;
        }
        if let Some(steps) = &mut self.steps {
            match steps.next(transcript) {
                Next::Finish => self.steps = None,
                other => return other,
            }
        }
        match &mut self.model {
            Some(model) => model.next(transcript, admit).await,
            None => Next::Finish,
        }
    }
}

//! Planners pick the next call from what the run has seen. A planner only
//! proposes: everything it returns goes through the gate.

pub mod steps;

use serde_json::{Map, Value};

use crate::gate::ProposedCall;
pub use steps::StepsPlanner;

/// What the planner wants next.
#[derive(Debug)]
pub enum Next {
    Call {
        id: String,
        call: ProposedCall,
    },
    /// A step whose `when` was false.
    Skip {
        id: String,
        when: String,
    },
    /// A tier-3 command for a person, never executed.
    Suggest {
        id: String,
        text: String,
    },
    Finish,
    /// The planner cannot go on (a `when` or template failed): the run is broken.
    Fail(String),
}

/// What the run has seen so far, as planners and templates read it.
#[derive(Debug, Default)]
pub struct Transcript {
    /// `steps.ID` -> the result view of that step.
    pub steps: Map<String, Value>,
}

pub enum Planner {
    Steps(StepsPlanner),
}

impl Planner {
    pub fn name(&self) -> &'static str {
        match self {
            Planner::Steps(_) => "steps",
        }
    }

    pub async fn next(&mut self, transcript: &Transcript) -> Next {
        match self {
            Planner::Steps(p) => p.next(transcript),
        }
    }
}

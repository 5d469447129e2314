//! An agent outside runwarden plans the calls: each one it asks for (over
//! MCP) is proposed to the run loop as the next step, and goes through the
//! same gate, audit lines and budgets as a model's or a step's. The agent
//! is told what became of each call from the run's own transcript: the
//! result, or the gate's reason for refusing it.
//!
//! The run ends when the agent goes away (its channel closes), or when the
//! run loop stops it (the kill switch, a budget, `max_duration`).

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::{Next, Transcript};
use crate::gate::ProposedCall;

/// One call an agent asks for, and where its outcome goes.
pub(crate) struct Asked {
    /// The step's id in the run (the agent's side chooses it, so it can
    /// find the step in the report if the run ends on it).
    pub(crate) id: String,
    /// The tool's name, as asked (perhaps no tool at all).
    pub(crate) tool: String,
    /// Its arguments, as asked.
    pub(crate) args: Value,
    /// The step's view in the transcript once the run loop has taken it.
    pub(crate) answer: oneshot::Sender<Value>,
}

/// The planner of a run an outside agent drives.
pub(crate) struct AgentPlanner {
    calls: mpsc::Receiver<Asked>,
    pending: Option<(String, oneshot::Sender<Value>)>,
}

impl std::fmt::Debug for AgentPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentPlanner").finish_non_exhaustive()
    }
}

impl AgentPlanner {
    /// A planner fed by `calls`.
    pub(crate) fn new(calls: mpsc::Receiver<Asked>) -> AgentPlanner {
        AgentPlanner {
            calls,
            pending: None,
        }
    }

    /// Tell the agent what became of its last call, then wait for its next
    /// one; the run ends when the agent has gone.
    pub(crate) async fn next(&mut self, transcript: &Transcript) -> Next {
        if let Some((id, answer)) = self.pending.take() {
            let view = transcript.steps.get(&id).cloned().unwrap_or(Value::Null);
            let _ = answer.send(view);
        }
        match self.calls.recv().await {
            None => Next::Finish,
            Some(asked) => {
                self.pending = Some((asked.id.clone(), asked.answer));
                Next::Call {
                    id: asked.id,
                    call: ProposedCall {
                        step: 0,
                        tool: asked.tool,
                        args: asked.args,
                    },
                }
            }
        }
    }
}

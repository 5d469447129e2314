//! The deterministic planner: a runbook's `steps`, in order, with `when`
//! conditions over earlier results and minijinja templates in values.
//!
//! A rendered value is only a proposal like any other: it goes through the
//! same argument checks at the gate as a literal one.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Next, Transcript};
use crate::config::Runbook;
use crate::config::runbook::{StepAction, template_env};
use crate::gate::ProposedCall;

/// The deterministic planner: the runbook's `steps`, in order, their
/// templates rendered against what earlier steps found.
pub(crate) struct StepsPlanner {
    runbook: Arc<Runbook>,
    /// Extra template context: `run` (id, runbook, host) and, for alert triggers, `alert`.
    context: Value,
    index: usize,
    env: minijinja::Environment<'static>,
}

impl StepsPlanner {
    /// A planner of `runbook`'s steps, with `context` (`run`, `alert`) for its templates.
    pub(crate) fn new(runbook: Arc<Runbook>, context: Value) -> StepsPlanner {
        StepsPlanner {
            runbook,
            context,
            index: 0,
            env: template_env(),
        }
    }

    fn scope(&self, transcript: &Transcript) -> Value {
        let mut scope = self.context.clone();
        scope["steps"] = Value::Object(transcript.steps.clone());
        scope
    }

    /// The next step, rendered; `Finish` after the last.
    pub(crate) fn next(&mut self, transcript: &Transcript) -> Next {
        let Some(step) = self.runbook.steps.get(self.index).cloned() else {
            return Next::Finish;
        };
        self.index += 1;
        let n = self.index as u32;
        // Literal steps need no template scope; building it clones the whole transcript.
        let needs_scope = step.when.is_some()
            || match &step.action {
                StepAction::Suggest(_) => true,
                StepAction::Call { args, reason, .. } => {
                    reason.is_some()
                        || args
                            .values()
                            .any(|v| v.as_str().is_some_and(crate::config::runbook::is_template))
                }
            };
        let scope = if needs_scope {
            self.scope(transcript)
        } else {
            Value::Null
        };
        let label = format!("step {n} ({}, line {})", step.id, step.line);
        if let Some(when) = &step.when {
            let verdict = self
                .env
                .compile_expression(when)
                .and_then(|e| e.eval(&scope))
                .map(|v| v.is_true());
            match verdict {
                Ok(true) => {}
                Ok(false) => {
                    return Next::Skip {
                        id: step.id,
                        when: when.clone(),
                    };
                }
                Err(e) => {
                    // A `when` over a step that failed, was skipped or was
                    // refused is false: that step is what the run reports.
                    if let Some(id) = unsuccessful_reference(when, transcript) {
                        return Next::Skip {
                            id: step.id,
                            when: format!("{when} (false: step {id} did not succeed)"),
                        };
                    }
                    return Next::Fail(format!("{label}: `when: {when}` failed: {}", detail(&e)));
                }
            }
        }
        match &step.action {
            StepAction::Suggest(text) => match self.env.render_str(text, &scope) {
                Ok(text) => Next::Suggest {
                    id: step.id,
                    text,
                    by_model: false,
                },
                Err(e) => Next::Fail(format!(
                    "{label}: suggestion template failed: {}",
                    detail(&e)
                )),
            },
            StepAction::Call { tool, args, reason } => {
                let mut rendered = serde_json::Map::new();
                for (k, v) in args {
                    let v = match v {
                        Value::String(s) if crate::config::runbook::is_template(s) => {
                            match self.env.render_str(s, &scope) {
                                Ok(s) => Value::String(s),
                                Err(e) => {
                                    return Next::Fail(format!(
                                        "{label}: argument `{k}` failed to render: {}",
                                        detail(&e)
                                    ));
                                }
                            }
                        }
                        other => other.clone(),
                    };
                    rendered.insert(k.clone(), v);
                }
                if let Some(reason) = reason {
                    match self.env.render_str(reason, &scope) {
                        Ok(r) => {
                            rendered.insert("reason".into(), json!(r));
                        }
                        Err(e) => {
                            return Next::Fail(format!(
                                "{label}: reason failed to render: {}",
                                detail(&e)
                            ));
                        }
                    }
                }
                Next::Call {
                    id: step.id,
                    call: ProposedCall {
                        step: n,
                        tool: tool.name().to_string(),
                        args: Value::Object(rendered),
                    },
                }
            }
        }
    }
}

/// The first step `when` names (`steps.ID`) whose result is not a success.
fn unsuccessful_reference(when: &str, transcript: &Transcript) -> Option<String> {
    references(when).find(|id| {
        transcript
            .steps
            .get(id)
            .is_some_and(|seen| seen["ok"] != true)
    })
}

/// The steps a template or expression names (`steps.ID`), in order.
pub(crate) fn references(text: &str) -> impl Iterator<Item = String> + '_ {
    text.match_indices("steps.").filter_map(|(i, _)| {
        let id: String = text[i + "steps.".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        (!id.is_empty()).then_some(id)
    })
}

fn detail(e: &minijinja::Error) -> String {
    crate::error_chain(e)
}

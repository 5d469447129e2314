//! One step of a runbook checked: its id, its call (a tool in the runbook's
//! lists, arguments the tool's schema takes), its `when` and its templates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_saphyr::Spanned;

use super::{Step, StepAction, is_template, unknown_tool};
use crate::config::diag::Diagnostics;
use crate::config::raw;
use crate::tools::{Tier, ToolId};

#[allow(clippy::too_many_arguments)]
pub(super) fn validate_step(
    index: usize,
    step: &Spanned<raw::Step>,
    file: &Path,
    tools: &crate::tools::Tools,
    observe: &BTreeSet<ToolId>,
    approve: &BTreeSet<ToolId>,
    env: &minijinja::Environment<'static>,
    ids: &mut BTreeSet<String>,
    diags: &mut Diagnostics,
) -> Option<Step> {
    let before = diags.len();
    let s = &step.value;
    let loc = step.referenced;
    let id = step_id(s, index, ids, file, diags);
    check_when(s, env, file, diags);
    let action = match (&s.call, &s.suggest) {
        (Some(_), Some(_)) | (None, None) => {
            diags.at(
                file,
                loc,
                "a step has exactly one of `call` (a tool) or `suggest` (a command for a person)",
            );
            return None;
        }
        (None, Some(text)) => {
            if !s.args.is_empty() || s.reason.is_some() {
                diags.at(file, text.referenced, "a `suggest` step takes no `args` or `reason`: the suggestion is text for a person");
            }
            if let Err(e) = env.template_from_str(&text.value) {
                diags.at(
                    file,
                    text.referenced,
                    format!("suggestion template does not parse: {e}"),
                );
            }
            StepAction::Suggest(text.value.clone())
        }
        (Some(call), None) => call_action(s, call, tools, observe, approve, env, file, diags)?,
    };
    if diags.len() != before {
        return None;
    }
    Some(Step {
        id,
        when: s.when.as_ref().map(|w| w.value.clone()),
        line: loc.line() as u32,
        column: loc.column() as u32,
        action,
    })
}

/// A step's `id` (`stepN` when unset): an identifier templates can name,
/// used once.
fn step_id(
    s: &raw::Step,
    index: usize,
    ids: &mut BTreeSet<String>,
    file: &Path,
    diags: &mut Diagnostics,
) -> String {
    match &s.id {
        Some(id) => {
            let ok = id
                .value
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && id.value.len() <= 64
                && id
                    .value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !ok {
                diags.at(file, id.referenced, format!("step id \"{}\" must be a lower-case identifier (a-z, 0-9, _) so templates can say steps.{}", id.value.escape_debug(), id.value.escape_debug()));
            }
            if !ids.insert(id.value.clone()) {
                diags.at(
                    file,
                    id.referenced,
                    format!("step id \"{}\" is used twice", id.value),
                );
            }
            id.value.clone()
        }
        None => format!("step{}", index + 1),
    }
}

/// A step's `when`: an expression that parses (not a template).
fn check_when(
    s: &raw::Step,
    env: &minijinja::Environment<'static>,
    file: &Path,
    diags: &mut Diagnostics,
) {
    if let Some(w) = &s.when {
        if is_template(&w.value) || w.value.contains("}}") || w.value.contains("%}") {
            // Delimiters inside an expression also crash minijinja's lexer (found by fuzzing).
            diags.at(
                file,
                w.referenced,
                "`when` is an expression, not a template: write it without {{ }} or {% %}",
            );
        } else if let Err(e) = env.compile_expression(&w.value) {
            diags.at(file, w.referenced, format!("`when` does not parse: {e}"));
        }
    }
}

/// A `call` step: a known tool in the runbook's lists, a `reason` exactly
/// when it is tier 2, templates that parse, literal arguments the tool's
/// own type takes (templated ones are checked after rendering).
#[allow(clippy::too_many_arguments)]
fn call_action(
    s: &raw::Step,
    call: &Spanned<String>,
    tools: &crate::tools::Tools,
    observe: &BTreeSet<ToolId>,
    approve: &BTreeSet<ToolId>,
    env: &minijinja::Environment<'static>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<StepAction> {
    let Some(tool) = tools.get(&call.value) else {
        if !tools.is_broken(&call.value) {
            diags.at(file, call.referenced, unknown_tool(&call.value, tools));
        }
        return None;
    };
    if !observe.contains(&tool) && !approve.contains(&tool) {
        let list = if tool.tier() == Tier::Observe {
            "tools.observe"
        } else {
            "tools.approve"
        };
        diags.at(
            file,
            call.referenced,
            format!(
                "step calls \"{}\" but the runbook does not list it under {list}",
                tool.name()
            ),
        );
    }
    match (tool.tier(), &s.reason) {
        (Tier::Change, None) => diags.at(file, call.referenced, format!("\"{}\" is a tier-2 tool: the step needs a `reason` (a template such as \"/ at {{{{ steps.root.use_pct }}}}%\")", tool.name())),
        (Tier::Observe, Some(r)) => diags.at(file, r.referenced, format!("`reason` is only for tier-2 calls; \"{}\" only observes", tool.name())),
        _ => {}
    }
    if let Some(r) = &s.reason
        && let Err(e) = env.template_from_str(&r.value)
    {
        diags.at(
            file,
            r.referenced,
            format!("reason template does not parse: {e}"),
        );
    }
    let mut args = BTreeMap::new();
    let mut templated = false;
    for (k, v) in &s.args {
        if k == "reason" {
            diags.at(
                file,
                v.referenced,
                "write the reason as the step's `reason`, not as an argument",
            );
            continue;
        }
        if let serde_json::Value::String(text) = &v.value
            && is_template(text)
        {
            templated = true;
            if let Err(e) = env.template_from_str(text) {
                diags.at(
                    file,
                    v.referenced,
                    format!("argument `{k}`: template does not parse: {e}"),
                );
            }
        }
        args.insert(k.clone(), v.value.clone());
    }
    // Literal arguments are checked against the tool's own argument type now;
    // templated ones are checked the same way at run time, after rendering.
    let mut probe: serde_json::Map<String, serde_json::Value> =
        args.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if tool.tier() == Tier::Change {
        probe.insert("reason".into(), "check".into());
    }
    if let Err(e) = crate::tools::check_shape(&tool, &serde_json::Value::Object(probe), templated) {
        let at = s
            .args
            .values()
            .next()
            .map(|v| v.referenced)
            .unwrap_or(call.referenced);
        diags.at(file, at, format!("arguments of \"{}\": {e}", tool.name()));
    }
    Some(StepAction::Call {
        tool,
        args,
        reason: s.reason.as_ref().map(|r| r.value.clone()),
    })
}

//! What a model-planned run may say it did: its final answer held to the
//! run's own record.
//!
//! A model's final answer is its account, not evidence. The verdict turns
//! on the record alone: a model-planned run that made no successful call,
//! or whose answer claims a change no tier-2 call of the run made and
//! verified, is `inconclusive` (it ranks between `failed` and `denied`),
//! never `ok`. Each checkable sentence of the answer is marked (see
//! [`crate::claims`]) for whoever reads the report, the transcript or the
//! API.

use crate::claims::{Claim, Evidence};
use crate::config::Runbook;
use crate::report::StepReport;
use crate::verdict::Verdict;

/// The claims of an answer and what they do to the verdict.
pub(super) struct Account {
    /// Each checkable sentence, marked.
    pub(super) claims: Vec<Claim>,
    /// `Inconclusive` and why, when the record does not bear the run out.
    pub(super) verdict: Option<(Verdict, String)>,
}

/// Hold `answer` to what `reports` record: every call's arguments and
/// result, and the tier-2 calls that succeeded and verified.
pub(super) fn judge(runbook: &Runbook, reports: &[StepReport], answer: Option<&str>) -> Account {
    let mut ev = Evidence::default();
    for d in runbook
        .approve
        .iter()
        .filter_map(crate::tools::ToolId::declared)
    {
        if let Some(verb) = &d.verb {
            ev.verb(verb, &d.name);
        }
    }
    for r in reports {
        let Some(result) = &r.result else { continue };
        ev.saw(&r.args);
        ev.saw(&result.data);
        if result.succeeded() {
            ev.calls_ok += 1;
            if r.tier == Some(2) && result.verified == Some(true) {
                ev.changed(r.tool.as_deref().unwrap_or_default(), &r.args);
            }
        }
    }
    // An account this build cannot read is not believed: inconclusive,
    // with the pattern that failed named (see `crate::compiled`).
    let claims = match answer.map(|a| crate::claims::mark(a, &ev)) {
        None => Vec::new(),
        Some(Ok(claims)) => claims,
        Some(Err(e)) => {
            return Account {
                claims: Vec::new(),
                verdict: Some((
                    Verdict::Inconclusive,
                    format!(
                        "the model's answer could not be checked against the run's record: {e}"
                    ),
                )),
            };
        }
    };
    let invented: Vec<&Claim> = claims.iter().filter(|c| c.change && !c.supported).collect();
    let verdict = if ev.calls_ok == 0 {
        Some((
            Verdict::Inconclusive,
            "the model made no successful call: nothing in its answer is evidence".to_string(),
        ))
    } else {
        invented.first().map(|c| {
            (
                Verdict::Inconclusive,
                format!(
                    "the model's answer claims a change the run's record lacks ({}: {})",
                    c.text, c.why
                ),
            )
        })
    };
    Account { claims, verdict }
}

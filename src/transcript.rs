//! `runwarden transcript RUN_ID`: a run, from its audit lines, as a person
//! reads it — each model turn (what it was sent, exactly as it saw it, and
//! what it answered), each call with the gate's decision, each result.
//!
//! It reads only the audit log, so it shows what was recorded, not what a
//! report claimed; a run whose process died shows its calls without results.

use std::fmt::Write;

use serde_json::Value;

use crate::audit::{Entry, Phase};

/// Render one run's lines (in log order).
pub(crate) fn render(lines: &[Entry]) -> String {
    let mut out = String::new();
    // The header comes from the run's start line (a daemon run is `queued` first).
    let Some(first) = lines
        .iter()
        .find(|e| e.phase == Some(Phase::Start))
        .or(lines.first())
    else {
        return out;
    };
    header(&mut out, first);
    for e in lines {
        line(&mut out, e);
    }
    if !lines.iter().any(|e| e.phase == Some(Phase::Verdict)) {
        out.push_str("\n── no verdict: the run is still going, or its process stopped\n");
    }
    out
}

/// Which run, which planner (and model, and prompt), since when.
fn header(out: &mut String, first: &Entry) {
    let _ = writeln!(
        out,
        "run {}: runbook {} on host {}",
        first.run_id, first.runbook, first.host
    );
    let _ = write!(out, "planner {}", first.planner);
    if let Some(m) = &first.model {
        let _ = write!(out, " (model {m}");
        if let Some(p) = &first.prompt {
            let _ = write!(out, ", prompt {p}");
        }
        out.push(')');
    }
    let _ = writeln!(out, ", started {}", first.ts);
}

/// One audit line as a person reads it.
fn line(out: &mut String, e: &Entry) {
    let step = e.step.map(|s| s.to_string()).unwrap_or_default();
    let call = || {
        format!(
            "{} {}",
            e.tool.as_deref().unwrap_or("?"),
            e.args
                .as_ref()
                .map(crate::report::args_text)
                .unwrap_or_default()
        )
    };
    let detail = e.detail.as_ref().unwrap_or(&Value::Null);
    match e.phase {
        Some(Phase::Queued) => {
            let _ = writeln!(out, "accepted {} (queued)", e.ts);
        }
        Some(Phase::Start) => {
            let dry = if detail["dry_run"].as_bool() == Some(true) {
                " (dry run: tier-2 calls shown, not made)"
            } else {
                ""
            };
            let _ = writeln!(out, "trigger {}{dry}", detail["trigger"]);
            if !detail["alert"].is_null() {
                let _ = write!(out, "{}", alert_text(&detail["alert"]));
            }
        }
        Some(Phase::Model) => model_turn(out, detail),
        Some(Phase::Intent) => {
            let _ = writeln!(out, "\n── call {step}: {}", call());
            let _ = writeln!(
                out,
                "   gate: allowed ({})",
                e.approved_by.as_deref().unwrap_or("?")
            );
            if let Some(d) = &e.declaration {
                let _ = writeln!(out, "   declared tool, file sha256:{d}");
            }
            if let Some(r) = &e.reason {
                let _ = writeln!(out, "   reason: {r}");
            }
        }
        Some(Phase::Result) => {
            let _ = write!(
                out,
                "   result: {} in {} ms",
                e.outcome.as_deref().unwrap_or("?"),
                e.duration_ms.unwrap_or(0)
            );
            if let Some(v) = detail.get("verified").and_then(Value::as_bool) {
                let _ = write!(out, ", verified: {v}");
            }
            out.push('\n');
            if let Some(err) = detail.get("error").and_then(Value::as_str) {
                let _ = writeln!(out, "   error: {err}");
            }
            let tool = e.tool.as_deref().unwrap_or("");
            match crate::tools::output_block(tool, &detail["data"], "   ") {
                Some(block) => out.push_str(&block),
                None => {
                    if let Some(said) = crate::tools::said(tool, &detail["data"]) {
                        let _ = writeln!(out, "   said: {said}");
                    }
                }
            }
        }
        Some(Phase::Denied) => {
            let _ = writeln!(out, "\n── call {step}: {}", call());
            let _ = writeln!(
                out,
                "   gate: DENIED {}: {}",
                detail["reason"].as_str().unwrap_or("?"),
                detail["message"].as_str().unwrap_or("")
            );
        }
        Some(Phase::Proposal) => {
            let _ = writeln!(out, "\n── call {step}: {}", call());
            let _ = writeln!(out, "   gate: proposal for a person (L1), not run");
        }
        Some(Phase::Pending) => {
            let _ = writeln!(out, "\n── call {step}: {}", call());
            let _ = writeln!(
                out,
                "   gate: held for a person's approval ({})",
                detail["approval_id"].as_str().unwrap_or("?")
            );
        }
        Some(Phase::Evidence) => {
            let _ = writeln!(
                out,
                "\n── alert {}: {}",
                e.outcome.as_deref().unwrap_or("?"),
                detail["said"].as_str().unwrap_or("")
            );
            for a in detail["alerts"].as_array().into_iter().flatten() {
                for q in a["queries"].as_array().into_iter().flatten() {
                    let _ = writeln!(out, "   query: {}", q.as_str().unwrap_or("?"));
                }
            }
        }
        Some(Phase::Recurred) => {
            let _ = writeln!(
                out,
                "\n── the alert it cleared came back {} s later: run {}",
                detail["after_s"],
                detail["back_in"].as_str().unwrap_or("?")
            );
        }
        Some(Phase::DryRun) => {
            let _ = writeln!(out, "\n── call {step}: {}", call());
            let _ = writeln!(out, "   gate: allowed; dry run, not dispatched");
        }
        Some(Phase::Suggestion) => {
            let _ = writeln!(
                out,
                "\n── suggestion for a person (tier 3, never run): {}",
                detail["suggestion"].as_str().unwrap_or("")
            );
        }
        Some(Phase::Verdict) => {
            claims(out, detail);
            let _ = writeln!(
                out,
                "\n── verdict: {} — {}",
                e.outcome.as_deref().unwrap_or("?"),
                detail["detail"].as_str().unwrap_or("")
            );
        }
        Some(Phase::Silence) => {
            let id = detail["id"].as_str().unwrap_or("?");
            let _ = match e.outcome.as_deref() {
                Some("created") => writeln!(
                    out,
                    "\n── alerts silenced on {} (silence {id}, until {} at the latest)",
                    detail["alertmanager"].as_str().unwrap_or("?"),
                    detail["ends_at"].as_str().unwrap_or("?")
                ),
                Some("expired") => writeln!(out, "\n── silence {id} expired"),
                other => writeln!(
                    out,
                    "\n── silence {}: {}",
                    other.unwrap_or("?"),
                    detail["why"].as_str().unwrap_or("")
                ),
            };
        }
        Some(
            Phase::KillSwitch | Phase::Autonomy | Phase::Segment | Phase::Rollout | Phase::Access,
        )
        | None => {}
    }
}

/// The model's final answer held to the record: each checkable claim,
/// marked supported or `unsupported`, with why.
fn claims(out: &mut String, verdict: &Value) {
    let Some(claims) = verdict["claims"].as_array().filter(|c| !c.is_empty()) else {
        return;
    };
    let _ = writeln!(
        out,
        "\n── the model's account, held to the run's record (its words are not evidence):"
    );
    for c in claims {
        let mark = match (c["supported"] == true, c["suggestion"] == true) {
            (true, true) => "suggestion (the model's, unverified)",
            (false, true) => "unsupported suggestion",
            (true, false) => "supported",
            (false, false) => "unsupported",
        };
        let _ = writeln!(
            out,
            "   {mark}: {}\n      why: {}",
            crate::text::printable(c["text"].as_str().unwrap_or("")),
            crate::text::printable(c["why"].as_str().unwrap_or(""))
        );
    }
}

fn model_turn(out: &mut String, t: &Value) {
    let _ = write!(
        out,
        "\n══ model turn {} ({} ms",
        t["turn"],
        t["duration_ms"].as_u64().unwrap_or(0)
    );
    if t["attempts"].as_u64().unwrap_or(1) > 1 {
        let _ = write!(out, ", {} attempts", t["attempts"]);
    }
    if let (Some(p), Some(c)) = (t["prompt_tokens"].as_u64(), t["completion_tokens"].as_u64()) {
        let _ = write!(out, ", {p} prompt + {c} completion tokens");
    }
    out.push_str(")\n");
    for input in t["input"].as_array().into_iter().flatten() {
        out.push_str("   sent to the model:\n");
        quote(out, input.as_str().unwrap_or(""));
    }
    let content = t["content"].as_str().unwrap_or("");
    if !content.trim().is_empty() {
        let label = if t["final_answer"] == true {
            "final answer"
        } else {
            "the model said"
        };
        let _ = writeln!(out, "   {label}:");
        quote(out, content);
    }
    for c in t["tool_calls"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "   the model asks for: {} {}",
            c["tool"].as_str().unwrap_or("?"),
            c["arguments"]
        );
    }
    if let Some(n) = t["dropped"].as_u64().filter(|n| *n > 0) {
        let _ = writeln!(
            out,
            "   ({n} more calls in this reply were past the step limit and not proposed)"
        );
    }
}

fn quote(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "     | {line}");
    }
}

/// The alert that started a run, as its start line records it: labels,
/// then summary and description, one per line.
pub(crate) fn alert_text(alert: &Value) -> String {
    let mut out = String::new();
    let labels = |l: &Value| -> String {
        l.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    let _ = writeln!(out, "alert {}", labels(&alert["labels"]));
    for key in ["summary", "description"] {
        if let Some(t) = alert[key].as_str() {
            let _ = writeln!(out, "   {key}: {t}");
        }
    }
    for other in alert["alerts"].as_array().into_iter().flatten().skip(1) {
        let _ = writeln!(out, "   with alert {}", labels(other));
    }
    out
}

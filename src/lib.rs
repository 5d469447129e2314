//! runwarden: a runbook-scoped remediation runner.
//!
//! A runbook names the hosts it may touch, the narrow typed tools it may call
//! and the budget it may spend. A planner (the runbook's deterministic
//! `steps`) proposes one call at a time; every call passes the same gate
//! before anything runs, and the audit log holds the intent on disk before
//! the call is dispatched.
//!
//! # Layout
//!
//! ```text
//! cli ──[RunRequest]──> run ── planner.next(&transcript)  -> Call | Suggest | Turn | Finish
//!                            │ gate.check(&call)           -> Deny(reason) ─> audit.denied, back to planner
//!                            │                             -> Allow(Permit)
//!                            │ audit.intent(&permit)       -> AuditTicket  (synced before the call)
//!                            │ executor.dispatch(&permit, &ticket, deadline) -> ToolResult
//!                            └ audit.result(ticket, &result); transcript += result
//! ```
//!
//! - [`config`]: raw YAML -> validated [`config::Runbook`] / [`config::Host`], errors as `FILE:LINE:COLUMN`.
//! - [`tools`]: the static registry; tiers live here, in code, keyed by tool.
//! - [`gate`]: the single choke point (kill switch, scope, arguments, approval, budget).
//! - [`audit`]: append-only, hash-chained JSONL.
//! - [`executor`]: runs a permitted, audited call; [`executor::process`] spawns argv safely.
//! - [`planner`]: picks the next call (the runbook's steps, or a model toward
//!   its `agent.goal`); it can only propose.
//! - [`run`]: one runbook on one host, from the first call to the verdict.
//! - [`transcript`]: a run read back from the audit log, model turns included.
//!
//! Two types make the order of operations a compile-time fact: a
//! [`gate::Permit`] can only be made by the gate, an [`audit::AuditTicket`]
//! only by the audit log, and the executor demands both.

pub mod app;
pub mod audit;
pub mod cli;
pub mod config;
pub mod executor;
pub mod gate;
pub mod http;
pub mod install;
pub mod metrics;
pub mod planner;
pub mod run;
pub mod runlock;
pub mod scheduler;
pub mod secret;
pub mod text;
pub mod tools;
pub mod transcript;
pub mod trigger;

/// An error and all its sources on one line ("a: b: c"), for messages that
/// must say what went wrong underneath (a template, an HTTP client).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s = format!("{s}: {inner}");
        src = inner.source();
    }
    s
}

/// Compare two secrets without leaking, through timing, how much of a guess was right.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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
//! cli ──[RunRequest]──────────────────────────────┐
//! trigger (cron, webhook) ──[Candidate]──> scheduler ──[RunRequest]──> run
//!   (no runbook, out of scope, kill switch: alone;         │
//!    the rest: state's admission, Local or Fleet; queued line on disk)
//! run ── planner.next(&transcript, admit)  -> Call | Suggest | Turn | Finish
//!     │ gate.check(&call)           -> Deny(reason) ─> audit.denied, back to planner
//!     │                             -> Allow(Permit)
//!     │ lease.fence(..)             -> lease_lost | kill_switch | fleet_budget  (shared state only)
//!     │ audit.intent(permit)        -> AuditTicket  (synced before the call; the permit is spent)
//!     │ executor.dispatch(ticket)   -> (Dispatched, ToolResult)  (the ticket is spent)
//!     └ audit.result(dispatched, &result); transcript += result
//! ```
//!
//! The modules form layers: every import goes down the order docs/code.md's
//! Layers section draws (`tests/fast/layers.rs` holds the code to it). The leaves:
//! [`text`], [`files`], [`secret`], [`process`] (spawning argv,
//! crate-private), [`verdict`], [`origin`] (what started a run), [`host`]
//! (a host's allowlists), [`signing`] (signed tier-2 permits), [`runlock`],
//! [`logging`], [`compiled`] (the binary's patterns, compiled into errors
//! that name them, never panics), [`fault`] (where the test build can make
//! a run panic on cue).
//!
//! - [`config`]: raw YAML -> validated [`config::Runbook`] / [`host::Host`], errors as `FILE:LINE:COLUMN`.
//! - [`tools`]: each tool one file implementing the `Tool` trait, and the
//!   registry table that makes [`tools::ToolId`]; tiers live here, in code.
//! - [`rules`]: the decisions, written once as pure functions over what is
//!   known: whether a trigger starts a run, a tier-2 call fits the fleet
//!   budgets, a failed run demotes its runbook, a kill switch stops it. The
//!   gate on one machine and the fleet's state in PostgreSQL both call them.
//! - [`gate`]: the single choke point (kill switch, scope, arguments, approval, budget, fleet budget).
//! - [`audit`]: append-only, hash-chained JSONL.
//! - [`executor`]: runs a permitted, audited call: on this machine
//!   ([`process`] spawns argv safely), on a host over SSH
//!   ([`executor::ssh`]), or through this machine's own root agent on a unix
//!   socket ([`executor::socket`], the privileged path of an unprivileged
//!   daemon).
//! - [`agent`]: the host's side of the last two, the last line of defence:
//!   its own policy check, its own permit type, a permit spent once across
//!   every agent process, its own audit log.
//! - [`planner`]: picks the next call (the runbook's steps, or a model toward
//!   its `agent.goal`); it can only propose.
//! - [`run`]: one runbook on one host, from the first call to the verdict;
//!   [`report`] is what it reports. A run started by an alert is done when
//!   that alert's own series is gone ([`done_when`], asking [`prometheus`]).
//! - [`state`]: what one machine and a fleet must agree on, behind one
//!   trait ([`state::SharedState`]) chosen once at start-up: admission (one
//!   run per runbook and host, cooldown, dedupe and `max_runs`), a person's run's claim, a failure
//!   toward demotion, approval requests; this machine's
//!   ([`state::Local`]) and PostgreSQL's ([`state::Fleet`]).
//! - [`scheduler`]: what becomes of each trigger (kill switch, scope,
//!   admission, the concurrency limit), each outcome counted once.
//! - [`rollout`]: a fan-out a wave at a time, canaries first, halted by
//!   the first failure past `max_failures`, the pause's guard, or the kill
//!   switch, and taken up again after a restart.
//! - [`store`]: state several daemons share in PostgreSQL (admission's rows,
//!   locked and written in one transaction; leases and fencing, the fleet's
//!   kill switch and budget).
//! - [`cli`]: the command line; messages and exit codes live there only.
//! - [`transcript`]: a run read back from the audit log, model turns included.
//!
//! The order of operations is a compile-time fact (`tests/compile-fail/`):
//! a [`tools::Action`] is made only by resolving a proposed call against a
//! host; a [`gate::Permit`] only by the gate's full check (an L2 approval
//! turns the gate's own [`gate::Hold`] into one); [`audit::AuditLog::intent`]
//! consumes the permit and returns the [`audit::AuditTicket`] that
//! [`executor::Executor::dispatch`] consumes in turn, so no call runs without
//! its intent line, nor twice on one; the result line takes what dispatch
//! returns. Audit lines come only from the audit module's typed
//! constructors. The host agent mints a permit of its own type, which only
//! its own dispatch takes (`tests/compile-fail/host_permit_outside.rs`), and
//! takes the same intent-then-dispatch path ([`audit::Permitted`] is sealed). Spawning a process is
//! crate-private.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub(crate) mod access;
pub mod agent;
pub mod app;
pub mod audit;
pub(crate) mod chat;
pub(crate) mod claims;
pub mod cli;
pub mod compiled;
pub mod config;
pub(crate) mod done_when;
pub mod executor;
pub mod fault;
pub mod files;
pub mod gate;
pub mod hmac;
pub mod host;
pub mod http;
pub mod install;
pub mod logging;
pub(crate) mod mcp;
pub mod metrics;
pub mod origin;
pub mod plan;
pub mod planner;
pub mod process;
pub(crate) mod prometheus;
pub mod report;
pub(crate) mod rollout;
pub mod rules;
pub mod run;
pub mod runlock;
pub mod sandbox;
pub mod scheduler;
pub mod secret;
pub mod signing;
pub(crate) mod silence;
pub mod state;
pub mod store;
pub mod text;
pub mod tools;
pub mod transcript;
pub mod trigger;
pub mod verdict;

/// A PostgreSQL cluster of a test's own, for the unit tests of the fleet's
/// state (the root tier).
#[cfg(all(test, feature = "estate"))]
#[path = "../tests/support/pg.rs"]
mod test_pg;

/// This build's version and the commit it was built from
/// (`runwarden --version`; the package's version is the same).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("RUNWARDEN_COMMIT"),
    ")"
);

/// An error and all its sources on one line ("a: b: c"), for messages that
/// must say what went wrong underneath (a template, an HTTP client). A
/// source whose text its error already says is not said twice.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    chain_text(std::iter::successors(Some(e), |e| e.source()).map(|e| e.to_string()))
}

/// The messages of an error chain, outermost first, on one line.
pub(crate) fn chain_text(messages: impl Iterator<Item = String>) -> String {
    let mut s = String::new();
    for m in messages {
        if s.is_empty() {
            s = m;
        } else if !s.contains(&m) {
            s = format!("{s}: {m}");
        }
    }
    s
}

/// Compare two secrets without leaking, through timing, how much of a guess was right.
/// (A length that differs is told at once: every secret compared here is a
/// token or a digest whose length is no secret.)
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

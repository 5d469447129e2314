//! Integration tests: the real `runwarden` binary against real files,
//! real processes and real programs (logrotate, openssl, gunicorn, a tmpfs).

// A test stops loudly where its setup fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod adversarial;
mod approvals;
mod chat;
mod cli;
mod daemon;
mod declared;
mod done_when;
mod e2e;
mod edges;
mod fuzz;
mod gate;
mod ha;
mod hardening;
mod isolation;
mod mcp;
mod model;
mod observability;
mod observer;
mod panics;
mod rollout;
mod silence;
mod ssh;
mod systemd;
mod tools;
mod util;
mod verdicts;

//! A panic in any stage of a run ends that run, never the daemon, and
//! never leaves its host taken.
//!
//! These tests drive this test build's binary, the only one with the
//! fault-injection hook (`RUNWARDEN_FAULT=<stage>`: the first run to reach
//! the stage panics there, once per process; see `src/fault.rs`). For each
//! stage: the run's verdict line says `failed` and `reason:
//! internal_error` with the panic's message and place, the chain verifies,
//! and the next run of the same runbook on the same host runs: on the
//! command line, in the daemon (which keeps serving and counts it), and
//! with the fleet's shared state in PostgreSQL (whose lease is given back).

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

/// Host `h`, a tier-2 tool of its own with a verify, and runbook `fix`:
/// a model-free run that reaches every stage (the planner, a tool's
/// result, a change's verify, the report, the verdict line).
fn estate() -> Estate {
    let e = Estate::new();
    let dir = e.work().join("app");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/mark_ready.yaml"),
        "name: mark_ready\ntier: 2\ndescription: Mark a directory ready.\nargs:\n  dir: { type: path }\n\
         run: [/usr/bin/touch, \"{{ dir }}/READY\"]\n\
         verify:\n  run: [/usr/bin/ls, \"{{ dir }}\"]\n  expect_stdout: '^READY$'\n",
    )
    .unwrap();
    e.host(
        "h",
        &local_host("h", &format!("paths: [{}]", dir.display())),
    );
    e.runbook(
        "fix",
        &format!(
            "name: fix\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage], approve: [mark_ready] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: {d} }}\n  - call: mark_ready\n    args: {{ dir: {d} }}\n    reason: the app waits for its marker\n",
            d = dir.display()
        ),
    );
    e
}

fn test_build(e: &Estate, args: &[&str]) -> Command {
    let mut c = Command::new(test_build_bin());
    c.args(args).arg("--config").arg(e.path());
    c
}

/// The verdict line of a run a panic ended.
fn ended_by_panic(line: &Value, stage: &str) {
    assert_eq!(line["outcome"], "failed", "{stage}: {line:#}");
    let detail = &line["detail"];
    assert_eq!(detail["reason"], "internal_error", "{stage}: {line:#}");
    let said = detail["detail"].as_str().unwrap();
    assert!(
        said.contains(&format!("a fault injected at stage {stage}")) && said.contains(" at src/"),
        "{stage}: {said}"
    );
}

#[test]
fn a_panic_at_each_stage_of_a_command_line_run_ends_it_and_frees_its_host() {
    for stage in ["planner", "tool_result", "verify", "report", "audit"] {
        let e = estate();
        let out = test_build(&e, &["run", "fix", "--host", "h", "--json"])
            .env("RUNWARDEN_FAULT", stage)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{stage}: no report: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(report["verdict"], "failed", "{stage}: {report:#}");
        assert_eq!(out.status.code(), Some(1), "{stage}");
        let verdicts = e.audit_phase("verdict");
        assert_eq!(verdicts.len(), 1, "{stage}: one verdict line");
        ended_by_panic(&verdicts[0], stage);
        assert!(e.run(&["audit", "verify"]).status.success(), "{stage}");
        // The run lock went with the run: the next run of it runs.
        let again = test_build(&e, &["run", "fix", "--host", "h", "--json"])
            .output()
            .unwrap();
        assert_eq!(
            again.status.code(),
            Some(0),
            "{stage}: {}",
            String::from_utf8_lossy(&again.stderr)
        );
    }
}

/// The daemon's run list and metrics after a panic: the run ended, nothing
/// in flight, the error counted; the next trigger for the same (runbook,
/// host) starts a run instead of being deduplicated onto a dead one.
fn daemon_survives(addr: &str, e: &Estate, stage: &str) {
    let started = |addr: &str| {
        let (status, body) = http(
            addr,
            "POST",
            "/api/v1/runs",
            &json!({ "runbook": "fix", "hosts": ["h"] }).to_string(),
        )
        .unwrap();
        assert_eq!(status, 202, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["outcomes"][0]["result"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(started(addr), "started");
    let first = wait_for("the first verdict", Duration::from_secs(30), || {
        e.audit_phase("verdict").first().cloned()
    });
    ended_by_panic(&first, stage);
    let (_, metrics) = http(addr, "GET", "/metrics", "").unwrap();
    assert!(
        metrics.contains("runwarden_internal_errors_total{runbook=\"fix\"} 1"),
        "{metrics}"
    );
    // The verdict line is on disk a moment before the daemon has given
    // the run's slot back (with shared state, after the lease's release).
    wait_for("the run's slot given back", Duration::from_secs(10), || {
        let (_, metrics) = http(addr, "GET", "/metrics", "")?;
        metrics.contains("runwarden_runs_in_flight 0").then_some(())
    });
    let (_, runs) = http(addr, "GET", "/api/v1/runs", "").unwrap();
    assert!(!runs.contains("\"running\""), "{runs}");
    assert_eq!(started(addr), "started", "the host was freed");
    let second = wait_for("the second verdict", Duration::from_secs(30), || {
        e.audit_phase("verdict").get(1).cloned()
    });
    assert_eq!(second["outcome"], "ok", "{second:#}");
    assert!(e.run(&["audit", "verify"]).status.success());
}

#[test]
fn a_panic_in_a_daemons_run_ends_that_run_and_the_daemon_keeps_serving() {
    for stage in ["tool_result", "verify", "report"] {
        let e = estate();
        let mut cmd = test_build(&e, &["serve", "--listen", "127.0.0.1:0"]);
        cmd.env("RUNWARDEN_FAULT", stage);
        let (child, addr) = start_serve(cmd);
        let _daemon = Proc(child);
        daemon_survives(&addr, &e, stage);
    }
}

#[test]
fn a_panic_in_a_run_with_shared_state_gives_its_lease_back() {
    let pg = crate::ha::pg::Pg::start();
    let e = estate();
    write_secret(&e.path().join("pg-url"), &pg.url());
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "audit_head: none\nreplica: a\nstate:\n  postgres:\n    url_file: pg-url\n    lease: 15s\n",
    )
    .unwrap();
    let migrate = e.run(&["db", "migrate"]);
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let mut cmd = test_build(&e, &["serve", "--listen", "127.0.0.1:0"]);
    cmd.env("RUNWARDEN_FAULT", "verify");
    let (child, addr) = start_serve(cmd);
    let _daemon = Proc(child);
    daemon_survives(&addr, &e, "verify");
}

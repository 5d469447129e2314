//! The shipped tier: the binary the package ships, driven from outside as a
//! user drives it.
//!
//! A green test build proves the test build: `cargo test` links
//! dev-dependencies whose features change the crate's own (a `regex`
//! feature once made every model-planned run of the release binary panic
//! while every test passed). So `tests/run.sh` builds the binary exactly as
//! the package does (`cargo build --release --locked`, what
//! `packaging/build-deb.sh` takes) and names it in `RUNWARDEN_BIN`; this
//! tier runs nothing else, and refuses to run without it. The fast and root
//! tiers drive the same binary for every command they run.
//!
//! What it covers, each as a user meets it: the README's quick start word
//! for word; a model-planned run ending in each verdict (a scripted
//! OpenAI-compatible server on loopback), an unsupported claim marked, an
//! answer cut at `max_tokens`; an agent over MCP with the Python SDK on
//! stdio and over HTTP; a declared tier-2 tool that verifies, and one that
//! does not and is undone; the kill switch engaged by its command during a
//! run; `install print`; `tools --json`.

// A test stops loudly where its setup fails.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

#[path = "../it/util.rs"]
mod util;

#[path = "../support/model_server.rs"]
mod model_server;

mod mcp;
mod model;
mod quick_start;
mod tools;

use std::path::PathBuf;

/// The shipped binary: `RUNWARDEN_BIN`, which `tests/run.sh` sets.
pub fn shipped() -> PathBuf {
    let bin = std::env::var("RUNWARDEN_BIN").unwrap_or_else(|_| {
        panic!(
            "the shipped tier drives the release binary: run `sudo tests/run.sh`, or build it with `cargo build --release --locked` and set RUNWARDEN_BIN=$PWD/target/release/runwarden"
        )
    });
    let bin = PathBuf::from(bin);
    assert!(bin.is_file(), "RUNWARDEN_BIN={} is no file", bin.display());
    assert_eq!(
        util::bin(),
        bin.to_str().unwrap(),
        "every helper drives the shipped binary"
    );
    bin
}

/// The binary under test is the shipped one: it carries no test hook
/// (`RUNWARDEN_FAULT` is the test build's alone), and it is not this test
/// build's binary.
#[test]
fn the_binary_under_test_is_the_shipped_one() {
    let bin = shipped();
    assert_ne!(
        std::fs::canonicalize(&bin).unwrap(),
        std::fs::canonicalize(util::test_build_bin()).unwrap()
    );
    let e = util::Estate::new();
    let data = e.work();
    e.host(
        "h",
        &util::local_host("h", &format!("paths: [{}]", data.display())),
    );
    e.runbook(
        "look",
        &format!(
            "name: look\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: {} }}\n",
            data.display()
        ),
    );
    let out = e
        .cmd(&["run", "look", "--host", "h", "--json"])
        .env("RUNWARDEN_FAULT", "planner")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["verdict"], "ok", "{report:#}");
}

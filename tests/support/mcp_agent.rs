//! An agent over MCP for the tests: the reference Python SDK (pinned in
//! tests/estate/mcp-client.txt, installed once per machine by
//! tests/estate/mcp-client.sh) running `tests/support/mcp_client.py`, which
//! plays a script of calls and says what it saw, one JSON event a line.
//! Shared by the root and shipped tiers.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The client's python, installed once per machine.
fn python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new(repo().join("tests/estate/mcp-client.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("tests/estate/mcp-client.sh");
        assert!(
            out.status.success(),
            "the MCP client could not be installed"
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

/// Start the client on `script` (each of `sessions` sessions runs it).
pub fn agent(transport: &[String], script: &Value, sessions: usize) -> Child {
    let mut child = Command::new(python())
        .arg(repo().join("tests/support/mcp_client.py"))
        .args(["--sessions", &sessions.to_string()])
        .args(transport)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the MCP client");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.to_string().as_bytes())
        .unwrap();
    child
}

/// What the client said, once it has exited.
pub fn events(child: Child) -> Vec<Value> {
    let out = child.wait_with_output().unwrap();
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        !events.is_empty(),
        "the client said nothing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    events
}

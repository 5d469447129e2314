//! An agent over MCP, as a user's agent meets the shipped binary: the
//! reference Python SDK (pinned in tests/estate/mcp-client.txt, installed
//! by tests/estate/mcp-client.sh) launches `runwarden mcp` on stdio, and
//! talks to the daemon's `/mcp` over streamable HTTP. Each sees the
//! runbook's tools, a call runs and one outside the scope is refused, and
//! the run ends with its verdict line.

use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

#[path = "../support/mcp_agent.rs"]
mod mcp_agent;

const TOKEN: &str = "mcp-token-shipped-0123456789";

/// The client on `transport`, running `script` once: what it said, none
/// of it an error.
fn session(transport: &[String], script: &Value) -> Vec<Value> {
    let events = mcp_agent::events(mcp_agent::agent(transport, script, 1));
    assert!(
        events.iter().all(|e| e.get("error").is_none()),
        "{events:#?}"
    );
    events
}

fn estate() -> Estate {
    let e = Estate::new();
    e.host("web-01", &local_host("web-01", "paths: [/tmp]"));
    e.runbook(
        "fix",
        "name: fix\ndescription: Free space on web-01.\nhosts: [web-01]\nautonomy: L3\ntools: { observe: [disk_usage] }\nbudget: { max_steps: 4, max_mutations: 0, max_duration: 1m }\nplanner: mcp\nagent:\n  goal: Find what fills /tmp.\n",
    );
    write_secret(&e.path().join("mcp.token"), &format!("{TOKEN}\n"));
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "mcp_token_file: mcp.token\nmcp_idle_timeout: 2s\n",
    )
    .unwrap();
    e
}

fn script() -> Value {
    json!([
        { "do": "list" },
        { "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } },
        { "do": "call", "tool": "restart_service", "args": { "unit": "nginx.service", "reason": "r" } },
    ])
}

/// What one session came to: the runbook's tools, a call that ran, one
/// refused, and the run's verdict line in a chain that verifies.
fn holds(e: &Estate, ev: &[Value]) {
    let tools = ev.iter().find_map(|e| e["tools"].as_array()).unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["disk_usage"]);
    let calls: Vec<&Value> = ev.iter().filter(|e| e.get("call").is_some()).collect();
    assert_eq!(calls[0]["is_error"], false, "{:#}", calls[0]);
    assert_eq!(calls[1]["is_error"], true, "{:#}", calls[1]);
    assert!(
        calls[1]["text"]
            .as_str()
            .unwrap()
            .contains("tool_out_of_scope")
    );
    let verdict = wait_for("the run's verdict line", Duration::from_secs(30), || {
        e.audit_phase("verdict").pop()
    });
    assert_eq!(verdict["outcome"], "denied", "{verdict:#}");
    assert!(e.run(&["audit", "verify"]).status.success());
}

#[test]
fn an_agent_over_stdio_with_the_python_sdk() {
    let e = estate();
    let transport: Vec<String> = [
        "stdio",
        "--",
        crate::shipped().to_str().unwrap(),
        "mcp",
        "fix",
        "--host",
        "web-01",
        "--config",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([e.path().display().to_string()])
    .collect();
    let ev = session(&transport, &script());
    holds(&e, &ev);
}

#[test]
fn an_agent_over_http_with_the_python_sdk() {
    let e = estate();
    let (_daemon, addr) = serve(&e);
    let transport = vec![
        "http".to_string(),
        format!("http://{addr}/mcp?runbook=fix&host=web-01"),
        e.path().join("mcp.token").display().to_string(),
    ];
    let ev = session(&transport, &script());
    holds(&e, &ev);
}

//! An agent's MCP session on a replica: its run is a fleet run (one run of
//! a runbook on a host across every replica), and it is planned where the
//! agent is connected, so it never waits in the fleet's queue for another
//! replica to take it.

use std::time::Duration;

use super::*;
use crate::mcp::{agent, calls, errors, events, refused};

const TOKEN: &str = "mcp-fleet-token-0123456789";

/// `/mcp` of replica `r` for runbook `look` on `host`.
fn url(r: &Replica, host: &str) -> Vec<String> {
    vec![
        "http".into(),
        format!("http://{}/mcp?runbook=look&host={host}", r.addr),
        r.e.path().join("mcp.token").display().to_string(),
    ]
}

#[test]
fn an_agents_run_is_a_fleet_run_and_never_goes_to_the_fleets_queue() {
    let pg = Pg::start();
    let fleet = fleet(
        &pg,
        2,
        LONG,
        "mcp_token_file: mcp.token\nmcp_idle_timeout: 5s\nmax_concurrent_runs: 1\n",
        &|e: &Estate| {
            write_secret(&e.path().join("mcp.token"), TOKEN);
            for h in ["h1", "h2"] {
                e.host(h, &local_host(h, "paths: [/tmp]"));
            }
            e.runbook(
                "look",
                "name: look\ndescription: Look at /tmp.\nhosts: [h1, h2]\nautonomy: L3\ntools: { observe: [disk_usage] }\nplanner: mcp\n",
            );
        },
    );
    let (a, b) = (&fleet[0], &fleet[1]);
    let look = json!({ "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } });
    let release = a.e.work().join("release");
    let holding = agent(
        &url(a, "h1"),
        &json!([look, { "do": "wait_file", "path": release.display().to_string() }, look]),
        1,
    );
    wait_for("the first agent's call", Duration::from_secs(20), || {
        a.e.audit_phase("result").first().cloned()
    });

    // The run is the fleet's: another replica will not start one of it.
    let other = events(agent(&url(b, "h1"), &json!([look]), 1));
    refused(calls(&other, 0)[0], "one at a time");
    let (_, text) = http(&b.addr, "GET", "/api/v1/fleet/runs?host=h1", "").unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(runs["runs"][0]["replica"], "a", "{runs:#}");
    assert_eq!(runs["runs"][0]["status"], "running", "{runs:#}");

    // Replica a's one run slot is the first agent's: a second agent there is
    // told to try again, and its run is not handed to b through the queue.
    let second = events(agent(&url(a, "h2"), &json!([look]), 1));
    assert!(errors(&second).is_empty(), "{second:#?}");
    refused(
        calls(&second, 0)[0],
        "every run slot of this replica is busy",
    );
    std::thread::sleep(Duration::from_secs(2));
    for r in [a, b] {
        assert!(
            !r.e.audit().iter().any(|l| l["host"] == "h2"),
            "nothing of h2 ran on {}",
            r.name
        );
    }

    std::fs::write(&release, "").unwrap();
    let first = events(holding);
    let c = calls(&first, 0);
    assert!(c.iter().all(|c| c["is_error"] == false), "{first:#?}");
    let v = wait_for("the first agent's verdict", Duration::from_secs(20), || {
        a.verdicts().first().cloned()
    });
    assert_eq!(v["outcome"], "ok", "{v:#}");
    assert_eq!(v["host"], "h1");
}

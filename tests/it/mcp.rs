//! Agents over MCP, driven by a real client: the reference Python SDK
//! (pinned in tests/estate/mcp-client.txt, installed by
//! tests/estate/mcp-client.sh) talks to `runwarden mcp` on stdio and to
//! the daemon's `/mcp` over streamable HTTP, as an agent would. Whatever
//! the agent asks, the gate answers: the runbook's tools only, the host's
//! allowlists, the budget, the kill switch, a person for L2, and an audit
//! line for every call, before it runs.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::daemon::Daemon;
use crate::util::*;

const TOKEN: &str = "mcp-token-0123456789abcdef";
const ALICE: &str = "Bearer alice-token-0123456789";

#[path = "../support/mcp_agent.rs"]
mod mcp_agent;
pub(crate) use mcp_agent::{agent, events};

/// `runwarden mcp RUNBOOK --host HOST` of `e`, as a client launches it.
fn stdio(e: &Estate, runbook: &str, host: &str) -> Vec<String> {
    [
        "stdio",
        "--",
        bin(),
        "mcp",
        runbook,
        "--host",
        host,
        "--config",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([e.path().display().to_string()])
    .collect()
}

/// The daemon's `/mcp` for `runbook` on `host`.
fn http(e: &Estate, d: &Daemon, runbook: &str, host: &str) -> Vec<String> {
    vec![
        "http".into(),
        format!("http://{}/mcp?runbook={runbook}&host={host}", d.addr),
        e.path().join("mcp.token").display().to_string(),
    ]
}

/// The events of session `n` that answer calls, in order.
pub(crate) fn calls(events: &[Value], n: u64) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["session"] == n && e.get("call").is_some())
        .collect()
}

/// Call event `c` is an error whose text says `says`.
pub(crate) fn refused(c: &Value, says: &str) {
    assert_eq!(c["is_error"], true, "{c:#}");
    let text = c["text"].as_str().unwrap_or("");
    assert!(text.contains(says), "{says:?} not in {c:#}");
}

pub(crate) fn errors(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e.get("error").is_some()).collect()
}

/// A host that may look at /tmp and rotate a real log, a slow tier-1
/// tool declared in YAML, and runbook `fix` (L3 unless `autonomy` says
/// otherwise) over them with an agent goal.
fn estate(autonomy: &str, budget: &str) -> Estate {
    let e = Estate::new();
    rotating_host(&e, "web-01");
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/slow_look.yaml"),
        "name: slow_look\ntier: 1\ndescription: Take a while to look.\nargs:\n  secs: { type: integer, min: 1, max: 10 }\nrun: [/usr/bin/sleep, \"{{ secs }}\"]\n",
    )
    .unwrap();
    e.runbook(
        "fix",
        &format!(
            "name: fix\ndescription: Free space on web-01.\nhosts: [web-01]\nautonomy: {autonomy}\ntools: {{ observe: [disk_usage, slow_look], approve: [rotate_logs] }}\nbudget: {budget}\nplanner: mcp\nagent:\n  goal: Find what fills /tmp and rotate the application log if it is large.\n"
        ),
    );
    write_secret(&e.path().join("mcp.token"), &format!("{TOKEN}\n"));
    write_secret(
        &e.path().join("approvers"),
        "alice alice-token-0123456789\n",
    );
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "mcp_token_file: mcp.token\nmcp_idle_timeout: 2s\napprovers_file: approvers\napproval_timeout: 5m\nmax_concurrent_runs: 24\n",
    )
    .unwrap();
    e
}

fn conf(e: &Estate) -> String {
    e.work().join("lr.conf").display().to_string()
}

/// The runs' verdict lines, once `n` of them are written.
fn verdicts(e: &Estate, n: usize) -> Vec<Value> {
    wait_for("the runs' verdict lines", Duration::from_secs(30), || {
        let v = e.audit_phase("verdict");
        (v.len() >= n).then_some(v)
    })
}

#[test]
fn an_agent_on_stdio_sees_the_runbooks_tools_and_every_call_is_gated_and_audited() {
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let script = json!([
        { "do": "list" },
        { "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } },
        { "do": "call", "tool": "disk_usage", "args": { "path": "/etc" } },
        { "do": "call", "tool": "restart_service", "args": { "unit": "nginx.service", "reason": "r" } },
        { "do": "call", "tool": "run_shell", "args": { "cmd": "id" } },
        { "do": "call", "tool": "rotate_logs", "args": { "config": conf(&e), "reason": "the log is large" } },
    ]);
    let ev = events(agent(&stdio(&e, "fix", "web-01"), &script, 1));
    assert!(errors(&ev).is_empty(), "{ev:#?}");
    let hello = &ev[0];
    assert!(hello["server"].as_str().unwrap().starts_with("runwarden "));
    let told = hello["instructions"].as_str().unwrap();
    assert!(told.contains("Goal: Find what fills /tmp"), "{told}");
    assert!(
        told.contains("at most 8 calls (1 of them changes)"),
        "{told}"
    );

    // Exactly the runbook's tools, with the hints of their tier.
    let tools = ev.iter().find_map(|e| e["tools"].as_array()).unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["disk_usage", "slow_look", "rotate_logs"]);
    assert_eq!(tools[0]["read_only"], true);
    assert_eq!(tools[2]["read_only"], false);
    assert_eq!(tools[2]["destructive"], false);
    assert!(
        tools[2]["schema"]["properties"]["config"].is_object(),
        "{:#}",
        tools[2]
    );
    // On this host's terms: the one logrotate file it allows, the one path.
    assert_eq!(
        tools[2]["schema"]["properties"]["config"]["enum"],
        json!([conf(&e)]),
        "{:#}",
        tools[2]
    );
    let path = tools[0]["schema"]["properties"]["path"]["description"]
        .as_str()
        .unwrap();
    assert!(path.contains("under /tmp"), "{path}");

    let c = calls(&ev, 0);
    assert_eq!(c[0]["is_error"], false, "{:#}", c[0]);
    assert!(c[0]["structured"]["use_pct"].is_number(), "{:#}", c[0]);
    refused(c[1], "invalid_arguments");
    refused(c[2], "tool_out_of_scope");
    refused(c[3], "unknown_tool");
    assert_eq!(c[4]["is_error"], false, "{:#}", c[4]);
    assert!(e.work().join("lr.state").exists(), "logrotate ran");

    // One run: its start names the agent, every call is a step with its
    // line, the refused ones included, and the chain holds.
    let lines = e.audit();
    let start = lines.iter().find(|l| l["phase"] == "start").unwrap();
    assert_eq!(start["detail"]["trigger"], "mcp", "{start:#}");
    assert_eq!(
        start["detail"]["client"], "runwarden-tests 1.0",
        "{start:#}"
    );
    let intents: Vec<&str> = lines
        .iter()
        .filter(|l| l["phase"] == "intent")
        .map(|l| l["tool"].as_str().unwrap())
        .collect();
    assert_eq!(intents, ["disk_usage", "rotate_logs"]);
    assert_eq!(e.audit_phase("denied").len(), 3);
    assert!(
        lines
            .iter()
            .all(|l| l["planner"] == "mcp" || l["phase"] == "queued")
    );
    let v = verdicts(&e, 1);
    assert_eq!(v[0]["outcome"], "denied", "{:#}", v[0]);
    let verify = e.run(&["audit", "verify"]);
    assert!(verify.status.success(), "{verify:?}");
}

#[test]
fn the_budget_and_the_kill_switch_end_an_agents_run_and_later_calls_hear_how() {
    // The budget: the third call is refused, and so is every one after.
    let e = estate("L3", "{ max_steps: 2, max_mutations: 0, max_duration: 2m }");
    let look = json!({ "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } });
    let script = json!([look, look, look, look]);
    let ev = events(agent(&stdio(&e, "fix", "web-01"), &script, 1));
    let c = calls(&ev, 0);
    assert_eq!(
        (c[0]["is_error"].clone(), c[1]["is_error"].clone()),
        (json!(false), json!(false))
    );
    refused(c[2], "step_limit");
    refused(c[3], "ended step_limit");
    assert_eq!(e.audit_phase("intent").len(), 2);
    assert_eq!(verdicts(&e, 1)[0]["outcome"], "step_limit");

    // The kill switch, engaged by the client between two calls.
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let switch = e.path().join("kill-switch/ENGAGED").display().to_string();
    let script = json!([look, { "do": "touch", "path": switch }, look, look]);
    let ev = events(agent(&stdio(&e, "fix", "web-01"), &script, 1));
    let c = calls(&ev, 0);
    assert_eq!(c[0]["is_error"], false);
    refused(c[1], "kill_switch");
    refused(c[2], "ended halted");
    assert_eq!(e.audit_phase("intent").len(), 1);
    assert_eq!(verdicts(&e, 1)[0]["outcome"], "halted");

    // With the switch engaged, a session's run does not start at all.
    let ev = events(agent(&stdio(&e, "fix", "web-01"), &json!([look]), 1));
    let c = calls(&ev, 0);
    refused(c[0], "kill switch");
    assert_eq!(e.audit_phase("intent").len(), 1, "nothing more ran");
}

#[test]
fn an_agent_that_leaves_mid_call_has_its_call_finished_and_audited() {
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let script = json!([
        { "do": "abandon", "tool": "slow_look", "args": { "secs": 2 }, "after": 0.5 },
    ]);
    let ev = events(agent(&stdio(&e, "fix", "web-01"), &script, 1));
    let left = ev.iter().find(|e| e.get("abandoned").is_some()).unwrap();
    assert_eq!(
        left["answered"], false,
        "the call was still running: {left:#}"
    );
    // The call's intent was on disk before it ran; its result and the
    // run's verdict follow once it ends, with nobody left to tell.
    let v = verdicts(&e, 1);
    let result = e
        .audit_phase("result")
        .into_iter()
        .find(|l| l["tool"] == "slow_look")
        .expect("the call's result line");
    assert_eq!(result["outcome"], "ok", "{result:#}");
    assert_eq!(v[0]["outcome"], "ok", "{:#}", v[0]);
}

#[test]
fn the_daemons_mcp_endpoint_needs_its_own_token_and_names_what_is_wrong() {
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let d = Daemon::start(&e);
    let path = "/mcp?runbook=fix&host=web-01";
    // No token, a wrong one, a web page: refused before MCP is spoken.
    let (status, _) = d.request("POST", path, &[], b"{}");
    assert_eq!(status, 401);
    let (status, _) = d.request(
        "POST",
        path,
        &[("Authorization", "Bearer wrong-token-0123456789")],
        b"{}",
    );
    assert_eq!(status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let (status, _) = d.request(
        "POST",
        path,
        &[
            ("Authorization", &bearer),
            ("Origin", "https://example.com"),
        ],
        b"{}",
    );
    assert_eq!(status, 403);
    let mut wrong = http(&e, &d, "fix", "web-01");
    std::fs::write(e.work().join("wrong.token"), "wrong-token-0123456789").unwrap();
    wrong[2] = e.work().join("wrong.token").display().to_string();
    let ev = events(agent(&wrong, &json!([{ "do": "list" }]), 1));
    assert!(!errors(&ev).is_empty(), "{ev:#?}");

    // A URL naming no runbook, or one the host is not in: the handshake says so.
    for (runbook, host, says) in [
        ("nope", "web-01", "no runbook named \"nope\""),
        ("fix", "db-9", "does not name host \"db-9\""),
    ] {
        let ev = events(agent(
            &http(&e, &d, runbook, host),
            &json!([{ "do": "list" }]),
            1,
        ));
        let err = errors(&ev);
        assert!(
            err.iter()
                .any(|x| x["error"].as_str().unwrap().contains(says)),
            "{ev:#?}"
        );
    }
    assert!(e.audit_phase("start").is_empty(), "nothing started");

    // The right token: the same gate as on stdio.
    let script = json!([
        { "do": "list" },
        { "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } },
        { "do": "call", "tool": "disk_usage", "args": { "path": "/etc" } },
    ]);
    let ev = events(agent(&http(&e, &d, "fix", "web-01"), &script, 1));
    assert!(errors(&ev).is_empty(), "{ev:#?}");
    let c = calls(&ev, 0);
    assert_eq!(c[0]["is_error"], false, "{:#}", c[0]);
    assert_eq!(c[1]["is_error"], true, "{:#}", c[1]);
    let v = verdicts(&e, 1);
    assert_eq!(v[0]["outcome"], "denied", "{:#}", v[0]);
    let start = e.audit_phase("start").remove(0);
    assert_eq!(start["detail"]["trigger"], "mcp");
    assert_eq!(start["detail"]["client"], "runwarden-tests 1.0");
    wait_for("the session closed", Duration::from_secs(10), || {
        (d.metric("runwarden_mcp_sessions_open") == 0.0).then_some(())
    });
    assert_eq!(
        d.metric(r#"runwarden_runs_started_total{runbook="fix",trigger="mcp"}"#),
        1.0
    );
    // An agent's calls count as any planner's, labelled as its.
    assert_eq!(
        d.metric(r#"runwarden_tool_calls_total{host="web-01",outcome="ok",planner="mcp",runbook="fix",tier="1",tool="disk_usage"}"#),
        1.0
    );

    // Without mcp_token_file there is no endpoint.
    let e2 = Estate::new();
    rotating_host(&e2, "web-01");
    let fix = std::fs::read_to_string(e.path().join("runbooks/fix.yaml")).unwrap();
    e2.runbook("fix", &fix.replace(", slow_look", ""));
    let d2 = Daemon::start(&e2);
    let (status, body) = d2.request("POST", path, &[("Authorization", &bearer)], b"{}");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("mcp_token_file"), "{body}");
}

/// Wait for the pending approval request of an agent's call.
fn pending(d: &Daemon) -> Value {
    wait_for("the approval request", Duration::from_secs(20), || {
        let (_, body) = d.request("GET", "/api/v1/approvals", &[("Authorization", ALICE)], b"");
        let list: Value = serde_json::from_str(&body).ok()?;
        list["approvals"]
            .as_array()?
            .iter()
            .find(|r| r["state"] == "pending")
            .cloned()
    })
}

fn decide(d: &Daemon, r: &Value, action: &str) -> u16 {
    let body = json!({ "digest": r["digest"], "comment": "looked" }).to_string();
    d.request(
        "POST",
        &format!("/api/v1/approvals/{}/{action}", r["id"].as_str().unwrap()),
        &[
            ("Authorization", ALICE),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
    .0
}

#[test]
fn an_l2_agents_change_waits_for_a_person_who_sees_who_asked() {
    let e = estate("L2", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let d = Daemon::start(&e);
    let rotate = json!({ "do": "call", "tool": "rotate_logs", "args": { "config": conf(&e), "reason": "app.log is 3 GiB" } });

    // Approved: the call runs, and its answer reaches the agent.
    let client = agent(&http(&e, &d, "fix", "web-01"), &json!([rotate]), 1);
    let r = pending(&d);
    assert_eq!(r["agent"], "runwarden-tests 1.0", "{r:#}");
    assert_eq!(r["reason"], "app.log is 3 GiB");
    assert!(
        !e.work().join("lr.state").exists(),
        "nothing before a decision"
    );
    assert_eq!(decide(&d, &r, "approve"), 200);
    let ev = events(client);
    assert_eq!(calls(&ev, 0)[0]["is_error"], false, "{ev:#?}");
    assert!(e.work().join("lr.state").exists(), "logrotate ran");
    let intent = e.audit_phase("intent").remove(0);
    assert_eq!(intent["approved_by"], "person:alice");

    // Denied: the agent hears who denied it, and nothing ran.
    std::fs::remove_file(e.work().join("lr.state")).unwrap();
    let client = agent(&http(&e, &d, "fix", "web-01"), &json!([rotate]), 1);
    let r = pending(&d);
    assert_eq!(decide(&d, &r, "deny"), 200);
    let ev = events(client);
    let c = calls(&ev, 0);
    refused(c[0], "alice denied");
    assert!(!e.work().join("lr.state").exists());

    // The agent leaves while its call waits: the request is withdrawn and
    // nothing runs for an agent no longer there.
    let client = agent(
        &http(&e, &d, "fix", "web-01"),
        &json!([{ "do": "abandon", "tool": "rotate_logs", "args": { "config": conf(&e), "reason": "r" }, "after": 1.0 }]),
        1,
    );
    let r = pending(&d);
    events(client);
    let v = verdicts(&e, 3);
    let last = v.last().unwrap();
    assert_eq!(last["outcome"], "halted", "{last:#}");
    let denied = e.audit_phase("denied");
    assert_eq!(
        denied.last().unwrap()["detail"]["reason"],
        "agent_gone",
        "{denied:#?}"
    );
    let (_, body) = d.request(
        "GET",
        &format!("/api/v1/approvals/{}", r["id"].as_str().unwrap()),
        &[("Authorization", ALICE)],
        b"",
    );
    let shown: Value = serde_json::from_str(&body).unwrap();
    assert_ne!(shown["state"], "pending", "{shown:#}");
    assert_eq!(decide(&d, &r, "approve"), 409, "too late to approve");
    assert!(!e.work().join("lr.state").exists(), "nothing ran");
}

#[test]
fn twenty_agents_at_once_each_get_a_run_of_their_own_and_a_second_on_one_host_is_refused() {
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let hosts: Vec<String> = (1..=20).map(|i| format!("w{i:02}")).collect();
    for h in &hosts {
        e.host(h, &local_host(h, "paths: [/tmp]"));
    }
    e.runbook(
        "look",
        &format!(
            "name: look\ndescription: Look at /tmp.\nhosts: [{}]\nautonomy: L3\ntools: {{ observe: [disk_usage, slow_look] }}\nplanner: mcp\n",
            hosts.join(", ")
        ),
    );
    let d = Daemon::start(&e);
    let script = json!([
        { "do": "list" },
        { "do": "call", "tool": "slow_look", "args": { "secs": 1 } },
        { "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } },
    ]);
    // Twenty sessions of one client at once, each on a host of its own.
    let ev = events(agent(&http(&e, &d, "look", "w{n}"), &script, 20));
    assert!(errors(&ev).is_empty(), "{ev:#?}");
    for n in 0..20 {
        let c = calls(&ev, n);
        assert_eq!(c.len(), 2, "{ev:#?}");
        assert!(c.iter().all(|c| c["is_error"] == false), "{c:#?}");
    }
    let v = verdicts(&e, 20);
    let mut runs: Vec<&str> = v.iter().map(|l| l["run_id"].as_str().unwrap()).collect();
    runs.sort();
    runs.dedup();
    assert_eq!(runs.len(), 20);
    assert!(v.iter().all(|l| l["outcome"] == "ok"), "{v:#?}");
    wait_for("every session closed", Duration::from_secs(10), || {
        (d.metric("runwarden_mcp_sessions_open") == 0.0).then_some(())
    });

    // Two sessions on one runbook and host: one run at a time, so the
    // second is told its run did not start, and why.
    let slow = json!([{ "do": "call", "tool": "slow_look", "args": { "secs": 3 } }]);
    let first = agent(&http(&e, &d, "look", "w01"), &slow, 1);
    wait_for("the first session's call", Duration::from_secs(10), || {
        (e.audit_phase("intent").len() == 41).then_some(())
    });
    let second = events(agent(&http(&e, &d, "look", "w01"), &slow, 1));
    let c = calls(&second, 0);
    assert_eq!(c[0]["is_error"], true, "{second:#?}");
    refused(c[0], "one at a time");
    let ev = events(first);
    assert_eq!(calls(&ev, 0)[0]["is_error"], false, "{ev:#?}");
}

/// The MCP Inspector's CLI (a second client nobody here wrote): its node
/// and its script, installed once per machine.
fn inspector() -> &'static (String, String) {
    static INSPECTOR: OnceLock<(String, String)> = OnceLock::new();
    INSPECTOR.get_or_init(|| {
        let out = Command::new(repo().join("tests/estate/mcp-inspector.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("tests/estate/mcp-inspector.sh");
        assert!(
            out.status.success(),
            "the MCP Inspector could not be installed"
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines().map(String::from);
        (lines.next().unwrap(), lines.next().unwrap())
    })
}

/// One method of the Inspector's CLI against `target` (its arguments):
/// what it printed first (the server's answer).
fn inspect(target: &[String], method: &[&str]) -> Value {
    let (node, cli) = inspector();
    let out = Command::new(node)
        .arg(cli)
        .arg("--cli")
        .args(method)
        .args(target)
        .env("MCP_INSPECTOR_SECRET_STORE", "memory")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Pretty JSON first; a refusal adds a line of its own after it.
    let mut answer = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
    answer.next().and_then(Result::ok).unwrap_or_else(|| {
        panic!(
            "no answer: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn the_mcp_inspector_sees_the_same_scope_and_the_same_refusals() {
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    let d = Daemon::start(&e);
    let stdio: Vec<String> = ["--", bin(), "mcp", "fix", "--host", "web-01", "--config"]
        .iter()
        .map(|s| s.to_string())
        .chain([e.path().display().to_string()])
        .collect();
    let http: Vec<String> = vec![
        "--transport".into(),
        "http".into(),
        "--server-url".into(),
        format!("http://{}/mcp?runbook=fix&host=web-01", d.addr),
        "--header".into(),
        format!("Authorization: Bearer {TOKEN}"),
    ];
    for target in [&stdio, &http] {
        let list = inspect(target, &["--method", "tools/list"]);
        let names: Vec<&str> = list["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["disk_usage", "slow_look", "rotate_logs"],
            "{list:#}"
        );
        assert_eq!(list["tools"][0]["annotations"]["readOnlyHint"], true);
        assert_eq!(list["tools"][2]["annotations"]["destructiveHint"], false);
        let call = |tool: &str, arg: &str| {
            // The Inspector leaves without ending its session: over HTTP
            // the run ends when the session has been idle (2 s here), and
            // until then it holds the runbook on the host.
            let started = e.audit_phase("start").len();
            verdicts(&e, started);
            inspect(
                target,
                &[
                    "--method",
                    "tools/call",
                    "--tool-name",
                    tool,
                    "--tool-arg",
                    arg,
                ],
            )
        };
        let ok = call("disk_usage", "path=/tmp");
        assert_ne!(ok["isError"], true, "{ok:#}");
        assert!(ok["structuredContent"]["use_pct"].is_number(), "{ok:#}");
        // The Inspector checks a tool's name against the list itself, so
        // calls outside it are the Python client's to make (above).
        let r = call("disk_usage", "path=/etc");
        assert_eq!(r["isError"], true, "{r:#}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("invalid_arguments"), "{r:#}");
    }
    // Each CLI invocation that calls is a session with a run (one that only
    // lists holds none): its start line names the Inspector.
    let starts = e.audit_phase("start");
    assert_eq!(starts.len(), 4, "{starts:#?}");
    assert!(starts.iter().all(|s| s["detail"]["trigger"] == "mcp"));
    assert!(
        starts.iter().all(|s| s["detail"]["client"]
            .as_str()
            .is_some_and(|c| c.contains("inspector"))),
        "{starts:#?}"
    );
    assert_eq!(e.audit_phase("denied").len(), 2);
}

/// A daemon told to stop does not wait out its grace for an agent that is
/// thinking: the session's run ends `halted` at once, and the daemon exits.
#[test]
fn a_stopping_daemon_ends_the_run_of_an_agent_between_calls_at_once() {
    let e = estate(
        "L3",
        "{ max_steps: 8, max_mutations: 1, max_duration: 10m }",
    );
    let settings = std::fs::read_to_string(e.path().join("runwarden.yaml")).unwrap();
    std::fs::write(
        e.path().join("runwarden.yaml"),
        format!("{settings}shutdown_grace: 60s\nmcp_idle_timeout: 10m\n")
            .replace("mcp_idle_timeout: 2s\n", ""),
    )
    .unwrap();
    let mut d = Daemon::start(&e);
    let never = e.work().join("never");
    let mut client = agent(
        &http(&e, &d, "fix", "web-01"),
        &json!([
            { "do": "call", "tool": "disk_usage", "args": { "path": "/tmp" } },
            { "do": "wait_file", "path": never.display().to_string() },
        ]),
        1,
    );
    wait_for("the agent's call", Duration::from_secs(20), || {
        e.audit_phase("result").first().cloned()
    });
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let stopped = std::time::Instant::now();
    let status = wait_for("the daemon's exit", Duration::from_secs(60), || {
        d.child.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}");
    assert!(
        stopped.elapsed() < Duration::from_secs(30),
        "the daemon waited out its grace for an idle agent: {:?}",
        stopped.elapsed()
    );
    let v = e.audit_phase("verdict").remove(0);
    assert_eq!(v["outcome"], "halted", "{v:#}");
    assert!(
        v["detail"]["detail"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{v:#}"
    );
    let _ = client.kill();
    let _ = client.wait();
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// One raw request to `/mcp` with its own `Host`: the status line's code.
fn mcp_raw(addr: &str, host: &str, body: &str) -> u16 {
    raw_post(addr, "/mcp?runbook=fix&host=web-01", &[host], body)
}

/// The status of a POST to `target` with these `Host` lines, as written.
fn raw_post(addr: &str, target: &str, hosts: &[&str], body: &str) -> u16 {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hosts: String = hosts.iter().map(|h| format!("Host: {h}\r\n")).collect();
    write!(
        c,
        "POST {target} HTTP/1.1\r\n{hosts}Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The status line is enough: a session's stream may stay open.
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

/// No client can grow the daemon without bound: 5,000 handshakes that
/// never call nor close (as a client that opens a session per call does)
/// get at most `mcp_max_sessions` sessions, the rest 429 with
/// `Retry-After`; memory stays flat; the webhook and the kill switch
/// answer throughout; the sessions that made no call end after
/// `mcp_handshake_timeout`; a `Host` that is not the daemon's is refused.
#[test]
fn five_thousand_handshakes_never_grow_the_daemon_past_its_session_cap() {
    let e = estate("L3", "{ max_steps: 8, max_mutations: 1, max_duration: 2m }");
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "mcp_token_file: mcp.token\nmcp_idle_timeout: 10m\nmcp_max_sessions: 20\nmcp_handshake_timeout: 3s\n",
    )
    .unwrap();
    let d = Daemon::start(&e);
    let addr = d.addr.clone();
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": { "name": "flood", "version": "1" } },
    })
    .to_string();
    // A first handful, to measure from once the daemon's pools are warm.
    for _ in 0..5 {
        assert_eq!(mcp_raw(&addr, &addr, &init), 200);
    }
    let before = rss_kib(d.child.id());
    let (mut ok, mut full) = (5u32, 0u32);
    for i in 0..5000 {
        match mcp_raw(&addr, &addr, &init) {
            200 => ok += 1,
            429 => full += 1,
            other => panic!("handshake {i}: {other}"),
        }
        if i % 1000 == 999 {
            let (status, _) = d.post_alerts(crate::daemon::FIRING);
            assert_eq!(status, 200, "the webhook answers under the flood");
            let out = e.run(&["kill-switch", "status"]);
            assert!(out.status.success(), "the kill switch answers");
        }
    }
    let after = rss_kib(d.child.id());
    assert!(ok <= 20, "{ok} sessions opened past mcp_max_sessions 20");
    assert_eq!(ok + full, 5005);
    assert!(d.metric("runwarden_mcp_sessions_open") <= 20.0);
    assert_eq!(
        d.metric(r#"runwarden_mcp_sessions_refused_total{reason="sessions"}"#),
        f64::from(full)
    );
    let grew = after.saturating_sub(before);
    eprintln!(
        "5,000 handshakes: {ok} sessions, {full} refused 429; RSS {before} -> {after} KiB ({grew} KiB, {} KiB a session)",
        grew / u64::from(ok)
    );
    assert!(
        grew < 20 * 1024,
        "5,000 handshakes grew the daemon by {grew} KiB ({before} -> {after})"
    );
    // None of them made a call: each ends after the handshake timeout.
    wait_for("silent sessions to end", Duration::from_secs(20), || {
        (d.metric("runwarden_mcp_sessions_open") == 0.0).then_some(())
    });
    assert!(d.metric(r#"runwarden_mcp_sessions_refused_total{reason="handshake_timeout"}"#) >= 1.0);
    assert_eq!(mcp_raw(&addr, &addr, &init), 200, "room again");
    // DNS rebinding: another site's name is refused; localhost is served.
    assert_eq!(mcp_raw(&addr, "evil.example:80", &init), 403);
    assert_eq!(
        d.metric(r#"runwarden_mcp_sessions_refused_total{reason="host"}"#),
        1.0
    );
    let port = addr.rsplit(':').next().unwrap();
    assert_eq!(mcp_raw(&addr, &format!("localhost:{port}"), &init), 200);
    // One authority or none (RFC 9112 §3.2): two Host lines, in either
    // order, or a target naming another authority than Host, get 400.
    let path = "/mcp?runbook=fix&host=web-01";
    for (target, hosts) in [
        (path.to_string(), vec![addr.as_str(), "evil.example"]),
        (path.to_string(), vec!["evil.example", addr.as_str()]),
        (path.to_string(), vec![addr.as_str(), addr.as_str()]),
        (format!("http://evil.example{path}"), vec![addr.as_str()]),
        (
            format!("http://{addr}@evil.example{path}"),
            vec![addr.as_str()],
        ),
        (format!("http://{addr}{path}"), vec!["evil.example"]),
    ] {
        assert_eq!(
            raw_post(&addr, &target, &hosts, &init),
            400,
            "POST {target} with Host {hosts:?}"
        );
    }
    // The same for the API, which trusts a loopback Host without a token.
    let alerts = crate::daemon::FIRING;
    assert_eq!(
        raw_post(&addr, "http://evil.example/api/v1/alerts", &[&addr], alerts),
        400
    );
    assert_eq!(
        raw_post(&addr, "/api/v1/alerts", &[&addr, "evil.example"], alerts),
        400
    );
    // One Host line that is a list (how a proxy merges two), or a name
    // with a space or a user part: not one authority either.
    for host in [
        format!("{addr}, evil.example"),
        format!("{addr},evil.example"),
        format!("{addr} evil.example"),
        format!("user@{addr}"),
    ] {
        assert_eq!(
            raw_post(&addr, "/api/v1/alerts", &[&host], alerts),
            400,
            "Host: {host}"
        );
        assert_eq!(raw_post(&addr, path, &[&host], &init), 400, "Host: {host}");
    }
    // An absolute-form target that names the daemon, as Host does, is served.
    assert_eq!(
        raw_post(&addr, &format!("http://{addr}{path}"), &[&addr], &init),
        200
    );
}

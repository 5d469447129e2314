//! The host agent as the last line of defence, on this machine's agent
//! socket: one signed permit spent once however many connections carry it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use runwarden::signing::{CallId, PermitKey};
use serde_json::{Value, json};

use super::*;

/// The agent's audit lines of one run: (intents, results, refusal reasons).
fn host_record(audit: &Path, run_id: &str) -> (usize, usize, Vec<String>) {
    let text = std::fs::read_to_string(audit).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &Value| l["run_id"] == run_id)
        .collect();
    let count = |phase: &str| lines.iter().filter(|l| l["phase"] == phase).count();
    let reasons = lines
        .iter()
        .filter(|l| l["phase"] == "denied")
        .map(|l| l["detail"]["reason"].as_str().unwrap_or("").to_string())
        .collect();
    (count("intent"), count("result"), reasons)
}

/// 16 connections to the agent socket send one signed tier-2 permit at the
/// same moment, 50 times over: each time exactly one agent process
/// dispatches it (one intent and one result line on the host) and the 15
/// others are refused `permit_replayed`, with a line each.
#[test]
fn one_permit_sent_on_sixteen_connections_at_once_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = agent_config(dir.path());
    install_print(dir.path());
    agent_socket(dir.path(), &socket, &dir.path().join("data"));
    let key = PermitKey::load(&dir.path().join("state/permit.key")).unwrap();
    let args = json!({ "unit": "demo.service", "reason": "t" });
    let mut replay_kinds = Vec::new();
    for trial in 0..50 {
        let run_id = format!("trial-{trial}");
        let permit = key.sign(
            &CallId {
                run_id: &run_id,
                step: 1,
                host: "me",
                tool: "restart_service",
                args: &args,
            },
            "standing:fix",
        );
        let mut line = serde_json::to_vec(&json!({
            "run_id": run_id, "step": 1, "runbook": "fix", "tool": "restart_service",
            "args": args, "permit": permit,
        }))
        .unwrap();
        line.push(b'\n');
        let start = std::sync::Barrier::new(16);
        let replies: Vec<Value> = std::thread::scope(|s| {
            let senders: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        let mut conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                        start.wait();
                        conn.write_all(&line).unwrap();
                        conn.shutdown(std::net::Shutdown::Write).unwrap();
                        let mut reply = String::new();
                        BufReader::new(conn).read_line(&mut reply).unwrap();
                        serde_json::from_str::<Value>(&reply).unwrap()
                    })
                })
                .collect();
            senders.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ran = replies.iter().filter(|r| r["result"].is_object()).count();
        let replayed = replies
            .iter()
            .filter(|r| {
                r["refused"]
                    .as_str()
                    .is_some_and(|w| w.contains("already used"))
            })
            .count();
        assert_eq!((ran, replayed), (1, 15), "trial {trial}: {replies:#?}");
        let (intents, results, reasons) =
            host_record(&dir.path().join("agent-audit.jsonl"), &run_id);
        assert_eq!((intents, results), (1, 1), "trial {trial}");
        assert_eq!(reasons.len(), 15, "trial {trial}: {reasons:?}");
        replay_kinds.extend(reasons);
    }
    assert!(
        replay_kinds.iter().all(|k| k == "permit_replayed"),
        "{replay_kinds:?}"
    );
}

/// One record of spent permits per host, whatever audit log each agent
/// keeps: a permit the socket's agent ran is refused by an agent started
/// as SSH's forced command with its own log (same policy), and the other
/// way round.
#[test]
fn a_permit_runs_once_on_a_host_whichever_agent_carries_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = agent_config(dir.path());
    install_print(dir.path());
    let policy = agent_socket(dir.path(), &socket, &dir.path().join("data"));
    let key = PermitKey::load(&dir.path().join("state/permit.key")).unwrap();
    let args = json!({ "unit": "demo.service", "reason": "t" });
    let line = |run_id: &str| {
        let permit = key.sign(
            &CallId {
                run_id,
                step: 1,
                host: "me",
                tool: "restart_service",
                args: &args,
            },
            "standing:fix",
        );
        let mut line = serde_json::to_vec(&json!({
            "run_id": run_id, "step": 1, "runbook": "fix", "tool": "restart_service",
            "args": args, "permit": permit,
        }))
        .unwrap();
        line.push(b'\n');
        line
    };
    let by_socket = |line: &[u8]| -> Value {
        let mut conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        conn.write_all(line).unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        BufReader::new(conn).read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    };
    let ssh_audit = dir.path().join("ssh-agent-audit.jsonl");
    let by_ssh = |line: &[u8]| -> Value {
        let mut child = std::process::Command::new(crate::bin())
            .args(["agent", "--stdio", "--policy"])
            .arg(&policy)
            .arg("--audit")
            .arg(&ssh_audit)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(line).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().next().unwrap()).unwrap()
    };
    let refused = |r: &Value| {
        r["refused"]
            .as_str()
            .is_some_and(|w| w.contains("already used"))
    };

    let first = line("socket-first");
    let ran = by_socket(&first);
    assert!(ran["result"].is_object(), "{ran:#}");
    let again = by_ssh(&first);
    assert!(refused(&again), "the SSH agent ran it again: {again:#}");
    let second = line("ssh-first");
    let ran = by_ssh(&second);
    assert!(ran["result"].is_object(), "{ran:#}");
    let again = by_socket(&second);
    assert!(
        refused(&again),
        "the socket's agent ran it again: {again:#}"
    );
    assert_eq!(
        host_record(&ssh_audit, "socket-first").0,
        0,
        "no intent line for the refused one"
    );
}

/// An agent whose connection sends nothing is not kept waiting: it says so
/// and ends after its request timeout; with an idle timeout, the same after
/// a reply. A connection that keeps sending is served.
#[test]
fn an_agent_ends_a_connection_that_sends_nothing() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    agent_config(dir.path());
    let policy = dir.path().join("agent.yaml");
    std::fs::write(
        &policy,
        format!(
            "name: me\nconnection: local\npaths: [{}]\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let agent = |extra: &[&str]| {
        Command::new(crate::bin())
            .args(["agent", "--stdio", "--policy"])
            .arg(&policy)
            .arg("--audit")
            .arg(dir.path().join("agent-audit.jsonl"))
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Nothing sent: the stdin pipe stays open and silent.
    let started = Instant::now();
    let mut silent = agent(&["--request-timeout", "1s"]);
    let _hold = silent.stdin.take();
    let out = silent.wait_with_output().unwrap();
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("no request within 1s"), "{said}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // One request, then silence: answered, then ended after the idle timeout.
    let mut once = agent(&["--request-timeout", "5s", "--idle-timeout", "1s"]);
    let mut stdin = once.stdin.take().unwrap();
    let data = dir.path().join("data");
    writeln!(
        stdin,
        "{}",
        json!({ "run_id": "r1", "step": 1, "runbook": "look", "tool": "disk_usage", "args": { "path": data } })
    )
    .unwrap();
    let out = once.wait_with_output().unwrap();
    drop(stdin);
    let said = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert!(lines[0].contains("\"result\""), "{said}");
    assert!(lines[1].contains("no request within 1s"), "{said}");
}

/// Calls to this machine through its agent's socket: a call goes through
/// the real agent, which writes its own audit line and whose policy wins;
/// with no agent listening nothing is sent, a change included, and the
/// run says which socket to look at.
#[test]
fn this_machine_through_its_agent_socket_and_without_it() {
    // No agent listening: nothing is sent, the run fails naming the socket.
    let dir = tempfile::tempdir().unwrap();
    let socket = agent_config(dir.path());
    // The runner's permit key exists (install print makes it), so a change
    // is refused for the socket alone.
    install_print(dir.path());
    for runbook in ["look", "fix"] {
        let (code, report) = run_json(dir.path(), runbook);
        assert_eq!(code, Some(1), "{runbook}: {report:#}");
        let error = report["steps"][0]["result"]["error"].as_str().unwrap_or("");
        assert!(
            error.starts_with("not sent") && error.contains(&socket.display().to_string()),
            "{runbook}: {report:#}"
        );
    }

    // The agent listening: a tier-1 call goes through it and its audit log.
    let _policy = agent_socket(dir.path(), &socket, &dir.path().join("data"));
    let (code, report) = run_json(dir.path(), "look");
    assert_eq!(code, Some(0), "{report:#}");
    assert!(
        report["steps"][0]["result"]["data"]["size_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{report:#}"
    );
    let agent_audit = std::fs::read_to_string(dir.path().join("agent-audit.jsonl")).unwrap();
    assert!(agent_audit.contains("disk_usage"), "{agent_audit}");

    // The agent's own policy wins over the runner's host file.
    let other = tempfile::tempdir().unwrap();
    let socket = agent_config(other.path());
    agent_socket(other.path(), &socket, Path::new("/nonexistent-elsewhere"));
    let (code, report) = run_json(other.path(), "look");
    assert_eq!(code, Some(1), "{report:#}");
    assert!(
        report["steps"][0]["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{report:#}"
    );
}

//! The adversarial scope suite: attempts to make runwarden run something
//! outside a runbook's scope, each with the decision expected of the gate
//! (or of the host's agent). Zero may get through.
//!
//! Channels: alert labels that feed runbook templates (`run --alert`, the
//! same context the webhook builds), annotations with template syntax,
//! crafted host names, unit names with shell metacharacters and systemd
//! escapes, paths that escape an allowed prefix (`..`, symlinks, a bind
//! mount of another directory, prefix tricks), and the agent's stdin
//! protocol on a managed host.
//! Text a model reads is covered by the injection table in `model.rs`.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::util::*;

/// The estate: host `web-01` (a unit, an allowed directory with a symlink
/// and a bind mount of /etc inside it, a rotatable log), host `db-01` that no
/// runbook may touch, and three probe runbooks fed by alert labels.
struct Probe {
    /// Declared first: unmounted before the estate's directory is removed.
    _bind: Option<BindMount>,
    e: Estate,
    allowed: String,
    conf: String,
}

struct BindMount(std::path::PathBuf);

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("/usr/bin/umount").arg(&self.0).output();
    }
}

fn probe() -> Probe {
    let e = Estate::new();
    let allowed = e.work().join("allowed");
    std::fs::create_dir_all(allowed.join("sub")).unwrap();
    // A bind mount inside the allowed directory of a directory outside it.
    // Its source belongs to the test: removing the estate must never be able
    // to reach anything else, even if the unmount failed.
    let outside = e.work().join("outside");
    std::fs::create_dir_all(outside.join("ssh")).unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("etc-link")).unwrap();
    std::fs::create_dir_all(allowed.join("bind")).unwrap();
    let bind = Command::new("/usr/bin/mount")
        .arg("--bind")
        .arg(&outside)
        .arg(allowed.join("bind"))
        .status()
        .unwrap()
        .success()
        .then(|| BindMount(allowed.join("bind")));
    assert!(bind.is_some(), "mount --bind");
    std::fs::create_dir_all(e.work().join("allowedx")).unwrap();
    let (conf, state) = rotatable_log(&e);
    let allowed = allowed.display().to_string();
    e.host(
        "web-01",
        &local_host(
            "web-01",
            &format!("units: [nginx.service]\npaths: [{allowed}]\nlogrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    e.host(
        "db-01",
        &local_host("db-01", "paths: [/]\nunits: [postgresql.service]"),
    );
    let head = |name: &str, tools: &str| {
        format!("name: {name}\ndescription: probe\nhosts: [web-01]\nautonomy: L3\ntools: {tools}\n")
    };
    e.runbook(
        "unit-probe",
        &(head("unit-probe", "{ observe: [service_status] }")
            + "steps:\n  - call: service_status\n    args: { unit: \"{{ alert.labels.unit }}\" }\n"),
    );
    e.runbook(
        "path-probe",
        &(head("path-probe", "{ observe: [disk_usage] }")
            + "steps:\n  - call: disk_usage\n    args: { path: \"{{ alert.labels.path }}\" }\n"),
    );
    e.runbook(
        "rotate-probe",
        &(head("rotate-probe", "{ approve: [rotate_logs] }")
            + "steps:\n  - call: rotate_logs\n    args: { config: \"{{ alert.labels.config }}\" }\n    reason: \"{{ alert.annotations.summary }}\"\n"),
    );
    Probe {
        _bind: bind,
        e,
        allowed,
        conf,
    }
}

/// What happened to the one call of a probe run.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Refused by the gate with this reason.
    Denied(String),
    /// Allowed, with these arguments and reason as audited.
    Allowed(Value, Option<String>),
    /// Refused before any call (usage error: nothing ran, nothing audited).
    NotRun,
}

fn run_probe(p: &Probe, runbook: &str, host: &str, alert: Value) -> Seen {
    let before = p.e.audit().len();
    let file = p.e.work().join("alert.json");
    std::fs::write(&file, alert.to_string()).unwrap();
    let out = p.e.run(&[
        "run",
        runbook,
        "--host",
        host,
        "--alert",
        file.to_str().unwrap(),
        "--json",
    ]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    let lines: Vec<Value> = p.e.audit().into_iter().skip(before).collect();
    if lines.is_empty() {
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return Seen::NotRun;
    }
    if let Some(d) = lines.iter().find(|l| l["phase"] == "denied") {
        assert!(lines.iter().all(|l| l["phase"] != "intent"), "{lines:#?}");
        return Seen::Denied(d["detail"]["reason"].as_str().unwrap().to_string());
    }
    let intent = lines
        .iter()
        .find(|l| l["phase"] == "intent")
        .expect("a decision");
    Seen::Allowed(
        intent["args"].clone(),
        intent["reason"].as_str().map(String::from),
    )
}

fn denied(reason: &str) -> Seen {
    Seen::Denied(reason.into())
}

#[test]
fn nothing_out_of_scope_gets_through() {
    let p = probe();
    let a = p.allowed.clone();
    let mut attempts = 0;
    let mut check = |what: &str, runbook: &str, host: &str, alert: Value, expected: Seen| {
        attempts += 1;
        let seen = run_probe(&p, runbook, host, alert);
        assert_eq!(seen, expected, "attempt {attempts}: {what}");
    };

    // Unit names from an alert label: shell metacharacters, systemd escapes, lookalikes.
    for unit in [
        "nginx.service; reboot",
        "nginx.service && id",
        "$(id).service",
        "`id`.service",
        "nginx.service | sh",
        "nginx.service\nExecStart=/bin/sh",
        "../../etc/shadow",
        "/etc/systemd/system/evil.service",
        "--force",
        "-H root@db-01 nginx.service",
        "nginx\\x2eservice",
        "ngіnx.service",
        "nginx.service\u{0}",
        "nginx.service ",
        "NGINX.service",
        "nginx.*",
        "*",
        "sshd.service",
        "postgresql.service",
        "{{ 7 * 7 }}.service",
        &"a".repeat(10_000),
    ] {
        check(
            &format!("unit {unit:?}"),
            "unit-probe",
            "web-01",
            json!({ "labels": { "unit": unit } }),
            denied("invalid_arguments"),
        );
    }

    // Paths from an alert label that try to leave the allowed directory.
    for path in [
        "/etc".to_string(),
        "/".to_string(),
        format!("{a}/../../etc"),
        format!("{a}/sub/../../allowedx"),
        format!("{a}x"),
        format!("{a}/etc-link"),
        format!("{a}/etc-link/ssh"),
        format!("{a}/bind"),
        format!("{a}/bind/ssh"),
        "relative/path".to_string(),
        format!("{a}\u{0}/sub"),
        "~root".to_string(),
        "$HOME".to_string(),
        format!("{a}/*"),
        format!("{a}/missing/../../../etc"),
        "-h /".to_string(),
    ] {
        check(
            &format!("path {path:?}"),
            "path-probe",
            "web-01",
            json!({ "labels": { "path": path } }),
            denied("invalid_arguments"),
        );
    }
    // The allowed directory itself and a directory in it are fine (the suite can tell).
    for path in [a.clone(), format!("{a}/sub"), format!("{a}/sub/../sub")] {
        let canonical = std::fs::canonicalize(&path).unwrap();
        check(
            &format!("path {path:?}"),
            "path-probe",
            "web-01",
            json!({ "labels": { "path": path } }),
            Seen::Allowed(json!({ "path": canonical }), None),
        );
    }

    // Changes: a config outside the allowlist, or the allowed one with decorations.
    for config in [
        "/etc/logrotate.conf".to_string(),
        format!("{}; id", p.conf),
        format!("{} --debug", p.conf),
        format!("{}/../lr.conf", p.conf),
        format!("-s /tmp/x {}", p.conf),
    ] {
        check(
            &format!("logrotate config {config:?}"),
            "rotate-probe",
            "web-01",
            json!({ "labels": { "config": config }, "annotations": { "summary": "disk full" } }),
            denied("invalid_arguments"),
        );
    }
    // Template syntax in an annotation is text: the reason is recorded literally, never evaluated.
    for summary in [
        "{{ 7 * 7 }}",
        "{% for x in range(1000000000) %}x{% endfor %}",
        "{{ alert.labels }} {{ run.id }}",
    ] {
        check(
            &format!("annotation {summary:?}"),
            "rotate-probe",
            "web-01",
            json!({ "labels": { "config": p.conf }, "annotations": { "summary": summary } }),
            Seen::Allowed(json!({ "config": p.conf }), Some(summary.to_string())),
        );
    }

    // Hosts: one the runbook does not name, and names crafted to look like one it does.
    check(
        "a host the runbook does not name",
        "unit-probe",
        "db-01",
        json!({ "labels": { "unit": "postgresql.service" } }),
        Seen::NotRun,
    );
    for host in [
        "web-01;id",
        "../hosts/web-01",
        "web-01\n",
        "WEB-01",
        "web-01 db-01",
    ] {
        check(
            &format!("host {host:?}"),
            "unit-probe",
            host,
            json!({ "labels": { "unit": "nginx.service" } }),
            Seen::NotRun,
        );
    }

    assert!(attempts >= 50, "{attempts} attempts");
    println!("adversarial scope suite: {attempts} attempts through the gate, 0 got through");
    assert!(p.e.run(&["audit", "verify"]).status.success());
}

#[test]
fn the_agent_refuses_what_its_own_policy_does_not_allow() {
    // The forced-command agent, fed raw lines on stdin as an SSH client would.
    let e = Estate::new();
    let allowed = e.work().join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(e.work().join("outside")).unwrap();
    std::os::unix::fs::symlink(e.work().join("outside"), allowed.join("etc-link")).unwrap();
    let a = allowed.display().to_string();
    let policy = e.work().join("agent.yaml");
    std::fs::write(
        &policy,
        format!(
            "name: web-01\nconnection: local\njail: {}/jail\npaths: [{a}]\nunits: []\n",
            e.work().display()
        ),
    )
    .unwrap();
    let audit = e.work().join("agent-audit.jsonl");
    let req = |tool: &str, args: Value| {
        json!({ "run_id": "r1", "step": 1, "runbook": "probe", "tool": tool, "args": args })
            .to_string()
    };
    let lines: Vec<(&str, String)> = vec![
        ("not JSON", "restart nginx".into()),
        ("a shell command field", r#"{"run_id":"r1","step":1,"runbook":"p","tool":"disk_usage","args":{"path":"/"},"cmd":"id"}"#.into()),
        ("a step that is not a number", r#"{"run_id":"r1","step":"1; id","runbook":"p","tool":"disk_usage","args":{}}"#.into()),
        ("a tool the policy has no unit for", req("restart_service", json!({ "unit": "nginx.service", "reason": "x" }))),
        ("a tool that does not exist", req("run_shell", json!({ "cmd": "id" }))),
        ("a tool name with a NUL", req("disk_usage\u{0}", json!({ "path": a }))),
        ("a path outside the policy", req("disk_usage", json!({ "path": "/etc" }))),
        ("a path that climbs out", req("disk_usage", json!({ "path": format!("{a}/../..") }))),
        ("a symlink out", req("disk_usage", json!({ "path": format!("{a}/etc-link") }))),
        ("an argument the tool does not take", req("disk_usage", json!({ "path": a, "follow": true }))),
        ("arguments that are not an object", req("disk_usage", json!(a))),
        ("a line of 300 KiB", req("disk_usage", json!({ "path": "x".repeat(300 << 10) }))),
    ];
    let mut input = String::new();
    for (_, l) in &lines {
        input.push_str(l);
        input.push('\n');
    }
    // A run id that tries to forge a second audit line (refused: not a run
    // id a runner makes), then one allowed call.
    input.push_str(&json!({ "run_id": "r1\n{\"phase\":\"intent\",\"tool\":\"restart_service\"}", "step": 2, "runbook": "p", "tool": "disk_usage", "args": { "path": a } }).to_string());
    input.push('\n');
    input.push_str(&json!({ "run_id": "r1", "step": 3, "runbook": "p", "tool": "disk_usage", "args": { "path": a } }).to_string());
    input.push('\n');
    let mut child = Command::new(bin())
        .args(["agent", "--stdio", "--policy"])
        .arg(&policy)
        .arg("--audit")
        .arg(&audit)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let replies: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), lines.len() + 2, "one answer per line");
    for ((what, _), reply) in lines.iter().zip(&replies) {
        assert!(reply.get("refused").is_some(), "{what}: {reply}");
    }
    let forged = &replies[lines.len()];
    assert!(
        forged["refused"]
            .as_str()
            .is_some_and(|r| r.contains("is not one a runner makes")),
        "{forged}"
    );
    assert_eq!(replies.last().unwrap()["result"]["outcome"], "ok");
    let log = std::fs::read_to_string(&audit).unwrap();
    let intents: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["phase"] == "intent")
        .collect();
    assert_eq!(intents.len(), 1, "only the allowed call ran:\n{log}");
    assert_eq!(intents[0]["tool"], "disk_usage");
    assert!(
        log.lines().count() >= lines.len(),
        "each refusal is audited on the host"
    );
    assert!(
        e.run(&["audit", "verify", audit.to_str().unwrap()])
            .status
            .success()
    );
    println!(
        "agent stdin protocol: {} hostile lines, 0 got through",
        lines.len()
    );
}

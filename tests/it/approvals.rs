//! Autonomy L2 against the running daemon: a person approves or denies each
//! tier-2 call through the HTTP API, with an approver token and the digest of
//! the exact call.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::{Daemon, FIRING, results};
use crate::util::*;

const ALICE: &str = "Bearer alice-token-0123456789";
const BOB: &str = "Bearer bob-token-0123456789ab";

/// An L2 runbook for the fixture alert: look, then rotate a real log.
fn l2_estate(timeout: &str) -> Estate {
    let e = Estate::new();
    let conf = rotating_host(&e, "web-01");
    e.runbook(
        "disk-l2",
        &format!(
            "name: disk-l2\ndescription: t\nhosts: [web-01]\nautonomy: L2\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"']\n  host_label: instance\ntools: {{ observe: [disk_usage], approve: [rotate_logs] }}\nsteps:\n  - id: look\n    call: disk_usage\n    args: {{ path: /tmp }}\n  - id: rotate\n    call: rotate_logs\n    args: {{ config: {} }}\n    reason: \"/tmp at {{{{ steps.look.use_pct }}}}%\"\n",
            conf
        ),
    );
    write_secret(
        &e.path().join("approvers"),
        "# people who may approve\nalice alice-token-0123456789\nbob bob-token-0123456789ab\n",
    );
    std::fs::write(
        e.path().join("runwarden.yaml"),
        format!("approvers_file: approvers\napproval_timeout: {timeout}\n"),
    )
    .unwrap();
    e
}

fn state_file(e: &Estate) -> std::path::PathBuf {
    e.work().join("lr.state")
}

/// Post the alert and wait for its approval request.
fn pending(d: &Daemon) -> Value {
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    waiting(d, ALICE)
}

/// The first request still pending, as `token` lists it, within 10 s.
fn waiting(d: &Daemon, token: &str) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) =
            d.request("GET", "/api/v1/approvals", &[("Authorization", token)], b"");
        assert_eq!(status, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        if let Some(r) = list["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == "pending")
        {
            return r.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no approval request"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn decide(d: &Daemon, who: &str, id: &str, action: &str, digest: &str) -> (u16, String) {
    let body = json!({ "digest": digest, "comment": "checked the host" }).to_string();
    d.request(
        "POST",
        &format!("/api/v1/approvals/{id}/{action}"),
        &[("Authorization", who), ("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

fn id_digest(r: &Value) -> (String, String) {
    (
        r["id"].as_str().unwrap().to_string(),
        r["digest"].as_str().unwrap().to_string(),
    )
}

#[test]
fn an_approved_call_runs_with_the_approver_in_the_audit_line() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let r = pending(&d);
    assert_eq!(r["tool"], "rotate_logs");
    assert!(
        r["reason"].as_str().unwrap().starts_with("/tmp at "),
        "{r:#}"
    );
    assert_eq!(
        r["findings"]["look"]["ok"], true,
        "the findings so far are shown"
    );
    assert!(!state_file(&e).exists(), "nothing runs before a decision");
    let (id, digest) = id_digest(&r);
    let (status, body) = decide(&d, ALICE, &id, "approve", &digest);
    assert_eq!(status, 200, "{body}");
    let runs = d.settled_runs();
    assert_eq!(runs[0]["status"], "ok", "{runs:#?}");
    assert!(state_file(&e).exists(), "logrotate ran");
    let intent = e
        .audit_phase("intent")
        .into_iter()
        .find(|l| l["tool"] == "rotate_logs")
        .unwrap();
    assert_eq!(intent["approved_by"], "person:alice");
    assert_eq!(e.audit_phase("pending").len(), 1);
    assert_eq!(
        d.metric(
            r#"runwarden_approvals_total{decision="approved",runbook="disk-l2",tool="rotate_logs"}"#
        ),
        1.0
    );
}

#[test]
fn a_denied_call_never_runs() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    assert_eq!(decide(&d, BOB, &id, "deny", &digest).0, 200);
    assert_eq!(d.settled_runs()[0]["status"], "denied");
    assert!(!state_file(&e).exists());
    let denied = e.audit_phase("denied");
    assert_eq!(denied[0]["detail"]["reason"], "approval_denied");
    assert!(
        denied[0]["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("bob denied")
    );
}

#[test]
fn an_unanswered_request_expires_as_a_denial() {
    let e = l2_estate("1s");
    let d = Daemon::start(&e);
    pending(&d);
    assert_eq!(d.settled_runs()[0]["status"], "denied");
    assert_eq!(
        e.audit_phase("denied")[0]["detail"]["reason"],
        "approval_expired"
    );
    assert!(!state_file(&e).exists());
    assert_eq!(
        d.metric(
            r#"runwarden_approvals_total{decision="expired",runbook="disk-l2",tool="rotate_logs"}"#
        ),
        1.0
    );
}

#[test]
fn a_stale_digest_or_a_wrong_token_approves_nothing() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    let stale = "0".repeat(64);
    let (status, body) = decide(&d, ALICE, &id, "approve", &stale);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("digest does not match"));
    let (status, _) = decide(&d, "Bearer not-an-approver-000000", &id, "approve", &digest);
    assert_eq!(status, 401);
    let (status, _) = d.request("GET", "/api/v1/approvals", &[], b"");
    assert_eq!(status, 401);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!state_file(&e).exists(), "nothing ran");
    assert_eq!(
        decide(&d, ALICE, &id, "approve", &digest).0,
        200,
        "the request was still pending"
    );
    assert_eq!(d.settled_runs()[0]["status"], "ok");
}

#[test]
fn the_kill_switch_cancels_a_waiting_request() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    std::fs::write(e.path().join("kill-switch/ENGAGED"), "").unwrap();
    assert_eq!(d.settled_runs()[0]["status"], "halted");
    let (_, body) = d.request(
        "GET",
        &format!("/api/v1/approvals/{id}"),
        &[("Authorization", ALICE)],
        b"",
    );
    assert!(body.contains("\"state\":\"cancelled\""), "{body}");
    assert_eq!(decide(&d, ALICE, &id, "approve", &digest).0, 409);
    assert!(!state_file(&e).exists());
}

#[test]
fn racing_approvers_exactly_one_decision_counts() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| decide(&d, ALICE, &id, "approve", &digest).0);
        let b = s.spawn(|| decide(&d, BOB, &id, "deny", &digest).0);
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut codes = [a, b];
    codes.sort();
    assert_eq!(codes, [200, 409]);
    let verdict = d.settled_runs()[0]["status"].as_str().unwrap().to_string();
    assert_eq!(
        verdict == "ok",
        a == 200,
        "the run followed the decision that counted"
    );
    assert_eq!(state_file(&e).exists(), a == 200);
}

#[test]
fn a_request_does_not_survive_a_restart() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    d.signal(nix::sys::signal::Signal::SIGKILL);
    drop(d);
    let d = Daemon::start(&e);
    let (status, body) = decide(&d, ALICE, &id, "approve", &digest);
    assert_eq!(status, 404, "{body}");
    assert_eq!(d.settled_runs()[0]["status"], "interrupted");
    assert!(!state_file(&e).exists());
}

#[test]
fn l2_on_the_command_line_asks_nobody_and_runs_nothing() {
    let e = l2_estate("5m");
    let (code, report) = e.run_json("disk-l2", "web-01", &[]);
    assert_eq!(code, 3, "{report:#}");
    assert!(
        step(&report, "rotate")["detail"]
            .as_str()
            .unwrap()
            .contains("no_approver")
    );
    assert!(!state_file(&e).exists());
}

#[test]
fn the_cli_approves_the_call_it_showed_and_promote_report_counts_it() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, _) = id_digest(&pending(&d));
    let token = e.work().join("my-token");
    write_secret(&token, "alice-token-0123456789\n");
    let daemon = format!("http://{}", d.addr);
    let cli = |args: &[&str]| {
        let mut all = vec!["approvals"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--daemon", &daemon, "--token-file", token.to_str().unwrap()]);
        e.run(&all)
    };
    let out = cli(&["list"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
    // How long the oldest request has waited is a gauge on-call can see.
    let started = std::time::Instant::now();
    while d.metric("runwarden_approval_oldest_pending_seconds") <= 0.0 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the oldest pending request's age never showed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = cli(&["approve", &id, "--comment", "looked at it"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("approving disk-l2 on web-01: rotate_logs") && text.contains("approved"),
        "{text}"
    );
    assert_eq!(d.settled_runs()[0]["status"], "ok");
    // A decided request says so before anything else, and nothing is sent.
    for verb in ["approve", "deny"] {
        let out = cli(&[verb, &id]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{verb}: {err}");
        assert!(
            err.contains(&format!(
                "request {id} is already approved by alice: nothing was sent"
            )),
            "{verb}: {err}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("approving"));
    }
    let out = cli(&["list", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["approvals"][0]["id"], id.as_str(), "{listed}");
    assert_eq!(listed["approvals"][0]["state"], "approved", "{listed}");

    let out = e.run(&["promote-report", "disk-l2", "--since", "1h", "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["report"]["runs"], 1, "{json}");
    assert_eq!(
        json["report"]["tier2_calls"]["rotate_logs"]["approved"], 1,
        "{json}"
    );

    let out = e.run(&["promote-report", "disk-l2", "--since", "1h"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("runs: 1"), "{report}");
    let row = report
        .lines()
        .find(|l| l.trim_start().starts_with("rotate_logs"))
        .unwrap();
    let counts: Vec<&str> = row.split_whitespace().skip(1).collect();
    assert_eq!(counts, ["0", "1", "0", "0", "0"], "{report}");
    assert!(report.contains("calls a person denied: 0"));
}

/// Sleep until `ms` milliseconds after the request's `expires_at`.
fn sleep_past_expiry(r: &Value, ms: i64) {
    let expires: jiff::Timestamp = r["expires_at"].as_str().unwrap().parse().unwrap();
    let target = expires + jiff::SignedDuration::from_millis(ms);
    let wait = target.duration_since(jiff::Timestamp::now());
    if wait.is_positive() {
        std::thread::sleep(Duration::try_from(wait).unwrap());
    }
}

#[test]
fn a_decision_after_expires_at_is_refused_however_late() {
    for late_ms in [2, 30, 80] {
        let e = l2_estate("2s");
        let d = Daemon::start(&e);
        let r = pending(&d);
        let (id, digest) = id_digest(&r);
        sleep_past_expiry(&r, late_ms);
        let (status, body) = decide(&d, ALICE, &id, "approve", &digest);
        assert_eq!(status, 409, "{late_ms} ms late: {body}");
        assert!(body.contains("expired"), "{body}");
        let runs = d.settled_runs();
        assert_eq!(runs[0]["status"], "denied", "{late_ms} ms late: {runs:#?}");
        assert!(!state_file(&e).exists(), "{late_ms} ms late: nothing ran");
        let denied = e.audit_phase("denied");
        assert_eq!(denied[0]["detail"]["reason"], "approval_expired");
    }
}

#[test]
fn secret_files_anyone_else_can_read_are_refused_with_the_fix() {
    // The approvers file.
    let e = l2_estate("5m");
    std::fs::set_permissions(
        e.path().join("approvers"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let out = e.run(&["serve", "--listen", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("principals file") && err.contains("chmod 600"),
        "{err}"
    );
    // The webhook token.
    let e = l2_estate("5m");
    std::fs::write(e.path().join("token"), "a-token-0123456789abcdef").unwrap();
    std::fs::set_permissions(
        e.path().join("token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "approvers_file: approvers\nwebhook_token_file: token\n",
    )
    .unwrap();
    let out = e.run(&["serve", "--listen", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("webhook_token_file") && err.contains("640"),
        "{err}"
    );
    // An approver's own token file for the CLI.
    let token = e.work().join("mine");
    std::fs::write(&token, "alice-token-0123456789").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o604)).unwrap();
    let out = e.run(&[
        "approvals",
        "list",
        "--daemon",
        "http://127.0.0.1:9",
        "--token-file",
        token.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
}

#[test]
fn sighup_rereads_the_approvers_so_a_revoked_approver_is_revoked() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let r = pending(&d);
    let (id, digest) = id_digest(&r);
    // Bob leaves on-call.
    write_secret(
        &e.path().join("approvers"),
        "alice alice-token-0123456789\n",
    );
    let reloads = |d: &Daemon| d.metric(r#"runwarden_config_reloads_total{result="success"}"#);
    let before = reloads(&d);
    d.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the reload", Duration::from_secs(10), || {
        (reloads(&d) > before).then_some(())
    });
    let (status, body) = decide(&d, BOB, &id, "approve", &digest);
    assert_eq!(status, 401, "{body}");
    assert!(!state_file(&e).exists(), "bob's approval ran nothing");
    let (status, body) = decide(&d, ALICE, &id, "approve", &digest);
    assert_eq!(status, 200, "{body}");
    assert_eq!(d.settled_runs()[0]["status"], "ok");
}

const RESOLVED: &str = include_str!("../fixtures/alertmanager/resolved-two-alerts.json");

/// Alertmanager says the alert resolved while the run's tier-2 call waits
/// for a person: the request is withdrawn (the answer names it), the run
/// ends at once with its own reason and runs nothing, the audit log says
/// why, and a decision that arrives afterwards approves nothing.
/// A loopback HTTP server standing in for a chat bridge: every body POSTed
/// to it, as it came.
fn chat_bridge() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(&conn);
            let mut length = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok()
                && let Ok(v) = serde_json::from_slice(&body)
            {
                seen.lock().unwrap().push(v);
            }
            let _ = (&conn).write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
        }
    });
    (url, bodies)
}

#[test]
fn a_resolved_alert_withdraws_the_request_its_run_waits_on() {
    let e = l2_estate("5m");
    let (url, told) = chat_bridge();
    let settings = e.path().join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(&settings, format!("{text}approval_webhook: {url}\n")).unwrap();
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    let (status, answer) = d.post_alerts(RESOLVED);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["withdrawn"][0]["approval_id"],
        id.as_str(),
        "{answer}"
    );
    let run = &d.settled_runs()[0];
    assert_eq!(run["status"], "denied", "{run:#}");
    let (_, body) = d.request(
        "GET",
        &format!("/api/v1/approvals/{id}"),
        &[("Authorization", ALICE)],
        b"",
    );
    assert!(body.contains("\"state\":\"withdrawn\""), "{body}");
    let (status, body) = decide(&d, ALICE, &id, "approve", &digest);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("withdrawn"), "{body}");
    let denied = e.audit_phase("denied");
    assert_eq!(denied.len(), 1, "{denied:#?}");
    assert_eq!(
        denied[0]["detail"]["reason"], "alert_resolved",
        "{:#}",
        denied[0]
    );
    assert!(!state_file(&e).exists(), "nothing rotated");
    // The approver was asked, then told it is no longer needed.
    let states = wait_for("both messages", Duration::from_secs(10), || {
        let told = told.lock().unwrap();
        let states: Vec<String> = told
            .iter()
            .filter(|b| b["id"] == id.as_str())
            .map(|b| b["state"].as_str().unwrap_or_default().to_string())
            .collect();
        (states.len() == 2).then_some(states)
    });
    assert_eq!(states, ["pending", "withdrawn"]);
    let metrics = d.request("GET", "/metrics", &[], b"").1;
    assert!(
        metrics.contains("decision=\"withdrawn\""),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("approvals_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `on_resolved: ignore` keeps the request waiting for a person, and an
/// alert of another fingerprint never withdraws a run's request: a person
/// still decides, and the approved call runs.
#[test]
fn a_request_stays_when_the_runbook_ignores_resolution_or_another_alert_resolved() {
    let e = l2_estate("5m");
    let d = Daemon::start(&e);
    let (id, digest) = id_digest(&pending(&d));
    // Another alert on the same host resolved: not this run's.
    let other = RESOLVED.replace("d262fe820fddf66b", "0000000000000000");
    let other = other.replacen("\"fingerprint\":\"", "\"fingerprint\":\"x", 2);
    let (_, answer) = d.post_alerts(&other);
    assert_eq!(answer["withdrawn"], json!([]), "{answer}");
    let rb = e.path().join("runbooks/disk-l2.yaml");
    let text = std::fs::read_to_string(&rb).unwrap();
    std::fs::write(&rb, format!("{text}on_resolved: ignore\n")).unwrap();
    wait_for("the reload", Duration::from_secs(10), || {
        d.request("GET", "/metrics", &[], b"")
            .1
            .contains("runwarden_config_reloads_total{result=\"success\"} 1")
            .then_some(())
    });
    let (_, answer) = d.post_alerts(RESOLVED);
    assert_eq!(answer["withdrawn"], json!([]), "{answer}");
    let (status, body) = decide(&d, ALICE, &id, "approve", &digest);
    assert_eq!(status, 200, "{body}");
    assert_eq!(d.settled_runs()[0]["status"], "ok");
    assert!(state_file(&e).exists(), "the approved rotation ran");
}

/// Principals instead of the approvers file: alice starts the run and may
/// approve disk-*, carol may approve disk-*, bob may approve other-* only;
/// the runbook takes four eyes.
fn principals_estate() -> Estate {
    let e = l2_estate("5m");
    let path = e.path().join("runbooks/disk-l2.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}four_eyes: true\n")).unwrap();
    let grant = |name: &str, approve: &str, extra: &str| {
        format!(
            "  {name}:\n    tokens: [{{ id: {name}-1, sha256: {} }}]\n    scopes:\n      approve: {{ runbooks: [\"{approve}\"] }}\n{extra}",
            sha256_hex(&format!("{name}-token-0123456789abcdef"))
        )
    };
    write_secret(
        &e.path().join("principals.yaml"),
        &format!(
            "principals:\n{}{}{}",
            grant(
                "alice",
                "disk-*",
                "      run:trigger: { runbooks: [disk-l2] }\n      run:read: {}\n"
            ),
            grant("bob", "other-*", ""),
            grant("carol", "disk-*", ""),
        ),
    );
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "principals_file: principals.yaml\napproval_timeout: 5m\n",
    )
    .unwrap();
    e
}

fn bearer(name: &str) -> String {
    format!("Bearer {name}-token-0123456789abcdef")
}

/// Who may decide is the token's principal, for the runbooks its grant
/// names, never the person who started the run under four eyes, and never
/// a name in the body; each decision, allowed or refused, is audited with
/// the principal and the token's id before it is taken.
#[test]
fn an_approval_is_the_tokens_principals_within_its_scope_and_four_eyes() {
    let e = principals_estate();
    let d = Daemon::start(&e);
    let alice = bearer("alice");
    let start = json!({ "runbook": "disk-l2", "hosts": ["web-01"] }).to_string();
    let (status, body) = d.request(
        "POST",
        "/api/v1/runs",
        &[
            ("Authorization", &alice),
            ("Content-Type", "application/json"),
        ],
        start.as_bytes(),
    );
    assert_eq!(status, 202, "{body}");
    let r = waiting(&d, &alice);
    assert_eq!(r["requested_by"], "alice", "{r:#}");
    let (id, digest) = id_digest(&r);

    let (status, body) = decide(&d, &bearer("bob"), &id, "approve", &digest);
    assert_eq!(status, 403, "bob's grant is for other-*: {body}");
    assert!(
        body.contains("holds approve only for runbooks other-*"),
        "{body}"
    );
    let (status, body) = decide(&d, &alice, &id, "approve", &digest);
    assert_eq!(status, 403, "four eyes: {body}");
    assert!(body.contains("four eyes"), "{body}");
    let named = json!({ "digest": digest, "by": "carol" }).to_string();
    let (status, body) = d.request(
        "POST",
        &format!("/api/v1/approvals/{id}/approve"),
        &[
            ("Authorization", &alice),
            ("Content-Type", "application/json"),
        ],
        named.as_bytes(),
    );
    assert_eq!(status, 400, "a body naming the approver: {body}");
    assert!(!state_file(&e).exists(), "nothing ran");

    let (status, body) = decide(&d, &bearer("carol"), &id, "approve", &digest);
    assert_eq!(status, 200, "{body}");
    assert_eq!(d.settled_runs()[0]["status"], "ok");
    assert!(state_file(&e).exists(), "logrotate ran");
    let intent = e
        .audit_phase("intent")
        .into_iter()
        .find(|l| l["tool"] == "rotate_logs")
        .unwrap();
    assert_eq!(intent["approved_by"], "person:carol");
    let access: Vec<(String, String, String)> = e
        .audit_phase("access")
        .iter()
        .map(|l| {
            (
                l["detail"]["principal"].as_str().unwrap().to_string(),
                l["detail"]["token_id"].as_str().unwrap().to_string(),
                l["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("bob", "bob-1", "refused"),
        ("alice", "alice-1", "refused"),
        ("carol", "carol-1", "allowed"),
    ];
    assert_eq!(
        access,
        want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())),
    );
    let log = serde_json::to_string(&e.audit()).unwrap();
    assert!(
        log.contains("carol-1") && !log.contains("token-0123456789abcdef"),
        "the token's id, never the token"
    );
}

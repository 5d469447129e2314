//! Principals and scopes through the daemon's API: each token does what
//! its principal's grants say, for the runbooks they name, and nothing
//! more; an expired token is refused; the webhook token keeps what it had.

use super::*;

const AM: &str = "am-token-0123456789abcdef";
const OPS: &str = "ops-token-0123456789abcdef";
const OLD: &str = "old-token-0123456789abcdef";
const BOTH: &str = "both-token-0123456789abcdef";
const ONCALL: &str = "oncall-token-0123456789abcdef";
const LEAD: &str = "lead-token-0123456789abcdef";

fn sha(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn principals(dir: &Path) {
    let f = dir.join("principals.yaml");
    std::fs::write(
        &f,
        format!(
            "principals:\n\
             \x20 alertmanager:\n\
             \x20   tokens: [{{ id: am-1, sha256: {} }}]\n\
             \x20   scopes:\n\
             \x20     run:trigger: {{ runbooks: [\"cert-*\"] }}\n\
             \x20 ops:\n\
             \x20   tokens: [{{ id: ops-1, sha256: {} }}, {{ id: ops-old, sha256: {}, expires: 2020-01-01 }}]\n\
             \x20   scopes:\n\
             \x20     run:trigger: {{ runbooks: [disk] }}\n\
             \x20     run:read: {{ runbooks: [disk] }}\n\
             \x20     kill:engage: {{ runbooks: [disk] }}\n\
             \x20 both:\n\
             \x20   tokens: [{{ id: both-1, sha256: {} }}]\n\
             \x20   scopes:\n\
             \x20     run:trigger: {{}}\n\
             \x20     approve: {{}}\n\
             \x20 oncall:\n\
             \x20   tokens: [{{ id: oncall-1, sha256: {} }}]\n\
             \x20   scopes:\n\
             \x20     kill:engage: {{}}\n\
             \x20     run:read: {{}}\n\
             \x20 lead:\n\
             \x20   tokens: [{{ id: lead-1, sha256: {} }}]\n\
             \x20   scopes:\n\
             \x20     kill:release: {{}}\n",
            sha(AM),
            sha(OPS),
            sha(OLD),
            sha(BOTH),
            sha(ONCALL),
            sha(LEAD)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let settings = dir.join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(
        &settings,
        format!("{text}principals_file: principals.yaml\n"),
    )
    .unwrap();
}

async fn call(
    d: &Daemon,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let c = client();
    let mut r = match method {
        "GET" => c.get(d.url(path)),
        "DELETE" => c.delete(d.url(path)),
        _ => c.post(d.url(path)),
    }
    .bearer_auth(token);
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, json_of(r).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_does_what_its_principal_is_granted_and_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    principals(dir.path());
    let d = Daemon::start(dir.path()).await;
    let run = serde_json::json!({ "runbook": "disk", "hosts": ["web-01"] });

    // Alertmanager's token may start cert-* only: the disk alert is out
    // of its scope, answered and recorded as such, and starts nothing.
    let (status, body) = call(&d, "POST", "/api/v1/alerts", AM, Some(notification())).await;
    assert_eq!(status, 200, "{body}");
    let first = &body["outcomes"][0];
    assert_eq!(first["result"], "out_of_scope", "{body}");
    assert!(
        first["why"].as_str().unwrap().contains(
            "alertmanager (token am-1) holds run:trigger only for runbooks cert-*, not for runbook \"disk\""
        ),
        "{body}"
    );
    assert!(first.get("run_id").is_none(), "{body}");
    for (method, path, body) in [
        ("POST", "/api/v1/runs", Some(run.clone())),
        ("GET", "/api/v1/runs", None),
        ("GET", "/api/v1/approvals", None),
    ] {
        let (status, answer) = call(&d, method, path, AM, body).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
    }

    // ops may start and read disk.
    let (status, body) = call(&d, "POST", "/api/v1/runs", OPS, Some(run.clone())).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["outcomes"][0]["result"], "started", "{body}");
    let run_id = body["outcomes"][0]["run_id"].as_str().unwrap().to_string();
    let (status, body) = call(&d, "GET", &format!("/api/v1/runs/{run_id}"), OPS, None).await;
    assert_eq!(
        (status, &body["runbook"]),
        (200, &Value::from("disk")),
        "{body}"
    );

    // Its expired token is no token, and says so.
    let (status, body) = call(&d, "GET", "/api/v1/runs", OLD, None).await;
    assert_eq!(status, 401, "{body}");
    let why = body["error"].as_str().unwrap();
    assert!(
        why.contains("token ops-old of ops expired at 2020-01-01"),
        "{why}"
    );

    // A token nobody has is refused; the webhook token keeps what it had.
    let (status, _) = call(&d, "GET", "/api/v1/runs", "nobody-has-this-token-000", None).await;
    assert_eq!(status, 401);
    let (status, body) = call(&d, "GET", "/api/v1/runs", TOKEN, None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&d, "GET", "/api/v1/approvals", TOKEN, None).await;
    assert_eq!(status, 401, "the webhook token never approves: {body}");
    d.shutdown().await.unwrap();
}

/// `check` names the principals file's line when a scope is misspelt.
#[test]
fn check_refuses_a_principals_file_it_cannot_take_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    principals(dir.path());
    let f = dir.path().join("principals.yaml");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replacen("run:read:", "run:raed:", 1);
    std::fs::write(&f, text).unwrap();
    let cfg = dir.path().to_str().unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("principals.yaml:10:")
            && said.contains("unknown scope \"run:raed\" (did you mean \"run:read\"?)"),
        "{said}"
    );
}

/// `/mcp` takes a principal's token for the runbook its URL names, and
/// never one whose principal may approve: an agent would approve itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_token_may_start_its_runbook_and_never_approve() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    principals(dir.path());
    let d = Daemon::start(dir.path()).await;
    let init = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": { "name": "t", "version": "1" } }
    });
    let mcp = |token: &'static str, runbook: &'static str| {
        let body = init.to_string();
        let url = d.url(&format!("/mcp?runbook={runbook}&host=web-01"));
        async move {
            let r = client()
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, body) = mcp(BOTH, "disk").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("both holds approve"), "{body}");
    let (status, body) = mcp(AM, "disk").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("holds run:trigger only for runbooks cert-*"),
        "{body}"
    );
    let (status, body) = mcp(OLD, "disk").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = mcp(OPS, "disk").await;
    assert_eq!(status, 200, "ops may start disk: {body}");
    assert!(
        metric(
            &d,
            r#"runwarden_mcp_sessions_refused_total{reason="scope"}"#
        )
        .await
            == Some(2.0),
        "both refusals counted"
    );
    d.shutdown().await.unwrap();
}

/// The kill switch over HTTP: a principal's token holding `kill:engage`
/// for what it stops engages it (every runbook needs `runbooks: ["*"]`),
/// `kill:release` releases it, and neither is the other; every decision,
/// allowed or refused, is audited with the principal and token id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_over_http_takes_a_principal_holding_its_scope() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    principals(dir.path());
    let d = Daemon::start(dir.path()).await;
    let ks = dir.path().join("kill-switch");
    let engage = |runbook: Option<&str>| {
        let mut b = serde_json::json!({ "reason": "INC-77 disk alarms" });
        if let Some(rb) = runbook {
            b["runbook"] = rb.into();
        }
        b
    };

    // ops holds kill:engage for disk only: not every runbook at once.
    let (status, body) = call(&d, "POST", "/api/v1/kill-switch", OPS, Some(engage(None))).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("not for every runbook at once"),
        "{body}"
    );
    assert!(!ks.join("ENGAGED").exists());
    // The webhook token and Alertmanager's never stop anything.
    for token in [TOKEN, AM] {
        let (status, body) =
            call(&d, "POST", "/api/v1/kill-switch", token, Some(engage(None))).await;
        assert!(status == 401 || status == 403, "{status} {body}");
    }
    // Bad bodies are refused before anything is decided.
    for (bad, says) in [
        (serde_json::json!({}), "reason"),
        (serde_json::json!({ "reason": " " }), "reason"),
        (serde_json::json!({ "reason": "x", "for": "soon" }), "for"),
        (
            serde_json::json!({ "reason": "x", "runbook": "dsik" }),
            "did you mean \"disk\"",
        ),
        (serde_json::json!({ "reason": "x", "by": "mallory" }), "by"),
    ] {
        let (status, body) =
            call(&d, "POST", "/api/v1/kill-switch", ONCALL, Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(says),
            "{bad}: {body}"
        );
    }
    assert!(!ks.join("ENGAGED").exists());

    // ops stops disk; the file names ops and why.
    let (status, body) = call(
        &d,
        "POST",
        "/api/v1/kill-switch",
        OPS,
        Some(engage(Some("disk"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["scope"], "disk", "{body}");
    let file = std::fs::read_to_string(ks.join("disk.ENGAGED")).unwrap();
    assert!(file.contains("engaged_by: ops (token ops-1)"), "{file}");
    assert!(file.contains("reason: INC-77 disk alarms"), "{file}");
    // A run of disk is refused now.
    let run = serde_json::json!({ "runbook": "disk", "hosts": ["web-01"] });
    let (_, body) = call(&d, "POST", "/api/v1/runs", OPS, Some(run)).await;
    assert_eq!(body["outcomes"][0]["result"], "kill_switch", "{body}");

    // on-call stops everything, for an hour.
    let mut timed = engage(None);
    timed["for"] = "1h".into();
    let (status, body) = call(&d, "POST", "/api/v1/kill-switch", ONCALL, Some(timed)).await;
    assert_eq!(status, 200, "{body}");
    let until: jiff::Timestamp = body["until"].as_str().unwrap().parse().unwrap();
    let left = until.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((3500..=3600).contains(&left), "{body}");
    let (status, body) = call(&d, "GET", "/api/v1/kill-switch", ONCALL, None).await;
    assert_eq!(status, 200, "{body}");
    let scopes: Vec<&str> = body["engaged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["scope"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["global", "disk"], "{body}");

    // Engaging is not releasing.
    let (status, body) = call(&d, "DELETE", "/api/v1/kill-switch", ONCALL, None).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("holds no kill:release"),
        "{body}"
    );
    assert!(ks.join("ENGAGED").exists());
    let (status, body) = call(&d, "DELETE", "/api/v1/kill-switch", LEAD, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["was_engaged"], true, "{body}");
    assert!(!ks.join("ENGAGED").exists());
    // What still stops runs is said: disk's own switch.
    assert_eq!(body["still_engaged"][0]["scope"], "disk", "{body}");
    let (status, body) = call(&d, "DELETE", "/api/v1/kill-switch?runbook=disk", LEAD, None).await;
    assert_eq!(
        (status, &body["was_engaged"]),
        (200, &Value::from(true)),
        "{body}"
    );
    assert!(!ks.join("disk.ENGAGED").exists());

    // Every decision is in the audit log, with the token's id, never the token.
    let lines = audit_lines(dir.path());
    let access: Vec<&Value> = lines.iter().filter(|l| l["phase"] == "access").collect();
    let said: Vec<(String, String, bool)> = access
        .iter()
        .map(|l| {
            (
                l["detail"]["principal"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                l["detail"]["scope"].as_str().unwrap().to_string(),
                l["detail"]["why"].is_null(),
            )
        })
        .collect();
    for want in [
        ("ops", "kill:engage", false),
        ("ops", "kill:engage", true),
        ("oncall", "kill:engage", true),
        ("oncall", "kill:release", false),
        ("lead", "kill:release", true),
    ] {
        let want = (want.0.to_string(), want.1.to_string(), want.2);
        assert!(said.contains(&want), "{want:?} not in {said:?}");
    }
    let log = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    assert!(!log.contains(ONCALL) && !log.contains(LEAD));
    d.shutdown().await.unwrap();
}

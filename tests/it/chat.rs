//! Slack, against the shipped daemon: approval requests posted to a
//! channel and rewritten when settled however they were, clicks and
//! `/runwarden stop` taken only with Slack's signature and only as the
//! principal whose `chat:` names the clicking user.
//!
//! Slack's Web API cannot run here, so [`SlackDouble`] plays it: a
//! loopback HTTP server that records what runwarden sends and answers
//! `chat.postMessage` and `chat.update` with the responses recorded in
//! Slack's documentation (api.slack.com/methods/chat.postMessage and
//! /chat.update), and a click's `response_url` as Slack's does (`ok`).
//! What Slack sends runwarden is built as its documentation shows it (a
//! `block_actions` payload, a slash command's form) and signed as Slack
//! signs it (`v0`, HMAC-SHA256, the signing secret).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::daemon::Daemon;
use crate::util::*;

/// The app's signing secret (Slack's documented example), and the one
/// before it during a rotation.
pub const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const OLD_SECRET: &str = "0e8888abcd99yyyzzz85a58f742231b1";
const TEAM: &str = "T0RUNWARD";

/// Slack's answer to `chat.postMessage`, from its documentation.
const POSTED: &str = r#"{"ok": true, "channel": "C123ABC456", "ts": "1503435956.000247", "message": {"text": "Here's a message for you", "username": "ecto1", "bot_id": "B123ABC456", "type": "message", "subtype": "bot_message", "ts": "1503435956.000247"}}"#;
/// Slack's answer to `chat.update`, from its documentation.
const UPDATED: &str = r#"{"ok": true, "channel": "C123ABC456", "ts": "1401383885.000061", "text": "Updated text you carefully authored", "message": {"text": "Updated text you carefully authored", "user": "U34567890"}}"#;

/// One request the double received.
#[derive(Debug, Clone)]
pub struct Heard {
    pub path: String,
    pub authorization: String,
    /// Every header, its name lowercased.
    pub headers: Vec<(String, String)>,
    pub raw: Vec<u8>,
    pub body: Value,
}

/// Slack's Web API and its `response_url`s, played on loopback.
pub struct SlackDouble {
    pub base: String,
    heard: Arc<Mutex<Vec<Heard>>>,
}

impl SlackDouble {
    pub fn start() -> SlackDouble {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heard: Arc<Mutex<Vec<Heard>>> = Arc::default();
        let log = heard.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(&conn);
                    let mut first = String::new();
                    if reader.read_line(&mut first).is_err() {
                        return;
                    }
                    let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
                    let (mut length, mut authorization) = (0, String::new());
                    let mut headers = Vec::new();
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                        if let Some((k, v)) = line.split_once(':') {
                            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if lower.starts_with("authorization:") {
                            authorization = line[14..].trim().to_string();
                        }
                        line.clear();
                    }
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    let raw = body.clone();
                    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let answer = match path.as_str() {
                        "/api/chat.postMessage" => POSTED,
                        "/api/chat.update" => UPDATED,
                        _ => "ok",
                    };
                    log.lock().unwrap().push(Heard {
                        path,
                        authorization,
                        headers,
                        raw,
                        body,
                    });
                    let _ = (&conn).write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                            answer.len()
                        )
                        .as_bytes(),
                    );
                });
            }
        });
        SlackDouble { base, heard }
    }

    /// What reached `path`, in order.
    pub fn heard(&self, path: &str) -> Vec<Heard> {
        let heard = self.heard.lock().unwrap();
        heard.iter().filter(|h| h.path == path).cloned().collect()
    }

    /// Wait until `n` requests reached `path`; all of them.
    pub fn wait(&self, path: &str, n: usize) -> Vec<Heard> {
        wait_for(&format!("{n} at {path}"), Duration::from_secs(10), || {
            let got = self.heard(path);
            (got.len() >= n).then_some(got)
        })
    }

    /// The replies clickers were sent (their `response_url`s), as text.
    pub fn replies(&self) -> Vec<String> {
        self.heard("/actions/reply")
            .iter()
            .map(|h| h.body["text"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub fn wait_reply(&self, n: usize) -> String {
        self.wait("/actions/reply", n);
        self.replies()[n - 1].clone()
    }
}

/// Settings for Slack at `slack`, its secrets in files beside them.
pub fn slack_settings(e: &Estate, slack: &SlackDouble) -> String {
    write_secret(&e.path().join("slack-signing"), &format!("{SECRET}\n"));
    write_secret(
        &e.path().join("slack-bot"),
        "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy\n",
    );
    format!(
        "chat:\n  slack:\n    signing_secret_file: slack-signing\n    bot_token_file: slack-bot\n    channel: C123ABC456\n    api_url: {}/api\n",
        slack.base
    )
}

/// Headers (`NAME: VALUE`) of a request Slack signed with `secret` at `at`
/// (Unix seconds).
pub fn signed(secret: &str, at: i64, body: &[u8]) -> Vec<String> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut message = format!("v0:{at}:").into_bytes();
    message.extend_from_slice(body);
    let tag = ring::hmac::sign(&key, &message);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    vec![
        format!("X-Slack-Request-Timestamp: {at}"),
        format!("X-Slack-Signature: v0={hex}"),
        "Content-Type: application/x-www-form-urlencoded".into(),
    ]
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A `block_actions` payload as Slack's documentation shows one: `user`
/// clicked runwarden's button `action` (value `value`); its replies go
/// to the double's `/actions/reply`.
pub fn click(slack: &SlackDouble, user: &str, action: &str, value: &str) -> Vec<u8> {
    let payload = json!({
        "type": "block_actions",
        "team": { "id": TEAM, "domain": "example" },
        "user": { "id": user, "username": user.to_lowercase(), "team_id": TEAM },
        "api_app_id": "AABA1ABCD",
        "token": "9s8d9as89d8as9d8as989",
        "container": { "type": "message", "message_ts": "1503435956.000247",
                       "channel_id": "C123ABC456", "is_ephemeral": false },
        "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
        "channel": { "id": "C123ABC456", "name": "oncall" },
        "response_url": format!("{}/actions/reply", slack.base),
        "actions": [{ "action_id": action, "block_id": "runwarden",
                      "text": { "type": "plain_text", "text": "Approve", "emoji": true },
                      "value": value, "type": "button", "action_ts": "1548426417.840180" }]
    });
    form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
        .into_bytes()
}

/// A slash command's form, as Slack's documentation shows one.
fn command(user: &str, text: &str) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("token", "gIkuvaNzQIHg97ATvDxqgjtO")
        .append_pair("team_id", TEAM)
        .append_pair("team_domain", "example")
        .append_pair("channel_id", "C123ABC456")
        .append_pair("channel_name", "oncall")
        .append_pair("user_id", user)
        .append_pair("user_name", &user.to_lowercase())
        .append_pair("command", "/runwarden")
        .append_pair("text", text)
        .append_pair("response_url", "https://hooks.slack.com/commands/1234/5678")
        .append_pair("trigger_id", "13345224609.738474920.8088930838d88f008e0")
        .append_pair("api_app_id", "A123456")
        .finish()
        .into_bytes()
}

/// POST `body` to `addr`'s Slack endpoint with `headers`.
fn post_slack(addr: &str, headers: &[String], body: &[u8]) -> (u16, String) {
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    http_with(
        addr,
        "POST",
        "/api/v1/chat/slack",
        &String::from_utf8_lossy(body),
        &headers,
    )
    .expect("the daemon answers")
}

/// POST `body` to `addr`'s Slack endpoint, signed with `secret` at `at`.
pub fn send_at(addr: &str, secret: &str, at: i64, body: &[u8]) -> (u16, String) {
    post_slack(addr, &signed(secret, at, body), body)
}

fn send(d: &Daemon, body: &[u8]) -> (u16, String) {
    send_at(&d.addr, SECRET, now(), body)
}

/// An L2 runbook with four eyes; alice (Slack UALICE) starts runs and may
/// approve them, carol (UCAROL) may approve disk-*, bob (UBOB) other-*,
/// oncall (UONCALL) may stop everything, ops (UOPS) may stop disk-l2
/// only. UEVE is nobody's.
fn estate(slack: &SlackDouble) -> Estate {
    let e = Estate::new();
    let conf = rotating_host(&e, "web-01");
    e.runbook(
        "disk-l2",
        &format!(
            "name: disk-l2\ndescription: t\nhosts: [web-01]\nautonomy: L2\nfour_eyes: true\n\
             tools: {{ observe: [disk_usage], approve: [rotate_logs] }}\n\
             steps:\n  - id: look\n    call: disk_usage\n    args: {{ path: /tmp }}\n\
             \x20 - id: rotate\n    call: rotate_logs\n    args: {{ config: {conf} }}\n    reason: \"/tmp at {{{{ steps.look.use_pct }}}}%\"\n"
        ),
    );
    let person = |name: &str, user: &str, scopes: &str| {
        format!(
            "  {name}:\n    tokens: [{{ id: {name}-1, sha256: {} }}]\n    chat: [\"slack:{TEAM}/{user}\"]\n    scopes:\n{scopes}",
            sha256_hex(&format!("{name}-token-0123456789abcdef"))
        )
    };
    write_secret(
        &e.path().join("principals.yaml"),
        &format!(
            "principals:\n{}{}{}{}{}",
            person(
                "alice",
                "UALICE",
                "      run:trigger: {}\n      run:read: {}\n      approve: { runbooks: [\"disk-*\"] }\n"
            ),
            person(
                "bob",
                "UBOB",
                "      approve: { runbooks: [\"other-*\"] }\n"
            ),
            person(
                "carol",
                "UCAROL",
                "      approve: { runbooks: [\"disk-*\"] }\n"
            ),
            person("oncall", "UONCALL", "      kill:engage: {}\n"),
            person(
                "ops",
                "UOPS",
                "      kill:engage: { runbooks: [disk-l2] }\n"
            ),
        ),
    );
    std::fs::write(
        e.path().join("runwarden.yaml"),
        format!(
            "principals_file: principals.yaml\napproval_timeout: 5m\n{}",
            slack_settings(&e, slack)
        ),
    )
    .unwrap();
    e
}

fn bearer(name: &str) -> String {
    format!("Bearer {name}-token-0123456789abcdef")
}

/// alice starts disk-l2 through the API; its request, once pending.
fn start(d: &Daemon) -> Value {
    let alice = bearer("alice");
    let body = json!({ "runbook": "disk-l2", "hosts": ["web-01"] }).to_string();
    let (status, answer) = d.request(
        "POST",
        "/api/v1/runs",
        &[
            ("Authorization", &alice),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(status, 202, "{answer}");
    wait_for("a pending request", Duration::from_secs(15), || {
        let (_, body) = d.request(
            "GET",
            "/api/v1/approvals",
            &[("Authorization", &alice)],
            b"",
        );
        let list: Value = serde_json::from_str(&body).ok()?;
        list["approvals"]
            .as_array()?
            .iter()
            .find(|r| r["state"] == "pending")
            .cloned()
    })
}

fn value(r: &Value) -> String {
    format!(
        "{} {}",
        r["id"].as_str().unwrap(),
        r["digest"].as_str().unwrap()
    )
}

/// The text of a message's blocks, joined.
fn text_of(h: &Heard) -> String {
    h.body["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn access_lines(e: &Estate) -> Vec<(String, String, String)> {
    e.audit_phase("access")
        .iter()
        .map(|l| {
            (
                l["detail"]["principal"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                l["detail"]["via"].as_str().unwrap_or_default().to_string(),
                l["outcome"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Only what Slack signed with a secret in force, within five minutes, is
/// read: a wrong signature, a stale timestamp, an unsigned request and a
/// retired secret get 401 and a metric, and decide nothing; during a
/// rotation both secrets are taken.
#[test]
fn only_a_request_slack_signed_in_the_last_five_minutes_is_read() {
    let slack = SlackDouble::start();
    let e = estate(&slack);
    let d = Daemon::start(&e);
    let r = start(&d);
    let approve = click(&slack, "UCAROL", "runwarden_approve", &value(&r));

    let (status, body) = send_at(&d.addr, "not-the-secret", now(), &approve);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("matches no signing secret"), "{body}");
    let (status, body) = send_at(&d.addr, SECRET, now() - 400, &approve);
    assert_eq!(status, 401, "a replay: {body}");
    assert!(body.contains("from this machine's clock"), "{body}");
    let form = ["Content-Type: application/x-www-form-urlencoded".to_string()];
    let (status, body) = post_slack(&d.addr, &form, &approve);
    assert_eq!(status, 401, "unsigned: {body}");
    // A signature over other bytes than were sent.
    let mut tampered = approve.clone();
    tampered.extend_from_slice(b"&x=1");
    let (status, _) = post_slack(&d.addr, &signed(SECRET, now(), &approve), &tampered);
    assert_eq!(status, 401);
    let (status, body) = send_at(&d.addr, OLD_SECRET, now(), &approve);
    assert_eq!(status, 401, "the old secret before a rotation: {body}");
    for (reason, n) in [("mismatch", 3.0), ("stale", 1.0), ("unsigned", 1.0)] {
        assert_eq!(
            d.metric(&format!(
                "runwarden_chat_requests_refused_total{{reason=\"{reason}\"}}"
            )),
            n,
            "{reason}"
        );
    }
    assert!(
        access_lines(&e).is_empty(),
        "nothing was read, nothing decided"
    );
    let (_, shown) = d.request(
        "GET",
        &format!("/api/v1/approvals/{}", r["id"].as_str().unwrap()),
        &[("Authorization", &bearer("alice"))],
        b"",
    );
    assert!(shown.contains("\"state\":\"pending\""), "{shown}");

    // A rotation: the new secret on the first line, the old on the second.
    write_secret(
        &e.path().join("slack-signing"),
        &format!("{SECRET}\n{OLD_SECRET}\n"),
    );
    let (status, body) = send_at(&d.addr, OLD_SECRET, now(), &approve);
    assert_eq!(status, 200, "the old secret during a rotation: {body}");
    assert_eq!(d.settled_runs()[0]["status"], "ok");
    assert_eq!(
        slack.wait_reply(1),
        format!("approved {}", r["id"].as_str().unwrap())
    );
}

/// A click decides as the principal whose `chat:` names the user, within
/// its grants and four eyes; an unmapped user, a principal without the
/// grant and the run's own starter are refused and audited; the decision
/// is made once however often it is clicked or retried; the message
/// shows the request and is rewritten when it is settled.
#[test]
fn a_click_decides_once_as_the_mapped_principal_and_the_message_is_rewritten() {
    let slack = SlackDouble::start();
    let e = estate(&slack);
    let d = Daemon::start(&e);
    let r = start(&d);
    let id = r["id"].as_str().unwrap().to_string();
    let posted = slack.wait("/api/chat.postMessage", 1);
    assert_eq!(
        posted[0].authorization,
        "Bearer xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy"
    );
    assert_eq!(posted[0].body["channel"], "C123ABC456");
    let shown = text_of(&posted[0]);
    for want in [
        "*disk-l2* on *web-01* asks to run `rotate_logs`",
        "/tmp at ",
        "Budget left:",
        r["digest"].as_str().unwrap(),
        r["expires_at"].as_str().unwrap(),
        "runwarden_approve",
        "runwarden_deny",
        "runwarden_stop",
    ] {
        assert!(shown.contains(want), "{want} in {shown}");
    }

    for (n, (user, why)) in [
        ("UEVE", "is no principal's chat identity here"),
        ("UBOB", "bob may not approve for disk-l2"),
        ("UALICE", "four eyes"),
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = send(&d, &click(&slack, user, "runwarden_approve", &value(&r)));
        assert_eq!(status, 200, "{user}: {body}");
        let reply = slack.wait_reply(n + 1);
        assert!(reply.contains(why), "{user}: {reply}");
    }
    assert!(!e.work().join("lr.state").exists(), "nothing ran");

    let approve = click(&slack, "UCAROL", "runwarden_approve", &value(&r));
    let headers = signed(SECRET, now(), &approve);
    // Slack's retry sends the same bytes with the same signature.
    for n in [4, 5] {
        let (status, body) = post_slack(&d.addr, &headers, &approve);
        assert_eq!(status, 200, "{body}");
        slack.wait_reply(n);
    }
    let (status, _) = send(&d, &click(&slack, "UCAROL", "runwarden_deny", &value(&r)));
    assert_eq!(status, 200);
    let replies = slack.wait("/actions/reply", 6);
    assert_eq!(replies.len(), 6);
    let replies = slack.replies();
    assert_eq!(replies[3], format!("approved {id}"));
    assert!(replies[4].contains("already decided"), "{replies:?}");
    assert!(replies[5].contains("already decided"), "{replies:?}");

    assert_eq!(d.settled_runs()[0]["status"], "ok");
    let intent = e
        .audit_phase("intent")
        .into_iter()
        .find(|l| l["tool"] == "rotate_logs")
        .unwrap();
    assert_eq!(intent["approved_by"], "person:carol");
    assert_eq!(
        d.metric(
            r#"runwarden_approvals_total{decision="approved",runbook="disk-l2",tool="rotate_logs"}"#
        ),
        1.0
    );
    let updated = slack.wait("/api/chat.update", 1);
    assert_eq!(
        updated[0].body["ts"], "1503435956.000247",
        "the posted message"
    );
    let rewritten = text_of(&updated[0]);
    assert!(
        rewritten.contains("approved by carol via Slack"),
        "{rewritten}"
    );
    assert!(
        !rewritten.contains("runwarden_approve"),
        "buttons gone: {rewritten}"
    );
    let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    assert_eq!(
        access_lines(&e),
        [
            s(&format!("slack:{TEAM}/UEVE"), "slack", "refused"),
            s("bob", "slack", "refused"),
            s("alice", "slack", "refused"),
            s("carol", "slack", "allowed"),
            s("carol", "slack", "allowed"),
            s("carol", "slack", "allowed"),
        ]
    );
    let log = std::fs::read_to_string(e.audit_path()).unwrap();
    assert!(
        !log.contains("xoxb-") && !log.contains(SECRET),
        "no secret audited"
    );
}

/// However a request is settled, its message says so: approved through
/// the CLI, by whom and how.
#[test]
fn an_approval_settled_by_the_cli_rewrites_the_message() {
    let slack = SlackDouble::start();
    let e = estate(&slack);
    let d = Daemon::start(&e);
    let r = start(&d);
    slack.wait("/api/chat.postMessage", 1);
    let token = e.work().join("carol-token");
    write_secret(&token, "carol-token-0123456789abcdef\n");
    let daemon = format!("http://{}", d.addr);
    let out = e.run(&[
        "approvals",
        "approve",
        r["id"].as_str().unwrap(),
        "--comment",
        "looked at it",
        "--daemon",
        &daemon,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let updated = slack.wait("/api/chat.update", 1);
    let rewritten = text_of(&updated[0]);
    assert!(
        rewritten.contains("approved by carol via CLI: looked at it"),
        "{rewritten}"
    );
    assert!(!rewritten.contains("runwarden_deny"), "{rewritten}");
    assert_eq!(d.settled_runs()[0]["status"], "ok");
}

/// `/runwarden stop` and the Stop button engage the kill switch for a
/// principal that may stop every runbook: a run waiting for a person
/// halts, its request is denied, and its message says why. A stranger
/// and a principal that may stop one runbook only engage nothing.
#[test]
fn stop_from_slack_halts_the_run_and_denies_its_pending_request() {
    let slack = SlackDouble::start();
    let e = estate(&slack);
    let d = Daemon::start(&e);
    let r = start(&d);
    slack.wait("/api/chat.postMessage", 1);

    let (status, body) = send(&d, &command("UEVE", "stop INC-7"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("is no principal's chat identity"), "{body}");
    let (status, body) = send(&d, &command("UONCALL", "status please"));
    assert_eq!(status, 200);
    assert!(body.contains("/runwarden stop REASON"), "help: {body}");
    let (status, _) = send(&d, &click(&slack, "UOPS", "runwarden_stop", "stop"));
    assert_eq!(status, 200);
    assert!(
        slack.wait_reply(1).contains("ops may not kill:engage"),
        "{:?}",
        slack.replies()
    );
    assert!(
        !e.path().join("kill-switch/ENGAGED").exists(),
        "nothing engaged"
    );

    let (status, body) = send(&d, &command("UONCALL", "stop INC-7 disks filling"));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response_type"], "ephemeral");
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .contains("kill switch engaged"),
        "{answer}"
    );
    let file = std::fs::read_to_string(e.path().join("kill-switch/ENGAGED")).unwrap();
    assert!(
        file.contains(&format!("oncall (slack:{TEAM}/UONCALL)"))
            && file.contains("INC-7 disks filling"),
        "{file}"
    );
    let run = &d.settled_runs()[0];
    assert_eq!(run["status"], "halted", "{run:#}");
    let (_, shown) = d.request(
        "GET",
        &format!("/api/v1/approvals/{}", r["id"].as_str().unwrap()),
        &[("Authorization", &bearer("alice"))],
        b"",
    );
    assert!(shown.contains("\"state\":\"cancelled\""), "{shown}");
    let updated = slack.wait("/api/chat.update", 1);
    let rewritten = text_of(&updated[0]);
    assert!(rewritten.contains("cancelled: "), "{rewritten}");
    assert!(!e.work().join("lr.state").exists(), "nothing rotated");
    // A click on the settled message's old button decides nothing.
    let (status, _) = send(
        &d,
        &click(&slack, "UCAROL", "runwarden_approve", &value(&r)),
    );
    assert_eq!(status, 200);
    assert!(
        slack.wait_reply(2).contains("nothing was decided"),
        "{:?}",
        slack.replies()
    );
    let s = |a: &str, c: &str| (a.to_string(), "slack".to_string(), c.to_string());
    let access = access_lines(&e);
    assert_eq!(
        access[..3],
        [
            s(&format!("slack:{TEAM}/UEVE"), "refused"),
            s("ops", "refused"),
            s("oncall", "allowed"),
        ]
    );
}

/// Slack down: a request is still decided through the API, and nothing
/// is approved or denied by the failure.
#[test]
fn slack_down_changes_no_decision() {
    let slack = SlackDouble::start();
    let e = estate(&slack);
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = format!("http://{}/api", closed.local_addr().unwrap());
    drop(closed);
    let settings = e.path().join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(
        &settings,
        text.replace(&format!("{}/api", slack.base), &gone),
    )
    .unwrap();
    let d = Daemon::start(&e);
    let r = start(&d);
    std::thread::sleep(Duration::from_millis(500));
    let (_, shown) = d.request(
        "GET",
        &format!("/api/v1/approvals/{}", r["id"].as_str().unwrap()),
        &[("Authorization", &bearer("alice"))],
        b"",
    );
    assert!(shown.contains("\"state\":\"pending\""), "{shown}");
    let body = json!({ "digest": r["digest"] }).to_string();
    let carol = bearer("carol");
    let (status, answer) = d.request(
        "POST",
        &format!("/api/v1/approvals/{}/approve", r["id"].as_str().unwrap()),
        &[
            ("Authorization", &carol),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(d.settled_runs()[0]["status"], "ok");
}

/// The approval webhook, signed: each POST carries a timestamp and a `v1`
/// signature a bridge verifies with the shared secret, and links to the
/// API that still need a principal's token; it is told when a request
/// opens and when it is settled, by whom and how.
#[test]
fn the_approval_webhook_is_signed_and_told_how_a_request_ended() {
    let slack = SlackDouble::start();
    let e = estate(&slack);
    write_secret(&e.path().join("hook-secret"), "bridge-secret-0123456789\n");
    let settings = e.path().join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(
        &settings,
        format!(
            "{text}approval_webhook: {}/hook\napproval_webhook_secret_file: hook-secret\nexternal_url: https://runwarden.example\n",
            slack.base
        ),
    )
    .unwrap();
    let d = Daemon::start(&e);
    let r = start(&d);
    let id = r["id"].as_str().unwrap().to_string();
    let opened = slack.wait("/hook", 1);
    let verify = |h: &Heard| {
        let header = |name: &str| {
            h.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {name}: {:?}", h.headers))
        };
        let ts = header("x-runwarden-timestamp");
        assert!((now() - ts.parse::<i64>().unwrap()).abs() < 30, "{ts}");
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"bridge-secret-0123456789");
        let mut message = format!("v1:{ts}:").into_bytes();
        message.extend_from_slice(&h.raw);
        let sig = header("x-runwarden-signature");
        let hex = sig.strip_prefix("v1=").unwrap_or_else(|| panic!("{sig}"));
        let tag: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        ring::hmac::verify(&key, &message, &tag).expect("signed with the shared secret");
        // One byte changed no longer verifies.
        let mut other = message.clone();
        *other.last_mut().unwrap() ^= 1;
        assert!(ring::hmac::verify(&key, &other, &tag).is_err());
    };
    verify(&opened[0]);
    let body = &opened[0].body;
    assert_eq!(body["event"], "opened", "{body:#}");
    assert_eq!(body["state"], "pending");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(
        body["links"]["approve"],
        format!("https://runwarden.example/api/v1/approvals/{id}/approve")
    );
    assert!(body["budget_left"]["steps"].is_number(), "{body:#}");
    // A link is the API's: without a principal's token it approves nothing.
    let (status, _) = d.request(
        "POST",
        &format!("/api/v1/approvals/{id}/approve"),
        &[("Content-Type", "application/json")],
        json!({ "digest": r["digest"] }).to_string().as_bytes(),
    );
    assert_eq!(status, 401);
    let (status, _) = send(&d, &click(&slack, "UCAROL", "runwarden_deny", &value(&r)));
    assert_eq!(status, 200);
    let settled = slack.wait("/hook", 2);
    verify(&settled[1]);
    let body = &settled[1].body;
    assert_eq!(
        (&body["event"], &body["state"], &body["by"], &body["via"]),
        (
            &json!("settled"),
            &json!("denied"),
            &json!("carol"),
            &json!("Slack")
        ),
        "{body:#}"
    );
    assert_eq!(d.settled_runs()[0]["status"], "denied");
}

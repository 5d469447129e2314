//! Quiet maintenance against Debian's real Alertmanager: a run holds a
//! silence (API v2) of its host's matching alerts while it changes the
//! host, expired when it ends; Alertmanager unreachable leaves the run
//! going on unsilenced; a restart expires what a killed daemon left.

use std::time::Duration;

use serde_json::Value;

use crate::daemon::Daemon;
use crate::util::*;

/// Hosts h1, h2, the tool `fix` sleeping `slow` s, and runbook `maint` on
/// both with `silence:` on Alertmanager at `am`.
fn estate(am: &str, slow: u32) -> Estate {
    let e = Estate::new();
    crate::rollout::hosts_and_fix(&e, 2, &[], slow);
    e.runbook(
        "maint",
        &format!(
            "name: maint\ndescription: t\nhosts: [h1, h2]\nautonomy: L3\ntools: {{ approve: [fix] }}\nsteps:\n  - call: fix\n    reason: weekly maintenance\nsilence:\n  alertmanager: http://{am}\n  matchers: ['severity=~\"warning|page\"']\n  for: 30m\n"
        ),
    );
    e
}

/// An Alertmanager that sends nothing anywhere, with a warning firing for
/// each of h1 and h2.
fn alertmanager_with_alerts(e: &Estate) -> (Proc, String) {
    let (am, addr) = alertmanager(
        &e.work().join("alertmanager"),
        "route:\n  receiver: none\nreceivers:\n  - name: none\n",
    );
    let alerts = r#"[{"labels":{"alertname":"Load","instance":"h1:9100","severity":"warning"}},{"labels":{"alertname":"Load","instance":"h2:9100","severity":"warning"}},{"labels":{"alertname":"Load","instance":"h1:9100","severity":"info"}}]"#;
    let (status, body) = http(&addr, "POST", "/api/v2/alerts", alerts).unwrap();
    assert_eq!(status, 200, "{body}");
    (am, addr)
}

/// Alertmanager's silences.
fn silences(am: &str) -> Vec<Value> {
    let (_, body) = http(am, "GET", "/api/v2/silences", "").unwrap();
    serde_json::from_str(&body).unwrap()
}

/// Alertmanager's alerts: (instance, severity) -> state.
fn alert_states(am: &str) -> Vec<(String, String, String)> {
    let (_, body) = http(am, "GET", "/api/v2/alerts", "").unwrap();
    let all: Vec<Value> = serde_json::from_str(&body).unwrap();
    let mut out: Vec<(String, String, String)> = all
        .iter()
        .map(|a| {
            (
                a["labels"]["instance"].as_str().unwrap().to_string(),
                a["labels"]["severity"].as_str().unwrap().to_string(),
                a["status"]["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_run_silences_its_hosts_matching_alerts_while_it_changes_it_and_expires_the_silence_at_its_end()
{
    let e0 = Estate::new();
    let (_am, am) = alertmanager_with_alerts(&e0);
    let e = estate(&am, 3);
    let mut child = e.cmd(&["run", "maint", "--host", "h1"]).spawn().unwrap();
    // While the fix runs: one active silence, h1's warning suppressed, its
    // info alert (not matched) and h2's warning (another host) still active.
    let silence = wait_for("the silence", Duration::from_secs(20), || {
        silences(&am)
            .into_iter()
            .find(|s| s["status"]["state"] == "active")
    });
    assert_eq!(silence["createdBy"], "runwarden", "{silence:#}");
    wait_for("h1's warning suppressed", Duration::from_secs(10), || {
        (alert_states(&am)
            == [
                ("h1:9100".into(), "info".into(), "active".into()),
                ("h1:9100".into(), "warning".into(), "suppressed".into()),
                ("h2:9100".into(), "warning".into(), "active".into()),
            ])
        .then_some(())
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    // Expired at the run's end, and both written with its id, the silence
    // before the change it covers.
    let id = silence["id"].as_str().unwrap();
    let now = silences(&am);
    let same = now.iter().find(|s| s["id"] == id).unwrap();
    assert_eq!(same["status"]["state"], "expired", "{same:#}");
    let lines = e.audit();
    let phases: Vec<String> = lines
        .iter()
        .filter(|l| l["phase"] == "silence" || l["phase"] == "intent")
        .map(|l| {
            format!(
                "{} {}",
                l["phase"].as_str().unwrap(),
                l["outcome"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        phases,
        ["silence created", "intent ", "silence expired"],
        "{lines:#?}"
    );
    let created = lines
        .iter()
        .find(|l| l["phase"] == "silence" && l["outcome"] == "created")
        .unwrap();
    assert_eq!(created["detail"]["id"], id);
    // The transcript says so.
    let run_id = created["run_id"].as_str().unwrap();
    let out = e.run(&["transcript", run_id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("alerts silenced on http://{am}/ (silence {id}")),
        "{text}"
    );
    assert!(text.contains(&format!("silence {id} expired")), "{text}");
}

#[test]
fn alertmanager_unreachable_the_run_goes_on_unsilenced_and_says_so() {
    let closed = format!("127.0.0.1:{}", free_port());
    let e = estate(&closed, 0);
    let out = e.run(&["run", "maint", "--host", "h2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = e.audit();
    let line = lines
        .iter()
        .find(|l| l["phase"] == "silence")
        .expect("a silence line");
    assert_eq!(line["outcome"], "unsilenced", "{line:#}");
    let why = line["detail"]["why"].as_str().unwrap();
    assert!(
        why.contains("cannot be reached") && why.contains("unsilenced"),
        "{why}"
    );
    let verdict = lines.iter().find(|l| l["phase"] == "verdict").unwrap();
    assert_eq!(verdict["outcome"], "ok", "{verdict:#}");
}

#[test]
fn a_restart_expires_the_silence_a_killed_daemon_left() {
    let e0 = Estate::new();
    let (_am, am) = alertmanager_with_alerts(&e0);
    let e = estate(&am, 60);
    let mut d = Daemon::start(&e);
    let (status, body) = d.request(
        "POST",
        "/api/v1/runs",
        &[("Content-Type", "application/json")],
        br#"{"runbook": "maint", "hosts": ["h1"]}"#,
    );
    assert_eq!(status, 202, "{body}");
    let silence = wait_for("the silence", Duration::from_secs(20), || {
        silences(&am)
            .into_iter()
            .find(|s| s["status"]["state"] == "active")
    });
    d.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = d.child.wait();
    // Still active: nothing expired it.
    std::thread::sleep(Duration::from_millis(500));
    let id = silence["id"].as_str().unwrap().to_string();
    assert!(
        silences(&am)
            .iter()
            .any(|s| s["id"] == id.as_str() && s["status"]["state"] == "active")
    );
    let _d = Daemon::start(&e);
    wait_for(
        "the silence expired by the restart",
        Duration::from_secs(20),
        || {
            silences(&am)
                .iter()
                .any(|s| s["id"] == id.as_str() && s["status"]["state"] == "expired")
                .then_some(())
        },
    );
    let expired = wait_for("its line", Duration::from_secs(10), || {
        e.audit()
            .into_iter()
            .find(|l| l["phase"] == "silence" && l["outcome"] == "expired")
    });
    assert_eq!(expired["detail"]["id"], id.as_str());
    assert!(
        expired["detail"]["by"]
            .as_str()
            .unwrap()
            .contains("next start"),
        "{expired:#}"
    );
}

/// `check` refuses a silence that cannot work, at its line.
#[test]
fn check_refuses_a_silence_that_cannot_work_at_its_line() {
    let e = estate("127.0.0.1:9093", 0);
    let path = e.path().join("runbooks/maint.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("http://127.0.0.1:9093", "ftp://am")
            .replace("for: 30m", "for: 48h")
            .replace("severity=~", "severity=~~"),
    )
    .unwrap();
    let out = e.run(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for said in [
        "maint.yaml:10:17: silence.alertmanager \"ftp://am\" must be an http:// or https:// URL",
        "maint.yaml:11:14: silence.matchers:",
        "maint.yaml:12:8: silence.for must be between 1m and 24h",
    ] {
        assert!(err.contains(said), "{said:?} in {err}");
    }
    // A URL with credentials: they would be written in the audit log.
    for url in [
        "am:hunter2@127.0.0.1:9093",
        "127.0.0.1:9093/?access_token=hunter2",
    ] {
        let secret = estate(url, 0);
        let out = secret.run(&["check"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("must not carry credentials"), "{err}");
        assert!(
            !err.contains("hunter2"),
            "the password is not repeated: {err}"
        );
    }
}

/// A proxy in front of Alertmanager that forwards each request and holds
/// the answer to a POST for `hold` before passing it on: Alertmanager made
/// the silence, runwarden never heard its id. Its address.
fn slow_proxy(am: &str, hold: Duration) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let am = am.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let am = am.clone();
            std::thread::spawn(move || {
                // One request: its head, then Content-Length bytes of body.
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                let body_at = loop {
                    let n = client.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                    if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&req[..body_at]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0));
                while req.len() < body_at + len {
                    let n = client.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                // Forwarded as HTTP/1.0-style: one request, then close.
                let text = String::from_utf8_lossy(&req).replacen("HTTP/1.1", "HTTP/1.0", 1);
                let mut upstream = std::net::TcpStream::connect(&am).unwrap();
                upstream.write_all(text.as_bytes()).unwrap();
                let mut answer = Vec::new();
                let _ = upstream.read_to_end(&mut answer);
                if head.starts_with("post") {
                    std::thread::sleep(hold);
                }
                let _ = client.write_all(&answer);
            });
        }
    });
    addr
}

#[test]
fn a_silence_whose_answer_was_lost_is_found_by_its_run_and_expired_at_the_runs_end() {
    let e0 = Estate::new();
    let (_am, am) = alertmanager_with_alerts(&e0);
    let proxy = slow_proxy(&am, Duration::from_secs(5));
    let e = estate(&proxy, 0);
    let out = e.run(&["run", "maint", "--host", "h1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = e.audit();
    let silence: Vec<&Value> = lines.iter().filter(|l| l["phase"] == "silence").collect();
    assert_eq!(silence[0]["outcome"], "unsilenced", "{silence:#?}");
    assert_eq!(silence[0]["detail"]["lost_answer"], true, "{silence:#?}");
    assert!(
        silence[0]["detail"]["why"]
            .as_str()
            .unwrap()
            .contains("did not answer within"),
        "{silence:#?}"
    );
    // Alertmanager made it all the same; the run's end found it by its
    // run id and expired it.
    let made: Vec<Value> = silences(&am)
        .into_iter()
        .filter(|s| s["createdBy"] == "runwarden")
        .collect();
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["status"]["state"], "expired", "{made:#?}");
    assert_eq!(silence[1]["outcome"], "expired", "{silence:#?}");
    assert_eq!(silence[1]["detail"]["ids"][0], made[0]["id"]);
}

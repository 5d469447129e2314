//! `runwarden serve` over real HTTP on loopback: the Alertmanager webhook
//! (with payloads captured from a real Alertmanager), schedules, reload,
//! shutdown and restart after a kill.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

pub const FIRING: &str = include_str!("../fixtures/alertmanager/firing-two-alerts.json");
const RESOLVED: &str = include_str!("../fixtures/alertmanager/resolved-two-alerts.json");

pub struct Daemon {
    pub child: Child,
    pub addr: String,
}

impl Daemon {
    pub fn start(e: &Estate) -> Daemon {
        let (child, addr) = spawn_serve(e);
        Daemon { child, addr }
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        let mut c = TcpStream::connect(&self.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req += &format!("{k}: {v}\r\n");
        }
        req += "\r\n";
        c.write_all(req.as_bytes()).unwrap();
        let _ = c.write_all(body);
        let mut resp = Vec::new();
        let _ = c.read_to_end(&mut resp);
        let text = String::from_utf8_lossy(&resp).into_owned();
        let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    pub fn post_alerts(&self, body: &str) -> (u16, Value) {
        let (status, text) = self.request(
            "POST",
            "/api/v1/alerts",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub fn get_json(&self, path: &str) -> Value {
        serde_json::from_str(&self.request("GET", path, &[], b"").1).unwrap()
    }

    pub fn metrics(&self) -> String {
        self.request("GET", "/metrics", &[], b"").1
    }

    /// The value of one series in /metrics (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// Wait until no run is queued or running; return the runs.
    pub fn settled_runs(&self) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let runs = self.get_json("/api/v1/runs")["runs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !runs
                .iter()
                .any(|r| r["status"] == "running" || r["status"] == "queued")
            {
                return runs;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "runs did not finish: {runs:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn results(resp: &Value) -> Vec<String> {
    resp["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["result"].as_str().unwrap().to_string())
        .collect()
}

/// Hosts web-01 and web-02, and a runbook for DiskAlmostFull alerts on `hosts`.
fn alert_estate(hosts: &str, steps: &str) -> Estate {
    let e = Estate::new();
    e.host("web-01", &local_host("web-01", "paths: [/tmp]"));
    e.host("web-02", &local_host("web-02", "paths: [/tmp]"));
    e.runbook(
        "disk-alert",
        &format!(
            "name: disk-alert\ndescription: t\nhosts: [{hosts}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"', 'severity=~\"warning|critical\"']\n  host_label: instance\ncooldown: 1h\ntools: {{ observe: [disk_usage, list_processes] }}\nsteps:\n{steps}"
        ),
    );
    e
}

const DISK_STEPS: &str = "  - id: tmp
    call: disk_usage
    args: { path: /tmp }
  - id: labelled
    call: disk_usage
    args: { path: \"{{ alert.labels.mountpoint }}\" }
";

#[test]
fn webhook_starts_one_run_and_accounts_for_every_alert() {
    let e = alert_estate("web-01", DISK_STEPS);
    let d = Daemon::start(&e);
    let (status, resp) = d.post_alerts(FIRING);
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        results(&resp),
        ["started", "deduplicated"],
        "two alerts, one host: one run"
    );
    let runs = d.settled_runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        runs[0]["host"], "web-01",
        "instance web-01:9100 names host web-01"
    );
    let run = d.get_json(&format!(
        "/api/v1/runs/{}",
        runs[0]["run_id"].as_str().unwrap()
    ));
    let report = &run["report"];
    assert_eq!(step(report, "tmp")["status"], "ok");
    // The alert's label is untrusted: "/" is outside the host's paths.
    assert_eq!(step(report, "labelled")["status"], "denied", "{report:#}");
    assert_eq!(run["status"], "denied");

    let (_, again) = d.post_alerts(FIRING);
    assert_eq!(
        results(&again),
        ["deduplicated", "deduplicated"],
        "repeats inside the cooldown start nothing"
    );
    let (_, resolved) = d.post_alerts(RESOLVED);
    assert!(
        results(&resolved).is_empty(),
        "resolved alerts start nothing"
    );

    assert_eq!(
        d.metric(r#"runwarden_alert_triggers_total{result="started",runbook="disk-alert"}"#),
        1.0
    );
    assert_eq!(
        d.metric(r#"runwarden_alert_triggers_total{result="deduplicated",runbook="disk-alert"}"#),
        3.0
    );
    assert_eq!(
        d.metric(r#"runwarden_alerts_received_total{status="resolved"}"#),
        2.0
    );
    assert_eq!(
        d.metric(r#"runwarden_runs_finished_total{runbook="disk-alert",verdict="denied"}"#),
        1.0
    );
    assert_eq!(
        d.metric(r#"runwarden_tool_calls_total{host="web-01",outcome="denied",planner="steps",runbook="disk-alert",tier="1",tool="disk_usage"}"#),
        1.0
    );
    assert_eq!(
        d.metric(
            r#"runwarden_gate_denials_total{reason="invalid_arguments",runbook="disk-alert"}"#
        ),
        1.0
    );
    assert!(
        !d.metrics().contains("web-01:9100"),
        "no label value comes from a payload"
    );
}

#[test]
fn webhook_refuses_bad_bodies_and_bad_tokens() {
    let e = alert_estate("web-01", DISK_STEPS);
    write_secret(&e.path().join("token"), "s3cret-token-0123456789\n");
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "webhook_token_file: token\n",
    )
    .unwrap();
    let d = Daemon::start(&e);
    let auth = [("Authorization", "Bearer s3cret-token-0123456789")];
    let (s, body) = d.request("POST", "/api/v1/alerts", &[], FIRING.as_bytes());
    assert_eq!(s, 401, "{body}");
    let (s, _) = d.request(
        "POST",
        "/api/v1/alerts",
        &[("Authorization", "Bearer wrong-token-000000000")],
        FIRING.as_bytes(),
    );
    assert_eq!(s, 401);
    let (s, body) = d.request("POST", "/api/v1/alerts", &auth, b"{not json");
    assert_eq!(s, 400);
    assert!(body.contains("not an Alertmanager notification"), "{body}");
    let v3 = FIRING.replace("\"version\":\"4\"", "\"version\":\"3\"");
    let (s, body) = d.request("POST", "/api/v1/alerts", &auth, v3.as_bytes());
    assert_eq!(s, 400);
    assert!(body.contains("version"), "{body}");
    // A notification may be up to 8 MiB (a group of 10,000 alerts); any
    // other body up to 1 MiB.
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(9 << 20));
    let (s, _) = d.request("POST", "/api/v1/alerts", &auth, big.as_bytes());
    assert_eq!(s, 413);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2 << 20));
    let (s, _) = d.request("POST", "/api/v1/runs", &auth, big.as_bytes());
    assert_eq!(s, 413);
    let (s, body) = d.request("POST", "/api/v1/alerts", &auth, FIRING.as_bytes());
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        d.metric(r#"runwarden_alert_triggers_total{result="started",runbook="disk-alert"}"#),
        1.0,
        "nothing before the good request counted"
    );
}

#[test]
fn an_alert_for_a_host_outside_the_runbook_is_out_of_scope() {
    let e = alert_estate("web-02", DISK_STEPS);
    let d = Daemon::start(&e);
    let (_, resp) = d.post_alerts(FIRING);
    assert_eq!(results(&resp), ["out_of_scope", "out_of_scope"]);
    assert!(d.settled_runs().is_empty());
}

#[test]
fn fifty_notifications_for_one_group_start_one_run() {
    let e = alert_estate("web-01", DISK_STEPS);
    let d = Daemon::start(&e);
    let mut all = Vec::new();
    for _ in 0..50 {
        let (s, resp) = d.post_alerts(FIRING);
        assert_eq!(s, 200);
        all.extend(results(&resp));
    }
    assert_eq!(all.len(), 100, "every alert has an outcome");
    assert_eq!(all.iter().filter(|r| *r == "started").count(), 1);
    assert_eq!(all.iter().filter(|r| *r == "deduplicated").count(), 99);
    assert_eq!(d.settled_runs().len(), 1);
}

#[test]
fn kill_switch_refuses_every_trigger() {
    let e = alert_estate("web-01", DISK_STEPS);
    let d = Daemon::start(&e);
    std::fs::write(e.path().join("kill-switch/ENGAGED"), "").unwrap();
    let (_, resp) = d.post_alerts(FIRING);
    assert_eq!(results(&resp), ["kill_switch", "kill_switch"]);
    let started = Instant::now();
    while d.metric(r#"runwarden_kill_switch_engaged{scope="global"}"#) != 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the gauge follows the file"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_broken_runbook_on_sighup_keeps_the_old_config() {
    let e = alert_estate("web-01", DISK_STEPS);
    let d = Daemon::start(&e);
    std::fs::write(
        e.path().join("runbooks/disk-alert.yaml"),
        "name: disk-alert\nautonomy: L9\n",
    )
    .unwrap();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let started = Instant::now();
    while d.metric(r#"runwarden_config_reloads_total{result="failure"}"#) < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "reload not attempted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.metric("runwarden_config_last_reload_successful"), 0.0);
    let (_, resp) = d.post_alerts(FIRING);
    assert_eq!(
        results(&resp)[0],
        "started",
        "the old runbook is still in force"
    );
}

fn slow_estate() -> Estate {
    let e = alert_estate(
        "web-01",
        "  - call: list_processes\n  - call: list_processes\n  - call: list_processes\n",
    );
    let slow = e.script("slow-ps", "sleep 1\necho '1 0 root S 1 0.0 100 init'");
    e.host(
        "web-01",
        &local_host(
            "web-01",
            &format!("paths: [/tmp]\nbinaries: {{ ps: {} }}", slow.display()),
        ),
    );
    e
}

#[test]
fn sigterm_mid_run_ends_it_with_a_verdict() {
    let e = slow_estate();
    let mut d = Daemon::start(&e);
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    std::thread::sleep(Duration::from_millis(400));
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let verdicts = e.audit_phase("verdict");
    assert_eq!(verdicts.len(), 1);
    assert_eq!(verdicts[0]["outcome"], "halted", "{:#}", verdicts[0]);
    assert_eq!(
        e.audit_phase("result").len(),
        1,
        "the call in flight finished, no other started"
    );
    assert!(e.run(&["audit", "verify"]).status.success());
}

#[test]
fn sigkill_mid_run_is_reported_interrupted_after_a_restart() {
    let e = slow_estate();
    let d = Daemon::start(&e);
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    std::thread::sleep(Duration::from_millis(400));
    d.signal(nix::sys::signal::Signal::SIGKILL);
    drop(d);
    assert!(e.audit_phase("verdict").is_empty());
    let d = Daemon::start(&e);
    let runs = d.settled_runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["status"], "interrupted");
    assert_eq!(
        d.metric(r#"runwarden_runs_finished_total{runbook="disk-alert",verdict="interrupted"}"#),
        1.0
    );
    let verdicts = e.audit_phase("verdict");
    assert_eq!(verdicts[0]["outcome"], "interrupted");
    assert!(e.run(&["audit", "verify"]).status.success());
}

#[test]
fn a_per_second_schedule_fires_without_waiting_minutes() {
    let e = Estate::new();
    e.host("web-01", &local_host("web-01", "paths: [/tmp]"));
    e.runbook(
        "tick",
        "name: tick\ndescription: t\nhosts: [web-01]\nautonomy: L3\nschedule: \"* * * * * *\"\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    let d = Daemon::start(&e);
    let started = Instant::now();
    loop {
        let runs = d.get_json("/api/v1/runs")["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if runs.iter().filter(|r| r["status"] == "ok").count() >= 2 {
            assert!(runs.iter().all(|r| r["trigger"] == "schedule"));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(8), "{runs:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(d.metric(r#"runwarden_schedule_last_run_timestamp_seconds{runbook="tick"}"#) > 1.7e9);
    assert!(
        d.metric(r#"runwarden_schedule_next_run_timestamp_seconds{runbook="tick"}"#)
            > d.metric(r#"runwarden_schedule_last_run_timestamp_seconds{runbook="tick"}"#)
    );
}

#[test]
fn serve_refuses_a_public_address_without_a_token() {
    let e = alert_estate("web-01", DISK_STEPS);
    let out = e.run(&["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without a webhook token"),
        "{err}"
    );
}

/// What the daemon's own reads and writes cause is not a change: an idle
/// daemon reloads nothing, a touch reloads nothing, one edit reloads once
/// (an editor's write-then-rename included), a broken edit is reported
/// once, and SIGHUP always reloads.
#[test]
fn the_daemon_reloads_only_when_its_configuration_changes() {
    let e = alert_estate("web-01", DISK_STEPS);
    let d = Daemon::start(&e);
    let ok = |d: &Daemon| d.metric(r#"runwarden_config_reloads_total{result="success"}"#);
    let failed = |d: &Daemon| d.metric(r#"runwarden_config_reloads_total{result="failure"}"#);
    let settle = || std::thread::sleep(Duration::from_millis(2500));
    settle();
    assert_eq!((ok(&d), failed(&d)), (0.0, 0.0), "idle");
    // Its own writes, reads and a touch.
    e.run(&["run", "disk-alert", "--host", "web-01"]);
    assert!(!e.audit().is_empty(), "the run wrote its audit lines");
    assert_eq!(e.run(&["check"]).status.code(), Some(0));
    let rb = e.path().join("runbooks/disk-alert.yaml");
    let text = std::fs::read_to_string(&rb).unwrap();
    std::fs::write(&rb, &text).unwrap();
    settle();
    assert_eq!((ok(&d), failed(&d)), (0.0, 0.0), "nothing changed");
    // An editor's write-then-rename: one reload.
    let tmp = e.path().join("runbooks/.disk-alert.yaml.swp");
    std::fs::write(&tmp, text.replace("cooldown: 1h", "cooldown: 2h")).unwrap();
    std::fs::rename(&tmp, &rb).unwrap();
    wait_for("the reload", Duration::from_secs(10), || {
        (ok(&d) == 1.0).then_some(())
    });
    settle();
    assert_eq!(ok(&d), 1.0, "one edit, one reload");
    // An edit in place of a host file: one more.
    let host = e.path().join("hosts/web-02.yaml");
    std::fs::write(&host, local_host("web-02", "paths: [/tmp, /var/tmp]")).unwrap();
    wait_for("the second reload", Duration::from_secs(10), || {
        (ok(&d) == 2.0).then_some(())
    });
    // A broken edit: reported once, not over and over.
    std::fs::write(&host, "name: web-02\nconnection: [\n").unwrap();
    wait_for("the rejected reload", Duration::from_secs(10), || {
        (failed(&d) == 1.0).then_some(())
    });
    settle();
    assert_eq!(failed(&d), 1.0, "a broken file is reported once");
    std::fs::write(&host, local_host("web-02", "paths: [/tmp]")).unwrap();
    wait_for("the repaired reload", Duration::from_secs(10), || {
        (ok(&d) == 3.0).then_some(())
    });
    // SIGHUP reloads whether or not anything changed.
    d.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the SIGHUP reload", Duration::from_secs(10), || {
        (ok(&d) == 4.0).then_some(())
    });
}

/// A runbook whose one call takes 2 s (a slow `ps`), for alerts `Slow`.
fn slow_alert_estate() -> Estate {
    let e = Estate::new();
    let ps = e.script("slow-ps", "/bin/sleep 2\nexec /bin/ps \"$@\"");
    e.host(
        "h",
        &local_host("h", &format!("binaries:\n  ps: {}", ps.display())),
    );
    e.runbook(
        "slow",
        "name: slow\ndescription: t\nhosts: [h]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"Slow\"']\n  host_label: instance\ntools: { observe: [list_processes] }\nsteps:\n  - call: list_processes\n",
    );
    e
}

const SLOW: &str = r#"{"version":"4","status":"firing","receiver":"rw","groupKey":"g","alerts":[{"status":"firing","labels":{"alertname":"Slow","instance":"h"},"annotations":{},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"s1"}]}"#;

/// (start, verdict) timestamps of every run in the audit log.
fn run_spans(e: &Estate) -> Vec<(String, jiff::Timestamp, jiff::Timestamp)> {
    let lines = e.audit();
    let ts = |l: &Value| {
        l["ts"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .unwrap()
    };
    lines
        .iter()
        .filter(|l| l["phase"] == "start")
        .filter_map(|s| {
            let end = lines
                .iter()
                .find(|l| l["phase"] == "verdict" && l["run_id"] == s["run_id"])?;
            Some((s["run_id"].as_str().unwrap().to_string(), ts(s), ts(end)))
        })
        .collect()
}

#[test]
fn a_command_line_run_and_the_daemon_never_run_one_runbook_on_one_host_at_once() {
    let e = slow_alert_estate();
    let d = Daemon::start(&e);
    // The command line first: the daemon's run waits for it.
    let cli = e
        .cmd(&["run", "slow", "--host", "h", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(
        "the command-line run's call",
        Duration::from_secs(10),
        || (!e.audit_phase("intent").is_empty()).then_some(()),
    );
    assert_eq!(results(&d.post_alerts(SLOW).1)[0], "started");
    // A second command-line run meanwhile is refused, and nothing of it runs.
    let second = e.run(&["run", "slow", "--host", "h"]);
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(75), "{err}");
    assert!(
        err.contains("another run of this runbook on this host is in progress"),
        "{err}"
    );
    let out = cli.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let runs = d.settled_runs();
    assert_eq!(runs[0]["status"], "ok", "{runs:#?}");
    let spans = run_spans(&e);
    assert_eq!(spans.len(), 2, "{spans:?}");
    let (first, then) = if spans[0].1 <= spans[1].1 {
        (&spans[0], &spans[1])
    } else {
        (&spans[1], &spans[0])
    };
    assert!(then.1 >= first.2, "the runs overlapped: {spans:?}");

    // The daemon first: the command line is refused while it runs.
    wait_for("the daemon's run to end", Duration::from_secs(10), || {
        (d.metric("runwarden_runs_in_flight") == 0.0).then_some(())
    });
    let again = SLOW.replace("\"s1\"", "\"s2\"").replace("\"g\"", "\"g2\"");
    let before = e.audit_phase("intent").len();
    assert_eq!(results(&d.post_alerts(&again).1)[0], "started");
    wait_for("the daemon's call", Duration::from_secs(10), || {
        (e.audit_phase("intent").len() > before).then_some(())
    });
    let cli = e.run(&["run", "slow", "--host", "h"]);
    assert_eq!(
        cli.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
}

#[test]
fn a_killed_run_releases_its_lock_even_while_its_tool_lives_on() {
    let e = slow_alert_estate();
    let mut killed = e.cmd(&["run", "slow", "--host", "h"]).spawn().unwrap();
    wait_for("the call", Duration::from_secs(10), || {
        (!e.audit_phase("intent").is_empty()).then_some(())
    });
    killed.kill().unwrap();
    killed.wait().unwrap();
    // Its `sleep 2` is still running, orphaned; the lock is free all the same.
    let out = e.run(&["run", "slow", "--host", "h"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `serve` with its stderr in a file: (daemon, address, the log file).
fn serve_logging(e: &Estate, extra: &[&str]) -> (Daemon, std::path::PathBuf) {
    let log = e.work().join("serve.log");
    let mut cmd = e.cmd(&["serve", "--listen", "127.0.0.1:0"]);
    cmd.args(extra)
        .env_remove("RUNWARDEN_LOG")
        .stderr(std::fs::File::create(&log).unwrap());
    let (child, addr) = start_serve(cmd);
    (Daemon { child, addr }, log)
}

const NO_MATCH: &str = r#"{"version":"4","status":"firing","receiver":"rw","groupKey":"n","alerts":[{"status":"firing","labels":{"alertname":"NobodysAlert","instance":"web-01"},"annotations":{},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"nm1"}]}"#;

#[test]
fn at_info_the_daemon_logs_each_trigger_run_switch_and_reload_without_colour() {
    for format in ["text", "json"] {
        let e = alert_estate("web-01", DISK_STEPS);
        let (d, log) = serve_logging(&e, &["--log-format", format]);
        assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
        d.settled_runs();
        d.post_alerts(NO_MATCH);
        std::fs::write(e.path().join("kill-switch/ENGAGED"), "reason: test\n").unwrap();
        let text = || std::fs::read_to_string(&log).unwrap();
        wait_for("the engaged line", Duration::from_secs(15), || {
            text().contains("kill switch engaged").then_some(())
        });
        std::fs::remove_file(e.path().join("kill-switch/ENGAGED")).unwrap();
        wait_for("the released line", Duration::from_secs(15), || {
            text().contains("kill switch released").then_some(())
        });
        d.signal(nix::sys::signal::Signal::SIGHUP);
        wait_for("the reload line", Duration::from_secs(15), || {
            text().contains("configuration reloaded").then_some(())
        });
        let text = text();
        for says in [
            "trigger",
            "started",
            "no_match",
            "run started",
            "run ended",
            "verdict",
        ] {
            assert!(text.contains(says), "{format}: no {says:?} in:\n{text}");
        }
        assert!(
            !text.contains('\u{1b}'),
            "{format}: colour codes in a file:\n{text}"
        );
        if format == "json" {
            for line in text.lines() {
                let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
            }
        }
    }
    // --log-level quiets it.
    let e = alert_estate("web-01", DISK_STEPS);
    let (d, log) = serve_logging(&e, &["--log-level", "warn"]);
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    d.settled_runs();
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap()
            .contains("run started")
    );
}

#[test]
fn run_history_comes_from_the_audit_log_for_every_process_and_survives_a_restart() {
    let e = alert_estate("web-01", DISK_STEPS);
    e.runbook(
        "look",
        "name: look\ndescription: t\nhosts: [web-02]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    // A person's run on the command line, before any daemon.
    let (code, manual) = e.run_json("look", "web-02", &[]);
    assert_eq!(code, 0, "{manual:#}");
    let manual_id = manual["run_id"].as_str().unwrap().to_string();
    let d = Daemon::start(&e);
    let (_, answer) = d.post_alerts(FIRING);
    assert_eq!(results(&answer)[0], "started");
    let runs = d.settled_runs();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert_eq!(
        answer["outcomes"][0]["run_id"], runs[1]["run_id"],
        "the webhook names the run it started"
    );
    assert_eq!(
        runs[0]["run_id"],
        manual_id.as_str(),
        "the command-line run is listed"
    );
    assert_eq!(runs[0]["trigger"], "cli");
    assert_eq!(runs[1]["trigger"], "alert");
    let count = |q: &str| {
        d.get_json(&format!("/api/v1/runs{q}"))["runs"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count("?runbook=look"), 1);
    assert_eq!(count("?host=web-01"), 1);
    for r in &runs {
        let status = r["status"].as_str().unwrap();
        let same = runs.iter().filter(|o| o["status"] == status).count();
        assert_eq!(count(&format!("?status={status}")), same, "{status}");
        assert_eq!(count(&format!("?verdict={status}")), same, "{status}");
    }
    assert_eq!(count("?status=interrupted"), 0);
    assert_eq!(count("?limit=1"), 1);
    assert_eq!(count("?since=1h"), 2);
    assert_eq!(count("?since=2999-01-01T00:00:00Z"), 0);
    let (status, body) = d.request("GET", "/api/v1/runs?colour=red", &[], b"");
    assert_eq!(status, 400, "{body}");
    let (status, body) = d.request("GET", "/api/v1/runs?since=yesterdayish", &[], b"");
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        d.get_json(&format!("/api/v1/runs/{manual_id}"))["status"],
        "ok"
    );
    // A restart forgets nothing.
    drop(d);
    let d = Daemon::start(&e);
    assert_eq!(
        d.get_json("/api/v1/runs")["runs"].as_array().unwrap().len(),
        2
    );
    drop(d);
    // The same from the command line, and a run id by a unique prefix.
    let out = e.run(&["runs", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    let text = String::from_utf8_lossy(&e.run(&["runs", "--runbook", "look"]).stdout).into_owned();
    assert!(
        text.starts_with("STARTED") && text.contains(&manual_id),
        "{text}"
    );
    let show = e.run(&["audit", "show", &manual_id[..20]]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let ambiguous = e.run(&["transcript", "01"]);
    assert!(String::from_utf8_lossy(&ambiguous.stderr).contains("give more of the id"));
}

/// A dry run changes nothing, so it starts no cooldown: the real run an
/// alert asks for right after it starts, by the daemon's memory and, after
/// a restart, by what it reads back from the audit log.
#[test]
fn a_dry_run_starts_no_cooldown_before_or_after_a_restart() {
    let steps = "  - call: disk_usage\n    args: { path: /tmp }\n";
    let dry = |d: &Daemon| {
        let (status, body) = d.request(
            "POST",
            "/api/v1/runs",
            &[("Content-Type", "application/json")],
            br#"{"runbook": "disk-alert", "hosts": ["web-01"], "dry_run": true}"#,
        );
        assert_eq!(status, 202, "{body}");
        let runs = d.settled_runs();
        assert_eq!(runs[0]["dry_run"], true, "{runs:#?}");
    };
    let e = alert_estate("web-01", steps);
    let d = Daemon::start(&e);
    dry(&d);
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    drop(d);
    let e = alert_estate("web-01", steps);
    let d = Daemon::start(&e);
    dry(&d);
    drop(d);
    let d = Daemon::start(&e);
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    // The real run's end does start it.
    d.settled_runs();
    let mut other: Value = serde_json::from_str(FIRING).unwrap();
    other["groupKey"] = "another-group".into();
    for a in other["alerts"].as_array_mut().unwrap() {
        a["fingerprint"] = format!("x{}", a["fingerprint"].as_str().unwrap()).into();
    }
    assert_eq!(results(&d.post_alerts(&other.to_string()).1)[0], "cooldown");
}

#[test]
fn cooldown_and_deduplication_survive_a_restart() {
    let e = alert_estate("web-01", DISK_STEPS);
    let d = Daemon::start(&e);
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "started");
    d.settled_runs();
    drop(d);
    let d = Daemon::start(&e);
    // The same alert again: a repeat inside the runbook's 1 h cooldown.
    assert_eq!(results(&d.post_alerts(FIRING).1)[0], "deduplicated");
    // Another alert for the same host: still in cooldown.
    let mut other: Value = serde_json::from_str(FIRING).unwrap();
    other["groupKey"] = "another-group".into();
    for a in other["alerts"].as_array_mut().unwrap() {
        a["fingerprint"] = format!("x{}", a["fingerprint"].as_str().unwrap()).into();
    }
    assert_eq!(results(&d.post_alerts(&other.to_string()).1)[0], "cooldown");
    assert_eq!(
        d.get_json("/api/v1/runs")["runs"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn a_reload_applies_a_new_max_concurrent_runs() {
    let e = Estate::new();
    let ps = e.script("slow-ps", "/bin/sleep 1.5\nexec /bin/ps \"$@\"");
    for h in ["h1", "h2"] {
        e.host(
            h,
            &local_host(h, &format!("binaries:\n  ps: {}", ps.display())),
        );
    }
    e.runbook(
        "slow",
        "name: slow\ndescription: t\nhosts: [h1, h2]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"Slow\"']\n  host_label: instance\ntools: { observe: [list_processes] }\nsteps:\n  - call: list_processes\n",
    );
    std::fs::write(e.path().join("runwarden.yaml"), "max_concurrent_runs: 1\n").unwrap();
    let d = Daemon::start(&e);
    let both = |tag: &str| {
        format!(
            r#"{{"version":"4","status":"firing","receiver":"rw","groupKey":"{tag}","alerts":[{{"status":"firing","labels":{{"alertname":"Slow","instance":"h1"}},"annotations":{{}},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"{tag}1"}},{{"status":"firing","labels":{{"alertname":"Slow","instance":"h2"}},"annotations":{{}},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"{tag}2"}}]}}"#
        )
    };
    let overlapping = |e: &Estate, skip: usize| {
        let spans: Vec<_> = run_spans(e).into_iter().skip(skip).collect();
        assert_eq!(spans.len(), 2, "{spans:?}");
        spans[0].1.max(spans[1].1) < spans[0].2.min(spans[1].2)
    };
    assert_eq!(
        results(&d.post_alerts(&both("a")).1),
        ["started", "started"]
    );
    d.settled_runs();
    assert!(!overlapping(&e, 0), "one run at a time");
    std::fs::write(e.path().join("runwarden.yaml"), "max_concurrent_runs: 2\n").unwrap();
    wait_for("the reload", Duration::from_secs(10), || {
        (d.metric(r#"runwarden_config_reloads_total{result="success"}"#) == 1.0).then_some(())
    });
    wait_for("the runs to end", Duration::from_secs(10), || {
        (d.metric("runwarden_runs_in_flight") == 0.0).then_some(())
    });
    assert_eq!(
        results(&d.post_alerts(&both("b")).1),
        ["started", "started"]
    );
    d.settled_runs();
    assert!(overlapping(&e, 2), "two at a time after the reload");
}

#[test]
fn post_runs_starts_runs_through_the_daemon_under_its_rules() {
    let e = slow_alert_estate();
    e.host("h2", &local_host("h2", "paths: [/tmp]"));
    let rb = std::fs::read_to_string(e.path().join("runbooks/slow.yaml")).unwrap();
    e.runbook("slow", &rb.replace("hosts: [h]", "hosts: [h, h2]"));
    let d = Daemon::start(&e);
    let post = |body: &str| {
        let (status, text) = d.request(
            "POST",
            "/api/v1/runs",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
        )
    };
    let (status, answer) = post(r#"{"runbook":"slow","all_hosts":true}"#);
    assert_eq!(status, 202, "{answer}");
    let outcomes = answer["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 2);
    assert!(
        outcomes
            .iter()
            .all(|o| o["result"] == "started" && o["run_id"].is_string()),
        "{answer}"
    );
    // While they run, another request for one host is a duplicate.
    let (_, again) = post(r#"{"runbook":"slow","hosts":["h"]}"#);
    assert_eq!(again["outcomes"][0]["result"], "deduplicated", "{again}");
    let runs = d.settled_runs();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert!(
        runs.iter()
            .all(|r| r["trigger"] == "api" && r["status"] == "ok"),
        "{runs:#?}"
    );
    // The kill switch holds for it as for any trigger.
    std::fs::write(e.path().join("kill-switch/ENGAGED"), "").unwrap();
    let (_, stopped) = post(r#"{"runbook":"slow","hosts":["h2"]}"#);
    assert_eq!(stopped["outcomes"][0]["result"], "kill_switch", "{stopped}");
    std::fs::remove_file(e.path().join("kill-switch/ENGAGED")).unwrap();
    // What it refuses, and why.
    for (body, want) in [
        (r#"{"runbook":"nope","hosts":["h"]}"#, 404),
        (r#"{"runbook":"slow","hosts":["db-01"]}"#, 400),
        (r#"{"runbook":"slow","hosts":["h"],"all_hosts":true}"#, 400),
        (r#"{"runbook":"slow"}"#, 400),
        (r#"{"runbook":"slow","hosts":["h"],"sudo":true}"#, 400),
        ("not json", 400),
    ] {
        assert_eq!(post(body).0, want, "{body}");
    }
    assert_eq!(
        d.get_json("/api/v1/runs")["runs"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn run_via_daemon_waits_for_each_verdict_and_says_what_did_not_start() {
    let e = slow_alert_estate();
    e.host("h2", &local_host("h2", "paths: [/tmp]"));
    let rb = std::fs::read_to_string(e.path().join("runbooks/slow.yaml")).unwrap();
    e.runbook("slow", &rb.replace("hosts: [h]", "hosts: [h, h2]"));
    let d = Daemon::start(&e);
    let url = format!("http://{}", d.addr);
    let out = e.run(&["run", "slow", "--all-hosts", "--via-daemon", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for host in ["h", "h2"] {
        assert!(
            text.contains(&format!("{host}: run ")) && text.contains(": ok"),
            "{text}"
        );
    }
    // A host already busy: not started, said so, exit 75.
    let busy = e
        .cmd(&["run", "slow", "--host", "h", "--via-daemon", &url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the first run's call", Duration::from_secs(10), || {
        (e.audit_phase("intent").len() >= 3).then_some(())
    });
    let out = e.run(&["run", "slow", "--host", "h", "--via-daemon", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(75), "{text}");
    assert!(text.contains("h: not started (deduplicated)"), "{text}");
    assert_eq!(busy.wait_with_output().unwrap().status.code(), Some(0));
    // Several hosts need the daemon.
    let out = e.run(&["run", "slow", "--all-hosts"]);
    assert_eq!(out.status.code(), Some(2));
}

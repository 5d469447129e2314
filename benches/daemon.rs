//! The daemon under load: `cargo bench --bench daemon`.
//!
//! 1. startup time and idle RSS with 200 runbooks and 500 hosts;
//! 2. an alert storm: 100,000 alerts in 1,000 webhook notifications against
//!    500 hosts (`STORM_NOTIFICATIONS` to change): accept latency p50/p99,
//!    every alert accounted for in `runwarden_alert_triggers_total`, no run
//!    started twice for one (runbook, host), peak RSS;
//! 3. a scheduled fan-out to 500 hosts with `max_concurrent_runs: 8`: the
//!    most runs in flight at any sample, every host's verdict, wall time;
//! 4. the kill switch (50 trials): time from `touch kill-switch/ENGAGED` to the last tool
//!    call dispatched by a runbook making calls back to back;
//! 5. alert to the tool's own `main`, against adnanh/webhook running the same
//!    compiled program, interleaved alert by alert, with what one synced
//!    append costs the same disk in the same run (`RUNWARDEN_BENCH_ONLY=latency`
//!    for this part alone; `RUNWARDEN_BENCH_LATENCY_DIR=/dev/shm` to put both
//!    sides' files on tmpfs and see what is left when a sync is free;
//!    `RUNWARDEN_BENCH_SAMPLES=FILE` for every alert's figures);
//! 6. one notification whose alerts all name one (runbook, host), as
//!    Alertmanager groups them: 100 (the baseline), 1,000 and 10,000
//!    alerts, the answer's time, its time per alert against the baseline's
//!    and the daemon's peak RSS (`RUNWARDEN_BENCH_ONLY=group` for this part alone);
//! 7. a staged rollout of 500 hosts (a canary of 1, then 10%, then 100%,
//!    no pause) against the flat fan-out of the same hosts, rounds
//!    interleaved on one daemon: each one's time from the request to the
//!    last verdict, and the rollout's ratio with the waits it asks for
//!    (its canary alone, and each wave's last run) taken out
//!    (`RUNWARDEN_BENCH_ONLY=rollout` for this part alone).
//! 8. what deciding who may ask costs a request, against a bare `/healthz`
//!    200 from the same daemon on the same kept-alive connection, rounds
//!    interleaved: a principal's token and `authorize()` (`GET
//!    /api/v1/approvals`), and Slack's signature check (a signed
//!    `/runwarden help` to `/api/v1/chat/slack`: secret file read, HMAC,
//!    parse); p50 and p99 of each and their ratios
//!    (`RUNWARDEN_BENCH_ONLY=chat` for this part alone).
//!
//! Figures only; nothing here asserts a time.

// A measurement harness: a failed setup step should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

fn rss_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap())
        })
        .unwrap()
}

fn main() {
    // `RUNWARDEN_BENCH_ONLY=latency`: just the alert-to-tool comparison.
    if std::env::var("RUNWARDEN_BENCH_ONLY").as_deref() == Ok("latency") {
        webhook_to_first_call();
        return;
    }
    if std::env::var("RUNWARDEN_BENCH_ONLY").as_deref() == Ok("group") {
        one_group();
        return;
    }
    if std::env::var("RUNWARDEN_BENCH_ONLY").as_deref() == Ok("chat") {
        who_may_ask();
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-daemon-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = dir.path();
    write(root, "kill-switch/README", "");
    write(root, "runwarden.yaml", "max_concurrent_runs: 8\n");
    let hosts: Vec<String> = (0..500).map(|i| format!("web-{i:03}")).collect();
    for h in &hosts {
        write(
            root,
            &format!("hosts/{h}.yaml"),
            &format!("name: {h}\nconnection: local\npaths: [/tmp]\n"),
        );
    }
    let host_list = hosts.join(", ");
    for i in 0..199 {
        write(
            root,
            &format!("runbooks/rb-{i:03}.yaml"),
            &format!(
                "name: rb-{i:03}\ndescription: b\nhosts: [{host_list}]\nautonomy: L3\nschedule: \"0 3 * * 1\"\non_alert:\n  matchers: ['alertname=\"Other{i}\"']\n  host_label: instance\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n"
            ),
        );
    }
    write(
        root,
        "runbooks/storm.yaml",
        &format!(
            "name: storm\ndescription: b\nhosts: [{host_list}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"']\n  host_label: instance\ncooldown: 1h\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n"
        ),
    );

    if std::env::var("RUNWARDEN_BENCH_ONLY").as_deref() == Ok("rollout") {
        rollout_against_flat(root, &hosts);
        return;
    }
    // `RUNWARDEN_BENCH_ONLY=fanout`: just the scheduled fan-out.
    if std::env::var("RUNWARDEN_BENCH_ONLY").as_deref() == Ok("fanout") {
        fan_out(root, &hosts);
        return;
    }
    // 1. Startup and idle memory.
    let mut startups = Vec::new();
    for _ in 0..5 {
        let d = start(root);
        startups.push(d.startup);
    }
    startups.sort();
    let d = start(root);
    std::thread::sleep(Duration::from_secs(1));
    println!("200 runbooks, 500 hosts:");
    println!(
        "  startup to listening, median of 5 : {:>7.1} ms (target < 200 ms)",
        percentile(&startups, 0.5).as_secs_f64() * 1e3
    );
    println!(
        "  idle RSS                         : {:>7.1} MB (target < 20 MB)",
        rss_kb(d.child.id(), "VmRSS:") as f64 / 1024.0
    );

    // 2. The storm: notifications of 100 alerts, 500 hosts, one group each.
    let notifications: usize = std::env::var("STORM_NOTIFICATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let mut latencies = Vec::new();
    let mut alerts_sent = 0;
    for n in 0..notifications {
        let alerts: Vec<String> = (0..100)
            .map(|i| {
                let host = &hosts[(n * 100 + i) % hosts.len()];
                format!(r#"{{"status":"firing","labels":{{"alertname":"DiskAlmostFull","instance":"{host}:9100","n":"{n}-{i}"}},"annotations":{{}},"startsAt":"2026-11-30T09:50:08.716Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"{n:04x}{i:04x}"}}"#)
            })
            .collect();
        alerts_sent += alerts.len();
        let body = format!(
            r#"{{"receiver":"rw","status":"firing","alerts":[{}],"groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"","version":"4","groupKey":"storm-{n}","truncatedAlerts":0}}"#,
            alerts.join(",")
        );
        let t = Instant::now();
        let resp = post(&d.addr, "/api/v1/alerts", &body);
        latencies.push(t.elapsed());
        assert!(
            resp.starts_with("HTTP/1.1 200"),
            "{}",
            &resp[..resp.len().min(300)]
        );
    }
    latencies.sort();
    std::thread::sleep(Duration::from_secs(2));
    let metrics = get(&d.addr, "/metrics");
    let accounted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("runwarden_alert_triggers_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!("alert storm: {alerts_sent} alerts in {notifications} notifications (500 hosts):");
    println!(
        "  accept latency p50 / p99         : {:>7.2} / {:.2} ms (target p99 < 10 ms)",
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3
    );
    println!("  alerts accounted for in metrics  : {accounted} of {alerts_sent}");
    for l in metrics
        .lines()
        .filter(|l| l.starts_with("runwarden_alert_triggers_total{") && l.contains("storm"))
    {
        println!("    {l}");
    }
    let started: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("runwarden_runs_started_total{") && l.contains("storm"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!("  runs started (at most one per host): {started} for 500 hosts");
    println!(
        "  peak RSS                         : {:>7.1} MB (target < 60 MB)",
        rss_kb(d.child.id(), "VmHWM:") as f64 / 1024.0
    );
    drop(d);

    fan_out(root, &hosts);

    // 3. Kill switch: a runbook making calls back to back; touch the file; when did the last call start?
    let kdir = tempfile::Builder::new()
        .prefix("rw-bench-ks-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let k = kdir.path();
    write(k, "kill-switch/README", "");
    write(
        k,
        "hosts/h.yaml",
        "name: h\nconnection: local\npaths: [/tmp]\n",
    );
    let mut rb = "name: busy\ndescription: b\nhosts: [h]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"Busy\"']\n  host_label: instance\ntools: { observe: [list_processes] }\nbudget: { max_steps: 1000, max_duration: 1h }\nsteps:\n".to_string();
    for _ in 0..1000 {
        rb += "  - call: list_processes\n    args: { limit: 1 }\n";
    }
    write(k, "runbooks/busy.yaml", &rb);
    let d = start(k);
    let mut gaps = Vec::new();
    let mut late_calls = 0;
    for trial in 0..50 {
        let _ = std::fs::remove_file(k.join("kill-switch/ENGAGED"));
        let body = format!(
            r#"{{"receiver":"rw","status":"firing","alerts":[{{"status":"firing","labels":{{"alertname":"Busy","instance":"h"}},"annotations":{{}},"fingerprint":"t{trial}"}}],"version":"4","groupKey":"busy-{trial}","truncatedAlerts":0}}"#
        );
        // Each trial after a cooldown-free previous run: wait for the run to be in flight.
        let resp = post(&d.addr, "/api/v1/alerts", &body);
        if !resp.contains("started") {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        std::thread::sleep(Duration::from_millis(300));
        let engaged_at = jiff::Timestamp::now();
        std::fs::write(k.join("kill-switch/ENGAGED"), "").unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let audit = std::fs::read_to_string(k.join("state/audit.jsonl")).unwrap();
        let last_intent = audit
            .lines()
            .filter(|l| l.contains("\"phase\":\"intent\""))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                v["ts"]
                    .as_str()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            })
            .max()
            .unwrap();
        let gap = last_intent.duration_since(engaged_at);
        if gap.is_positive() {
            late_calls += 1;
        }
        gaps.push(Duration::try_from(gap).unwrap_or(Duration::ZERO));
    }
    gaps.sort();
    println!(
        "kill switch, {} trials (touch ENGAGED while calls run back to back):",
        gaps.len()
    );
    println!(
        "  last call dispatched after the touch, p50 / p99 : {:.2} / {:.2} ms (target p99 < 50 ms)",
        percentile(&gaps, 0.5).as_secs_f64() * 1e3,
        percentile(&gaps, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "  trials where a call started after the file existed: {late_calls} (each one already past the gate when the file appeared)"
    );
    webhook_to_first_call();
    one_group();
}

/// Part 6: one notification, all its alerts for one (runbook, host), a
/// fresh host each time, so each starts one run and deduplicates the rest.
/// One request on a kept-alive connection: its time, after checking the
/// answer is `status`.
fn kept_alive(c: &mut std::io::BufReader<TcpStream>, request: &[u8], status: &str) -> Duration {
    use std::io::{BufRead, Read};
    let t = Instant::now();
    c.get_mut().write_all(request).unwrap();
    let mut line = String::new();
    c.read_line(&mut line).unwrap();
    assert!(line.starts_with(status), "{line}");
    let mut length = 0;
    loop {
        line.clear();
        c.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    c.read_exact(&mut body).unwrap();
    t.elapsed()
}

fn who_may_ask() {
    use sha2::Digest;
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-chat-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = dir.path();
    let secret = |rel: &str, text: &str| {
        write(root, rel, text);
        std::fs::set_permissions(
            root.join(rel),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
    };
    let token = "bench-token-0123456789abcdef";
    let sha: String = sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    write(root, "kill-switch/README", "");
    secret(
        "principals.yaml",
        &format!(
            "principals:\n  carol:\n    tokens: [{{ id: carol-1, sha256: {sha} }}]\n    chat: [\"slack:T0BENCH/UCAROL\"]\n    scopes:\n      approve: {{}}\n"
        ),
    );
    secret("slack-signing", "8f742231b10e8888abcd99yyyzzz85a5\n");
    secret("slack-bot", "xoxb-bench-0123456789abcdef\n");
    write(
        root,
        "runwarden.yaml",
        "principals_file: principals.yaml\nchat:\n  slack:\n    signing_secret_file: slack-signing\n    bot_token_file: slack-bot\n    channel: C0BENCH\n    api_url: http://127.0.0.1:9/api\n",
    );
    write(
        root,
        "hosts/h.yaml",
        "name: h\nconnection: local\npaths: [/tmp]\n",
    );
    write(
        root,
        "runbooks/l2.yaml",
        "name: l2\ndescription: b\nhosts: [h]\nautonomy: L2\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    let d = start_quiet(root);
    std::thread::sleep(Duration::from_millis(300));
    let connect = || {
        let c = TcpStream::connect(&d.addr).unwrap();
        c.set_nodelay(true).unwrap();
        std::io::BufReader::new(c)
    };
    let (mut bare, mut api, mut slack) = (connect(), connect(), connect());
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec();
    let approvals = format!(
        "GET /api/v1/approvals HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .into_bytes();
    // Slack's documented slash command form, its command ours.
    let form = "token=gIkuvaNzQIHg97ATvDxqgjtO&team_id=T0BENCH&team_domain=example&channel_id=C0BENCH&channel_name=oncall&user_id=UCAROL&user_name=carol&command=%2Frunwarden&text=help&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1234%2F5678&trigger_id=13345224609.738474920.8088930838d88f008e0&api_app_id=A123456";
    let signed = |at: i64| {
        let key =
            ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"8f742231b10e8888abcd99yyyzzz85a5");
        let tag = ring::hmac::sign(&key, format!("v0:{at}:{form}").as_bytes());
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "POST /api/v1/chat/slack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nX-Slack-Request-Timestamp: {at}\r\nX-Slack-Signature: v0={hex}\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        )
        .into_bytes()
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let rounds: usize = std::env::var("CHAT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let (mut b, mut a, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds + 200 {
        let slack_request = signed(now());
        let took = (
            kept_alive(&mut bare, &healthz, "HTTP/1.1 200"),
            kept_alive(&mut api, &approvals, "HTTP/1.1 200"),
            kept_alive(&mut slack, &slack_request, "HTTP/1.1 200"),
        );
        // The first 200 warm the connections and caches.
        if i >= 200 {
            b.push(took.0);
            a.push(took.1);
            s.push(took.2);
        }
    }
    for v in [&mut b, &mut a, &mut s] {
        v.sort();
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("who may ask, {rounds} interleaved rounds on kept-alive connections:");
    for (name, v) in [
        ("bare /healthz 200", &b),
        ("token + authorize()", &a),
        ("Slack signature", &s),
    ] {
        println!(
            "  {name:<22}: p50 {:>7.1} µs, p99 {:>7.1} µs; ratio to bare p50 {:.2}, p99 {:.2}",
            us(percentile(v, 0.5)),
            us(percentile(v, 0.99)),
            percentile(v, 0.5).as_secs_f64() / percentile(&b, 0.5).as_secs_f64(),
            percentile(v, 0.99).as_secs_f64() / percentile(&b, 0.99).as_secs_f64(),
        );
    }
    println!("  (target: signature check + authorize() at most 1.1x the bare answer at p50)");
}

fn one_group() {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-group-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = dir.path();
    write(root, "kill-switch/README", "");
    write(root, "runwarden.yaml", "");
    let sizes = [100usize, 1_000, 10_000];
    let hosts: Vec<String> = (0..sizes.len()).map(|i| format!("g-{i}")).collect();
    for h in &hosts {
        write(
            root,
            &format!("hosts/{h}.yaml"),
            &format!("name: {h}\nconnection: local\npaths: [/tmp]\n"),
        );
    }
    write(
        root,
        "runbooks/group.yaml",
        &format!(
            "name: group\ndescription: b\nhosts: [{}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"']\n  host_label: instance\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n",
            hosts.join(", ")
        ),
    );
    let d = start_quiet(root);
    std::thread::sleep(Duration::from_millis(500));
    println!("one notification, every alert for one (runbook, host):");
    let mut base_per_alert = None;
    for (size, host) in sizes.iter().zip(&hosts) {
        // A dozen labels and two annotations each, as node_exporter's
        // filesystem alerts carry.
        let alerts: Vec<String> = (0..*size)
            .map(|i| {
                format!(r#"{{"status":"firing","labels":{{"alertname":"DiskAlmostFull","instance":"{host}","device":"/dev/sd{i}","fstype":"ext4","job":"node","mountpoint":"/srv/m{i}","severity":"warning","team":"storage","env":"staging","region":"eu-1","cluster":"c1","service":"files"}},"annotations":{{"summary":"{host} /srv/m{i} is almost full","description":"Filesystem /srv/m{i} on {host} has less than 10% free."}},"startsAt":"2026-11-30T09:50:08.716Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"{i:016x}"}}"#)
            })
            .collect();
        let body = format!(
            r#"{{"receiver":"rw","status":"firing","alerts":[{}],"groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"","version":"4","groupKey":"group-{host}","truncatedAlerts":0}}"#,
            alerts.join(",")
        );
        let t = Instant::now();
        let resp = post(&d.addr, "/api/v1/alerts", &body);
        let took = t.elapsed();
        assert!(
            resp.starts_with("HTTP/1.1 200"),
            "{}",
            &resp[..resp.len().min(300)]
        );
        let per_alert = took.as_secs_f64() / *size as f64;
        let base = *base_per_alert.get_or_insert(per_alert);
        println!(
            "  {size:>6} alerts ({:>5.1} MB): answered in {:>8.1} ms, {:>6.1} µs per alert ({:.2}x the 100-alert baseline's), peak RSS {:>6.1} MB",
            body.len() as f64 / 1e6,
            ms(took),
            per_alert * 1e6,
            per_alert / base,
            rss_kb(d.child.id(), "VmHWM:") as f64 / 1024.0
        );
    }
}

/// Wall time from sending an alert to the first tool process starting, for
/// runwarden (parse, match, dedupe, gate, audit intent fsynced, spawn) and for
/// adnanh/webhook (Debian `webhook`) running a command for the same POST.
fn webhook_to_first_call() {
    const HOSTS: usize = 500;
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-latency-")
        .tempdir_in(std::env::var("RUNWARDEN_BENCH_LATENCY_DIR").unwrap_or("/var/tmp".into()))
        .unwrap();
    let root = dir.path();
    let (marks, hosts) = marking_hosts(root, HOSTS);
    write(
        root,
        "runbooks/first.yaml",
        &format!(
            "name: first\ndescription: b\nhosts: [{}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"Latency\"']\n  host_label: instance\ntools: {{ observe: [list_processes] }}\nsteps:\n  - call: list_processes\n",
            hosts.join(", ")
        ),
    );
    let marks_seen = || {
        std::fs::read_to_string(&marks)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let last_mark = || -> f64 {
        std::fs::read_to_string(&marks)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    let now = || jiff::Timestamp::now().as_nanosecond() as f64 / 1e9;
    // One alert (the `seen`-th mark to come): send, wait for the tool's mark.
    // The tool stamps its own start, so this side only needs to notice it:
    // it looks every 2 ms rather than spin beside what it measures on two
    // cores, and lets both servers finish their work (runwarden's verdict
    // line, webhook's reaping) before the next alert, one at a time.
    let one = |addr: &str, path: &str, body: &str, seen: usize| -> (Duration, Stamped) {
        let sent = now();
        let resp = post(addr, path, body);
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let t = Instant::now();
        while marks_seen() < seen {
            assert!(t.elapsed() < Duration::from_secs(10), "no call for {body}");
            std::thread::sleep(Duration::from_millis(2));
        }
        let mark = last_mark();
        let took = Duration::from_secs_f64((mark - sent).max(0.0));
        std::thread::sleep(Duration::from_millis(10));
        let run_id = resp
            .split("\"run_id\":\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_string();
        (took, Stamped { run_id, sent, mark })
    };
    // The durability floor, in the same run and on the same disk (in out/,
    // not the configuration directory the daemon watches): what
    // appending an intent-sized line and `fdatasync` costs this disk now.
    // runwarden pays it once before every call; webhook never does.
    let floor_file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(root.join("out/sync-floor"))
        .unwrap();
    let line = format!("{}\n", "x".repeat(1500));
    let synced = || -> Duration {
        let t = Instant::now();
        (&floor_file).write_all(line.as_bytes()).unwrap();
        floor_file.sync_data().unwrap();
        let took = t.elapsed();
        std::thread::sleep(Duration::from_millis(10));
        took
    };
    // The idea of a cheaper sync, measured beside it: the same line written
    // over blocks that were written before (a preallocated, zeroed file),
    // so `fdatasync` has no size or extent to journal, only the data.
    let inplace_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(root.join("out/sync-inplace"))
        .unwrap();
    const INPLACE: u64 = 4 << 20;
    std::os::unix::fs::FileExt::write_all_at(&inplace_file, &vec![0u8; INPLACE as usize], 0)
        .unwrap();
    inplace_file.sync_all().unwrap();
    let inplace_at = std::cell::Cell::new(0u64);
    let synced_inplace = || -> Duration {
        let at = match inplace_at.get() + line.len() as u64 > INPLACE {
            true => 0,
            false => inplace_at.get(),
        };
        let t = Instant::now();
        std::os::unix::fs::FileExt::write_all_at(&inplace_file, line.as_bytes(), at).unwrap();
        inplace_file.sync_data().unwrap();
        let took = t.elapsed();
        inplace_at.set(at + line.len() as u64);
        std::thread::sleep(Duration::from_millis(10));
        took
    };
    // Alert `n` of the run, for host `i`.
    let alert = |i: usize, n: usize| {
        format!(
            r#"{{"receiver":"rw","status":"firing","alerts":[{{"status":"firing","labels":{{"alertname":"Latency","instance":"h{i:03}:9100"}},"annotations":{{}},"fingerprint":"f{n}"}}],"version":"4","groupKey":"g{n}","truncatedAlerts":0}}"#
        )
    };
    // Its log lines go to /dev/null, as webhook's do below: written, not shown.
    let d = start_quiet(root);
    let webhook = Path::new("/usr/bin/webhook").exists().then(|| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        write(
            root,
            "hooks.json",
            &format!(
                r#"[{{"id":"run","execute-command":"{}"}}]"#,
                root.join("first-call").display()
            ),
        );
        let hook = Command::new("/usr/bin/webhook")
            .args([
                "-hooks",
                root.join("hooks.json").to_str().unwrap(),
                "-ip",
                "127.0.0.1",
                "-port",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let t = Instant::now();
        while TcpStream::connect(&addr).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(20));
        }
        (hook, addr)
    });
    // Interleaved, alert by alert, so both sides meet the same moments of
    // the machine's noise. Two rounds over the hosts: a runbook's first run
    // on a host creates its run lock's file, and that new inode rides on
    // the intent line's sync; every later run finds the file there.
    // Emptied, not removed: the collector keeps the file open to append.
    std::fs::File::create(&marks).unwrap();
    let mut rounds = Vec::new();
    let mut stamped = Vec::new();
    for round in 0..2 {
        let (mut rw, mut wh, mut sync, mut inplace) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut stamps = Vec::new();
        for i in 0..HOSTS {
            let n = round * HOSTS + i;
            let (took, stamp) = one(&d.addr, "/api/v1/alerts", &alert(i, n), marks_seen() + 1);
            rw.push(took);
            stamps.push(stamp);
            if let Some((_, addr)) = &webhook {
                let body = format!(r#"{{"n":{n}}}"#);
                wh.push(one(addr, "/hooks/run", &body, marks_seen() + 1).0);
            }
            sync.push(synced());
            inplace.push(synced_inplace());
        }
        rounds.push([rw, wh, sync, inplace]);
        stamped.push(stamps);
    }
    drop(d);
    let stages = stages(&root.join("state"), &stamped);
    if let Some((mut hook, _)) = webhook {
        let _ = hook.kill();
        let _ = hook.wait();
    }
    // `RUNWARDEN_BENCH_SAMPLES=FILE`: every alert's figures in send order
    // (round, host, runwarden ms, webhook ms, sync ms), to see when a tail came.
    if let Ok(path) = std::env::var("RUNWARDEN_BENCH_SAMPLES") {
        let mut rows = String::new();
        for (round, [rw, wh, sync, _]) in rounds.iter().enumerate() {
            for i in 0..rw.len() {
                let w = wh.get(i).map_or(f64::NAN, |w| ms(*w));
                rows += &format!("{round},{i},{:.3},{w:.3},{:.3}\n", ms(rw[i]), ms(sync[i]));
            }
        }
        std::fs::write(path, rows).unwrap();
    }
    println!("webhook to first tool call, {HOSTS} hosts twice, one alert at a time, interleaved:");
    let titles = [
        "a runbook's first run on each host",
        "every later run (the steady state)",
    ];
    for ((title, [mut rw, mut wh, mut sync, mut inplace]), stages) in
        titles.into_iter().zip(rounds).zip(stages)
    {
        rw.sort();
        wh.sort();
        sync.sort();
        inplace.sort();
        let p50 = |v: &[Duration]| ms(percentile(v, 0.5));
        let p99 = |v: &[Duration]| ms(percentile(v, 0.99));
        println!(" {title}:");
        println!(
            "  runwarden p50 / p99              : {:>7.2} / {:.2} ms",
            p50(&rw),
            p99(&rw)
        );
        for (stage, mut took) in stages {
            took.sort();
            println!(
                "    {stage:<31}: {:>7.2} / {:.2} ms",
                p50(&took),
                p99(&took)
            );
        }
        if wh.is_empty() {
            println!("  adnanh/webhook not installed (Debian package webhook): comparison skipped");
            continue;
        }
        println!(
            "  adnanh/webhook p50 / p99         : {:>7.2} / {:.2} ms",
            p50(&wh),
            p99(&wh)
        );
        println!(
            "  append + fdatasync, same disk    : {:>7.2} / {:.2} ms (the floor runwarden pays once per call)",
            p50(&sync),
            p99(&sync)
        );
        println!(
            "  the same, over written blocks    : {:>7.2} / {:.2} ms (a preallocated file written in place)",
            p50(&inplace),
            p99(&inplace)
        );
        println!(
            "  ratio runwarden / webhook        : p50 {:.2}, p99 {:.2} (target: p99 <= 1.5)",
            p50(&rw) / p50(&wh),
            p99(&rw) / p99(&wh)
        );
        println!(
            "  runwarden / (webhook + sync) p50 : {:.3} (target <= 1.15: the floor is webhook plus the one sync)",
            p50(&rw) / (p50(&wh) + p50(&sync))
        );
        println!(
            "  runwarden - webhook at p50       : {:>7.2} ms, the sync's p50 {:.2} ms of it",
            p50(&rw) - p50(&wh),
            p50(&sync)
        );
    }
}

/// One alert's run as the bench saw it: its id, when the alert was sent
/// and when the tool's `main` stamped its mark (seconds since the epoch).
struct Stamped {
    run_id: String,
    sent: f64,
    mark: f64,
}

/// Where each alert's time went, from the run's own audit lines (their
/// `ts` is taken as each line is made, before it is written): per round,
/// each stage's durations. The intent line is made before its sync, so
/// its stage to the tool's `main` holds the sync and the spawn.
fn stages(state: &Path, rounds: &[Vec<Stamped>]) -> Vec<Vec<(&'static str, Vec<Duration>)>> {
    let mut at: std::collections::HashMap<(String, String), f64> = Default::default();
    for entry in std::fs::read_dir(state).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("audit") || !name.contains(".jsonl") || name.ends_with(".torn") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let (Some(run), Some(phase), Some(ts)) =
                (v["run_id"].as_str(), v["phase"].as_str(), v["ts"].as_str())
            else {
                continue;
            };
            let ts: jiff::Timestamp = ts.parse().unwrap();
            let key = (run.to_string(), phase.to_string());
            // A run's first line of each phase.
            at.entry(key).or_insert(ts.as_nanosecond() as f64 / 1e9);
        }
    }
    let span = |from: f64, to: f64| Duration::from_secs_f64((to - from).max(0.0));
    rounds
        .iter()
        .map(|stamps| {
            let mut out: Vec<(&'static str, Vec<Duration>)> = vec![
                ("sent to its trigger line", Vec::new()),
                ("trigger line to run start", Vec::new()),
                ("run start to intent line", Vec::new()),
                ("intent to tool (sync, spawn)", Vec::new()),
            ];
            for s in stamps {
                let phase = |p: &str| at.get(&(s.run_id.clone(), p.to_string())).copied();
                let (Some(q), Some(st), Some(i)) =
                    (phase("queued"), phase("start"), phase("intent"))
                else {
                    continue;
                };
                out[0].1.push(span(s.sent, q));
                out[1].1.push(span(q, st));
                out[2].1.push(span(st, i));
                out[3].1.push(span(i, s.mark));
            }
            out
        })
        .collect()
}

/// 3. One scheduled fire across 500 hosts under `max_concurrent_runs: 8`.
fn fan_out(root: &Path, hosts: &[String]) {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-fan-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let f = dir.path();
    write(f, "kill-switch/README", "");
    write(
        f,
        "runwarden.yaml",
        "max_concurrent_runs: 8
timezone: UTC
",
    );
    for h in hosts {
        std::fs::copy(root.join(format!("hosts/{h}.yaml")), {
            std::fs::create_dir_all(f.join("hosts")).unwrap();
            f.join(format!("hosts/{h}.yaml"))
        })
        .unwrap();
    }
    // A second of the day 4 s from now: the schedule fires once while we watch.
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4);
    let at = at.to_zoned(jiff::tz::TimeZone::UTC);
    write(
        f,
        "runbooks/fan.yaml",
        &format!(
            "name: fan\ndescription: b\nhosts: [{}]\nautonomy: L3\nschedule: \"{} {} {} * * *\"\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n",
            hosts.join(", "),
            at.second(),
            at.minute(),
            at.hour()
        ),
    );
    let d = start(f);
    let mut most = 0.0f64;
    let mut first: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished = loop {
        let metrics = get(&d.addr, "/metrics");
        let value = |name: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let in_flight = value("runwarden_runs_in_flight ");
        most = most.max(in_flight);
        let done = value("runwarden_runs_finished_total{runbook=\"fan\"");
        if first.is_none() && (in_flight > 0.0 || done > 0.0) {
            first = Some(Instant::now());
        }
        if done >= hosts.len() as f64 || Instant::now() > deadline {
            break done;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall = first.map(|t| t.elapsed()).unwrap_or_default();
    let metrics = get(&d.addr, "/metrics");
    println!(
        "scheduled fan-out to {} hosts, max_concurrent_runs 8:",
        hosts.len()
    );
    println!(
        "  runs finished                    : {finished} of {}",
        hosts.len()
    );
    for l in metrics.lines().filter(|l| {
        l.starts_with("runwarden_runs_finished_total{runbook=\"fan\"") && !l.ends_with(" 0")
    }) {
        println!("    {l}");
    }
    println!("  most runs in flight at a sample  : {most} (limit 8; sampled every 10 ms)");
    println!(
        "  wall time, first run to last    : {:>7.2} s",
        wall.as_secs_f64()
    );
    // Group commit: concurrent runs share a device flush.
    if let Some(syncs) = metrics
        .lines()
        .find_map(|l| l.strip_prefix("runwarden_audit_syncs_total "))
        .and_then(|v| v.parse::<f64>().ok())
    {
        println!(
            "  audit syncs                      : {syncs} for {finished} runs ({:.2} a run)",
            syncs / finished.max(1.0)
        );
    }
}

/// Part 7: one runbook's 500 hosts as a staged rollout (1, 10%, 100%, no
/// pause) and the same hosts as a flat fan-out, rounds interleaved on one
/// daemon, each timed from its request to its last verdict.
fn rollout_against_flat(root: &Path, hosts: &[String]) {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-rollout-")
        .tempdir_in(std::env::var("RUNWARDEN_BENCH_ROLLOUT_DIR").unwrap_or("/var/tmp".into()))
        .unwrap();
    let f = dir.path();
    write(f, "kill-switch/README", "");
    write(f, "runwarden.yaml", "max_concurrent_runs: 8\n");
    std::fs::create_dir_all(f.join("hosts")).unwrap();
    for h in hosts {
        std::fs::copy(
            root.join(format!("hosts/{h}.yaml")),
            f.join(format!("hosts/{h}.yaml")),
        )
        .unwrap();
    }
    let body = format!(
        "description: b\nhosts: [{}]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n",
        hosts.join(", ")
    );
    write(f, "runbooks/flat.yaml", &format!("name: flat\n{body}"));
    write(
        f,
        "runbooks/staged.yaml",
        &format!(
            "name: staged\n{body}rollout:\n  canary: 1\n  waves: [\"10%\", \"100%\"]\n  pause: 0s\n  max_failures: 0\n"
        ),
    );
    let d = start_quiet(f);
    let finished = |runbook: &str| -> f64 {
        get(&d.addr, "/metrics")
            .lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "runwarden_runs_finished_total{{runbook=\"{runbook}\""
                ))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let one = |runbook: &str| -> Duration {
        let before = finished(runbook);
        let t = Instant::now();
        let resp = post(
            &d.addr,
            "/api/v1/runs",
            &format!(r#"{{"runbook":"{runbook}","all_hosts":true}}"#),
        );
        assert!(resp.starts_with("HTTP/1.1 202"), "{resp}");
        let deadline = t + Duration::from_secs(300);
        loop {
            if finished(runbook) - before >= hosts.len() as f64 {
                break;
            }
            assert!(Instant::now() < deadline, "{runbook}: not every host ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = t.elapsed();
        // A rollout is over (its `finished` line written) before the next.
        if runbook == "staged" {
            let body: serde_json::Value =
                serde_json::from_str(resp.split_once("\r\n\r\n").unwrap().1).unwrap();
            let id = body["rollout"]["id"].as_str().unwrap().to_string();
            loop {
                let s = get(&d.addr, &format!("/api/v1/rollouts/{id}"));
                if s.contains("\"state\":\"finished\"") {
                    break;
                }
                assert!(!s.contains("\"state\":\"halted\""), "{s}");
                assert!(Instant::now() < deadline, "{s}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        took
    };
    let rounds: usize = std::env::var("RUNWARDEN_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    // One of each first, unmeasured: files cached, pools warm.
    one("flat");
    one("staged");
    let mut ratios = Vec::new();
    println!(
        "{} hosts, max_concurrent_runs 8: a rollout (1, 10%, 100%, no pause) vs a flat fan-out",
        hosts.len()
    );
    for round in 1..=rounds {
        let (flat, staged) = if round % 2 == 1 {
            let f = one("flat");
            (f, one("staged"))
        } else {
            let s = one("staged");
            (one("flat"), s)
        };
        let ratio = staged.as_secs_f64() / flat.as_secs_f64();
        ratios.push(ratio);
        println!(
            "  round {round}: flat {:>6.2} s, rollout {:>6.2} s, ratio {ratio:.3}",
            flat.as_secs_f64(),
            staged.as_secs_f64()
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "  rollout / flat, median of {rounds}: {:.3} (target <= 1.1, the canary and each wave's barrier included)",
        ratios[ratios.len() / 2]
    );
}

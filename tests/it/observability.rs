//! The observability pack against the real tools: promtool and amtool on the
//! shipped files, and the whole chain on loopback with real Prometheus and
//! Alertmanager: an estate alert fires, Alertmanager routes it to runwarden
//! (with the shipped example config), runwarden's tier-2 calls make its own
//! burst alert fire, and that alert reaches a person's receiver, not runwarden.
//! Every PromQL expression of the dashboard returns data from that Prometheus.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?}:\n{text}");
    text
}

#[test]
fn shipped_rules_and_routes_pass_promtool_and_amtool() {
    let text = run_ok(
        "/usr/bin/promtool",
        &[
            "check",
            "rules",
            "alerts/runwarden.rules.yml",
            "alerts/staging.example.rules.yml",
        ],
    );
    // Every alert and recording rule the file writes is one promtool found.
    let written = std::fs::read_to_string(repo().join("alerts/runwarden.rules.yml"))
        .unwrap()
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("- alert:") || l.starts_with("- record:")
        })
        .count();
    assert!(
        text.contains(&format!("SUCCESS: {written} rules found")),
        "{written} rules written: {text}"
    );
    let text = run_ok(
        "/usr/bin/promtool",
        &["test", "rules", "alerts/tests/runwarden.rules.test.yml"],
    );
    assert!(text.contains("SUCCESS"), "{text}");
    run_ok(
        "/usr/bin/amtool",
        &["check-config", "alerts/alertmanager.example.yml"],
    );
}

/// A loopback HTTP server: answers `body` to GETs and keeps every POST body.
fn sink(body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    sink_of(Arc::new(Mutex::new(body)))
}

/// [`sink`] whose answer the test can change while it runs.
fn sink_of(body: Arc<Mutex<&'static str>>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let posts = Arc::new(Mutex::new(Vec::new()));
    let kept = posts.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(c) = conn else { continue };
            let mut reader = BufReader::new(c);
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let mut len = 0;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut buf = vec![0; len];
            let _ = reader.read_exact(&mut buf);
            if first.starts_with("POST") {
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
            }
            let mut c = reader.into_inner();
            let body = *body.lock().unwrap();
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, posts)
}

pub(crate) fn query(prom: &str, expr: &str) -> Option<Vec<Value>> {
    let q: String = expr
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let (_, body) = http(prom, "GET", &format!("/api/v1/query?query={q}"), "")?;
    let v: Value = serde_json::from_str(&body).ok()?;
    assert_eq!(v["status"], "success", "{expr}: {v}");
    v["data"]["result"].as_array().cloned()
}

/// A node_exporter stand-in for one nearly full filesystem: the only test double here,
/// limited to the exporter's two series (node_exporter itself is not part of the estate).
const NODE_METRICS: &str = "node_filesystem_avail_bytes{instance=\"web-01:9100\",device=\"/dev/vda\",fstype=\"ext4\",mountpoint=\"/\"} 5e+09\nnode_filesystem_size_bytes{instance=\"web-01:9100\",device=\"/dev/vda\",fstype=\"ext4\",mountpoint=\"/\"} 1e+11\n";

#[test]
fn estate_alert_to_runwarden_to_burst_alert_to_a_person_and_the_dashboard_has_data() {
    let e = Estate::new();
    let conf = rotating_host(&e, "web-01");
    let mut rb = "name: disk-remediation\ndescription: t\nhosts: [web-01]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"NodeFilesystemAlmostFull\"', 'env=\"staging\"']\n  host_label: instance\ncooldown: 1h\ndemote_after: { failures: 3, per: 1h }\ntools: { observe: [disk_usage], approve: [rotate_logs] }\nbudget: { max_mutations: 3 }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n".to_string();
    for i in 0..4 {
        rb += &format!(
            "  - call: rotate_logs\n    args: {{ config: {} }}\n    reason: \"{{{{ alert.labels.mountpoint }}}} almost full (rotation {i})\"\n",
            conf
        );
    }
    e.runbook("disk-remediation", &rb);
    // A schedule every two seconds, capped at three runs an hour: the
    // fourth fire on is `capped` (the dashboard's capped panel has data).
    e.runbook(
        "tick",
        "name: tick\ndescription: t\nhosts: [web-01]\nautonomy: L3\nschedule: \"*/2 * * * * *\"\nmax_runs: { count: 3, per: 1h }\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    let token = e.path().join("token");
    write_secret(&token, "obs-token-0123456789abcdef\n");
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "webhook_token_file: token\nfleet_budget: { max_mutations: 50, per: 1h }\n",
    )
    .unwrap();

    let (_rw, rw_addr) = serve(&e);
    // The filesystem fills only once Prometheus has scraped runwarden: the
    // burst rule's increase() needs the counters' zero before the changes.
    let node_body = Arc::new(Mutex::new(""));
    let (node_addr, _) = sink_of(node_body.clone());
    let (person_addr, person) = sink("ok");

    // Alertmanager with the shipped example route, pointed at this test's addresses.
    let example = std::fs::read_to_string(repo().join("alerts/alertmanager.example.yml")).unwrap();
    let am_config = example
        .replace(
            "http://127.0.0.1:9731/api/v1/alerts",
            &format!("http://{rw_addr}/api/v1/alerts"),
        )
        .replace("/etc/runwarden/webhook-token", token.to_str().unwrap())
        .replace(
            "http://127.0.0.1:9095/on-call",
            &format!("http://{person_addr}/on-call"),
        )
        .replace("group_wait: 30s", "group_wait: 0s")
        .replace("group_wait: 10s", "group_wait: 0s")
        .replace("group_interval: 5m", "group_interval: 1s");
    let (_am, am_addr) = alertmanager(&e.work().join("am"), &am_config);

    // Prometheus with the shipped rules (the estate rule without its `for:`), evaluating every second.
    let prom_dir = e.work().join("prom");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let staging = std::fs::read_to_string(repo().join("alerts/staging.example.rules.yml"))
        .unwrap()
        .replace("for: 10m", "for: 0s");
    std::fs::write(prom_dir.join("staging.rules.yml"), staging).unwrap();
    std::fs::copy(
        repo().join("alerts/runwarden.rules.yml"),
        prom_dir.join("runwarden.rules.yml"),
    )
    .unwrap();
    let (_prom, prom_addr) = prometheus(
        &prom_dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [runwarden.rules.yml, staging.rules.yml]\nalerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am_addr}']\nscrape_configs:\n  - job_name: runwarden\n    static_configs:\n      - targets: ['{rw_addr}']\n  - job_name: node\n    honor_labels: true\n    static_configs:\n      - targets: ['{node_addr}']\n"
        ),
    );

    wait_for(
        "a scrape of runwarden's tier-2 counters",
        Duration::from_secs(60),
        || query(&prom_addr, "runwarden_tool_calls_total{tier=\"2\"}").filter(|r| !r.is_empty()),
    );
    *node_body.lock().unwrap() = NODE_METRICS;

    // Hop 1-3: the estate alert fires in Prometheus, Alertmanager routes it, runwarden runs.
    let run = wait_for("the remediation run", Duration::from_secs(150), || {
        let runs: Value = serde_json::from_str(
            &http_with(
                &rw_addr,
                "GET",
                "/api/v1/runs",
                "",
                &["Authorization: Bearer obs-token-0123456789abcdef"],
            )?
            .1,
        )
        .ok()?;
        runs["runs"]
            .as_array()?
            .iter()
            .find(|r| {
                r["runbook"] == "disk-remediation"
                    && r["status"] != "running"
                    && r["status"] != "queued"
            })
            .cloned()
    });
    assert_eq!(run["trigger"], "alert");
    assert_eq!(run["host"], "web-01");
    assert_eq!(
        run["status"], "budget_exhausted",
        "three changes, the fourth refused: {run:#}"
    );

    // Hop 4-5: the tier-2 calls make runwarden's own burst alert fire, and it reaches a person.
    let burst = wait_for(
        "RunwardenTier2Burst at the person's receiver",
        Duration::from_secs(150),
        || {
            person
                .lock()
                .unwrap()
                .iter()
                .find(|b| b.contains("\"alertname\":\"RunwardenTier2Burst\""))
                .cloned()
        },
    );
    let burst: Value = serde_json::from_str(&burst).unwrap();
    assert_eq!(burst["alerts"][0]["labels"]["service"], "runwarden");
    // ... and never back into runwarden: every alert runwarden received was the estate's.
    let received = wait_for(
        "runwarden's own alert counts",
        Duration::from_secs(60),
        || {
            let m = http(&rw_addr, "GET", "/metrics", "")?.1;
            Some(
                m.lines()
                    .filter(|l| {
                        l.starts_with("runwarden_alert_triggers_total{") && !l.ends_with(" 0")
                    })
                    .map(String::from)
                    .collect::<Vec<_>>(),
            )
        },
    );
    assert!(!received.is_empty());
    assert!(
        received
            .iter()
            .all(|l| l.contains("runbook=\"disk-remediation\"")),
        "{received:#?}"
    );

    // Every dashboard query returns data from this Prometheus.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("dashboards/runwarden.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_string())
        })
        .collect();
    assert!(exprs.len() >= 14);
    // The model planner's panels have data only where a model is configured
    // (`model.rs` checks them against a daemon that has one), the shared
    // state's only with PostgreSQL (`ha.rs`): here they must parse.
    for expr in exprs {
        let concrete = expr
            .replace("$__rate_interval", "1m")
            .replace("$job", "runwarden")
            .replace("$instance", ".*");
        // A query that keeps only what is set (`> 0`: an engaged switch)
        // must parse; the series under it must have data.
        query(&prom_addr, &concrete);
        if [
            "runwarden_model_",
            "runwarden_store_up",
            "lease_lost",
            "runwarden_fleet_queued_runs",
        ]
        .iter()
        .any(|only| expr.contains(only))
        {
            continue;
        }
        let series = concrete.trim_end_matches(" > 0");
        wait_for(&format!("data for {expr}"), Duration::from_secs(90), || {
            query(&prom_addr, series).filter(|r| !r.is_empty())
        });
    }
    // The fleet budget's gauges count the run's three rotations, against its 50.
    wait_for("fleet budget used 3 of 50", Duration::from_secs(60), || {
        let used = query(
            &prom_addr,
            "runwarden_fleet_budget_used{scope=\"all\"} == 3",
        )?;
        let limit = query(
            &prom_addr,
            "runwarden_fleet_budget_limit{scope=\"all\"} == 50",
        )?;
        (!used.is_empty() && !limit.is_empty()).then_some(())
    });
    // So does every recording rule.
    for rule in [
        "runwarden:tier2_calls:increase1h",
        "runwarden:runs_finished:increase1h",
        "runwarden:run_duration_seconds:p95_1h",
    ] {
        wait_for(rule, Duration::from_secs(150), || {
            query(&prom_addr, rule).filter(|r| !r.is_empty())
        });
    }
}

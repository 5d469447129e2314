//! End to end with the real Debian `prometheus-alertmanager` and `prometheus`,
//! all on loopback: an alert posted to Alertmanager's API reaches
//! `runwarden serve` through a real route (bearer token read by Alertmanager
//! from a credentials file) and starts the right run; a real Prometheus
//! scrapes `/metrics` and sees the trigger.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A tiny HTTP/1.1 client: (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut c = TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).ok()?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.get(9..12)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    // Prometheus answers chunked; the JSON is on the first chunk line here.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.lines().nth(1).unwrap_or("").to_string()
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn alertmanager_routes_an_alert_to_a_run_and_prometheus_scrapes_it() {
    let e = Estate::new();
    e.host("web-01", &local_host("web-01", "paths: [/tmp]"));
    e.runbook(
        "disk-alert",
        "name: disk-alert\ndescription: t\nhosts: [web-01]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"', 'env=\"staging\"']\n  host_label: instance\ncooldown: 1h\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    let token = e.path().join("token");
    std::fs::write(&token, "e2e-token-0123456789abcdef\n").unwrap();
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "webhook_token_file: token\n",
    )
    .unwrap();

    let mut rw = e
        .cmd(&["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(rw.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _rw = Proc(rw);
    let rw_addr = line
        .split_whitespace()
        .nth(3)
        .unwrap()
        .trim_end_matches(';')
        .to_string();

    let am_port = free_port();
    let am_addr = format!("127.0.0.1:{am_port}");
    let am_dir = e.work().join("alertmanager");
    std::fs::create_dir_all(&am_dir).unwrap();
    std::fs::write(
        am_dir.join("alertmanager.yml"),
        format!(
            "route:\n  receiver: runwarden\n  group_by: [alertname, instance]\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: runwarden\n    webhook_configs:\n      - url: http://{rw_addr}/api/v1/alerts\n        send_resolved: true\n        http_config:\n          authorization:\n            credentials_file: {}\n",
            token.display()
        ),
    )
    .unwrap();
    let _am = Proc(
        Command::new("/usr/bin/prometheus-alertmanager")
            .arg(format!(
                "--config.file={}",
                am_dir.join("alertmanager.yml").display()
            ))
            .arg(format!("--storage.path={}", am_dir.join("data").display()))
            .arg(format!("--web.listen-address={am_addr}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-alertmanager (Debian package)"),
    );
    wait_for("alertmanager", Duration::from_secs(20), || {
        http(&am_addr, "GET", "/-/ready", "").filter(|r| r.0 == 200)
    });

    let prom_port = free_port();
    let prom_addr = format!("127.0.0.1:{prom_port}");
    let prom_dir = e.work().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    std::fs::write(
        prom_dir.join("prometheus.yml"),
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: runwarden\n    static_configs:\n      - targets: ['{rw_addr}']\n"),
    )
    .unwrap();
    let _prom = Proc(
        Command::new("/usr/bin/prometheus")
            .arg(format!(
                "--config.file={}",
                prom_dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                prom_dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package)"),
    );

    // The staging estate's own alert, posted to Alertmanager like Prometheus would.
    let alert = r#"[{"labels":{"alertname":"DiskAlmostFull","env":"staging","instance":"web-01:9100","mountpoint":"/","severity":"warning"},"annotations":{"summary":"/ is over 90% full"}}]"#;
    let (status, body) = http(&am_addr, "POST", "/api/v2/alerts", alert).unwrap();
    assert_eq!(status, 200, "{body}");

    let run = wait_for(
        "a run started by Alertmanager",
        Duration::from_secs(30),
        || {
            let (_, body) = http(&rw_addr, "GET", "/api/v1/runs", "")?;
            let runs: Value = serde_json::from_str(&body).ok()?;
            runs["runs"]
                .as_array()?
                .iter()
                .find(|r| r["status"] == "ok")
                .cloned()
        },
    );
    assert_eq!(run["runbook"], "disk-alert");
    assert_eq!(run["host"], "web-01");
    assert_eq!(run["trigger"], "alert");

    let started = wait_for(
        "prometheus to scrape the trigger",
        Duration::from_secs(30),
        || {
            let q =
                "/api/v1/query?query=runwarden_alert_triggers_total%7Bresult%3D%22started%22%7D";
            let (_, body) = http(&prom_addr, "GET", q, "")?;
            let v: Value = serde_json::from_str(&body).ok()?;
            let first = v["data"]["result"].as_array()?.first()?.clone();
            Some(first)
        },
    );
    assert_eq!(started["metric"]["runbook"], "disk-alert");
    assert_eq!(started["value"][1], "1");
    let (_, up) = http(
        &prom_addr,
        "GET",
        "/api/v1/query?query=up%7Bjob%3D%22runwarden%22%7D",
        "",
    )
    .unwrap();
    assert!(
        up.contains(r#""value":["#) && up.contains(r#","1"]"#),
        "{up}"
    );
}

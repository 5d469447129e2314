//! End to end with the real Debian `prometheus-alertmanager` and `prometheus`,
//! all on loopback: an alert posted to Alertmanager's API reaches
//! `runwarden serve` through a real route (bearer token read by Alertmanager
//! from a credentials file) and starts the right run; a real Prometheus
//! scrapes `/metrics` and sees the trigger.

use std::time::Duration;

use serde_json::Value;

use crate::util::*;

#[test]
fn alertmanager_routes_an_alert_to_a_run_and_prometheus_scrapes_it() {
    let e = Estate::new();
    e.host("web-01", &local_host("web-01", "paths: [/tmp]"));
    e.runbook(
        "disk-alert",
        "name: disk-alert\ndescription: t\nhosts: [web-01]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"', 'env=\"staging\"']\n  host_label: instance\ncooldown: 1h\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    let token = e.path().join("token");
    write_secret(&token, "e2e-token-0123456789abcdef\n");
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "webhook_token_file: token\n",
    )
    .unwrap();
    let (_rw, rw_addr) = serve(&e);

    let (_am, am_addr) = alertmanager(
        &e.work().join("alertmanager"),
        &format!(
            "route:\n  receiver: runwarden\n  group_by: [alertname, instance]\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: runwarden\n    webhook_configs:\n      - url: http://{rw_addr}/api/v1/alerts\n        send_resolved: true\n        http_config:\n          authorization:\n            credentials_file: {}\n",
            token.display()
        ),
    );
    let (_prom, prom_addr) = prometheus(
        &e.work().join("prometheus"),
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: runwarden\n    static_configs:\n      - targets: ['{rw_addr}']\n"
        ),
    );

    // The staging estate's own alert, posted to Alertmanager like Prometheus would.
    let alert = r#"[{"labels":{"alertname":"DiskAlmostFull","env":"staging","instance":"web-01:9100","mountpoint":"/","severity":"warning"},"annotations":{"summary":"/ is over 90% full"}}]"#;
    let (status, body) = http(&am_addr, "POST", "/api/v2/alerts", alert).unwrap();
    assert_eq!(status, 200, "{body}");

    let run = wait_for(
        "a run started by Alertmanager",
        Duration::from_secs(30),
        || {
            let (_, body) = http_with(
                &rw_addr,
                "GET",
                "/api/v1/runs",
                "",
                &["Authorization: Bearer e2e-token-0123456789abcdef"],
            )?;
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
            v["data"]["result"]
                .as_array()?
                .iter()
                .find(|r| r["value"][1] == "1")
                .cloned()
        },
    );
    assert_eq!(started["metric"]["runbook"], "disk-alert");
    let (_, up) = http(
        &prom_addr,
        "GET",
        "/api/v1/query?query=up%7Bjob%3D%22runwarden%22%7D",
        "",
    )
    .unwrap();
    assert!(up.contains(r#","1"]"#), "{up}");
}

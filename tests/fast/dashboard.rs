//! The shipped Grafana dashboard: every panel described, every query
//! following the dashboard's variables.

use super::*;

/// The dashboard as a person meets it, checked without a Grafana (none is
/// packaged where the tests run; every query is run against a real
/// Prometheus in the root tier): every panel says what it shows and in
/// which unit, every query follows the `job` and `instance` variables,
/// panels do not overlap, the kill switch is red when engaged, and kill
/// switch changes and reloads are annotations.
#[test]
fn the_dashboard_describes_every_panel_and_follows_its_variables() {
    let d = dashboard();
    let panels = d["panels"].as_array().unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let mut cells = std::collections::BTreeMap::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "{title}: duplicate id"
        );
        assert!(
            p["description"].as_str().is_some_and(|s| s.len() > 20),
            "{title}: no description"
        );
        assert!(
            p["fieldConfig"]["defaults"]["unit"].as_str().is_some(),
            "{title}: no unit"
        );
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let selectors = expr.matches("runwarden_").count();
            assert_eq!(
                expr.matches("job=~\"$job\",instance=~\"$instance\"")
                    .count(),
                selectors,
                "{title}: {expr}"
            );
        }
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "{title}: wider than the grid");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.to_string()) {
                    panic!("{title} overlaps {other}");
                }
            }
        }
    }
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance", "api"]);
    let switch = panels.iter().find(|p| p["title"] == "Kill switch").unwrap();
    let steps = &switch["fieldConfig"]["defaults"]["thresholds"]["steps"];
    assert_eq!(steps[1], serde_json::json!({ "color": "red", "value": 1 }));
    let annotations: Vec<&str> = d["annotations"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["expr"].as_str().unwrap())
        .collect();
    assert!(
        annotations
            .iter()
            .any(|e| e.contains("runwarden_kill_switch_engaged"))
    );
    assert!(
        annotations
            .iter()
            .any(|e| e.contains("runwarden_config_reloads_total"))
    );
}

fn dashboard() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/dashboards/runwarden.json"
        ))
        .unwrap(),
    )
    .unwrap()
}

/// What is stopped now is the dashboard's top row (the kill switch, the
/// demotions, the caps, the runs in flight and the last failed run), and
/// each of its panels links to the runs that explain it: every link is a
/// runs API query a real daemon answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_row_is_what_is_stopped_now_and_links_to_its_runs() {
    let d = dashboard();
    let top: Vec<&Value> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["gridPos"]["y"] == 0)
        .collect();
    let titles: Vec<&str> = top.iter().map(|p| p["title"].as_str().unwrap()).collect();
    assert_eq!(
        titles,
        [
            "Kill switch",
            "Demoted to L2",
            "Capped (last hour)",
            "In flight now",
            "Last failed run"
        ]
    );
    let width: u64 = top
        .iter()
        .map(|p| p["gridPos"]["w"].as_u64().unwrap())
        .sum();
    assert_eq!(width, 24, "the row spans the grid");
    // A daemon without a webhook token, on loopback, as a browser reaches
    // it from the dashboard (with a token, through a proxy that adds it).
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::write(
        dir.path().join("runwarden.yaml"),
        "listen: 127.0.0.1:0\naudit_head: none\n",
    )
    .unwrap();
    let daemon = Daemon::start(dir.path()).await;
    for p in top {
        let links = p["links"].as_array().unwrap();
        assert!(!links.is_empty(), "{}: no link", p["title"]);
        for l in links {
            let url = l["url"].as_str().unwrap();
            let path = url.strip_prefix("${api}").expect("a link to the runs API");
            let r = client().get(daemon.url(path)).send().await.unwrap();
            assert_eq!(r.status(), 200, "{url}");
            assert!(json_of(r).await["runs"].is_array(), "{url}");
        }
    }
    daemon.shutdown().await.unwrap();
}

/// "Capped (last hour)" has a series to read before the first cap: 0 for
/// each host of a runbook with `max_runs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capped_series_starts_at_zero_where_a_cap_can_bite() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let rb = dir.path().join("runbooks/disk.yaml");
    let text = std::fs::read_to_string(&rb).unwrap();
    std::fs::write(
        &rb,
        text.replace(
            "cooldown: 1h\n",
            "cooldown: 1h\nmax_runs: { count: 3, per: 1h }\n",
        ),
    )
    .unwrap();
    let d = Daemon::start(dir.path()).await;
    for host in ["web-01", "web-02"] {
        assert_eq!(
            metric(
                &d,
                &format!("runwarden_triggers_capped_total{{host=\"{host}\",runbook=\"disk\"}}")
            )
            .await,
            Some(0.0),
            "{host}"
        );
    }
    d.shutdown().await.unwrap();
}

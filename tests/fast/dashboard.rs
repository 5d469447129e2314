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
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/dashboards/runwarden.json"
        ))
        .unwrap(),
    )
    .unwrap();
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
    assert_eq!(vars, ["datasource", "job", "instance"]);
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

//! Alerts that cannot be kept, on this machine's own state: the same
//! outcome as with PostgreSQL (`tests/it/ha.rs`).

use super::{Daemon, config, notification, post_alerts};

/// A NUL byte in one alert's fingerprint or labels, or in the group key:
/// each such alert is `invalid`, counted, and named in the answer; the
/// other alert of the notification starts; the answer is 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_with_a_nul_byte_is_invalid_and_its_neighbour_starts() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = Daemon::start(dir.path()).await;
    let mut body = notification();
    body["alerts"][1]["labels"]["instance"] = "web-01\u{0}:9100".into();
    let (status, answer) = post_alerts(&d, &body).await;
    assert_eq!(status, 200, "{answer}");
    let results: Vec<&str> = answer["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["started", "invalid"], "{answer:#}");
    assert!(
        answer["outcomes"][1]["why"]
            .as_str()
            .is_some_and(|w| w.contains("label instance holds a NUL byte")),
        "{answer:#}"
    );
    let mut body = notification();
    body["groupKey"] = "{}:{alertname=\"Disk\u{0}\"}".into();
    let (status, answer) = post_alerts(&d, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["result"] == "invalid"),
        "{answer:#}"
    );
    assert_eq!(
        super::metric(
            &d,
            "runwarden_alert_triggers_total{result=\"invalid\",runbook=\"none\"}"
        )
        .await,
        Some(3.0)
    );
    d.shutdown().await.unwrap();
}

//! The daemon's HTTP API: its bearer token, the kill switch in front of the
//! webhook, and a configuration `serve` refuses to start with.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_without_the_token_and_the_switch_stops_the_webhook() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = Daemon::start(dir.path()).await;
    let c = client();

    for path in ["/api/v1/runs", "/api/v1/runs/0123"] {
        let r = c.get(d.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without a token");
        let r = c
            .get(d.url(path))
            .bearer_auth("not-the-token-at-all-000")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path} with a wrong token");
    }
    let r = c
        .post(d.url("/api/v1/alerts"))
        .header("content-type", "application/json")
        .body(notification().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the webhook without its token");
    let r = c.get(d.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "health needs no token");

    std::fs::write(dir.path().join("kill-switch/ENGAGED"), "fast tier").unwrap();
    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["result"] == "kill_switch" || o["result"] == "deduplicated"),
        "{body}"
    );
    assert!(
        body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["result"] == "kill_switch"),
        "{body}"
    );
    let metrics = c
        .get(d.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("runwarden_kill_switch_engaged{scope=\"global\"} 1")
            || metrics.contains(
                "runwarden_alert_triggers_total{result=\"kill_switch\",runbook=\"disk\"} 1"
            ),
        "{metrics}"
    );
    // The gauge follows the switch, with since when (the file's time).
    let mtime = std::fs::metadata(dir.path().join("kill-switch/ENGAGED"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut since = None;
    for _ in 0..200 {
        let text = c
            .get(d.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        since = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "runwarden_kill_switch_engaged_since_timestamp_seconds{scope=\"global\"} ",
                )
            })
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v > 0.0);
        if since.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        since.is_some_and(|s| (s - mtime).abs() < 1.0),
        "since {since:?}, file {mtime}"
    );
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_config_it_cannot_use_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::write(
        dir.path().join("runbooks/disk.yaml"),
        "name: disk\nhosts: [nowhere]\n",
    )
    .unwrap();
    let (ready, _r) = tokio::sync::oneshot::channel();
    let opts = runwarden::app::ServeOptions {
        config_dir: dir.path().to_path_buf(),
        listen: None,
    };
    let err = runwarden::app::serve(opts, async {}, Some(ready))
        .await
        .expect_err("a broken runbook");
    let text = format!("{err:#}");
    assert!(text.contains("disk.yaml"), "{text}");
}

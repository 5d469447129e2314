use std::collections::HashMap;

use super::*;
use crate::rules::TriggerResult;
use crate::trigger::alerts::Candidate;

/// A scheduler over a real config directory: runbook `rb` on host `web`,
/// with a one-hour cooldown.
fn scheduler() -> (tempfile::TempDir, Arc<Config>, Arc<Scheduler>) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    for d in ["hosts", "runbooks", "kill-switch"] {
        std::fs::create_dir_all(p.join(d)).unwrap();
    }
    std::fs::write(
        p.join("hosts/web.yaml"),
        "name: web\nconnection: local\npaths: [/tmp]\n",
    )
    .unwrap();
    std::fs::write(
        p.join("runbooks/rb.yaml"),
        "name: rb\ndescription: t\nhosts: [web]\nautonomy: L3\ncooldown: 1h\ntools:\n  observe: [disk_usage]\nsteps: [{ call: disk_usage, args: { path: /tmp } }]\n",
    )
    .unwrap();
    let config = Arc::new(Config::load(p).unwrap());
    let audit = Arc::new(AuditLog::open(&p.join("state/audit.jsonl")).unwrap());
    let metrics = Arc::new(Metrics::new(prometheus::Registry::new()));
    let (_, shutdown) = watch::channel(false);
    let s = Scheduler::new(
        watch::channel(config.clone()).1,
        audit,
        metrics,
        shutdown,
        None,
        crate::state::chosen(None),
    );
    (dir, config, s)
}

fn alert(keys: &[&str]) -> RunRequest {
    let mut req = RunRequest::cli("rb".into(), "web".into(), false);
    req.trigger = crate::origin::Trigger::Alert;
    req.keys = keys.iter().map(|k| k.to_string()).collect();
    req
}

#[tokio::test(start_paused = true)]
async fn what_a_trigger_names_outside_the_config_never_starts_a_run() {
    let (_d, config, s) = scheduler();
    let mut engaged = HashMap::new();
    let mut other = alert(&[]);
    other.runbook = "nope".into();
    assert_eq!(
        s.alone(&config, &other, &mut engaged),
        Some(TriggerResult::NoMatch)
    );
    let mut elsewhere = alert(&[]);
    elsewhere.host = "db".into();
    assert_eq!(
        s.alone(&config, &elsewhere, &mut engaged),
        Some(TriggerResult::OutOfScope)
    );
    assert_eq!(s.alone(&config, &alert(&[]), &mut engaged), None);
    engaged.insert("rb".into(), true);
    assert_eq!(
        s.alone(&config, &alert(&[]), &mut engaged),
        Some(TriggerResult::KillSwitch),
        "the switch is engaged"
    );
}

/// Every candidate of a notification gets one outcome, counted once:
/// the run, its duplicate, and the alerts decided before admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_candidate_is_decided_and_counted_once() {
    let (_d, _config, s) = scheduler();
    let candidates = vec![
        Candidate::Run(alert(&["fp:1"])),
        Candidate::Run(alert(&["fp:2"])),
        Candidate::NoMatch {
            fingerprint: "f3".into(),
            keys: vec!["fp:f3".into()],
            why: "no runbook".into(),
        },
        Candidate::OutOfScope {
            runbook: "rb".into(),
            host: "db".into(),
            fingerprint: "f4".into(),
            keys: vec!["fp:f4".into()],
            why: "not its host".into(),
        },
    ];
    let got: Vec<TriggerResult> = s
        .submit_candidates(&candidates)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.result)
        .collect();
    assert_eq!(
        got,
        [
            TriggerResult::Started,
            TriggerResult::Deduplicated,
            TriggerResult::NoMatch,
            TriggerResult::OutOfScope
        ]
    );
    let counted = |runbook: &str, result: TriggerResult| {
        s.metrics
            .alert_triggers
            .with_label_values(&[runbook, result.as_str()])
            .get()
    };
    assert_eq!(counted("rb", TriggerResult::Started), 1);
    assert_eq!(counted("rb", TriggerResult::Deduplicated), 1);
    assert_eq!(counted("none", TriggerResult::NoMatch), 1);
    assert_eq!(counted("rb", TriggerResult::OutOfScope), 1);
    assert!(s.wait_idle(Duration::from_secs(20)).await, "the run ended");
}

/// A schedule's fire the kill switch refuses leaves an audit line
/// naming the runbook and its hosts; an alert's refusal (answered to its
/// sender) and a fire that starts leave none.
#[tokio::test(start_paused = true)]
async fn a_schedule_the_kill_switch_refused_is_in_the_audit_log() {
    let (dir, _config, s) = scheduler();
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join("state/audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|l: &serde_json::Value| l["outcome"] == "refused")
            .collect()
    };
    std::fs::write(dir.path().join("kill-switch/ENGAGED"), "").unwrap();
    let mut fire = RunRequest::cli("rb".into(), "web".into(), false);
    fire.trigger = crate::origin::Trigger::Schedule;
    let got = s.submit_all(vec![fire.clone()]).await.unwrap();
    assert_eq!(got[0].result, TriggerResult::KillSwitch);
    let refused = lines();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["runbook"], "rb");
    assert_eq!(refused[0]["detail"]["hosts"][0], "web");
    let got = s.submit_all(vec![alert(&["fp:1"])]).await.unwrap();
    assert_eq!(got[0].result, TriggerResult::KillSwitch);
    assert_eq!(lines().len(), 1, "an alert's refusal is its answer");
}

/// A daemon shutting down answers what it cannot start as pending (the
/// webhook's 503: retry), never as stopped by a kill switch nobody
/// engaged.
#[tokio::test(start_paused = true)]
async fn a_daemon_shutting_down_asks_for_a_retry_not_a_kill_switch() {
    let (_dir, _config, s) = scheduler();
    let (stop, shutdown) = watch::channel(false);
    let s = Scheduler::new(
        s.config.clone(),
        s.audit.clone(),
        s.metrics.clone(),
        shutdown,
        None,
        crate::state::chosen(None),
    );
    stop.send(true).unwrap();
    let got = s.submit_all(vec![alert(&["fp:1"])]).await.unwrap();
    assert_eq!(got[0].result, TriggerResult::Pending);
    assert!(s.stopping());
}

/// An accepted trigger whose run the shutdown stopped before it made a
/// call (here: while it waited for its run lock) is handed to the next
/// start, which runs it again, once: 0 accepted triggers without a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_the_shutdown_stopped_before_any_call_runs_at_the_next_start() {
    let (dir, config, first) = scheduler();
    let fresh = |shutdown| {
        Scheduler::new(
            first.config.clone(),
            first.audit.clone(),
            first.metrics.clone(),
            shutdown,
            None,
            crate::state::chosen(None),
        )
    };
    let (stop, shutdown) = watch::channel(false);
    let s = fresh(shutdown);
    let held = crate::runlock::try_acquire(&config.settings.state_dir, "rb", "web", "someone")
        .unwrap()
        .unwrap();
    let mut fired = alert(&["fp:1"]);
    fired.alert = Some(serde_json::json!({
        "labels": { "alertname": "DiskAlmostFull", "instance": "web" },
        "annotations": { "summary": "/ is 93% full", "runbook_url": "http://x" },
        "fingerprint": "1",
    }));
    let got = s.submit_all(vec![fired]).await.unwrap();
    assert_eq!(got[0].result, TriggerResult::Started);
    let old = got[0].run_id.clone().unwrap();
    stop.send(true).unwrap();
    assert!(s.wait_idle(Duration::from_secs(10)).await);
    drop(held);
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join("state/audit.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let verdict = lines()
        .into_iter()
        .find(|l| l["run_id"] == old.as_str() && l["phase"] == "verdict")
        .unwrap();
    assert_eq!(verdict["outcome"], "halted");
    assert_eq!(verdict["detail"]["handed_back"], true, "{verdict}");
    // The next start runs it again, with its trigger and keys.
    let (_stop, shutdown) = watch::channel(false);
    let next = fresh(shutdown);
    let (_, again) = next.recover().unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].trigger, crate::origin::Trigger::Alert);
    assert!(
        again[0].keys.contains(&"fp:1".to_string()),
        "{:?}",
        again[0].keys
    );
    // The alert as its templates read it: labels, and the annotations
    // its queued line kept; and its fingerprint, which `done_when` and
    // `recurred` need.
    assert_eq!(
        again[0].alert,
        Some(serde_json::json!({
            "labels": { "alertname": "DiskAlmostFull", "instance": "web" },
            "annotations": { "summary": "/ is 93% full" },
            "fingerprint": "1",
        }))
    );
    let got = next.submit_all(again).await.unwrap();
    assert_eq!(
        got[0].result,
        TriggerResult::Started,
        "no cooldown from a run that did nothing"
    );
    let new = got[0].run_id.clone().unwrap();
    assert!(next.wait_idle(Duration::from_secs(10)).await);
    let ended = lines()
        .into_iter()
        .find(|l| l["run_id"] == new.as_str() && l["phase"] == "verdict")
        .unwrap();
    assert_eq!(ended["outcome"], "ok", "{ended}");
    // Once: the start after that has nothing to hand back.
    let (_stop, shutdown) = watch::channel(false);
    let (_, again) = fresh(shutdown).recover().unwrap();
    assert!(again.is_empty(), "{again:?}");
}

/// The other way a shutdown meets an accepted trigger: its run waited
/// for the one permit (`max_concurrent_runs: 1`) and starts only as the
/// daemon stops, so its loop stops it before its first proposal; it is
/// handed back too, and so is the run that held the permit waiting for
/// its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_waited_for_a_permit_through_the_shutdown_is_handed_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    for d in ["hosts", "runbooks", "kill-switch"] {
        std::fs::create_dir_all(p.join(d)).unwrap();
    }
    std::fs::write(p.join("runwarden.yaml"), "max_concurrent_runs: 1\n").unwrap();
    for h in ["web", "db"] {
        std::fs::write(
            p.join(format!("hosts/{h}.yaml")),
            format!("name: {h}\nconnection: local\npaths: [/tmp]\n"),
        )
        .unwrap();
    }
    std::fs::write(
        p.join("runbooks/rb.yaml"),
        "name: rb\ndescription: t\nhosts: [web, db]\nautonomy: L3\ntools:\n  observe: [disk_usage]\nsteps: [{ call: disk_usage, args: { path: /tmp } }]\n",
    )
    .unwrap();
    let config = Arc::new(Config::load(p).unwrap());
    let audit = Arc::new(AuditLog::open(&p.join("state/audit.jsonl")).unwrap());
    let (stop, shutdown) = watch::channel(false);
    let s = Scheduler::new(
        watch::channel(config.clone()).1,
        audit,
        Arc::new(Metrics::new(prometheus::Registry::new())),
        shutdown,
        None,
        crate::state::chosen(None),
    );
    let held = crate::runlock::try_acquire(&config.settings.state_dir, "rb", "web", "someone")
        .unwrap()
        .unwrap();
    let mut on_db = alert(&["fp:db"]);
    on_db.host = "db".into();
    let got = s.submit_all(vec![alert(&["fp:web"]), on_db]).await.unwrap();
    assert!(
        got.iter().all(|o| o.result == TriggerResult::Started),
        "{got:?}"
    );
    stop.send(true).unwrap();
    assert!(s.wait_idle(Duration::from_secs(10)).await);
    drop(held);
    let text = std::fs::read_to_string(p.join("state/audit.jsonl")).unwrap();
    let handed: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["phase"] == "verdict" && l["detail"]["handed_back"] == true)
        .collect();
    assert_eq!(handed.len(), 2, "{text}");
    assert!(
        !text.contains("\"phase\":\"intent\""),
        "no call was made: {text}"
    );
    let (_stop, shutdown) = watch::channel(false);
    let next = Scheduler::new(
        watch::channel(config.clone()).1,
        Arc::new(AuditLog::open(&p.join("state/audit.jsonl")).unwrap()),
        Arc::new(Metrics::new(prometheus::Registry::new())),
        shutdown,
        None,
        crate::state::chosen(None),
    );
    let (_, again) = next.recover().unwrap();
    let mut hosts: Vec<&str> = again.iter().map(|r| r.host.as_str()).collect();
    hosts.sort();
    assert_eq!(hosts, ["db", "web"]);
}

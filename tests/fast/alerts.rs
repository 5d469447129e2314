//! Alerts that cannot be kept, on this machine's own state: the same
//! outcome as with PostgreSQL (`tests/it/ha.rs`).

use super::*;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_alertmanager_notification_starts_one_run_that_ends_ok_and_is_in_the_history() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::write(dir.path().join("data/file"), vec![0u8; 64 << 10]).unwrap();
    let d = Daemon::start(dir.path()).await;

    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{body}");
    // Two alerts for one host: one run, and the second alert is deduplicated.
    let outcomes = body["outcomes"].as_array().expect("outcomes");
    let started: Vec<&Value> = outcomes
        .iter()
        .filter(|o| o["result"] == "started")
        .collect();
    assert_eq!(started.len(), 1, "{body}");
    let run_id = started[0]["run_id"].as_str().expect("a run id").to_string();

    let run = verdict_of(&d, &run_id).await;
    assert_eq!(run["status"], "ok", "{run}");
    assert_eq!(run["runbook"], "disk");
    assert_eq!(run["host"], "web-01");
    let used = &run["report"]["steps"][0]["result"]["data"]["used_bytes"];
    assert!(
        used.as_u64().is_some_and(|b| b >= 64 << 10),
        "disk_usage measured the file: {run}"
    );

    // Within the cooldown the same notification starts nothing.
    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200);
    assert!(
        body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["result"] != "started"),
        "{body}"
    );

    // The audit log the run wrote verifies.
    let v = runwarden::audit::verify(&dir.path().join("state/audit.jsonl")).unwrap();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    assert!(
        v.lines >= 4,
        "queued, start, intent, result, verdict: {}",
        v.lines
    );
    d.shutdown().await.unwrap();
}

/// `runwarden alerts test FILE --json` against a config directory.
fn alerts_test(dir: &Path, file: &Path) -> Value {
    let out = runwarden_ok(&[
        "alerts".as_ref(),
        "test".as_ref(),
        "--json".as_ref(),
        "--config".as_ref(),
        dir.as_os_str(),
        file.as_os_str(),
    ]);
    serde_json::from_str(&out).unwrap()
}

/// The captured notification (`/` and `/var` filling on web-01) against the
/// shipped example runbook and host: `alerts test` says the first alert
/// starts a run and the second joins it; posted to the webhook it starts
/// one run that sees both alerts (`alerts` in its templates) and measures
/// both filesystems; afterwards `alerts test` names the cooldown, and an
/// alert no runbook takes says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_captured_notification_starts_the_shipped_example_and_one_run_sees_both_alerts() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::remove_file(dir.path().join("runbooks/disk.yaml")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["runbooks/disk-almost-full.yaml", "hosts/web-01.yaml"] {
        std::fs::copy(repo.join(f), dir.path().join(f)).unwrap();
    }
    let fixture = repo.join("tests/fixtures/alertmanager/firing-two-alerts.json");

    let before = alerts_test(dir.path(), &fixture);
    let results: Vec<&str> = before["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcomes"][0]["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["would_start", "joins"], "{before:#}");

    let d = Daemon::start(dir.path()).await;
    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{body}");
    let run_id = body["outcomes"][0]["run_id"]
        .as_str()
        .expect("a run")
        .to_string();
    assert_eq!(body["outcomes"][1]["result"], "deduplicated", "{body}");
    let run = verdict_of(&d, &run_id).await;
    assert_eq!(run["status"], "ok", "{run:#}");
    let measured: Vec<&str> = run["report"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["args"]["path"].as_str())
        .collect();
    assert_eq!(measured, ["/", "/var"], "{run:#}");
    d.shutdown().await.unwrap();

    // The same notification again is what the webhook deduplicates; a new
    // alert for the host waits out the cooldown: the scheduler's own rule.
    let again = alerts_test(dir.path(), &fixture);
    assert_eq!(
        again["alerts"][0]["outcomes"][0]["result"], "deduplicated",
        "{again:#}"
    );
    let fresh = dir.path().join("fresh.json");
    std::fs::write(
        &fresh,
        std::fs::read_to_string(&fixture)
            .unwrap()
            .replace("d262fe820fddf66b", "0000000000000001")
            .replace("7723640f18b12a3c", "0000000000000002")
            .replace("\"groupKey\":\"{}", "\"groupKey\":\"new{}"),
    )
    .unwrap();
    let after = alerts_test(dir.path(), &fresh);
    let first = &after["alerts"][0]["outcomes"][0];
    assert_eq!(first["result"], "cooldown", "{after:#}");
    assert!(
        first["why"].as_str().unwrap().contains("cooldown of 10m"),
        "{after:#}"
    );

    let other = dir.path().join("other.json");
    std::fs::write(
        &other,
        std::fs::read_to_string(&fixture)
            .unwrap()
            .replace("DiskAlmostFull", "MemoryPressure"),
    )
    .unwrap();
    let unmatched = alerts_test(dir.path(), &other);
    let o = &unmatched["alerts"][0]["outcomes"][0];
    assert_eq!(o["result"], "no_match", "{unmatched:#}");
    assert!(
        o["why"].as_str().unwrap().contains("DiskAlmostFull"),
        "{unmatched:#}"
    );
}

/// A notification like the captured one, for `host`, with its own
/// fingerprints and group: no duplicate of an earlier one.
fn fresh_for(host: &str, tag: &str) -> Value {
    let mut n = notification();
    n["groupKey"] = format!("{tag}-{host}").into();
    for a in n["alerts"].as_array_mut().unwrap() {
        a["labels"]["instance"] = format!("{host}:9100").into();
        a["fingerprint"] = format!("{tag}-{host}-{}", a["fingerprint"].as_str().unwrap()).into();
    }
    n
}

/// `max_runs` holds across a restart: the one run allowed on web-01 within
/// the hour is read back from the audit log, so a new alert for web-01
/// after the restart is `capped` (counted, and `alerts test` says so with
/// the reason), while web-02 still has its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_runs_caps_a_host_across_a_daemon_restart() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let runbook = dir.path().join("runbooks/disk.yaml");
    let text = std::fs::read_to_string(&runbook).unwrap();
    std::fs::write(
        &runbook,
        text.replace("cooldown: 1h\n", "max_runs: { count: 1, per: 1h }\n"),
    )
    .unwrap();
    let d = Daemon::start(dir.path()).await;
    assert_eq!(
        run_to_its_verdict(&d, &fresh_for("web-01", "first")).await["status"],
        "ok"
    );
    d.shutdown().await.unwrap();

    let d = Daemon::start(dir.path()).await;
    let (status, answer) = post_alerts(&d, &fresh_for("web-01", "second")).await;
    assert_eq!(status, 200, "{answer}");
    // Both alerts of the notification name web-01: both are capped.
    let results: Vec<&Value> = answer["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["result"])
        .collect();
    assert_eq!(results, ["capped", "capped"], "{answer:#}");
    assert_eq!(
        metric(
            &d,
            r#"runwarden_triggers_capped_total{host="web-01",runbook="disk"}"#
        )
        .await,
        Some(2.0)
    );
    assert_eq!(
        run_to_its_verdict(&d, &fresh_for("web-02", "first")).await["status"],
        "ok",
        "the cap is per host"
    );
    d.shutdown().await.unwrap();

    let file = dir.path().join("third.json");
    std::fs::write(&file, fresh_for("web-01", "third").to_string()).unwrap();
    let said = alerts_test(dir.path(), &file);
    let first = &said["alerts"][0]["outcomes"][0];
    assert_eq!(first["result"], "capped", "{said:#}");
    assert!(
        first["why"]
            .as_str()
            .unwrap()
            .contains("1 time(s) on web-01 within 1h"),
        "{said:#}"
    );
    // On-call's status names each capped host (both ran their one run).
    let out = runwarden(&[
        "kill-switch",
        "status",
        "--config",
        dir.path().to_str().unwrap(),
    ]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a cap is not a switch: {status}"
    );
    for host in ["web-01", "web-02"] {
        assert!(
            status.contains(&format!(
                "CAPPED runbook \"disk\" on {host}: 1 run(s) within 1h (max_runs 1)"
            )),
            "{status}"
        );
    }
    let out = runwarden(&[
        "kill-switch",
        "status",
        "--json",
        "--config",
        dir.path().to_str().unwrap(),
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["capped"][0]["host"], "web-01", "{json:#}");
}

const APPROVER: &str = "alice-token-0123456789";

/// A config whose host `web-01` runs nothing real: every binary it names
/// is a tripwire that records that it ran. Runbook `plan` (L3) and
/// `plan-l2` (L2) take the fixture's alert: a look, a rotation, a step that
/// reads the look's result, and a look outside the host's paths.
fn tripwired(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    config(dir);
    let tripped = dir.join("data/TRIPPED");
    let wire = dir.join("tripwire");
    std::fs::write(
        &wire,
        format!("#!/bin/sh\necho \"$0 $*\" >> {}\n", tripped.display()),
    )
    .unwrap();
    std::fs::set_permissions(&wire, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.join("data/app.conf");
    std::fs::write(&conf, "/tmp/app.log {\n  rotate 1\n}\n").unwrap();
    let approvers = dir.join("approvers");
    std::fs::write(&approvers, format!("alice {APPROVER}\n")).unwrap();
    std::fs::set_permissions(&approvers, std::fs::Permissions::from_mode(0o600)).unwrap();
    let settings = dir.join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(&settings, format!("{text}approvers_file: approvers\n")).unwrap();
    let binaries = [
        "systemctl",
        "journalctl",
        "logrotate",
        "df",
        "du",
        "ps",
        "kill",
    ]
    .map(|b| format!("{b}: {}", wire.display()))
    .join(", ");
    std::fs::write(
        dir.join("hosts/web-01.yaml"),
        format!(
            "name: web-01\nconnection: local\npaths: [{data}]\nlogrotate_configs: [{conf}]\nlogrotate_state: {data}/lr.state\nunits: [app.service]\nbinaries: {{ {binaries} }}\n",
            data = dir.join("data").display(),
            conf = conf.display()
        ),
    )
    .unwrap();
    for (name, autonomy) in [("plan", "L3"), ("plan-l2", "L2")] {
        std::fs::write(
            dir.join(format!("runbooks/{name}.yaml")),
            format!(
                "name: {name}\ndescription: t\nhosts: [web-01]\nautonomy: {autonomy}\non_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"']\n  host_label: instance\n\
                 tools: {{ observe: [disk_usage, service_status], approve: [rotate_logs] }}\nsteps:\n\
                 \x20 - id: look\n    call: disk_usage\n    args: {{ path: {data} }}\n\
                 \x20 - id: rotate\n    call: rotate_logs\n    args: {{ config: {conf} }}\n    reason: \"{{{{ alert.labels.mountpoint }}}} is full\"\n\
                 \x20 - id: after\n    when: \"steps.look.use_pct > 90\"\n    call: service_status\n    args: {{ unit: app.service }}\n\
                 \x20 - id: outside\n    call: disk_usage\n    args: {{ path: /etc }}\n",
                data = dir.join("data").display(),
                conf = conf.display()
            ),
        )
        .unwrap();
    }
    tripped
}

/// `alerts test --plan` and `POST /api/v1/alerts?plan=1` take each run the
/// fixture's alert would start through the real gate: the exact argv of
/// each allowed call (the host's own binaries), `needs_approval` at L2, a
/// step that reads an earlier result marked as unknown, a path outside the
/// host's allowlist denied. No tripwire ran, no audit line, run lock or
/// approval was written; the same notification without `plan` starts runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_goes_through_the_gate_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tripped = tripwired(dir.path());
    let wire = dir.path().join("tripwire").display().to_string();
    let file = dir.path().join("notification.json");
    std::fs::write(&file, notification().to_string()).unwrap();
    let check_plan = |all: &Value| {
        let outcomes: Vec<&Value> = all["alerts"][0]["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        let plan_of = |rb: &str| {
            outcomes
                .iter()
                .find(|o| o["runbook"] == rb)
                .map(|o| o["plan"]["steps"].clone())
                .unwrap_or_else(|| panic!("no plan of {rb}: {all:#}"))
        };
        let decisions = |steps: &Value| -> Vec<String> {
            steps
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["decision"].as_str().unwrap().to_string())
                .collect()
        };
        let l3 = plan_of("plan");
        assert_eq!(
            decisions(&l3),
            ["allowed", "allowed", "depends", "denied"],
            "{l3:#}"
        );
        assert_eq!(l3[0]["argv"][0][0], wire.as_str(), "{l3:#}");
        assert_eq!(l3[1]["argv"][0][0], wire.as_str(), "{l3:#}");
        assert!(
            l3[1]["args"]["reason"]
                .as_str()
                .unwrap()
                .ends_with("is full"),
            "{l3:#}"
        );
        assert!(l3[2]["why"].as_str().unwrap().contains("look"), "{l3:#}");
        assert!(
            l3[3]["why"]
                .as_str()
                .unwrap()
                .starts_with("invalid_arguments"),
            "{l3:#}"
        );
        let l2 = plan_of("plan-l2");
        assert_eq!(
            decisions(&l2),
            ["allowed", "needs_approval", "depends", "denied"],
            "{l2:#}"
        );
    };
    // The command line.
    let out = runwarden_ok(&[
        "alerts".as_ref(),
        "test".as_ref(),
        "--plan".as_ref(),
        "--json".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
        file.as_os_str(),
    ]);
    check_plan(&serde_json::from_str(&out).unwrap());
    let text = runwarden_ok(&[
        "alerts".as_ref(),
        "test".as_ref(),
        "--plan".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
        file.as_os_str(),
    ]);
    assert!(text.contains(&format!("$ {wire}")), "{text}");
    assert!(text.contains("needs_approval"), "{text}");
    assert!(!tripped.exists(), "a tripwire ran");
    assert!(!dir.path().join("state").exists(), "state was written");
    // The daemon, as a CI pipeline asks it.
    let d = Daemon::start(dir.path()).await;
    let audit = dir.path().join("state/audit.jsonl");
    let before = std::fs::read(&audit).unwrap_or_default();
    let r = client()
        .post(d.url("/api/v1/alerts?plan=1"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(notification().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    check_plan(&json_of(r).await);
    assert!(!tripped.exists(), "a tripwire ran");
    assert_eq!(
        std::fs::read(&audit).unwrap_or_default(),
        before,
        "an audit line was written"
    );
    // The daemon makes its alert-triggered runs' lock files ahead, empty; a
    // run that takes one writes who holds it.
    for lock in std::fs::read_dir(dir.path().join("state/locks"))
        .into_iter()
        .flatten()
    {
        let lock = lock.unwrap().path();
        let holder = std::fs::read_to_string(&lock).unwrap();
        assert!(
            holder.is_empty(),
            "a run lock was taken: {} says {holder:?}",
            lock.display()
        );
    }
    let metrics = client()
        .get(d.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            (l.starts_with("runwarden_alert_triggers_total")
                || l.starts_with("runwarden_alerts_received_total"))
                && !l.ends_with(" 0")
        })
        .collect();
    assert!(counted.is_empty(), "a plan was counted: {counted:?}");
    let approvals = client()
        .get(d.url("/api/v1/approvals"))
        .bearer_auth(APPROVER)
        .send()
        .await
        .unwrap();
    let approvals = json_of(approvals).await;
    assert_eq!(approvals["approvals"], serde_json::json!([]), "{approvals}");
    // Without `plan`, the same notification starts the three runs.
    let (status, answer) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{answer}");
    let started = answer["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["result"] == "started")
        .count();
    assert_eq!(started, 3, "{answer:#}");
    // And the tripwires are live: a real run trips them.
    for _ in 0..200 {
        if tripped.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tripped.exists(), "a real run did not trip the wire");
    d.shutdown().await.unwrap();
}

/// A model runbook's plan is the scope its model would get (goal, tools,
/// host, call budget), not calls: the model picks them at run time. No
/// model endpoint is asked (none listens at the configured address).
#[test]
fn a_model_runbooks_plan_shows_the_scope_its_model_would_get() {
    let dir = tempfile::tempdir().unwrap();
    tripwired(dir.path());
    let settings = dir.path().join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(
        &settings,
        format!("{text}model:\n  endpoint: http://127.0.0.1:9/v1\n  name: planner\n"),
    )
    .unwrap();
    let rb = dir.path().join("runbooks/plan.yaml");
    let text = std::fs::read_to_string(&rb).unwrap();
    std::fs::write(
        &rb,
        format!("{text}agent:\n  goal: find what fills the disk\n  max_steps: 5\n"),
    )
    .unwrap();
    let file = dir.path().join("notification.json");
    std::fs::write(&file, notification().to_string()).unwrap();
    let out = runwarden_ok(&[
        "alerts".as_ref(),
        "test".as_ref(),
        "--plan".as_ref(),
        "--json".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
        file.as_os_str(),
    ]);
    let all: Value = serde_json::from_str(&out).unwrap();
    let plan = all["alerts"][0]["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["runbook"] == "plan")
        .map(|o| o["plan"].clone())
        .unwrap();
    assert_eq!(
        plan["model"]["goal"], "find what fills the disk",
        "{plan:#}"
    );
    assert_eq!(
        plan["model"]["tools"],
        serde_json::json!(["disk_usage", "service_status", "rotate_logs"]),
        "{plan:#}"
    );
    assert_eq!(plan["model"]["max_steps"], 5);
    assert!(
        plan["steps"].is_null(),
        "the model's calls are not known: {plan:#}"
    );
}

/// A `plan` parameter that is not exactly true or false (another value, a
/// bare `plan`, another spelling, a NUL byte, twice), or a parameter the
/// webhook does not take, is a 400 and starts nothing; `plan=true` plans
/// and `plan=false` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_parameter_that_is_not_true_or_false_is_refused_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = Daemon::start(dir.path()).await;
    let post = |query: &'static str| {
        let url = d.url(&format!("/api/v1/alerts{query}"));
        async move {
            let r = client()
                .post(url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(notification().to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    for query in [
        "?plan=yes",
        "?plan",
        "?plan=",
        "?PLAN=1",
        "?Plan=true",
        "?plan=1%00",
        "?plan%00=1",
        "?plan=TRUE",
        "?plan=1&plan=1",
        "?plan=1&x=2",
        "?dry_run=1",
    ] {
        let (status, said) = post(query).await;
        assert_eq!(status, 400, "{query}: {said}");
        assert!(said.contains("nothing was started"), "{query}: {said}");
    }
    let audit = dir.path().join("state/audit.jsonl");
    let lines = || std::fs::read_to_string(&audit).unwrap_or_default();
    assert!(
        !lines().contains("\"queued\""),
        "a refused query started a run"
    );
    let (status, said) = post("?plan=true").await;
    assert_eq!(status, 200, "{said}");
    assert!(!lines().contains("\"queued\""), "a plan started a run");
    let (status, said) = post("?plan=false").await;
    assert_eq!(status, 200, "{said}");
    assert!(said.contains("started"), "{said}");
    d.shutdown().await.unwrap();
}

/// One notification of 5,000 alerts for one (runbook, host), larger than
/// any other request may be: accepted, every alert answered, one run
/// started and the rest deduplicated against it, and the run's record
/// lists a bounded few of them (the cost is linear in the notification).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_of_thousands_of_alerts_for_one_host_starts_one_run() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = Daemon::start(dir.path()).await;
    let mut body = notification();
    let first = body["alerts"][0].clone();
    let alerts: Vec<Value> = (0..5000)
        .map(|i| {
            let mut a = first.clone();
            a["labels"]["mountpoint"] = format!("/m{i}").into();
            a["fingerprint"] = format!("{i:016x}").into();
            a
        })
        .collect();
    body["alerts"] = Value::Array(alerts);
    assert!(
        body.to_string().len() > 1 << 20,
        "larger than any other request"
    );
    let (status, answer) = post_alerts(&d, &body).await;
    assert_eq!(status, 200, "{answer}");
    let outcomes = answer["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 5000);
    let started = outcomes.iter().filter(|o| o["result"] == "started").count();
    let deduplicated = outcomes
        .iter()
        .filter(|o| o["result"] == "deduplicated")
        .count();
    assert_eq!((started, deduplicated), (1, 4999), "{:#}", outcomes[0]);
    let run_id = outcomes[0]["run_id"].as_str().unwrap();
    let v = verdict_of(&d, run_id).await;
    assert_eq!(v["status"], "ok", "{v:#}");
    let audit = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    let start: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["phase"] == "start" && l["run_id"] == run_id)
        .unwrap();
    assert_eq!(
        start["detail"]["alert"]["alerts"].as_array().unwrap().len(),
        10
    );
    assert!(
        audit.len() < 64 << 10,
        "the log stays small: {} bytes",
        audit.len()
    );
    d.shutdown().await.unwrap();
}

/// `alerts test -` reads the notification from standard input.
#[test]
fn alerts_test_reads_a_notification_from_standard_input() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let mut child = std::process::Command::new(crate::bin())
        .args(["alerts", "test", "-", "--json", "--config"])
        .arg(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(notification().to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["alerts"][0]["outcomes"][0]["runbook"], "disk", "{v:#}");
    assert_eq!(
        v["alerts"][0]["outcomes"][0]["result"], "would_start",
        "{v:#}"
    );
}

/// A person's `runwarden run` after the daemon started counts as any of
/// its runs: against `max_runs` and for the cooldown, as `alerts test`
/// and `kill-switch status` already count it (one record: the audit log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_runs_after_the_daemon_started_count_for_max_runs_and_cooldown() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let runbook = dir.path().join("runbooks/disk.yaml");
    let text = std::fs::read_to_string(&runbook).unwrap();
    std::fs::write(
        &runbook,
        text.replace("cooldown: 1h\n", "max_runs: { count: 2, per: 1h }\n"),
    )
    .unwrap();
    let d = Daemon::start(dir.path()).await;
    for _ in 0..2 {
        let (code, run) = run_json_on(dir.path(), "disk", "web-01");
        assert_eq!(code, Some(0), "{run:#}");
    }
    let (status, answer) = post_alerts(&d, &fresh_for("web-01", "after-hand")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcomes"][0]["result"], "capped", "{answer:#}");
    // The daemon's own record and the log's agree: a restart decides the same.
    d.shutdown().await.unwrap();
    let d = Daemon::start(dir.path()).await;
    let (_, again) = post_alerts(&d, &fresh_for("web-01", "after-restart")).await;
    assert_eq!(again["outcomes"][0]["result"], "capped", "{again:#}");
    // web-02 has had no run: its trigger starts one.
    let (_, other) = post_alerts(&d, &fresh_for("web-02", "other")).await;
    assert_eq!(other["outcomes"][0]["result"], "started", "{other:#}");
    d.shutdown().await.unwrap();

    // Cooldown: a hand run on web-02 ends; an alert for it waits the hour
    // out. Segments of 4 KiB: the hand runs' lines close one or more.
    std::fs::write(&runbook, &text).unwrap();
    small_segments(dir.path());
    let segments = || segments(dir.path());
    let d = Daemon::start(dir.path()).await;
    let (_, first) = post_alerts(&d, &fresh_for("web-01", "cool")).await;
    assert_eq!(
        first["outcomes"][0]["result"], "cooldown",
        "the hand runs on web-01 ended within the hour: {first:#}"
    );
    // A hand run once the daemon runs, and the log rotated in between.
    let before = segments();
    let (code, run) = run_json_on(dir.path(), "disk", "web-02");
    assert_eq!(code, Some(0), "{run:#}");
    assert!(segments() > before, "the hand run closed a segment");
    let (_, later) = post_alerts(&d, &fresh_for("web-02", "cool-later")).await;
    assert_eq!(later["outcomes"][0]["result"], "cooldown", "{later:#}");
    d.shutdown().await.unwrap();
}

/// A runbook with `rollout:` started by an alert: `alerts test` says the
/// alert's run is not staged and shows the waves its fan-outs take, in
/// both its forms.
#[test]
fn alerts_test_says_an_alerts_run_is_not_staged_and_shows_the_waves() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::remove_file(dir.path().join("runbooks/disk.yaml")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        repo.join("hosts/web-01.yaml"),
        dir.path().join("hosts/web-01.yaml"),
    )
    .unwrap();
    let runbook = std::fs::read_to_string(repo.join("runbooks/disk-almost-full.yaml")).unwrap();
    std::fs::write(
        dir.path().join("runbooks/disk-almost-full.yaml"),
        format!("{runbook}\nrollout:\n  canary: 1\n  waves: [\"100%\"]\n  pause: 5m\n"),
    )
    .unwrap();
    let fixture = repo.join("tests/fixtures/alertmanager/firing-two-alerts.json");
    let said = alerts_test(dir.path(), &fixture);
    let r = &said["rollouts"]["disk-almost-full"];
    assert_eq!(r["staged"], false, "{said:#}");
    assert!(
        r["why"].as_str().unwrap().contains("not in waves"),
        "{said:#}"
    );
    assert_eq!(r["waves"][0], "wave 1: web-01", "{said:#}");
    let text = runwarden_ok(&[
        "alerts".as_ref(),
        "test".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
        fixture.as_os_str(),
    ]);
    assert!(
        text.contains("runbook disk-almost-full has rollout: an alert's run starts")
            && text.contains("  wave 1: web-01"),
        "{text}"
    );
}

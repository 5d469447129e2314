//! `done_when.alert_clears` on a real Prometheus and a real Alertmanager
//! (Debian's), scraping a real exporter: a small HTTP server on loopback
//! serving a metrics file that the runbook's own tier-2 tool rewrites.
//!
//! The rule of the alert is evaluated as written, and only the alert's own
//! series counts: another host's series of the same rule keeps firing
//! throughout, two rules share the alert's name with different static
//! `severity` labels, and the Prometheus adds `external_labels`; none of
//! them may make a firing series look cleared, nor a cleared one firing.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

/// The exporter's metrics, as a tier-2 tool leaves them: `node="local"`'s
/// queue at `depth` (its state named in a comment the tool's verify
/// reads), and `node="web2"`'s at 90 whatever happens on local.
fn metrics(state: &str, depth: u32) -> String {
    format!(
        "# state {state}\n# TYPE bar_queue_depth gauge\nbar_queue_depth{{node=\"local\",queue=\"orders\"}} {depth}\nbar_queue_depth{{node=\"web2\",queue=\"orders\"}} 90\n"
    )
}

/// In config directory `e`: host `local` and the `set_queue` tool, which
/// copies a state file of `work` over the exporter's file in `served`.
fn set_up(e: &Estate, work: &std::path::Path, served: &std::path::Path) {
    e.host("local", &local_host("local", "paths: [/tmp]"));
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/set_queue.yaml"),
        format!(
            "name: set_queue\ntier: 2\ndescription: Put the orders queue's exported state in place.\nverb: set\nargs:\n  to: {{ type: enum, values: [fixed, still, bad] }}\nrun: [/usr/bin/cp, \"{w}/{{{{ to }}}}.prom\", \"{s}/metrics\"]\nverify:\n  run: [/usr/bin/cat, \"{s}/metrics\"]\n  expect_stdout: '^# state {{{{ to }}}}$'\nundo:\n  run: [/usr/bin/cp, \"{w}/bad.prom\", \"{s}/metrics\"]\n",
            w = work.display(),
            s = served.display()
        ),
    )
    .unwrap();
}

/// The runbook [`Stack::runbook`] writes.
fn runbook_yaml(name: &str, alert: &str, to: &str, done_when: &str, extra: &str) -> String {
    format!(
        "name: {name}\ndescription: t\nhosts: [local]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"{alert}\"']\n  host_label: node\ntools: {{ observe: [disk_usage], approve: [set_queue] }}\nbudget: {{ max_duration: 90s }}\ndone_when: {{ alert_clears: {done_when} }}\n{extra}steps:\n  - id: fix\n    call: set_queue\n    args: {{ to: {to} }}\n    reason: the queue is deep\n"
    )
}

/// Two rules named BarQueueDeep (a page over 50, a ticket over 10) and a
/// windowed one, every group evaluated each second.
const RULES: &str = r#"groups:
  - name: bar
    interval: 1s
    rules:
      - alert: BarQueueDeep
        expr: bar_queue_depth > 50
        labels: { severity: page }
      - alert: BarQueueDeep
        expr: bar_queue_depth > 10
        labels: { severity: ticket }
      - alert: BarErrors
        expr: rate(bar_errors_total[8s]) > 0
        labels: { severity: page }
      - alert: BarQueueSticky
        expr: bar_queue_depth > 50
        keep_firing_for: 5s
        labels: { severity: page }
      - alert: BarQueueSlow
        expr: bar_queue_depth > 50
        for: 2s
        labels: { severity: page }
"#;

/// What the test drives: an estate, an exporter serving `metrics` from
/// `served`, and a Prometheus scraping it each second.
struct Stack {
    e: Estate,
    served: PathBuf,
    prom_addr: String,
    _exporter: Proc,
    _prom: Proc,
}

impl Stack {
    /// With `alertmanager` (its address) to send alerts to, if any.
    fn new(first: &str, alertmanager: Option<&str>) -> Stack {
        Stack::with(first, alertmanager, "", true)
    }

    /// With `alerting` added to Prometheus's `alerting:` block, and its
    /// rules or none.
    fn with(first: &str, alertmanager: Option<&str>, alerting: &str, rules: bool) -> Stack {
        use std::os::unix::fs::PermissionsExt;
        let e = Estate::new();
        // The verify probe runs as the observer: it must reach the file.
        for dir in [e.path().to_path_buf(), e.work()] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let served = e.work().join("exporter");
        std::fs::create_dir_all(&served).unwrap();
        std::fs::write(served.join("metrics"), first).unwrap();
        for (name, text) in [
            ("fixed.prom", metrics("fixed", 3)),
            ("still.prom", metrics("still", 20)),
            ("bad.prom", metrics("bad", 82)),
        ] {
            std::fs::write(e.work().join(name), text).unwrap();
        }
        let port = free_port();
        let exporter = Proc(
            std::process::Command::new("/usr/bin/python3")
                .args([
                    "-m",
                    "http.server",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                ])
                .arg("--directory")
                .arg(&served)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("python3's http.server as the exporter"),
        );
        let exporter_addr = format!("127.0.0.1:{port}");
        wait_for("the exporter", Duration::from_secs(20), || {
            http(&exporter_addr, "GET", "/metrics", "").filter(|r| r.0 == 200)
        });
        let alerting = match alertmanager {
            Some(am) => format!(
                "alerting:\n{alerting}  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n"
            ),
            None => String::new(),
        };
        let rule_files = match rules {
            true => "rule_files: [rules.yml]\n",
            false => "",
        };
        let dir = e.work().join("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rules.yml"), RULES).unwrap();
        let (prom, prom_addr) = prometheus(
            &dir,
            &format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  external_labels: {{ cluster: staging }}\n{rule_files}{alerting}scrape_configs:\n  - job_name: bar\n    static_configs:\n      - targets: ['{exporter_addr}']\n"
            ),
        );
        wait_for(
            "prometheus to serve its rules",
            Duration::from_secs(30),
            || {
                http(&prom_addr, "GET", "/api/v1/rules", "")
                    .filter(|r| r.0 == 200 && (!rules || r.1.contains("BarQueueDeep")))
            },
        );
        set_up(&e, &e.work(), &served);
        Stack {
            e,
            served,
            prom_addr,
            _exporter: exporter,
            _prom: prom,
        }
    }

    /// runwarden.yaml: this Prometheus, and `extra`.
    fn settings(&self, extra: &str) {
        std::fs::write(
            self.e.path().join("runwarden.yaml"),
            format!(
                "audit_head: none\nprometheus: {{ url: 'http://{}', timeout: 5s }}\n{extra}",
                self.prom_addr
            ),
        )
        .unwrap();
    }

    /// A runbook `name` of `alert` on `local` that sets the queue `to`,
    /// done when the alert clears (`done_when` as YAML flow).
    fn runbook(&self, name: &str, alert: &str, to: &str, done_when: &str, extra: &str) {
        self.e
            .runbook(name, &runbook_yaml(name, alert, to, done_when, extra));
    }

    /// Whether Prometheus's query `expr` has a series now.
    fn has_series(&self, expr: &str) -> bool {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        http(&self.prom_addr, "GET", &path, "")
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["data"]["result"].as_array().map(|r| !r.is_empty()))
            .unwrap_or(false)
    }

    /// The notification Alertmanager would send for `labels`, as a file for `run --alert`.
    fn alert_file(&self, alerts: &[Value]) -> PathBuf {
        let body = serde_json::json!({
            "version": "4",
            "groupKey": "{}:{alertname=\"BarQueueDeep\"}",
            "status": "firing",
            "receiver": "runwarden",
            "alerts": alerts,
        });
        let path = self.e.work().join("alert.json");
        std::fs::write(&path, body.to_string()).unwrap();
        path
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An alert as Alertmanager sends it for the local queue, with the labels
/// Prometheus gives it (the rule's severity, the external cluster).
fn queue_alert(s: &Stack, severity: &str, fingerprint: &str) -> Value {
    let instance = s.exporter_instance();
    serde_json::json!({
        "status": "firing",
        "labels": {
            "alertname": "BarQueueDeep", "severity": severity, "cluster": "staging",
            "node": "local", "queue": "orders", "instance": instance, "job": "bar",
        },
        "annotations": {},
        "fingerprint": fingerprint,
        "generatorURL": format!("http://{}/graph?g0.expr=bar_queue_depth+%3E+50", s.prom_addr),
    })
}

impl Stack {
    /// The exporter's `instance` label, as Prometheus scraped it.
    fn exporter_instance(&self) -> String {
        wait_for("a scrape of the exporter", Duration::from_secs(30), || {
            let (_, body) = http(
                &self.prom_addr,
                "GET",
                "/api/v1/query?query=up%7Bjob%3D%22bar%22%7D",
                "",
            )?;
            let v: Value = serde_json::from_str(&body).ok()?;
            v["data"]["result"][0]["metric"]["instance"]
                .as_str()
                .map(String::from)
        })
    }
}

fn evidence(e: &Estate, run_id: &str) -> Value {
    e.audit()
        .into_iter()
        .find(|l| l["phase"] == "evidence" && l["run_id"] == run_id)
        .unwrap_or_else(|| panic!("no evidence line for {run_id}"))
}

fn verdicts(e: &Estate, runbook: &str) -> Vec<Value> {
    e.audit()
        .into_iter()
        .filter(|l| l["phase"] == "verdict" && l["runbook"] == runbook)
        .collect()
}

fn metric(addr: &str, line_start: &str) -> Option<f64> {
    let (_, body) = http(addr, "GET", "/metrics", "")?;
    body.lines()
        .find(|l| l.starts_with(line_start))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// Alertmanager routes the real alerts of a deep queue (a page and a
/// ticket, one notification) to the daemon; the fix brings local's queue
/// to 3 while web2's stays at 90: `ok`, with the evidence of both alerts'
/// series gone. Then the queue is deep again: Alertmanager's notification
/// of the alert back starts a run at once (the run that saw it clear left
/// no keys to deduplicate it against) that names the earlier run, which
/// gets its `recurred` line, and the metric counts it.
#[test]
fn a_fix_that_clears_its_alert_is_ok_with_the_evidence_and_a_recurrence_is_recorded() {
    // Alertmanager first: Prometheus sends a firing alert once, then again
    // only after a minute. runwarden's port is chosen ahead, and
    // Alertmanager retries until it listens.
    let rw_addr = format!("127.0.0.1:{}", free_port());
    let am_dir = tempfile::Builder::new().prefix("rw-am-").tempdir().unwrap();
    let (_am, am_addr) = alertmanager(
        am_dir.path(),
        &format!(
            "route:\n  receiver: runwarden\n  group_by: [alertname, node]\n  group_wait: 2s\n  group_interval: 1s\n  repeat_interval: 5s\nreceivers:\n  - name: runwarden\n    webhook_configs:\n      - url: http://{rw_addr}/api/v1/alerts\n        send_resolved: true\n"
        ),
    );
    let s = Stack::new(&metrics("bad", 82), Some(&am_addr));
    s.settings("");
    s.runbook(
        "fix-queue",
        "BarQueueDeep",
        "fixed",
        "{ within: 30s, recurrence: 1h }",
        "",
    );
    let (rw, _) = start_serve(s.e.cmd(&["serve", "--listen", &rw_addr]));
    let _rw = Proc(rw);
    let first = wait_for("the first run's verdict", Duration::from_secs(90), || {
        verdicts(&s.e, "fix-queue").into_iter().next()
    });
    let run_id = first["run_id"].as_str().unwrap().to_string();
    assert_eq!(first["outcome"], "ok", "{first}");
    let said = first["detail"]["detail"].as_str().unwrap();
    assert!(said.contains("cleared"), "{said}");
    let ev = evidence(&s.e, &run_id);
    assert_eq!(ev["outcome"], "cleared", "{ev}");
    let alerts = ev["detail"]["alerts"].as_array().unwrap();
    assert_eq!(
        alerts.len(),
        2,
        "the page and the ticket, each its own rule: {ev}"
    );
    let queries: Vec<&str> = alerts
        .iter()
        .map(|a| a["queries"][0].as_str().unwrap())
        .collect();
    assert!(queries.contains(&"bar_queue_depth > 50"), "{queries:?}");
    assert!(queries.contains(&"bar_queue_depth > 10"), "{queries:?}");
    for a in alerts {
        assert_eq!(a["series"]["node"], "local", "{a}");
        assert!(
            a["series"].get("severity").is_none(),
            "the rule's label: {a}"
        );
        assert!(
            a["series"].get("cluster").is_none(),
            "the server's label: {a}"
        );
        let evals = a["evaluations"].as_array().unwrap();
        assert!(evals.len() >= 2, "{a}");
        assert!(
            evals[evals.len() - 2..]
                .iter()
                .all(|e| e["value"].is_null()),
            "{a}"
        );
    }
    assert!(
        s.has_series("bar_queue_depth{node=\"web2\"} > 50"),
        "web2's series kept firing all along"
    );
    assert_eq!(
        metric(
            &rw_addr,
            "runwarden_alert_clear_seconds_count{runbook=\"fix-queue\"}"
        ),
        Some(1.0)
    );

    // The queue is deep again: the fix did not hold.
    std::fs::copy(s.e.work().join("bad.prom"), s.served.join("metrics")).unwrap();
    let back = std::time::Instant::now();
    let recurred = wait_for("a recurred line", Duration::from_secs(150), || {
        s.e.audit().into_iter().find(|l| l["phase"] == "recurred")
    });
    assert_eq!(recurred["run_id"], run_id.as_str(), "{recurred}");
    assert!(
        back.elapsed() < Duration::from_secs(30),
        "not held back as a repeat of the first notification: {:?}",
        back.elapsed()
    );
    let again = recurred["detail"]["back_in"].as_str().unwrap().to_string();
    assert_ne!(again, run_id);
    let (status, body) = http(&rw_addr, "GET", &format!("/api/v1/runs/{again}"), "").unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        metric(
            &rw_addr,
            "runwarden_fixes_recurred_total{runbook=\"fix-queue\"}"
        ),
        Some(1.0)
    );
    let second = wait_for("the second run's verdict", Duration::from_secs(60), || {
        verdicts(&s.e, "fix-queue")
            .into_iter()
            .find(|v| v["run_id"] == again.as_str())
    });
    assert_eq!(second["outcome"], "ok", "{second}");
    let report: Value = serde_json::from_str(
        &http(&rw_addr, "GET", &format!("/api/v1/runs/{again}"), "")
            .unwrap()
            .1,
    )
    .unwrap();
    let report = if report["report"].is_object() {
        &report["report"]
    } else {
        &report
    };
    assert_eq!(report["recurred_from"], run_id.as_str(), "{report}");
}

/// The fix verifies (the file is what the tool wrote) but leaves the queue
/// at 20: the page's series is gone, the ticket's is not. `unresolved`
/// (exit 9), the last value in the report, the change's undo offered, and
/// the failure counted toward `demote_after`. The alert carries the rule's
/// `severity` and the server's `cluster`: neither hides the firing series.
#[test]
fn a_fix_that_does_not_clear_its_alert_is_unresolved_with_its_undo_and_counts_toward_demotion() {
    let s = Stack::new(&metrics("bad", 82), None);
    s.settings("");
    s.runbook(
        "fix-queue",
        "BarQueueDeep",
        "still",
        "{ within: 6s }",
        "demote_after: { failures: 1, per: 1h }\n",
    );
    let page = queue_alert(&s, "page", "fp-page");
    let mut ticket = queue_alert(&s, "ticket", "fp-ticket");
    ticket["generatorURL"] = "".into();
    let file = s.alert_file(&[page, ticket]);
    let (code, report) =
        s.e.run_json("fix-queue", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 9, "{report}");
    assert_eq!(report["verdict"], "unresolved", "{report}");
    let check = &report["alert_check"];
    assert_eq!(check["outcome"], "firing", "{check}");
    let said = check["said"].as_str().unwrap();
    assert!(said.contains("still firing"), "{said}");
    assert!(said.contains("value 20"), "{said}");
    // The page's series (over 50) is gone; the ticket's (over 10) is not.
    let alerts = check["detail"]["alerts"].as_array().unwrap();
    let last = |query: &str| -> Value {
        let a = alerts
            .iter()
            .find(|a| a["queries"][0] == query)
            .unwrap_or_else(|| panic!("{query} in {check}"));
        a["evaluations"].as_array().unwrap().last().unwrap()["value"].clone()
    };
    assert_eq!(last("bar_queue_depth > 10"), "20", "{check}");
    assert!(last("bar_queue_depth > 50").is_null(), "{check}");
    let fix = step(&report, "fix");
    assert_eq!(fix["status"], "ok", "the change itself verified: {fix}");
    assert!(
        fix["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("to put it back, a person runs"),
        "{fix}"
    );
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("its changes stay made"),
        "{report}"
    );
    let demoted = s.e.audit_phase("autonomy");
    assert_eq!(demoted.len(), 1, "{demoted:?}");
    assert_eq!(demoted[0]["outcome"], "demoted", "{:?}", demoted[0]);
    let ev = evidence(&s.e, report["run_id"].as_str().unwrap());
    assert_eq!(ev["outcome"], "firing");
}

/// A check that cannot run is never an `ok`: Prometheus gone (the run
/// says so, inconclusive, exit 8), a run no alert started, an alert no
/// rule fired and with no generatorURL. Each counts toward demotion.
#[test]
fn a_clear_that_cannot_be_checked_is_inconclusive_and_counts_as_a_failed_fix() {
    let s = Stack::new(&metrics("bad", 82), None);
    s.runbook(
        "fix-queue",
        "BarQueueDeep",
        "fixed",
        "{ within: 10s }",
        "demote_after: { failures: 3, per: 1h }\n",
    );
    let alert = queue_alert(&s, "page", "fp-page");
    let file = s.alert_file(std::slice::from_ref(&alert));
    let args = ["--alert", file.to_str().unwrap()];

    // Prometheus is somewhere nobody listens.
    let dead = free_port();
    std::fs::write(
        s.e.path().join("runwarden.yaml"),
        format!(
            "audit_head: none\nprometheus: {{ url: 'http://127.0.0.1:{dead}', timeout: 2s }}\n"
        ),
    )
    .unwrap();
    let (code, report) = s.e.run_json("fix-queue", "local", &args);
    assert_eq!(
        (code, report["verdict"].as_str()),
        (8, Some("inconclusive")),
        "{report}"
    );
    let said = report["alert_check"]["said"].as_str().unwrap();
    assert!(said.contains("could not be reached"), "{said}");
    assert!(said.contains("not called ok"), "{said}");

    // The real Prometheus again: a run that no alert started.
    s.settings("");
    let (code, report) = s.e.run_json("fix-queue", "local", &[]);
    assert_eq!(code, 8, "{report}");
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("no alert started this run"),
        "{report}"
    );

    // An alert of a name no rule has, and no generatorURL to read one from.
    let mut other = alert;
    other["labels"]["alertname"] = "NoSuchRule".into();
    other["generatorURL"] = "".into();
    let file = s.alert_file(&[other]);
    let (code, report) =
        s.e.run_json("fix-queue", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 8, "{report}");
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("no alerting rule NoSuchRule"),
        "{report}"
    );
    let ev = s.e.audit_phase("evidence");
    assert_eq!(ev.len(), 3, "each run holds what it saw: {ev:?}");
    assert!(ev.iter().all(|l| l["outcome"] == "unknown"), "{ev:?}");
    // Three inconclusive fixes: demoted, as for three failures.
    let demoted = s.e.audit_phase("autonomy");
    assert_eq!(demoted.len(), 1, "{demoted:?}");
}

/// A rule over `rate(...[8s])` keeps firing for its window after a good
/// fix: the run waits it out and is `ok`, no sooner than the window; and
/// `check` warns of a runbook whose `within` is shorter than that window
/// plus two evaluations, saying what to set.
#[test]
fn a_windowed_rule_clears_once_its_window_has_passed_and_check_warns_of_a_shorter_within() {
    let s = Stack::new(&metrics("bad", 82), None);
    s.settings("");
    s.runbook("fix-errors", "BarErrors", "fixed", "{ within: 40s }", "");
    s.runbook(
        "fix-errors-hastily",
        "BarErrors",
        "fixed",
        "{ within: 5s }",
        "",
    );
    let out = s.e.run(&["check"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("done_when.alert_clears.within"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("fix-errors-hastily"), "{stderr}");
    assert!(warned[0].contains("looks back 8s"), "{stderr}");
    assert!(warned[0].contains("at least 10s"), "{stderr}");

    let counter = s.served.join("metrics");
    let stop = s.e.work().join("errors-stopped");
    // The errors counter climbs until the fix.
    let climbing = {
        let counter = counter.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.exists() {
                n += 5;
                let text = format!(
                    "# state bad\n# TYPE bar_errors_total counter\nbar_errors_total{{node=\"local\"}} {n}\n"
                );
                std::fs::write(&counter, text).unwrap();
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    wait_for("the errors rule to fire", Duration::from_secs(30), || {
        s.has_series("rate(bar_errors_total[8s]) > 0").then_some(())
    });
    let instance = s.exporter_instance();
    std::fs::write(&stop, "").unwrap();
    climbing.join().unwrap();
    // The fix stops the errors: its file holds the counter where it stopped.
    let last = std::fs::read_to_string(&counter).unwrap();
    std::fs::write(
        s.e.work().join("fixed.prom"),
        last.replace("# state bad", "# state fixed"),
    )
    .unwrap();
    let alert = serde_json::json!({
        "status": "firing",
        "labels": { "alertname": "BarErrors", "severity": "page", "cluster": "staging",
                    "node": "local", "instance": instance, "job": "bar" },
        "fingerprint": "fp-errors",
    });
    let file = s.alert_file(&[alert]);
    let (code, report) =
        s.e.run_json("fix-errors", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{report}");
    let check = &report["alert_check"];
    assert_eq!(check["outcome"], "cleared", "{check}");
    let seconds: f64 = check["said"]
        .as_str()
        .unwrap()
        .split(" cleared ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{check}"));
    assert!(
        seconds >= 3.0,
        "a rate over 8s cannot clear at once: {check}"
    );
}

/// A flapping series (deep two seconds, shallow one) is absent now and then
/// but never in three evaluations in a row: no `ok` from a gap.
#[test]
fn a_flapping_series_is_not_called_cleared_by_one_gap() {
    let s = Stack::new(&metrics("bad", 82), None);
    s.settings("");
    s.runbook(
        "fix-queue",
        "BarQueueDeep",
        "bad",
        "{ within: 14s, absent_evaluations: 3 }",
        "",
    );
    let served = s.served.join("metrics");
    let stop = s.e.work().join("stop-flapping");
    let flapping = {
        let (served, stop) = (served.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.exists() {
                std::fs::write(&served, metrics("bad", 82)).unwrap();
                std::thread::sleep(Duration::from_millis(2000));
                std::fs::write(&served, metrics("bad", 3)).unwrap();
                std::thread::sleep(Duration::from_millis(1000));
            }
        })
    };
    let alert = queue_alert(&s, "page", "fp-page");
    let file = s.alert_file(&[alert]);
    let (code, report) =
        s.e.run_json("fix-queue", "local", &["--alert", file.to_str().unwrap()]);
    std::fs::write(&stop, "").unwrap();
    flapping.join().unwrap();
    assert_eq!(code, 9, "{report}");
    let said = report["alert_check"]["said"].as_str().unwrap();
    assert!(said.contains("of the 3 needed"), "{said}");
}

/// L2: a person approves the change after the queue drained by itself. The
/// alert's series is gone from its rule's expression now, so the change is
/// not made: the call is denied (`alert_resolved`), with no intent line,
/// and the exporter's file is as the queue left it.
#[test]
fn an_l2_change_approved_after_its_alert_cleared_by_itself_is_not_made() {
    const ALICE: &str = "Bearer alice-token-0123456789";
    let s = Stack::new(&metrics("bad", 82), None);
    write_secret(
        &s.e.path().join("approvers"),
        "alice alice-token-0123456789\n",
    );
    s.settings("approvers_file: approvers\napproval_timeout: 5m\n");
    s.runbook("fix-queue", "BarQueueDeep", "still", "{ within: 20s }", "");
    let file = s.e.path().join("runbooks/fix-queue.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("autonomy: L3", "autonomy: L2")).unwrap();
    let d = crate::daemon::Daemon::start(&s.e);
    let body = serde_json::json!({
        "version": "4", "groupKey": "{}:{alertname=\"BarQueueDeep\"}", "status": "firing",
        "receiver": "runwarden", "alerts": [queue_alert(&s, "page", "fp-page")],
    });
    let (status, said) = d.post_alerts(&body.to_string());
    assert_eq!(status, 200, "{said}");
    let request = wait_for("the approval request", Duration::from_secs(20), || {
        let (_, text) = d.request("GET", "/api/v1/approvals", &[("Authorization", ALICE)], b"");
        let list: Value = serde_json::from_str(&text).ok()?;
        list["approvals"]
            .as_array()?
            .iter()
            .find(|r| r["state"] == "pending")
            .cloned()
    });
    // The queue drains by itself while the request waits.
    std::fs::write(s.served.join("metrics"), metrics("drained", 3)).unwrap();
    wait_for("the series to go", Duration::from_secs(20), || {
        (!s.has_series("bar_queue_depth{node=\"local\"} > 50")).then_some(())
    });
    let decision = serde_json::json!({ "digest": request["digest"], "comment": "ok" }).to_string();
    let (status, text) = d.request(
        "POST",
        &format!(
            "/api/v1/approvals/{}/approve",
            request["id"].as_str().unwrap()
        ),
        &[
            ("Authorization", ALICE),
            ("Content-Type", "application/json"),
        ],
        decision.as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    let verdict = wait_for("the run's verdict", Duration::from_secs(30), || {
        verdicts(&s.e, "fix-queue").into_iter().next()
    });
    assert_eq!(verdict["outcome"], "denied", "{verdict}");
    let denied = s.e.audit_phase("denied");
    assert_eq!(denied.len(), 1, "{denied:?}");
    let detail = denied[0]["detail"].to_string();
    assert!(detail.contains("alert_resolved"), "{detail}");
    assert!(detail.contains("cleared by itself"), "{detail}");
    assert!(s.e.audit_phase("intent").is_empty(), "no change was made");
    let served = std::fs::read_to_string(s.served.join("metrics")).unwrap();
    assert!(served.starts_with("# state drained"), "{served}");
}

/// Three replicas on one PostgreSQL, each asking Prometheus itself: the
/// alert posted to all three (as Alertmanager's receivers would) starts
/// one run, which waits for its alert on its replica and ends `ok` with the
/// evidence, while its lease keeps the host from the other two.
#[test]
fn three_replicas_run_the_alert_once_and_see_it_clear() {
    let s = Stack::new(&metrics("bad", 82), None);
    let pg = crate::ha::pg::Pg::start();
    let extra = format!(
        "prometheus: {{ url: 'http://{}', timeout: 5s }}\n",
        s.prom_addr
    );
    let (work, served) = (s.e.work(), s.served.clone());
    let fleet = crate::ha::fleet(&pg, 3, "15s", &extra, &|e| {
        set_up(e, &work, &served);
        e.runbook(
            "fix-queue",
            &runbook_yaml("fix-queue", "BarQueueDeep", "fixed", "{ within: 30s }", ""),
        );
    });
    let body = serde_json::json!({
        "version": "4", "groupKey": "{}:{alertname=\"BarQueueDeep\"}", "status": "firing",
        "receiver": "runwarden", "alerts": [queue_alert(&s, "page", "fp-page")],
    })
    .to_string();
    let answers = crate::ha::post_to_all(&fleet, &body);
    let mut results: Vec<&str> = answers
        .iter()
        .map(|(_, a)| a["outcomes"][0]["result"].as_str().unwrap_or("?"))
        .collect();
    results.sort();
    assert_eq!(
        results,
        ["deduplicated", "deduplicated", "started"],
        "{answers:?}"
    );
    let (ran, verdict) = wait_for("the fleet's one verdict", Duration::from_secs(60), || {
        fleet
            .iter()
            .find_map(|r| r.verdicts().into_iter().next().map(|v| (r, v)))
    });
    assert_eq!(verdict["outcome"], "ok", "{verdict}");
    let ev = evidence(&ran.e, verdict["run_id"].as_str().unwrap());
    assert_eq!(ev["outcome"], "cleared", "{ev}");
    std::thread::sleep(Duration::from_millis(500));
    let runs: usize = fleet.iter().map(|r| r.verdicts().len()).sum();
    assert_eq!(runs, 1, "one run across the fleet");
}

/// The alerts Alertmanager holds now, in the webhook's shape (as it would
/// send them): those of `alertname` whose labels include `with`.
fn held_by_alertmanager(am: &str, alertname: &str, with: &[(&str, &str)]) -> Vec<Value> {
    wait_for(
        "Alertmanager to hold the alert",
        Duration::from_secs(60),
        || {
            let (_, body) = http(am, "GET", "/api/v2/alerts", "")?;
            let all: Vec<Value> = serde_json::from_str(&body).ok()?;
            let found: Vec<Value> = all
                .into_iter()
                .filter(|a| a["labels"]["alertname"] == alertname)
                .filter(|a| with.iter().all(|(k, v)| a["labels"][*k] == *v))
                .map(|a| {
                    serde_json::json!({
                        "status": "firing",
                        "labels": a["labels"],
                        "annotations": a["annotations"],
                        "fingerprint": a["fingerprint"],
                        "generatorURL": a["generatorURL"],
                    })
                })
                .collect();
            (!found.is_empty()).then_some(found)
        },
    )
}

/// An Alertmanager that keeps what Prometheus sends (no receiver to call).
fn quiet_alertmanager() -> (Proc, String, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("rw-am-").tempdir().unwrap();
    let (am, addr) = alertmanager(
        dir.path(),
        "route:\n  receiver: nobody\n  group_wait: 1s\nreceivers:\n  - name: nobody\n",
    );
    (am, addr, dir)
}

/// Prometheus's `alert_relabel_configs` gives the alert a `region` its
/// series never has (as Alertmanager receives it). A fix that leaves the
/// queue deep is `unresolved`: the label does not hide the firing series;
/// the fix that drains it is `ok`.
#[test]
fn a_label_relabelling_adds_to_the_alert_does_not_make_it_look_cleared() {
    let (_am, am, _dir) = quiet_alertmanager();
    let s = Stack::with(
        &metrics("bad", 82),
        Some(&am),
        "  alert_relabel_configs:\n    - target_label: region\n      replacement: eu\n",
        true,
    );
    s.settings("");
    let alerts = held_by_alertmanager(
        &am,
        "BarQueueDeep",
        &[("severity", "page"), ("node", "local")],
    );
    assert_eq!(alerts[0]["labels"]["region"], "eu", "{alerts:?}");
    let file = s.alert_file(&alerts);
    let args = ["--alert", file.to_str().unwrap()];
    s.runbook("fix-queue", "BarQueueDeep", "bad", "{ within: 5s }", "");
    let (code, report) = s.e.run_json("fix-queue", "local", &args);
    assert_eq!(code, 9, "{report:#}");
    assert_eq!(report["alert_check"]["outcome"], "firing", "{report:#}");
    assert!(
        report["alert_check"]["said"]
            .as_str()
            .unwrap()
            .contains("value 82"),
        "{report:#}"
    );
    s.runbook("fix-queue", "BarQueueDeep", "fixed", "{ within: 20s }", "");
    let (code, report) = s.e.run_json("fix-queue", "local", &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["alert_check"]["outcome"], "cleared", "{report:#}");
}

/// The rule is renamed after it fired: this Prometheus no longer
/// evaluates the alert (and the alert's static `severity` could be
/// matched against a generatorURL expression's series that never has
/// it). `inconclusive`, never `ok`, though the fix does nothing.
#[test]
fn a_rule_renamed_after_it_fired_is_inconclusive() {
    let (_am, am, _dir) = quiet_alertmanager();
    let s = Stack::with(&metrics("bad", 82), Some(&am), "", true);
    s.settings("");
    let alerts = held_by_alertmanager(
        &am,
        "BarQueueDeep",
        &[("severity", "page"), ("node", "local")],
    );
    assert!(
        alerts[0]["generatorURL"]
            .as_str()
            .unwrap()
            .contains("g0.expr")
    );
    let rules = s.e.work().join("prometheus/rules.yml");
    let text = std::fs::read_to_string(&rules).unwrap();
    std::fs::write(
        &rules,
        text.replace("alert: BarQueueDeep", "alert: BarQueueTooDeep"),
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s._prom.0.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_for("the renamed rules", Duration::from_secs(30), || {
        http(&s.prom_addr, "GET", "/api/v1/rules", "").filter(|r| r.1.contains("BarQueueTooDeep"))
    });
    let file = s.alert_file(&alerts);
    s.runbook("fix-queue", "BarQueueDeep", "bad", "{ within: 5s }", "");
    let (code, report) =
        s.e.run_json("fix-queue", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 8, "{report:#}");
    let said = report["verdict_detail"].as_str().unwrap();
    assert!(said.contains("does not evaluate this alert"), "{said}");
}

/// `prometheus.url` names a reachable Prometheus that scrapes the same
/// exporter but has no rules: it cannot say the alert cleared.
/// `inconclusive`, though the alert fires on the other one throughout.
#[test]
fn a_prometheus_that_does_not_evaluate_the_rule_is_inconclusive() {
    let (_am, am, _dir) = quiet_alertmanager();
    let s = Stack::with(&metrics("bad", 82), Some(&am), "", true);
    let alerts = held_by_alertmanager(
        &am,
        "BarQueueDeep",
        &[("severity", "page"), ("node", "local")],
    );
    let other = Stack::with(&metrics("bad", 82), None, "", false);
    std::fs::write(
        s.e.path().join("runwarden.yaml"),
        format!(
            "audit_head: none\nprometheus: {{ url: 'http://{}', timeout: 5s }}\n",
            other.prom_addr
        ),
    )
    .unwrap();
    let file = s.alert_file(&alerts);
    s.runbook("fix-queue", "BarQueueDeep", "bad", "{ within: 5s }", "");
    let (code, report) =
        s.e.run_json("fix-queue", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 8, "{report:#}");
    assert!(
        s.has_series("ALERTS{alertname=\"BarQueueDeep\",alertstate=\"firing\",node=\"local\"}"),
        "it fires all along on the Prometheus that evaluates it"
    );
}

/// An alert whose labels match no series of its rule (a queue this
/// exporter does not have): never seen firing, so never seen clear.
/// `inconclusive`, the report says why.
#[test]
fn an_alert_never_seen_firing_is_inconclusive() {
    let s = Stack::new(&metrics("bad", 82), None);
    s.settings("");
    let mut alert = queue_alert(&s, "ticket", "fp-ghost");
    alert["labels"]["queue"] = "ghost".into();
    let file = s.alert_file(&[alert]);
    s.runbook("fix-queue", "BarQueueDeep", "fixed", "{ within: 10s }", "");
    let (code, report) =
        s.e.run_json("fix-queue", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 8, "{report:#}");
    let said = report["alert_check"]["said"].as_str().unwrap();
    assert!(said.contains("never seen firing"), "{said}");
    assert!(said.contains("not called ok"), "{said}");
}

/// `keep_firing_for: 5s`: Prometheus reports the alert firing that long
/// after its expression cleared, and runwarden does not call it cleared
/// before then; a `within` shorter than that is `unresolved`, the report
/// naming the rule's keep_firing_for in the `within` to set. `for: 2s`
/// holds nothing back once the expression clears.
#[test]
fn keep_firing_for_holds_the_clear_and_for_does_not() {
    let (_am, am, _dir) = quiet_alertmanager();
    let s = Stack::with(&metrics("bad", 82), Some(&am), "", true);
    s.settings("");
    let sticky = held_by_alertmanager(&am, "BarQueueSticky", &[("node", "local")]);
    let slow = held_by_alertmanager(&am, "BarQueueSlow", &[("node", "local")]);
    let reset = || std::fs::copy(s.e.work().join("bad.prom"), s.served.join("metrics")).unwrap();

    s.runbook("sticky", "BarQueueSticky", "fixed", "{ within: 3s }", "");
    let file = s.alert_file(&sticky);
    let (code, report) =
        s.e.run_json("sticky", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 9, "{report:#}");
    let said = report["alert_check"]["said"].as_str().unwrap();
    assert!(said.contains("firing (ALERTS)"), "{said}");
    assert!(said.contains("set within to at least"), "{said}");

    reset();
    wait_for("the sticky alert back", Duration::from_secs(20), || {
        s.has_series("bar_queue_depth{node=\"local\"} > 50")
            .then_some(())
    });
    s.runbook("sticky", "BarQueueSticky", "fixed", "{ within: 30s }", "");
    let started = std::time::Instant::now();
    let (code, report) =
        s.e.run_json("sticky", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{report:#}");
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "cleared while Prometheus still reported it firing: {:?}",
        started.elapsed()
    );

    reset();
    wait_for("the slow alert back", Duration::from_secs(20), || {
        s.has_series("ALERTS{alertname=\"BarQueueSlow\",alertstate=\"firing\",node=\"local\"}")
            .then_some(())
    });
    s.runbook("slow", "BarQueueSlow", "fixed", "{ within: 20s }", "");
    let file = s.alert_file(&slow);
    let (code, report) =
        s.e.run_json("slow", "local", &["--alert", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["alert_check"]["outcome"], "cleared", "{report:#}");
}

//! Several daemons against one real PostgreSQL (Debian's, a cluster of the
//! test's own in a temporary directory, run as the postgres user): one run
//! per trigger across the fleet, fencing, failover, the fleet's kill switch
//! and budget, and what a replica does when the database goes away.
//!
//! The hosts are local; what a tier-2 call did is read from the host's own
//! record: logrotate's `postrotate` appends the time of each rotation to a
//! file, whichever replica asked for it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::*;

#[path = "../support/pg.rs"]
pub(crate) mod pg;
use pg::{PG_PASSWORD, Pg};

mod chat;
mod demotion;
mod killswitch;
mod mcp;
mod queue;
mod rollout;

/// The hosts' own world, shared by every replica: per host a log, its
/// logrotate configuration and the record `postrotate` appends to.
pub struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    pub fn new() -> Site {
        Site {
            dir: tempfile::Builder::new()
                .prefix("rw-site-")
                .tempdir()
                .unwrap(),
        }
    }

    /// The host file of local host `name`, made (once) with its own log.
    pub fn host(&self, name: &str, extra: &str) -> String {
        let dir = self.dir.path().join(name);
        let conf = self.dir.path().join(format!("{name}.conf"));
        if !conf.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("app.log"), "line\n").unwrap();
            std::fs::write(
                &conf,
                format!(
                    "{log} {{\n  rotate 1000\n  ifempty\n  missingok\n  create\n  postrotate\n    date +%s.%N >> {record}\n  endscript\n}}\n",
                    log = dir.join("app.log").display(),
                    record = self.record_path(name).display()
                ),
            )
            .unwrap();
        }
        local_host(
            name,
            &format!(
                "paths: [/tmp]\nlogrotate_configs: [{}]\nlogrotate_state: {}\n{extra}",
                conf.display(),
                dir.join("logrotate.state").display()
            ),
        )
    }

    fn record_path(&self, host: &str) -> PathBuf {
        self.dir.path().join(format!("{host}.record"))
    }

    /// When each rotation of `host` happened (seconds since the epoch), by the host's clock.
    pub fn rotations(&self, host: &str) -> Vec<f64> {
        std::fs::read_to_string(self.record_path(host))
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    }

    /// An executable on the host: `list_processes` through it is slow.
    pub fn slow_ps(&self, seconds: f64) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.path().join(format!("slow-ps-{seconds}"));
        std::fs::write(
            &p,
            format!("#!/bin/sh\nsleep {seconds}\nexec /bin/ps \"$@\"\n"),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }
}

/// One daemon of the fleet: its own config directory, audit log and
/// kill-switch directory, the shared database.
pub struct Replica {
    /// First, so the daemon stops before its directory goes.
    pub d: Option<Proc>,
    pub e: Estate,
    pub name: String,
    pub addr: String,
}

/// The runwarden.yaml of replica `name`: shared state with a `lease`.
fn replica_yaml(name: &str, lease: &str, extra: &str) -> String {
    format!(
        "audit_head: none\nreplica: {name}\nshutdown_grace: 2s\nstate:\n  postgres:\n    url_file: pg-url\n    lease: {lease}\n{extra}"
    )
}

/// The lease of tests about failover: short, so they are quick.
const SHORT: &str = "3s";
/// The lease of the others: long enough that a loaded machine never lets
/// one lapse between two renewals.
const LONG: &str = "15s";

impl Replica {
    /// A config directory for replica `name`; `setup` adds its hosts and runbooks.
    pub fn prepare(
        pg: &Pg,
        name: &str,
        lease: &str,
        extra: &str,
        setup: &dyn Fn(&Estate),
    ) -> Replica {
        let e = Estate::new();
        write_secret(&e.path().join("pg-url"), &pg.url());
        std::fs::write(
            e.path().join("runwarden.yaml"),
            replica_yaml(name, lease, extra),
        )
        .unwrap();
        setup(&e);
        Replica {
            d: None,
            e,
            name: name.into(),
            addr: String::new(),
        }
    }

    pub fn start(&mut self) {
        let (child, addr) = serve(&self.e);
        self.d = Some(child);
        self.addr = addr;
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.d.as_ref().unwrap().0.id() as i32)
    }

    pub fn signal(&self, s: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), s).unwrap();
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let (status, text) = http(&self.addr, "POST", path, body).expect("the replica answers");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Start runs of `runbook` on `hosts` through the API: each host's result.
    pub fn start_runs(&self, runbook: &str, hosts: &[&str]) -> Vec<String> {
        let (status, answer) = self.post(
            "/api/v1/runs",
            &json!({ "runbook": runbook, "hosts": hosts }).to_string(),
        );
        assert_eq!(status, 202, "{answer}");
        answer["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["result"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn healthz(&self) -> u16 {
        http(&self.addr, "GET", "/healthz", "").map_or(0, |r| r.0)
    }

    pub fn verdicts(&self) -> Vec<Value> {
        self.e.audit_phase("verdict")
    }
}

/// `n` replicas (`a`, `b`, `c`, ...) with the same hosts and runbooks, the
/// schema migrated, all started.
pub fn fleet(pg: &Pg, n: usize, lease: &str, extra: &str, setup: &dyn Fn(&Estate)) -> Vec<Replica> {
    let mut replicas: Vec<Replica> = (0..n)
        .map(|i| {
            let name = ((b'a' + i as u8) as char).to_string();
            Replica::prepare(pg, &name, lease, extra, setup)
        })
        .collect();
    let migrate = replicas[0].e.run(&["db", "migrate"]);
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    for r in &mut replicas {
        r.start();
    }
    replicas
}

/// `body` posted to every replica's webhook at once, as Alertmanager's
/// receivers would: each replica's answer.
pub fn post_to_all(fleet: &[Replica], body: &str) -> Vec<(u16, Value)> {
    std::thread::scope(|s| {
        let posts: Vec<_> = fleet
            .iter()
            .map(|r| s.spawn(|| r.post("/api/v1/alerts", body)))
            .collect();
        posts.into_iter().map(|p| p.join().unwrap()).collect()
    })
}

/// Every line of every replica's audit log.
fn all_lines(fleet: &[Replica]) -> Vec<Value> {
    fleet.iter().flat_map(|r| r.e.audit()).collect()
}

fn verdicts_of(fleet: &[Replica]) -> Vec<Value> {
    all_lines(fleet)
        .into_iter()
        .filter(|l| l["phase"] == "verdict")
        .collect()
}

/// The runbook `rot`: look, rotate the host's log (tier 2, standing
/// approval), then `slow` slow looks.
fn rot_runbook(site: &Site, hosts: &str, slow: usize) -> String {
    let site = site.dir.path().display();
    let mut rb = format!(
        "name: rot\ndescription: t\nhosts: [{hosts}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"LogsFull\"']\n  host_label: instance\ncooldown: 1h\ntools: {{ observe: [disk_usage, list_processes], approve: [rotate_logs] }}\nbudget: {{ max_steps: 100, max_mutations: 1, max_duration: 5m }}\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n  - call: rotate_logs\n    args: {{ config: \"{site}/{{{{ run.host }}}}.conf\" }}\n    reason: the log is full\n"
    );
    for _ in 0..slow {
        rb += "  - call: list_processes\n";
    }
    rb
}

/// An Alertmanager notification of one `LogsFull` alert per host.
fn notification(hosts: &[&str]) -> String {
    let alerts: Vec<Value> = hosts
        .iter()
        .map(|h| {
            json!({
                "status": "firing",
                "labels": { "alertname": "LogsFull", "instance": format!("{h}:9100") },
                "annotations": {},
                "startsAt": "2026-12-01T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": format!("fp-{h}"),
            })
        })
        .collect();
    json!({
        "version": "4", "status": "firing", "receiver": "runwarden",
        "groupKey": "{}:{alertname=\"LogsFull\"}", "truncatedAlerts": 0,
        "groupLabels": { "alertname": "LogsFull" }, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager", "alerts": alerts,
    })
    .to_string()
}

/// Wait until `n` runs have a verdict; each run's first verdict line.
/// Until `r`'s API lists no run as queued or running: every run it took has
/// its verdict, its report and, with shared state, its lease given back.
fn settled(r: &Replica) {
    wait_for("every run settled", Duration::from_secs(30), || {
        let (status, text) = http(&r.addr, "GET", "/api/v1/runs", "")?;
        let runs: Value = serde_json::from_str(&text).ok()?;
        let busy = runs["runs"]
            .as_array()?
            .iter()
            .any(|r| r["status"] == "running" || r["status"] == "queued");
        (status == 200 && !busy).then_some(())
    });
}

fn wait_verdicts(fleet: &[Replica], n: usize, within: Duration) -> Vec<Value> {
    wait_for(&format!("{n} verdict(s)"), within, || {
        let mut seen = std::collections::HashSet::new();
        let v: Vec<Value> = verdicts_of(fleet)
            .into_iter()
            .filter(|l| seen.insert(l["run_id"].as_str().unwrap_or_default().to_string()))
            .collect();
        (v.len() >= n).then_some(v)
    })
}

/// `max_runs` across the fleet: three replicas receive every round's alert
/// for one host at once (each its own fingerprint, so no duplicate stands in
/// the way); the cap of two runs is counted in the shared state under the
/// host's lock, so exactly two runs start across all of them, and every
/// later trigger is `capped`, recorded once with its own outcome.
#[test]
fn max_runs_holds_across_three_replicas_racing_for_one_host() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 3, LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook(
            "rot",
            &rot_runbook(&site, "h1", 0)
                .replace("cooldown: 1h\n", "max_runs: { count: 2, per: 1h }\n"),
        );
    });
    let mut results: Vec<String> = Vec::new();
    for round in 0..4 {
        let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
            let posts: Vec<_> = fleet
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let body = notification(&["h1"])
                        .replace("fp-h1", &format!("fp-h1-{round}-{i}"))
                        .replace("{}:{", &format!("{{}}:{{round={round}-{i},"));
                    s.spawn(move || r.post("/api/v1/alerts", &body))
                })
                .collect();
            posts.into_iter().map(|p| p.join().unwrap()).collect()
        });
        for (status, a) in &answers {
            assert_eq!(*status, 200, "{a}");
            results.push(a["outcomes"][0]["result"].as_str().unwrap().to_string());
        }
        // Each round's run, if any, ends before the next round.
        for r in &fleet {
            settled(r);
        }
    }
    let started = results.iter().filter(|r| *r == "started").count();
    assert_eq!(started, 2, "{results:?}");
    assert!(
        results.iter().filter(|r| *r == "capped").count() >= 6,
        "rounds 3 and 4 are capped on every replica: {results:?}"
    );
    assert_eq!(verdicts_of(&fleet).len(), 2, "two runs across the fleet");
    let recorded = pg.sql(
        "SELECT outcome, count(*) FROM runwarden_triggers WHERE host = 'h1' GROUP BY outcome ORDER BY outcome",
    );
    let capped = results.iter().filter(|r| *r == "capped").count();
    assert!(
        recorded.contains(&format!("capped|{capped}")) && recorded.contains("started|2"),
        "{recorded}"
    );
    let metrics: usize = fleet
        .iter()
        .map(|r| {
            let (_, text) = http(&r.addr, "GET", "/metrics", "").unwrap();
            text.lines()
                .find(|l| {
                    l.starts_with("runwarden_triggers_capped_total{host=\"h1\",runbook=\"rot\"}")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(
        metrics, capped,
        "each capped trigger counted once, where it arrived"
    );
    // On-call sees the cap from any replica, the fleet's count of runs.
    let out = fleet[2].e.run(&["kill-switch", "status"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains("CAPPED runbook \"rot\" on h1: 2 run(s) within 1h"),
        "{status}"
    );
}

/// With shared state too, a dry run starts no cooldown: the fleet's lease
/// keeps the last real run's end.
#[test]
fn a_dry_run_starts_no_cooldown_in_the_fleet() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 1, LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook("rot", &rot_runbook(&site, "h1", 0));
    });
    let (status, answer) = fleet[0].post(
        "/api/v1/runs",
        &json!({ "runbook": "rot", "hosts": ["h1"], "dry_run": true }).to_string(),
    );
    assert_eq!(status, 202, "{answer}");
    settled(&fleet[0]);
    assert!(site.rotations("h1").is_empty(), "a dry run rotates nothing");
    // Its lease given back (the API may show the verdict a moment before).
    let freed = || {
        wait_for("the run's lease freed", Duration::from_secs(10), || {
            (pg.sql("SELECT run_id IS NULL FROM runwarden_leases WHERE host = 'h1'") == "t")
                .then_some(())
        })
    };
    freed();
    let (status, a) = fleet[0].post("/api/v1/alerts", &notification(&["h1"]));
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["outcomes"][0]["result"], "started", "{a}");
    settled(&fleet[0]);
    freed();
    // The real run's end starts it: another alert for h1 waits.
    let mut again: Value = serde_json::from_str(&notification(&["h1"])).unwrap();
    again["alerts"][0]["fingerprint"] = "another".into();
    again["groupKey"] = "another".into();
    let (_, a) = fleet[0].post("/api/v1/alerts", &again.to_string());
    assert_eq!(a["outcomes"][0]["result"], "cooldown", "{a}");
}

#[test]
fn the_same_notification_posted_to_three_replicas_starts_exactly_one_run() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 3, LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook("rot", &rot_runbook(&site, "h1", 0));
    });
    let body = notification(&["h1"]);
    let answers = post_to_all(&fleet, &body);
    let mut results: Vec<String> = answers
        .iter()
        .map(|(status, a)| {
            assert_eq!(*status, 200, "{a}");
            a["outcomes"][0]["result"].as_str().unwrap().to_string()
        })
        .collect();
    results.sort();
    assert_eq!(
        results,
        ["deduplicated", "deduplicated", "started"],
        "{answers:?}"
    );
    let verdicts = wait_verdicts(&fleet, 1, Duration::from_secs(20));
    assert_eq!(verdicts[0]["outcome"], "ok", "{:#}", verdicts[0]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(verdicts_of(&fleet).len(), 1, "one run across the fleet");
    assert_eq!(site.rotations("h1").len(), 1, "the host rotated once");
    // Every alert's one outcome, recorded once across the fleet.
    let recorded = pg.sql("SELECT outcome, count(*) FROM runwarden_triggers WHERE 'fp:fp-h1' = ANY(keys) GROUP BY outcome ORDER BY outcome");
    assert_eq!(recorded, "deduplicated|2\nstarted|1", "{recorded}");
    // Any replica lists the fleet's runs: this one, who ran it, how it ended.
    let run_id = verdicts[0]["run_id"].as_str().unwrap();
    let ran_on = fleet
        .iter()
        .find(|r| !r.verdicts().is_empty())
        .unwrap()
        .name
        .clone();
    for r in &fleet {
        let (status, text) = http(&r.addr, "GET", "/api/v1/fleet/runs?host=h1", "").unwrap();
        assert_eq!(status, 200, "{text}");
        let runs: Value = serde_json::from_str(&text).unwrap();
        let run = &runs["runs"][0];
        assert_eq!(run["run_id"], run_id, "{runs:#}");
        assert_eq!(run["replica"], ran_on.as_str());
        assert_eq!(
            (run["status"].as_str(), run["verdict"].as_str()),
            (Some("ended"), Some("ok"))
        );
        // On-call's command lists the same from any replica's machine.
        let out = r.e.run(&["runs", "--fleet", "--host", "h1"]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(
            said.lines()
                .any(|l| l.contains(run_id) && l.contains(ran_on.as_str()) && l.ends_with(" ok")),
            "{said}"
        );
    }
    // A repeat within the cooldown, to any replica, starts nothing.
    let (status, again) = fleet[2].post("/api/v1/alerts", &body);
    assert_eq!(status, 200);
    assert_eq!(again["outcomes"][0]["result"], "deduplicated", "{again}");
}

#[test]
fn alerts_no_runbook_takes_or_for_hosts_out_of_scope_are_in_the_fleets_table_too() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 1, LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.host("h3", &site.host("h3", ""));
        e.runbook("rot", &rot_runbook(&site, "h1", 0));
    });
    // h1 starts a run; h2 has no host file; h3 is not one of the
    // runbook's hosts; a fourth alert is one no runbook takes.
    let mut body: Value = serde_json::from_str(&notification(&["h1", "h2", "h3", "h4"])).unwrap();
    body["alerts"][3]["labels"]["alertname"] = "MemoryPressure".into();
    let (status, answer) = fleet[0].post("/api/v1/alerts", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let results: Vec<&str> = answer["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["result"].as_str().unwrap())
        .collect();
    assert_eq!(
        results,
        ["started", "out_of_scope", "out_of_scope", "no_match"],
        "{answer:#}"
    );
    // Every alert's one outcome is a row, whichever replica decided it and
    // however: the fleet's table answers "what became of this alert".
    let recorded = pg.sql(
        "SELECT runbook, host, outcome, array_to_string(keys, ',') FROM runwarden_triggers ORDER BY keys[1]",
    );
    let group = "group:{}:{alertname=\"LogsFull\"}";
    assert_eq!(
        recorded,
        format!(
            "rot|h1|started|fp:fp-h1,{group}\nrot|h2|out_of_scope|fp:fp-h2,{group}\nrot|h3|out_of_scope|fp:fp-h3,{group}\nnone||no_match|fp:fp-h4,{group}"
        ),
        "{recorded}"
    );
    wait_verdicts(&fleet, 1, Duration::from_secs(20));
}

/// A poison alert: a NUL byte in an alert's fingerprint, host label or an
/// annotation, or in the notification's groupKey. Each such alert gets its
/// own recorded outcome `invalid` (its row shows the byte escaped), the
/// good alerts beside it start, and the answer is 200, so Alertmanager does
/// not resend it forever (it was a 503 for the whole notification).
#[test]
fn an_alert_with_a_nul_byte_is_recorded_invalid_and_its_neighbours_start() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 1, LONG, "", &|e| {
        for h in ["h1", "h5"] {
            e.host(h, &site.host(h, ""));
        }
        e.runbook("rot", &rot_runbook(&site, "h1, h5", 0));
    });
    let mut body: Value = serde_json::from_str(&notification(&["h1", "h2", "h3", "h4"])).unwrap();
    body["alerts"][1]["fingerprint"] = "fp-h2\u{0}x".into();
    body["alerts"][2]["labels"]["instance"] = "h3\u{0}:9100".into();
    body["alerts"][3]["annotations"]["summary"] = "disk \u{0} full".into();
    let (status, answer) = fleet[0].post("/api/v1/alerts", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let results: Vec<&str> = answer["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["result"].as_str().unwrap())
        .collect();
    assert_eq!(
        results,
        ["started", "invalid", "invalid", "invalid"],
        "{answer:#}"
    );
    assert!(
        answer["outcomes"][1]["why"]
            .as_str()
            .unwrap()
            .contains("fingerprint holds a NUL byte"),
        "{answer:#}"
    );
    let recorded =
        pg.sql("SELECT runbook, outcome, keys[1] FROM runwarden_triggers ORDER BY keys[1]");
    assert_eq!(
        recorded,
        "rot|started|fp:fp-h1\nnone|invalid|fp:fp-h2\\0x\nnone|invalid|fp:fp-h3\nnone|invalid|fp:fp-h4",
        "{recorded}"
    );
    // A NUL in the group key: every alert of it is invalid, and still 200.
    let mut body: Value = serde_json::from_str(&notification(&["h5"])).unwrap();
    body["groupKey"] = "{}:{alertname=\"Logs\u{0}Full\"}".into();
    let (status, answer) = fleet[0].post("/api/v1/alerts", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcomes"][0]["result"], "invalid", "{answer:#}");
    let (_, metrics) = http(&fleet[0].addr, "GET", "/metrics", "").unwrap();
    assert!(
        metrics.contains("runwarden_alert_triggers_total{result=\"invalid\",runbook=\"none\"} 4"),
        "{metrics}"
    );
    wait_verdicts(&fleet, 1, Duration::from_secs(20));
}

#[test]
fn a_replica_killed_mid_run_is_closed_interrupted_by_another_within_its_lease_and_nothing_runs_twice()
 {
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(0.5);
    let mut fleet = fleet(&pg, 3, SHORT, "", &|e| {
        e.host(
            "h1",
            &site.host("h1", &format!("binaries: {{ ps: {} }}", ps.display())),
        );
        e.runbook("rot", &rot_runbook(&site, "h1", 20));
    });
    assert_eq!(fleet[0].start_runs("rot", &["h1"]), ["started"]);
    wait_for("the rotation", Duration::from_secs(10), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    let run_id = fleet[0].e.audit_phase("start")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    fleet[0].signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    let closed = wait_for(
        "another replica to close the run",
        Duration::from_secs(10),
        || {
            let row = pg.sql(&format!(
                "SELECT status, closed_by FROM runwarden_runs WHERE run_id = '{run_id}'"
            ));
            row.starts_with("interrupted|").then_some(row)
        },
    );
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(3 + 1) + Duration::from_millis(500),
        "closed {took:?} after the kill; the lease is 3 s"
    );
    let by = closed.split('|').nth(1).unwrap().to_string();
    assert!(by == "b" || by == "c", "closed by {by}");
    let closer = fleet.iter().find(|r| r.name == by).unwrap();
    let line = closer
        .verdicts()
        .into_iter()
        .find(|v| v["run_id"] == run_id.as_str())
        .expect("the closing replica's audit log records it");
    assert_eq!(line["outcome"], "interrupted", "{line:#}");
    // Its record reads like any other: the history lists the run, the chain holds.
    let runs = closer.e.run(&["runs", "--json"]);
    assert!(
        runs.status.success(),
        "{}",
        String::from_utf8_lossy(&runs.stderr)
    );
    assert!(String::from_utf8_lossy(&runs.stdout).contains(&run_id));
    let verify = closer.e.run(&["audit", "verify"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    // Runs are not resumed: the rotation the dead run made is the only one.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(site.rotations("h1").len(), 1);
    // The dead replica comes back: it closes the run in its own log too and
    // the fleet's record of the run stays `interrupted`, closed once.
    fleet[0].d = None;
    fleet[0].start();
    let own = wait_for(
        "the restarted replica's own verdict",
        Duration::from_secs(10),
        || {
            fleet[0]
                .verdicts()
                .into_iter()
                .find(|v| v["run_id"] == run_id.as_str())
        },
    );
    assert_eq!(own["outcome"], "interrupted");
    assert_eq!(
        pg.sql(&format!(
            "SELECT status, closed_by FROM runwarden_runs WHERE run_id = '{run_id}'"
        )),
        closed
    );
}

#[test]
fn a_replica_paused_past_its_lease_is_fenced_at_its_next_call() {
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(0.3);
    let fleet = fleet(&pg, 2, SHORT, "", &|e| {
        e.host(
            "h1",
            &site.host("h1", &format!("binaries: {{ ps: {} }}", ps.display())),
        );
        // No cooldown: the other replica may start anew once the lease is free.
        e.runbook(
            "rot",
            &rot_runbook(&site, "h1", 30).replace("cooldown: 1h\n", ""),
        );
    });
    assert_eq!(fleet[0].start_runs("rot", &["h1"]), ["started"]);
    wait_for("the rotation", Duration::from_secs(10), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    fleet[0].signal(nix::sys::signal::Signal::SIGSTOP);
    let paused = jiff::Timestamp::now();
    // Past the lease: the other replica closes the run and may start anew.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        fleet[1].start_runs("rot", &["h1"]),
        ["started"],
        "the lease was free"
    );
    fleet[0].signal(nix::sys::signal::Signal::SIGCONT);
    let a = wait_for(
        "the paused replica's verdict",
        Duration::from_secs(10),
        || fleet[0].verdicts().into_iter().next(),
    );
    assert_eq!(a["outcome"], "interrupted", "{a:#}");
    let denied: Vec<Value> = fleet[0].e.audit_phase("denied");
    assert_eq!(denied.len(), 1, "{denied:#?}");
    assert_eq!(
        denied[0]["detail"]["reason"], "lease_lost",
        "{:#}",
        denied[0]
    );
    // Whichever fence speaks first after the pause: the store says another
    // replica took over, or the run's own clock says the lease's last proof
    // is too old to trust. Either way the call is not sent.
    let message = denied[0]["detail"]["message"].as_str().unwrap();
    assert!(
        (message.contains("taken over") && message.contains("token 2"))
            || (message.contains("last proven") && message.contains("was not sent")),
        "{message}"
    );
    // Nothing of the paused replica's run was dispatched after it resumed
    // past its lease: its intent lines all predate the pause.
    for intent in fleet[0].e.audit_phase("intent") {
        let at: jiff::Timestamp = intent["ts"].as_str().unwrap().parse().unwrap();
        assert!(
            at < paused,
            "an intent line at {at}, after the pause at {paused}"
        );
    }
    // The new run's one rotation, and the first: two in all (its thirty
    // slow looks after that are not this test's business).
    wait_for("the new run's rotation", Duration::from_secs(20), || {
        (site.rotations("h1").len() == 2).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(site.rotations("h1").len(), 2);
}

#[test]
fn a_call_longer_than_the_lease_keeps_it_by_renewal() {
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(5.0);
    let fleet = fleet(&pg, 2, SHORT, "", &|e| {
        e.host(
            "h1",
            &site.host("h1", &format!("binaries: {{ ps: {} }}", ps.display())),
        );
        e.runbook("rot", &rot_runbook(&site, "h1", 1));
    });
    assert_eq!(fleet[0].start_runs("rot", &["h1"]), ["started"]);
    let v = wait_verdicts(&fleet, 1, Duration::from_secs(20));
    assert_eq!(v[0]["outcome"], "ok", "{:#}", v[0]);
    assert!(fleet[1].verdicts().is_empty(), "nobody else closed it");
    let run_id = v[0]["run_id"].as_str().unwrap();
    assert_eq!(
        pg.sql(&format!(
            "SELECT status, verdict FROM runwarden_runs WHERE run_id = '{run_id}'"
        )),
        "ended|ok"
    );
}

#[test]
fn with_postgres_stopped_no_call_runs_and_the_webhook_answers_503_then_it_recovers_alone() {
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(0.3);
    let fleet = fleet(&pg, 2, SHORT, "", &|e| {
        for h in ["h1", "h2"] {
            e.host(
                h,
                &site.host(h, &format!("binaries: {{ ps: {} }}", ps.display())),
            );
        }
        e.runbook("rot", &rot_runbook(&site, "h1, h2", 30));
    });
    assert_eq!(fleet[0].start_runs("rot", &["h1"]), ["started"]);
    wait_for("the rotation", Duration::from_secs(10), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    pg.stop();
    let stopped = jiff::Timestamp::now();
    for r in &fleet {
        wait_for(
            &format!("{}'s /healthz to say 503", r.name),
            Duration::from_secs(5),
            || (r.healthz() == 503).then_some(()),
        );
        let (status, answer) = r.post("/api/v1/alerts", &notification(&["h2"]));
        assert_eq!(status, 503, "{answer}");
        assert!(answer.to_string().contains("PostgreSQL"), "{answer}");
    }
    // The run in flight stops at its next call: it cannot prove its lease.
    let v = wait_for("the run's verdict", Duration::from_secs(10), || {
        fleet[0].verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "interrupted", "{v:#}");
    let denied = fleet[0].e.audit_phase("denied");
    assert_eq!(
        denied[0]["detail"]["reason"], "lease_lost",
        "{:#}",
        denied[0]
    );
    for intent in fleet[0].e.audit_phase("intent") {
        let at: jiff::Timestamp = intent["ts"].as_str().unwrap().parse().unwrap();
        assert!(
            at < stopped + jiff::SignedDuration::from_millis(400),
            "a call at {at}, the database stopped at {stopped}"
        );
    }
    assert!(site.rotations("h2").is_empty(), "no tier-2 call anywhere");
    // Back: no manual step.
    pg.start_again();
    for r in &fleet {
        wait_for(
            &format!("{}'s /healthz to recover", r.name),
            Duration::from_secs(10),
            || (r.healthz() == 200).then_some(()),
        );
    }
    // The first notification after the restart may still meet a
    // connection the restart broke: answered 503, it is sent again, as
    // Alertmanager does, and starts the run.
    let answer = wait_for(
        "the notification accepted",
        Duration::from_secs(15),
        || match fleet[1].post("/api/v1/alerts", &notification(&["h2"])) {
            (200, answer) => Some(answer),
            (503, _) => None,
            (status, answer) => panic!("{status}: {answer}"),
        },
    );
    assert_eq!(answer["outcomes"][0]["result"], "started", "{answer}");
    wait_for("h2's rotation", Duration::from_secs(10), || {
        (site.rotations("h2").len() == 1).then_some(())
    });
}

#[test]
fn the_kill_switch_engaged_through_one_replica_halts_runs_on_all_three_within_a_second() {
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(0.2);
    let fleet = fleet(&pg, 3, LONG, "", &|e| {
        for h in ["h1", "h2", "h3"] {
            e.host(
                h,
                &site.host(h, &format!("binaries: {{ ps: {} }}", ps.display())),
            );
        }
        e.runbook("rot", &rot_runbook(&site, "h1, h2, h3", 60));
    });
    for (r, h) in fleet.iter().zip(["h1", "h2", "h3"]) {
        assert_eq!(r.start_runs("rot", &[h]), ["started"]);
    }
    for h in ["h1", "h2", "h3"] {
        wait_for("each run's rotation", Duration::from_secs(10), || {
            (site.rotations(h).len() == 1).then_some(())
        });
    }
    let engage = fleet[1]
        .e
        .run(&["kill-switch", "engage", "--reason", "fleet-wide stop"]);
    let engaged = jiff::Timestamp::now();
    assert!(
        engage.status.success(),
        "{}",
        String::from_utf8_lossy(&engage.stderr)
    );
    assert!(String::from_utf8_lossy(&engage.stdout).contains("engaged for the fleet"));
    // At once, on a replica that may not have heard yet: admission itself
    // sees the fleet's switch, and a person's run exits 7 (not 75, busy).
    let (status, answer) = fleet[2].post("/api/v1/alerts", &notification(&["h1"]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcomes"][0]["result"], "kill_switch", "{answer}");
    let person = fleet[2].e.run(&["run", "rot", "--host", "h3"]);
    assert_eq!(
        person.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&person.stderr)
    );
    let verdicts = wait_verdicts(&fleet, 3, Duration::from_secs(10));
    for v in &verdicts {
        assert_eq!(v["outcome"], "halted", "{v:#}");
    }
    for r in &fleet {
        let denied = &r.e.audit_phase("denied")[0];
        assert_eq!(denied["detail"]["reason"], "kill_switch", "{denied:#}");
        assert!(
            denied["detail"]["message"]
                .as_str()
                .unwrap()
                .contains("fleet-wide stop")
        );
        let at: jiff::Timestamp = denied["ts"].as_str().unwrap().parse().unwrap();
        assert!(
            at.duration_since(engaged) < jiff::SignedDuration::from_secs(1),
            "replica {} stopped {} after the switch",
            r.name,
            at.duration_since(engaged)
        );
        // No run that was stopped dispatched or finished a call after its
        // stop, in the log's own order (its line numbers: a wall clock can
        // step back between two lines a millisecond apart).
        let audit = r.e.audit();
        for stop in audit.iter().filter(|l| l["phase"] == "denied") {
            let after: Vec<&Value> = audit
                .iter()
                .filter(|l| l["run_id"] == stop["run_id"] && l["n"].as_u64() > stop["n"].as_u64())
                .filter(|l| l["phase"] == "intent" || l["phase"] == "result")
                .collect();
            let order: Vec<String> = audit
                .iter()
                .map(|l| format!("{} {} {} {}", l["n"], l["phase"], l["run_id"], l["step"]))
                .collect();
            assert!(
                after.is_empty(),
                "replica {}: a call after its run's stop {stop}: {after:#?}\nthe log: {order:#?}",
                r.name
            );
        }
    }
    // Every replica shows the fleet's switch on /metrics, not only the one
    // it was engaged through (the dashboard and the alert read it there).
    let fleet_series = |r: &Replica| {
        http(&r.addr, "GET", "/metrics", "").and_then(|(_, text)| {
            text.lines()
                .find(|l| l.starts_with("runwarden_kill_switch_engaged{scope=\"fleet\"}"))
                .map(str::to_string)
        })
    };
    for r in &fleet {
        wait_for(
            "the fleet switch on /metrics",
            Duration::from_secs(10),
            || {
                (fleet_series(r).as_deref()
                    == Some("runwarden_kill_switch_engaged{scope=\"fleet\"} 1"))
                .then_some(())
            },
        );
    }
    // Released through another replica: the fleet runs again.
    let release = fleet[2].e.run(&["kill-switch", "release"]);
    assert!(
        release.status.success(),
        "{}",
        String::from_utf8_lossy(&release.stderr)
    );
    let status = fleet[0].e.run(&["kill-switch", "status"]);
    assert_eq!(
        status.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    for r in &fleet {
        wait_for(
            "the fleet switch released on /metrics",
            Duration::from_secs(10),
            || {
                (fleet_series(r).as_deref()
                    == Some("runwarden_kill_switch_engaged{scope=\"fleet\"} 0"))
                .then_some(())
            },
        );
    }
    // Engaging for the fleet wrote no file on replica b: released through
    // c, nothing stays engaged anywhere.
    let status = fleet[1].e.run(&["kill-switch", "status"]);
    assert_eq!(
        status.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    assert!(String::from_utf8_lossy(&release.stdout).contains("nothing stays engaged"));

    // A replica's own file (engaged by hand on a) is named by status and
    // by a release on another replica, with where to release it.
    std::fs::write(
        fleet[0].e.path().join("kill-switch/ENGAGED"),
        "reason: disk work on a\n",
    )
    .unwrap();
    let a = fleet[0].name.clone();
    wait_for(
        "replica a's file in the shared state",
        Duration::from_secs(10),
        || {
            let out = fleet[2].e.run(&["kill-switch", "status"]);
            String::from_utf8_lossy(&out.stdout)
                .contains(&format!("ENGAGED global on replica {a}"))
                .then_some(())
        },
    );
    let release = fleet[1].e.run(&["kill-switch", "release"]);
    let said = String::from_utf8_lossy(&release.stdout).to_string();
    assert!(
        said.contains(&format!("still ENGAGED global on replica {a}"))
            && said.contains("disk work on a")
            && said.contains(&format!(
                "release it there: runwarden kill-switch release on {a}"
            )),
        "{said}"
    );
    std::fs::remove_file(fleet[0].e.path().join("kill-switch/ENGAGED")).unwrap();

    // A timed fleet switch: every replica stops, and at its time it ends
    // everywhere, with one audit line (the replica that removed it) naming
    // who engaged it and why.
    let engage = fleet[0]
        .e
        .run(&["kill-switch", "engage", "--reason", "INC-77", "--for", "3s"]);
    assert!(
        engage.status.success(),
        "{}",
        String::from_utf8_lossy(&engage.stderr)
    );
    assert!(String::from_utf8_lossy(&engage.stdout).contains("releases itself at"));
    for r in &fleet {
        wait_for("the timed fleet switch", Duration::from_secs(10), || {
            (fleet_series(r).as_deref() == Some("runwarden_kill_switch_engaged{scope=\"fleet\"} 1"))
                .then_some(())
        });
    }
    for r in &fleet {
        wait_for(
            "the timed fleet switch ended",
            Duration::from_secs(15),
            || {
                (fleet_series(r).as_deref()
                    == Some("runwarden_kill_switch_engaged{scope=\"fleet\"} 0"))
                .then_some(())
            },
        );
    }
    wait_for("its end audited", Duration::from_secs(10), || {
        let lines: Vec<Value> = fleet
            .iter()
            .flat_map(|r| r.e.audit_phase("kill_switch"))
            .collect();
        (!lines.is_empty()).then_some(())
    });
    std::thread::sleep(Duration::from_secs(6));
    let lines: Vec<Value> = fleet
        .iter()
        .flat_map(|r| r.e.audit_phase("kill_switch"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["detail"]["reason"], "INC-77");
    assert_eq!(lines[0]["detail"]["source"], "fleet");
    assert!(
        lines[0]["detail"]["engaged_by"]
            .as_str()
            .unwrap()
            .ends_with(&format!("@{}", fleet[0].name)),
        "{:#}",
        lines[0]
    );

    // An engage never weakens the fleet's switch in force: `--for 2s` over
    // an untimed one keeps it untimed, with both reasons, past those 2 s.
    let run = |args: &[&str]| {
        let out = fleet[1].e.run(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, said) = run(&["kill-switch", "engage", "--reason", "INC-88 hands off"]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = run(&[
        "kill-switch",
        "engage",
        "--reason",
        "maintenance",
        "--for",
        "2s",
    ]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("stays untimed"), "{said}");
    std::thread::sleep(Duration::from_secs(3));
    let (code, said) = run(&["kill-switch", "status"]);
    assert_eq!(code, Some(1), "still engaged: {said}");
    assert!(
        said.contains("INC-88 hands off") && said.contains("maintenance"),
        "{said}"
    );
    let (code, said) = run(&["kill-switch", "release"]);
    assert_eq!(code, Some(0), "{said}");
}

#[test]
fn a_fleet_budget_of_ten_holds_across_three_replicas_and_fifty_runs() {
    let pg = Pg::start();
    let site = Site::new();
    let hosts: Vec<String> = (0..50).map(|i| format!("h{i:02}")).collect();
    let list = hosts.join(", ");
    let fleet = fleet(
        &pg,
        3,
        LONG,
        "fleet_budget: { max_mutations: 10, per: 1h }\nmax_concurrent_runs: 8\n",
        &|e| {
            for h in &hosts {
                e.host(h, &site.host(h, ""));
            }
            e.runbook("rot", &rot_runbook(&site, &list, 0));
        },
    );
    std::thread::scope(|s| {
        for (i, r) in fleet.iter().enumerate() {
            let mine: Vec<&str> = hosts
                .iter()
                .skip(i)
                .step_by(3)
                .map(String::as_str)
                .collect();
            s.spawn(move || {
                assert!(r.start_runs("rot", &mine).iter().all(|x| x == "started"));
            });
        }
    });
    let verdicts = wait_verdicts(&fleet, 50, Duration::from_secs(60));
    assert_eq!(verdicts.len(), 50);
    let rotated: usize = hosts.iter().map(|h| site.rotations(h).len()).sum();
    assert_eq!(rotated, 10, "exactly ten tier-2 calls ran across the fleet");
    let refused: Vec<Value> = all_lines(&fleet)
        .into_iter()
        .filter(|l| l["phase"] == "denied" && l["detail"]["reason"] == "fleet_budget")
        .collect();
    assert_eq!(
        refused.len(),
        40,
        "every other run was refused, and audited"
    );
    assert!(
        refused[0]["detail"]["message"].as_str().unwrap().contains(
            "every runbook's 10 tier-2 calls in 1h are taken (fleet_budget in runwarden.yaml)"
        ),
        "the message a single daemon gives: {:#}",
        refused[0]
    );
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_fleet_calls"), "10");
    let budget_exhausted = verdicts
        .iter()
        .filter(|v| v["outcome"] == "budget_exhausted")
        .count();
    assert_eq!(budget_exhausted, 40);
}

#[test]
fn a_command_line_run_takes_the_fleet_lease_and_a_daemon_run_holding_it_refuses_it() {
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(0.3);
    let fleet = fleet(&pg, 1, LONG, "", &|e| {
        e.host(
            "h1",
            &site.host("h1", &format!("binaries: {{ ps: {} }}", ps.display())),
        );
        e.runbook("rot", &rot_runbook(&site, "h1", 10));
    });
    // Another machine's command line: its own config directory, the same database.
    let other = Replica::prepare(&pg, "laptop", LONG, "", &|e| {
        e.host(
            "h1",
            &site.host("h1", &format!("binaries: {{ ps: {} }}", ps.display())),
        );
        e.runbook("rot", &rot_runbook(&site, "h1", 10));
    });
    assert_eq!(fleet[0].start_runs("rot", &["h1"]), ["started"]);
    wait_for("the rotation", Duration::from_secs(10), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    let out = other.e.run(&["run", "rot", "--host", "h1"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds its lease"));
    assert_eq!(site.rotations("h1").len(), 1);
}

#[test]
fn the_schema_is_migrated_once_checked_at_start_and_the_url_file_guarded() {
    let pg = Pg::start();
    let mut r = Replica::prepare(&pg, "a", LONG, "", &|e| {
        e.host("h", &local_host("h", "paths: [/tmp]"));
    });
    let status = r.e.run(&["db", "status"]);
    assert_eq!(status.status.code(), Some(1));
    let said = String::from_utf8_lossy(&status.stderr).to_string();
    assert!(
        said.contains("version 0") && said.contains("runwarden db migrate"),
        "{said}"
    );
    // A daemon on an unmigrated database refuses to start, saying the same.
    let serve = r.e.run(&["serve", "--listen", "127.0.0.1:0"]);
    assert!(!serve.status.success());
    assert!(String::from_utf8_lossy(&serve.stderr).contains("runwarden db migrate"));
    for expect in [
        "applied migration(s) [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]",
        "the schema is current; nothing to do",
    ] {
        let out = r.e.run(&["db", "migrate"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(expect));
    }
    assert_eq!(r.e.run(&["db", "status"]).status.code(), Some(0));
    // The URL holds the password: a file others can read is refused, and
    // no message ever shows the password.
    let url_file = r.e.path().join("pg-url");
    std::fs::set_permissions(
        &url_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let out = r.e.run(&["db", "status"]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("chmod 600"), "{said}");
    write_secret(&url_file, &pg.url().replace(PG_PASSWORD, "wrong-password"));
    let out = r.e.run(&["db", "status"]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("password authentication failed"), "{said}");
    assert!(
        !said.contains("wrong-password") && !said.contains(PG_PASSWORD),
        "{said}"
    );
    write_secret(&url_file, &pg.url());
    r.start();
    assert_eq!(r.healthz(), 200);
}

/// The privileges README's "High availability" gives a daemon's own role:
/// data only, set up once before the first migration, so every table a
/// later migration adds is granted too.
const APP_ROLE: &str = "
    CREATE ROLE runwarden_app LOGIN PASSWORD 'app-secret-pw';
    ALTER DEFAULT PRIVILEGES FOR ROLE runwarden IN SCHEMA public
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO runwarden_app;
    ALTER DEFAULT PRIVILEGES FOR ROLE runwarden IN SCHEMA public
        GRANT USAGE ON SEQUENCES TO runwarden_app;";

#[test]
fn a_daemon_runs_with_the_documented_data_only_role_and_cannot_migrate() {
    let pg = Pg::start();
    for statement in APP_ROLE.split(';').filter(|s| !s.trim().is_empty()) {
        pg.sql(statement);
    }
    let site = Site::new();
    let mut app = Replica::prepare(&pg, "a", LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook("rot", &rot_runbook(&site, "h1", 0));
    });
    write_secret(
        &app.e.path().join("pg-url"),
        &pg.url().replace(
            &format!("runwarden:{PG_PASSWORD}@"),
            "runwarden_app:app-secret-pw@",
        ),
    );
    let refused = app.e.run(&["db", "migrate"]);
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert_eq!(
        refused.status.code(),
        Some(1),
        "the daemons' role cannot create tables: {said}"
    );
    assert!(said.contains("permission denied"), "{said}");
    // The owner's URL, for this one command.
    write_secret(&app.e.path().join("owner-url"), &pg.url());
    let owner_url = app.e.path().join("owner-url").display().to_string();
    let migrate = app.e.run(&["db", "migrate", "--url-file", &owner_url]);
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert_eq!(app.e.run(&["db", "status"]).status.code(), Some(0));
    app.start();
    assert_eq!(app.start_runs("rot", &["h1"]), ["started"]);
    let v = wait_for("the verdict", Duration::from_secs(10), || {
        app.verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "ok", "{v:#}");
    assert_eq!(site.rotations("h1").len(), 1);
    // What it may not do: change the schema.
    let denied = pg.sql("SELECT has_schema_privilege('runwarden_app', 'public', 'CREATE')::text");
    assert_eq!(denied, "false");
}

const ALICE: &str = "Authorization: Bearer alice-token-0123456789";

fn approvals_of(r: &Replica) -> Vec<Value> {
    let (status, body) = http_with(&r.addr, "GET", "/api/v1/approvals", "", &[ALICE]).unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["approvals"]
        .as_array()
        .unwrap()
        .clone()
}

fn decide(r: &Replica, id: &str, action: &str, digest: &str) -> (u16, String) {
    let body = json!({ "digest": digest, "comment": "looked at it" }).to_string();
    http_with(
        &r.addr,
        "POST",
        &format!("/api/v1/approvals/{id}/{action}"),
        &body,
        &[ALICE],
    )
    .unwrap()
}

#[test]
fn an_l2_request_opened_on_one_replica_is_approved_through_another_after_a_third_restarts() {
    let pg = Pg::start();
    let site = Site::new();
    let mut fleet = fleet(
        &pg,
        3,
        LONG,
        "approvers_file: approvers\napproval_timeout: 1m\n",
        &|e| {
            e.host("h1", &site.host("h1", ""));
            write_secret(
                &e.path().join("approvers"),
                "alice alice-token-0123456789\n",
            );
            e.runbook(
                "l2",
                &rot_runbook(&site, "h1", 0)
                    .replace("name: rot", "name: l2")
                    .replace("autonomy: L3", "autonomy: L2"),
            );
        },
    );
    assert_eq!(fleet[0].start_runs("l2", &["h1"]), ["started"]);
    // The third replica restarts while the request waits: nothing is lost.
    fleet[2].d = None;
    fleet[2].start();
    let request = wait_for(
        "the request, listed by the restarted replica",
        Duration::from_secs(10),
        || {
            approvals_of(&fleet[2])
                .into_iter()
                .find(|r| r["state"] == "pending")
        },
    );
    assert_eq!(request["tool"], "rotate_logs");
    let id = request["id"].as_str().unwrap();
    let digest = request["digest"].as_str().unwrap();
    let (status, body) = decide(&fleet[1], id, "approve", &"0".repeat(64));
    assert_eq!(
        status, 409,
        "a digest of another call approves nothing: {body}"
    );
    assert!(site.rotations("h1").is_empty());
    let (status, body) = decide(&fleet[1], id, "approve", digest);
    let approved = jiff::Timestamp::now();
    assert_eq!(status, 200, "{body}");
    let v = wait_for("the waiting run's verdict", Duration::from_secs(10), || {
        fleet[0].verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "ok", "{v:#}");
    assert_eq!(site.rotations("h1").len(), 1);
    let intent = fleet[0]
        .e
        .audit_phase("intent")
        .into_iter()
        .find(|l| l["tool"] == "rotate_logs")
        .unwrap();
    assert_eq!(intent["approved_by"], "person:alice", "{intent:#}");
    let at: jiff::Timestamp = intent["ts"].as_str().unwrap().parse().unwrap();
    assert!(
        at.duration_since(approved) < jiff::SignedDuration::from_secs(1),
        "the run went on {} after the decision",
        at.duration_since(approved)
    );
    // Exactly one decision counts, wherever the second comes from.
    let (status, body) = decide(&fleet[2], id, "deny", digest);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("already decided"), "{body}");
    let shown = approvals_of(&fleet[1])
        .into_iter()
        .find(|r| r["id"] == id)
        .unwrap();
    assert_eq!(
        (shown["state"].as_str(), shown["by"].as_str()),
        (Some("approved"), Some("alice"))
    );
}

/// The alert resolves while its run's request waits on replica `a`;
/// Alertmanager tells replica `b`. The request is withdrawn in the shared
/// state, `a`'s run hears it within a second and ends without its call,
/// and a decision through any replica approves nothing.
#[test]
fn a_resolved_alert_heard_by_another_replica_withdraws_the_request_a_run_waits_on() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(
        &pg,
        2,
        LONG,
        "approvers_file: approvers\napproval_timeout: 5m\n",
        &|e| {
            e.host("h1", &site.host("h1", ""));
            write_secret(
                &e.path().join("approvers"),
                "alice alice-token-0123456789\n",
            );
            e.runbook(
                "rot",
                &rot_runbook(&site, "h1", 0).replace("autonomy: L3", "autonomy: L2"),
            );
        },
    );
    let (status, answer) = fleet[0].post("/api/v1/alerts", &notification(&["h1"]));
    assert_eq!(status, 200);
    assert_eq!(answer["outcomes"][0]["result"], "started", "{answer}");
    let request = wait_for("the request", Duration::from_secs(10), || {
        approvals_of(&fleet[1])
            .into_iter()
            .find(|r| r["state"] == "pending")
    });
    let id = request["id"].as_str().unwrap().to_string();
    let digest = request["digest"].as_str().unwrap().to_string();
    let resolved = notification(&["h1"]).replace("\"firing\"", "\"resolved\"");
    let sent = Instant::now();
    let (status, answer) = fleet[1].post("/api/v1/alerts", &resolved);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["withdrawn"][0]["approval_id"],
        id.as_str(),
        "{answer}"
    );
    let v = wait_for("the waiting run's verdict", Duration::from_secs(10), || {
        fleet[0].verdicts().into_iter().next()
    });
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(v["outcome"], "denied", "{v:#}");
    let denied = fleet[0].e.audit_phase("denied");
    assert_eq!(
        denied[0]["detail"]["reason"], "alert_resolved",
        "{:#}",
        denied[0]
    );
    assert!(site.rotations("h1").is_empty(), "nothing ran");
    let (status, body) = decide(&fleet[0], &id, "approve", &digest);
    assert_eq!(status, 409, "{body}");
    let shown = approvals_of(&fleet[0])
        .into_iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap();
    assert_eq!(shown["state"], "withdrawn", "{shown:#}");
}

#[test]
fn a_storm_of_20000_alerts_over_200_hosts_across_three_replicas_never_overlaps_two_runs_of_a_host()
{
    let pg = Pg::start();
    let hosts: Vec<String> = (0..200).map(|i| format!("h{i:03}")).collect();
    let list = hosts.join(", ");
    // No cooldown: a host's next alert after its run ends starts another.
    let fleet = fleet(&pg, 3, LONG, "max_concurrent_runs: 8\n", &|e| {
        for h in &hosts {
            e.host(h, &local_host(h, "paths: [/tmp]"));
        }
        e.runbook(
            "look",
            &format!(
                "name: look\ndescription: t\nhosts: [{list}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"LogsFull\"']\n  host_label: instance\ntools: {{ observe: [list_processes] }}\nsteps:\n  - call: list_processes\n  - call: list_processes\n"
            ),
        );
    });
    let notifications = 200;
    let answered: usize = std::thread::scope(|s| {
        let senders: Vec<_> = fleet
            .iter()
            .enumerate()
            .map(|(w, r)| {
                let hosts = &hosts;
                s.spawn(move || {
                    let mut outcomes = 0;
                    for n in (w..notifications).step_by(3) {
                        let mine: Vec<&str> = (0..100)
                            .map(|i| hosts[(n * 100 + i) % 200].as_str())
                            .collect();
                        let body = notification(&mine)
                            .replace("fp-", &format!("fp-{n}-"))
                            .replace("{}:{alertname", &format!("{{}}:{{n={n},alertname"));
                        let (status, answer) = r.post("/api/v1/alerts", &body);
                        assert_eq!(status, 200, "{answer}");
                        outcomes += answer["outcomes"].as_array().unwrap().len();
                    }
                    outcomes
                })
            })
            .collect();
        senders.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert_eq!(answered, 20_000, "every alert has an outcome in its answer");
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_triggers"), "20000");
    let started: usize = pg
        .sql("SELECT count(*) FROM runwarden_triggers WHERE outcome = 'started'")
        .parse()
        .unwrap();
    assert!(started >= 200, "{started} runs");
    wait_verdicts(&fleet, started, Duration::from_secs(120));
    // From the three audit logs: each host's runs one after another.
    let mut runs: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
    let lines = all_lines(&fleet);
    let ts = |phase: &str, run: &str| {
        lines
            .iter()
            .find(|l| l["phase"] == phase && l["run_id"] == run)
            .map(|l| l["ts"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no {phase} line for run {run}"))
    };
    for start in lines.iter().filter(|l| l["phase"] == "start") {
        let run = start["run_id"].as_str().unwrap();
        runs.entry(start["host"].as_str().unwrap().to_string())
            .or_default()
            .push((ts("start", run), ts("verdict", run)));
    }
    assert_eq!(runs.values().map(Vec::len).sum::<usize>(), started);
    for (host, mut spans) in runs {
        spans.sort();
        for pair in spans.windows(2) {
            let (a_end, b_start): (jiff::Timestamp, jiff::Timestamp) =
                (pair[0].1.parse().unwrap(), pair[1].0.parse().unwrap());
            assert!(
                a_end <= b_start,
                "{host}: a run started at {b_start} before the last ended at {a_end}"
            );
        }
    }
}

/// Two Alertmanagers in a cluster (gossip on loopback), both routing to
/// every replica.
fn clustered_alertmanagers(dir: &std::path::Path, config: &str) -> Vec<(Proc, String)> {
    let gossip = [free_port(), free_port()];
    (0..2)
        .map(|i| {
            let own = dir.join(format!("am{i}"));
            std::fs::create_dir_all(&own).unwrap();
            std::fs::write(own.join("alertmanager.yml"), config).unwrap();
            let addr = format!("127.0.0.1:{}", free_port());
            let proc = Proc(
                Command::new("/usr/bin/prometheus-alertmanager")
                    .arg(format!(
                        "--config.file={}",
                        own.join("alertmanager.yml").display()
                    ))
                    .arg(format!("--storage.path={}", own.join("data").display()))
                    .arg(format!("--web.listen-address={addr}"))
                    .arg(format!("--cluster.listen-address=127.0.0.1:{}", gossip[i]))
                    .arg(format!(
                        "--cluster.advertise-address=127.0.0.1:{}",
                        gossip[i]
                    ))
                    .arg(format!("--cluster.peer=127.0.0.1:{}", gossip[1 - i]))
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("prometheus-alertmanager (Debian package)"),
            );
            wait_for("alertmanager", Duration::from_secs(20), || {
                http(&addr, "GET", "/-/ready", "").filter(|r| r.0 == 200)
            });
            (proc, addr)
        })
        .collect()
}

#[test]
fn two_clustered_alertmanagers_routing_to_three_replicas_start_one_run() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 3, LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook("rot", &rot_runbook(&site, "h1", 0));
    });
    let urls: String = fleet
        .iter()
        .map(|r| {
            format!(
                "      - url: http://{}/api/v1/alerts\n        send_resolved: false\n",
                r.addr
            )
        })
        .collect();
    let config = format!(
        "route:\n  receiver: runwarden\n  group_by: [alertname, instance]\n  group_wait: 1s\n  group_interval: 5s\n  repeat_interval: 1h\nreceivers:\n  - name: runwarden\n    webhook_configs:\n{urls}"
    );
    let work = tempfile::tempdir().unwrap();
    let ams = clustered_alertmanagers(work.path(), &config);
    // As Prometheus does: the alert goes to every Alertmanager.
    let alert =
        json!([{ "labels": { "alertname": "LogsFull", "instance": "h1:9100" } }]).to_string();
    for (_, addr) in &ams {
        let (status, body) = http(addr, "POST", "/api/v2/alerts", &alert).unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let received = wait_for(
        "every replica to hear of the alert",
        Duration::from_secs(30),
        || {
            let n: usize = pg
                .sql("SELECT count(*) FROM runwarden_triggers")
                .parse()
                .unwrap();
            (n >= 3).then_some(n)
        },
    );
    wait_verdicts(&fleet, 1, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        pg.sql("SELECT count(*) FROM runwarden_triggers WHERE outcome = 'started'"),
        "1",
        "one run for {received} notification(s) received"
    );
    assert_eq!(verdicts_of(&fleet).len(), 1);
    assert_eq!(site.rotations("h1").len(), 1);
}

/// A network namespace with a veth to this one: its side 10.238.1.2, ours
/// 10.238.1.1. Removed on drop.
struct Netns {
    name: String,
    veth: String,
    /// The third octet of its subnet, 10.238.N.0/24 (N.1 outside, N.2 inside).
    net: u8,
}

impl Netns {
    /// Namespace `net`: tests that run at once take different ones.
    fn new(net: u8) -> Netns {
        let n = Netns {
            name: format!("rw-ha-cut{net}"),
            veth: format!("rwhcut{net}"),
            net,
        };
        let (outside, inside) = (n.outside(), format!("10.238.{net}.2/24"));
        n.remove();
        let ip = |args: &[&str]| sh("/usr/sbin/ip", args);
        ip(&["netns", "add", &n.name]);
        ip(&[
            "link", "add", &n.veth, "type", "veth", "peer", "name", "eth0", "netns", &n.name,
        ]);
        ip(&["addr", "add", &format!("{outside}/24"), "dev", &n.veth]);
        ip(&["link", "set", &n.veth, "up"]);
        ip(&["-n", &n.name, "addr", "add", &inside, "dev", "eth0"]);
        ip(&["-n", &n.name, "link", "set", "eth0", "up"]);
        ip(&["-n", &n.name, "link", "set", "lo", "up"]);
        n
    }

    /// The address of the outside end (where PostgreSQL is reached).
    fn outside(&self) -> String {
        format!("10.238.{}.1", self.net)
    }

    fn link(&self, up: bool) {
        sh(
            "/usr/sbin/ip",
            &["link", "set", &self.veth, if up { "up" } else { "down" }],
        );
        if up {
            sh(
                "/usr/sbin/ip",
                &[
                    "addr",
                    "replace",
                    &format!("{}/24", self.outside()),
                    "dev",
                    &self.veth,
                ],
            );
        }
    }

    /// `curl` from inside: (status, body).
    fn http(&self, addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
        let out = Command::new("/usr/sbin/ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "/usr/bin/curl",
                "-s",
                "-m",
                "10",
                "-X",
                method,
            ])
            .args([
                "-H",
                "Content-Type: application/json",
                "-w",
                "\n%{http_code}",
            ])
            .args(["--data-binary", body, &format!("http://{addr}{path}")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn remove(&self) {
        let _ = Command::new("/usr/sbin/ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("/bin/kill").args(["-9", pid]).output();
                }
            });
        let _ = Command::new("/usr/sbin/ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("/usr/sbin/ip")
            .args(["link", "del", &self.veth])
            .output();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Two replicas, a in a network namespace whose link to PostgreSQL can be
/// cut, b outside; hosts h1 and h2 whose `ps` records, by the host's clock,
/// when each call ran; and replica a running `rot` (30 slow calls) on h1,
/// past its rotation.
struct CutOff {
    fleet: Vec<Replica>,
    ns: Netns,
    /// Replica a's address, inside the namespace.
    addr: String,
    site: Site,
    /// When each `ps` ran, by the host's clock.
    calls: std::path::PathBuf,
    _pg: Pg,
}

impl CutOff {
    fn start(net: u8) -> CutOff {
        let pg = Pg::start();
        let ns = Netns::new(net);
        pg.allow_network(&format!("10.238.{net}.0/24"));
        let site = Site::new();
        let calls = site.dir.path().join("ps-calls");
        let ps = site.dir.path().join("recording-ps");
        std::fs::write(
            &ps,
            format!(
                "#!/bin/sh\ndate +%s.%N >> {}\nsleep 0.3\nexec /bin/ps \"$@\"\n",
                calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&ps, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let setup = |e: &Estate| {
            for h in ["h1", "h2"] {
                e.host(
                    h,
                    &site.host(h, &format!("binaries: {{ ps: {} }}", ps.display())),
                );
            }
            e.runbook("rot", &rot_runbook(&site, "h1, h2", 30));
        };
        let mut fleet = fleet(&pg, 2, SHORT, "", &setup);
        // Replica a again, inside the namespace, reaching PostgreSQL over the veth.
        fleet[0].d = None;
        write_secret(
            &fleet[0].e.path().join("pg-url"),
            &pg.url_via(&ns.outside()),
        );
        let mut cmd = Command::new("/usr/sbin/ip");
        cmd.args([
            "netns",
            "exec",
            &ns.name,
            bin(),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(fleet[0].e.path());
        let (child, addr) = start_serve(cmd);
        fleet[0].d = Some(Proc(child));
        wait_for(
            "replica a to reach the database",
            Duration::from_secs(10),
            || (ns.http(&addr, "GET", "/healthz", "").0 == 200).then_some(()),
        );
        let (status, body) = ns.http(
            &addr,
            "POST",
            "/api/v1/runs",
            r#"{"runbook": "rot", "hosts": ["h1"]}"#,
        );
        assert_eq!(status, 202, "{body}");
        wait_for("the rotation", Duration::from_secs(10), || {
            (site.rotations("h1").len() == 1).then_some(())
        });
        CutOff {
            fleet,
            ns,
            addr,
            site,
            calls,
            _pg: pg,
        }
    }
}

/// No call on the hosts ran (by the host's own clock, `CutOff::calls`)
/// after the 3 s lease could have expired, counted from the `cut`.
fn no_call_after_the_lease(calls: &std::path::Path, cut: jiff::Timestamp) {
    let lease_end = cut.as_nanosecond() as f64 / 1e9 + 3.0;
    no_call_after(calls, lease_end, "the lease ended");
}

#[test]
fn a_stalled_disk_with_the_database_reachable_slows_calls_but_refuses_none() {
    let CutOff {
        fleet,
        site,
        ns: _ns,
        _pg,
        ..
    } = CutOff::start(3);
    let a = &fleet[0];
    // Each sync held for longer than the lease: the renewals, which need no
    // disk, keep proving it while the intent lines wait.
    let stall = StalledDisk::hold(
        a.pid().as_raw() as u32,
        Duration::from_secs(4),
        &site.dir.path().join("strace.log"),
    );
    std::thread::sleep(Duration::from_secs(9));
    stall.release();
    let v = wait_for("replica a's verdict", Duration::from_secs(30), || {
        a.verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "ok", "{v:#}");
    assert!(a.e.audit_phase("denied").is_empty());
    let results = a.e.audit_phase("result");
    assert_eq!(results.len(), 32, "every step ran");
    assert!(
        results.iter().all(|l| l["outcome"] != "error"),
        "{results:#?}"
    );
}

#[test]
fn a_call_whose_intent_line_outlasts_the_proof_of_its_lease_is_not_sent() {
    let CutOff {
        fleet,
        ns,
        site,
        calls,
        _pg,
        ..
    } = CutOff::start(2);
    let a = &fleet[0];
    // A disk that stalls: every fdatasync of replica a is held 5 s, longer
    // than its 3 s lease. Its calls now spend their time in the intent
    // line's sync, after the fence answered and before dispatch.
    let stall = StalledDisk::hold(
        a.pid().as_raw() as u32,
        Duration::from_secs(5),
        &site.dir.path().join("strace.log"),
    );
    // An intent line is written before its sync: the moment a new one is
    // in the log, a is held in that sync for 5 s (however loaded this
    // machine is), and the cut falls inside it.
    let before = a.e.audit_phase("intent").len();
    wait_for(
        "a new intent line, held in its sync",
        Duration::from_secs(30),
        || (a.e.audit_phase("intent").len() > before).then_some(()),
    );
    ns.link(false);
    let cut = jiff::Timestamp::now();
    let v = wait_for("replica a's verdict", Duration::from_secs(30), || {
        a.verdicts().into_iter().next()
    });
    stall.release();
    assert_eq!(v["outcome"], "interrupted", "{v:#}");
    // Though the run's last fence answered before the cut.
    no_call_after_the_lease(&calls, cut);
    // The intent line is closed by a result that says the call was not
    // sent, and the gate's refusal says why.
    let unsent: Vec<Value> =
        a.e.audit_phase("result")
            .into_iter()
            .filter(|l| {
                l["detail"]["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("not dispatched"))
            })
            .collect();
    assert_eq!(unsent.len(), 1, "{unsent:#?}");
    let denied = a.e.audit_phase("denied");
    assert_eq!(denied[0]["detail"]["reason"], "lease_lost", "{denied:#?}");
    assert_eq!(denied[0]["step"], unsent[0]["step"]);
    assert_eq!(site.rotations("h1").len(), 1);
}

#[test]
fn a_replica_cut_off_from_postgres_makes_no_call_past_its_lease_answers_503_and_recovers() {
    let CutOff {
        fleet,
        ns,
        addr,
        site,
        calls,
        _pg,
    } = CutOff::start(1);
    let a = &fleet[0];
    ns.link(false);
    let cut = jiff::Timestamp::now();
    // No call after the lease (3 s) could have expired, by the host's own clock.
    let v = wait_for("replica a's verdict", Duration::from_secs(15), || {
        a.verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "interrupted", "{v:#}");
    no_call_after_the_lease(&calls, cut);
    assert_eq!(
        a.e.audit_phase("denied")[0]["detail"]["reason"],
        "lease_lost"
    );
    // Its webhook says 503, so Alertmanager tries another replica...
    let (status, body) = ns.http(&addr, "POST", "/api/v1/alerts", &notification(&["h2"]));
    assert_eq!(status, 503, "{body}");
    // ...and that replica closes the cut-off run once its lease is over.
    let run_id = v["run_id"].as_str().unwrap();
    wait_for(
        "replica b to close the run",
        Duration::from_secs(10),
        || {
            fleet[1]
                .verdicts()
                .into_iter()
                .find(|l| l["run_id"] == run_id)
        },
    );
    // The link comes back: replica a recovers with no manual step.
    ns.link(true);
    wait_for("replica a to recover", Duration::from_secs(20), || {
        (ns.http(&addr, "GET", "/healthz", "").0 == 200).then_some(())
    });
    let (status, body) = ns.http(&addr, "POST", "/api/v1/alerts", &notification(&["h2"]));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"started\""), "{body}");
    wait_for("h2's rotation", Duration::from_secs(15), || {
        (site.rotations("h2").len() == 1).then_some(())
    });
    assert_eq!(
        site.rotations("h1").len(),
        1,
        "nothing of the cut-off run ran again"
    );
}

#[test]
fn a_notification_sent_again_after_its_run_ended_is_a_duplicate_on_any_replica_without_a_cooldown()
{
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 2, LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook(
            "rot",
            &rot_runbook(&site, "h1", 0).replace("cooldown: 1h\n", ""),
        );
    });
    let body = notification(&["h1"]);
    let (_, first) = fleet[0].post("/api/v1/alerts", &body);
    assert_eq!(first["outcomes"][0]["result"], "started", "{first}");
    wait_verdicts(&fleet, 1, Duration::from_secs(10));
    // Ended in the fleet's record too (its verdict line comes first).
    wait_for(
        "the run's end in the shared state",
        Duration::from_secs(10),
        || (pg.sql("SELECT status FROM runwarden_runs") == "ended").then_some(()),
    );
    // The HA pair's second copy, to the other replica, after the run ended.
    let (_, again) = fleet[1].post("/api/v1/alerts", &body);
    assert_eq!(again["outcomes"][0]["result"], "deduplicated", "{again}");
    // Another alert on the same host is no duplicate.
    let other = body
        .replace("fp-h1", "fp-h1-other")
        .replace("{}:{alertname", "{}:{other");
    let (_, other) = fleet[1].post("/api/v1/alerts", &other);
    assert_eq!(other["outcomes"][0]["result"], "started", "{other}");
    wait_verdicts(&fleet, 2, Duration::from_secs(10));
    assert_eq!(site.rotations("h1").len(), 2);
}

#[test]
fn a_replica_forgets_what_is_a_month_old_and_keeps_the_rest() {
    let pg = Pg::start();
    let mut r = Replica::prepare(&pg, "a", LONG, "", &|e| {
        e.host("h", &local_host("h", "paths: [/tmp]"));
    });
    assert!(r.e.run(&["db", "migrate"]).status.success());
    pg.sql(
        "INSERT INTO runwarden_triggers (received_at, replica, runbook, host, trigger, keys, outcome)
         VALUES (now() - interval '31 days', 'a', 'rb', 'h', 'alert', '{}', 'started'),
                (now() - interval '29 days', 'a', 'rb', 'h', 'alert', '{}', 'cooldown')",
    );
    pg.sql(
        "INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status, ended_at)
         VALUES ('old', 'rb', 'h', 'a', 1, 'ended', now() - interval '31 days'),
                ('running', 'rb', 'h', 'a', 2, 'running', NULL)",
    );
    r.start();
    wait_for("the month-old rows to go", Duration::from_secs(10), || {
        (pg.sql("SELECT count(*) FROM runwarden_triggers") == "1").then_some(())
    });
    assert_eq!(pg.sql("SELECT outcome FROM runwarden_triggers"), "cooldown");
    assert_eq!(
        pg.sql("SELECT run_id FROM runwarden_runs ORDER BY run_id"),
        "running"
    );
}

/// What a trigger comes to, and what holds for runs, is the same on this
/// machine's own state and on PostgreSQL: one body of checks, run against both.
fn the_same_behaviour(pg: Option<&Pg>) {
    let site = Site::new();
    let ps = site.slow_ps(0.2);
    let extra = "fleet_budget: { max_mutations: 2, per: 1h }\n";
    let setup = |e: &Estate| {
        for h in ["h1", "h2", "h3", "h4"] {
            e.host(
                h,
                &site.host(h, &format!("binaries: {{ ps: {} }}", ps.display())),
            );
        }
        e.runbook("rot", &rot_runbook(&site, "h1, h2, h3, h4", 0));
        let mut slow = "name: slow\ndescription: t\nhosts: [h4]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n".to_string();
        slow += &"  - call: list_processes\n".repeat(15);
        e.runbook("slow", &slow);
    };
    let mut r = match pg {
        Some(pg) => fleet(pg, 1, LONG, extra, &setup).remove(0),
        None => {
            let e = Estate::new();
            std::fs::write(
                e.path().join("runwarden.yaml"),
                format!("audit_head: none\n{extra}"),
            )
            .unwrap();
            setup(&e);
            let mut r = Replica {
                d: None,
                e,
                name: "embedded".into(),
                addr: String::new(),
            };
            r.start();
            r
        }
    };
    if pg.is_none() {
        // One machine's own state has no fleet to list.
        let (status, text) = http(&r.addr, "GET", "/api/v1/fleet/runs", "").unwrap();
        assert_eq!(status, 404, "{text}");
        assert!(text.contains("state.postgres"), "{text}");
    }
    let result = |r: &Replica, body: &str| {
        let (status, answer) = r.post("/api/v1/alerts", body);
        assert_eq!(status, 200, "{answer}");
        answer["outcomes"][0]["result"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // One notification, twice at once: one run.
    let h1 = notification(&["h1"]);
    assert_eq!(result(&r, &h1), "started");
    assert_eq!(result(&r, &h1), "deduplicated");
    wait_verdicts(std::slice::from_ref(&r), 1, Duration::from_secs(10));
    settled(&r);
    // After it ended: the same again is a duplicate; another alert waits out the cooldown.
    assert_eq!(result(&r, &h1), "deduplicated");
    let other = h1
        .replace("fp-h1", "fp-h1-b")
        .replace("{}:{alertname", "{}:{b,alertname");
    assert_eq!(result(&r, &other), "cooldown");
    // The fleet budget (2 an hour): h2's change runs, h3's is refused.
    assert_eq!(result(&r, &notification(&["h2"])), "started");
    wait_verdicts(std::slice::from_ref(&r), 2, Duration::from_secs(10));
    settled(&r);
    assert_eq!(result(&r, &notification(&["h3"])), "started");
    let v = wait_verdicts(std::slice::from_ref(&r), 3, Duration::from_secs(10));
    let h3 = v.iter().find(|l| l["host"] == "h3").unwrap();
    assert_eq!(h3["outcome"], "budget_exhausted", "{h3:#}");
    assert_eq!(
        (
            site.rotations("h1").len(),
            site.rotations("h2").len(),
            site.rotations("h3").len()
        ),
        (1, 1, 0)
    );
    // A person's run while the daemon's run of the same runbook and host goes on: 75.
    assert_eq!(r.start_runs("slow", &["h4"]), ["started"]);
    wait_for("the slow run's first call", Duration::from_secs(10), || {
        r.e.audit_phase("intent")
            .into_iter()
            .find(|l| l["host"] == "h4")
    });
    let out = r.e.run(&["run", "slow", "--host", "h4"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The kill switch refuses new triggers and stops the run in flight.
    let engage =
        r.e.run(&["kill-switch", "engage", "--reason", "same behaviour"]);
    assert!(
        engage.status.success(),
        "{}",
        String::from_utf8_lossy(&engage.stderr)
    );
    assert_eq!(result(&r, &notification(&["h2"])), "kill_switch");
    if let Some(pg) = pg {
        // Decided on the replica alone, recorded for the fleet all the same.
        assert_eq!(
            pg.sql("SELECT host, trigger, outcome, keys[1] FROM runwarden_triggers WHERE outcome = 'kill_switch'"),
            "h2|alert|kill_switch|fp:fp-h2"
        );
    }
    let v = wait_verdicts(std::slice::from_ref(&r), 4, Duration::from_secs(10));
    let slow = v.iter().find(|l| l["runbook"] == "slow").unwrap();
    assert_eq!(slow["outcome"], "halted", "{slow:#}");
    assert!(r.e.run(&["kill-switch", "release"]).status.success());
    // A restart forgets nothing: h1 is still in its cooldown.
    r.d = None;
    r.start();
    assert_eq!(result(&r, &other.replace("fp-h1-b", "fp-h1-c")), "cooldown");
}

#[test]
fn the_same_behaviour_on_this_machines_own_state() {
    the_same_behaviour(None);
}

#[test]
fn the_same_behaviour_on_postgres() {
    let pg = Pg::start();
    the_same_behaviour(Some(&pg));
}

#[test]
fn with_tls_required_a_replica_verifies_the_server_against_its_ca_file_and_never_falls_back() {
    let pg = Pg::start();
    let ca = pg.require_tls();
    let site = Site::new();
    let tls_url = format!("{}?sslmode=require", pg.url());
    let mut r = Replica::prepare(&pg, "a", LONG, "", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook("rot", &rot_runbook(&site, "h1", 0));
    });
    write_secret(&r.e.path().join("pg-url"), &tls_url);
    // The system's authorities do not know this server: no connection at all.
    let out = r.e.run(&["db", "migrate"]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.to_lowercase().contains("certificate"), "{said}");
    // Plain TCP is refused by the server, so nothing can go around TLS.
    write_secret(
        &r.e.path().join("pg-url"),
        &format!("{}?sslmode=disable", pg.url()),
    );
    let out = r.e.run(&["db", "migrate"]);
    assert_eq!(out.status.code(), Some(1));
    // Its own authority: TLS, verified.
    write_secret(&r.e.path().join("pg-url"), &tls_url);
    let yaml = std::fs::read_to_string(r.e.path().join("runwarden.yaml")).unwrap();
    let yaml = yaml.replace(
        "    lease:",
        &format!("    ca_file: {}\n    lease:", ca.display()),
    );
    std::fs::write(r.e.path().join("runwarden.yaml"), yaml).unwrap();
    let out = r.e.run(&["db", "migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    r.start();
    assert_eq!(r.start_runs("rot", &["h1"]), ["started"]);
    let v = wait_for("the verdict", Duration::from_secs(10), || {
        r.verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "ok", "{v:#}");
    let encrypted = pg.psql(
        "postgres",
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
         WHERE ssl AND application_name = 'runwarden a'",
    );
    assert_ne!(encrypted, "0", "the replica's connections are TLS");
}

#[test]
fn prometheus_sees_a_replica_lose_its_store_and_its_leases_on_the_dashboards_shared_state_panel() {
    use crate::observability::query;
    let pg = Pg::start();
    let site = Site::new();
    let ps = site.slow_ps(0.3);
    let fleet = fleet(&pg, 1, SHORT, "", &|e| {
        e.host(
            "h1",
            &site.host("h1", &format!("binaries: {{ ps: {} }}", ps.display())),
        );
        e.runbook("rot", &rot_runbook(&site, "h1", 30));
    });
    let work = tempfile::tempdir().unwrap();
    let (_prom, prom) = prometheus(
        work.path(),
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: runwarden\n    static_configs:\n      - targets: ['{}']\n",
            fleet[0].addr
        ),
    );
    let seen = |expr: &str| query(&prom, expr).filter(|r| !r.is_empty());
    wait_for("runwarden_store_up 1", Duration::from_secs(60), || {
        seen("runwarden_store_up{store=\"postgres\"} == 1")
    });
    assert_eq!(fleet[0].start_runs("rot", &["h1"]), ["started"]);
    wait_for("the rotation", Duration::from_secs(10), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    pg.stop();
    wait_for("runwarden_store_up 0", Duration::from_secs(30), || {
        seen("runwarden_store_up{store=\"postgres\"} == 0")
    });
    // The dashboard's panel, as Grafana would ask it.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("dashboards/runwarden.json")).unwrap(),
    )
    .unwrap();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"].as_str().unwrap().starts_with("Shared state"))
        .unwrap();
    for target in panel["targets"].as_array().unwrap() {
        let expr = target["expr"]
            .as_str()
            .unwrap()
            .replace("$__rate_interval", "1m")
            .replace("$job", "runwarden")
            .replace("$instance", ".*");
        wait_for(&format!("data for {expr}"), Duration::from_secs(30), || {
            // A gauge with data is enough for the store's state and the
            // queue (0 while nothing waits).
            seen(&format!("({expr}) > 0")).or_else(|| {
                seen(&expr)
                    .filter(|_| expr.contains("store_up") || expr.contains("fleet_queued_runs"))
            })
        });
    }
    pg.start_again();
    wait_for(
        "runwarden_store_up 1 again",
        Duration::from_secs(30),
        || seen("runwarden_store_up{store=\"postgres\"} == 1"),
    );
}

/// A rolling upgrade: the schema is migrated one version ahead of the
/// replicas first (an additive migration, as the next version's `db
/// migrate` brings), then each replica in turn is stopped as systemd stops
/// it (SIGTERM) and started again, while alerts keep arriving (each sent,
/// as Alertmanager does, to a replica that answers). Every replica works on
/// the newer schema, every alert answered 200 has exactly one recorded
/// outcome, every host's alert started one run, and no host ran twice. A
/// schema two versions ahead is refused, naming the version to upgrade to.
#[test]
fn replicas_keep_working_through_a_rolling_restart_on_a_schema_one_version_ahead() {
    let pg = Pg::start();
    let site = Site::new();
    let hosts: Vec<String> = (0..24).map(|i| format!("h{i:02}")).collect();
    let list = hosts.join(", ");
    let mut fleet = fleet(&pg, 3, SHORT, "", &|e| {
        for h in &hosts {
            e.host(h, &site.host(h, ""));
        }
        e.runbook("rot", &rot_runbook(&site, &list, 0));
    });
    // The next version's migration: additive, as every migration must be.
    let next = pg.sql("SELECT max(version) + 1 FROM runwarden_schema");
    pg.sql(&format!(
        "BEGIN; ALTER TABLE runwarden_runs ADD COLUMN upgrade_note text; INSERT INTO runwarden_schema (version) VALUES ({}); COMMIT;",
        next.trim()
    ));
    let status = fleet[0].e.run(&["db", "status"]);
    let said = String::from_utf8_lossy(&status.stdout).to_string();
    assert_eq!(status.status.code(), Some(0), "{said}");
    assert!(said.contains("one ahead of this runwarden's"), "{said}");

    let addrs: Vec<std::sync::Arc<std::sync::Mutex<String>>> = fleet
        .iter()
        .map(|r| std::sync::Arc::new(std::sync::Mutex::new(r.addr.clone())))
        .collect();
    let sender = {
        let addrs = addrs.clone();
        let hosts = hosts.clone();
        std::thread::spawn(move || {
            let mut answered = Vec::new();
            for (i, h) in hosts.iter().enumerate() {
                let body = notification(&[h]);
                // Alertmanager's way: another replica when one does not answer.
                let mut tries = 0;
                loop {
                    let addr = addrs[(i + tries) % addrs.len()].lock().unwrap().clone();
                    match http(&addr, "POST", "/api/v1/alerts", &body) {
                        Some((200, text)) => {
                            answered.push((h.clone(), text));
                            break;
                        }
                        _ => {
                            tries += 1;
                            assert!(tries < 200, "no replica took {h}'s alert");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(150));
            }
            answered
        })
    };
    for (i, r) in fleet.iter_mut().enumerate() {
        std::thread::sleep(Duration::from_millis(700));
        r.signal(nix::sys::signal::Signal::SIGTERM);
        let exited = r.d.as_mut().unwrap().0.wait().unwrap();
        assert!(exited.success(), "replica {} stopped: {exited:?}", r.name);
        r.d = None;
        r.start();
        *addrs[i].lock().unwrap() = r.addr.clone();
        assert_eq!(
            r.healthz(),
            200,
            "replica {} is back on the newer schema",
            r.name
        );
    }
    let answered = sender.join().unwrap();
    assert_eq!(answered.len(), hosts.len());
    // Every run ends: `ok`, or `interrupted` when its replica was stopped
    // under it (runs are not resumed; Alertmanager's repeat starts anew).
    // On a timeout, say which runs are still open and what the queue holds.
    let open = || {
        pg.sql(
            "SELECT run_id, host, status, coalesce(replica, '-') FROM runwarden_runs WHERE status NOT IN ('ended', 'not_started') ORDER BY host",
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !open().trim().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "runs not ended after 60 s:\n{}\nqueue:\n{}",
            open(),
            pg.sql("SELECT run_id, host, ready FROM runwarden_queue ORDER BY host")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let verdicts = pg.sql("SELECT host, verdict FROM runwarden_runs ORDER BY host");
    for h in &hosts {
        let rotated = site.rotations(h).len();
        assert!(rotated <= 1, "{h} rotated {rotated} times");
        if verdicts.contains(&format!("{h}|ok")) {
            assert_eq!(rotated, 1, "{h}: {verdicts}");
        }
    }
    // A run its replica's stop cut short ends halted (the stop reached it
    // between calls) or interrupted; none ends any other way.
    assert!(
        verdicts
            .lines()
            .all(|l| l.ends_with("|ok") || l.ends_with("|halted") || l.ends_with("|interrupted")),
        "{verdicts}"
    );
    let ok = verdicts.lines().filter(|l| l.ends_with("|ok")).count();
    assert!(ok >= hosts.len() / 2, "{verdicts}");
    // Each alert answered 200 has one row; one of them started its run.
    let rows = pg.sql(
        "SELECT keys[1], count(*), count(*) FILTER (WHERE outcome = 'started') FROM runwarden_triggers GROUP BY keys[1] ORDER BY keys[1]",
    );
    for h in &hosts {
        assert!(rows.contains(&format!("fp:fp-{h}|1|1")), "{h}: {rows}");
    }
    // Two versions ahead: refused, naming the version to upgrade to.
    pg.sql(&format!(
        "INSERT INTO runwarden_schema (version) VALUES ({})",
        next.trim().parse::<i32>().unwrap() + 1
    ));
    let status = fleet[0].e.run(&["db", "status"]);
    let said = String::from_utf8_lossy(&status.stderr).to_string();
    assert_eq!(status.status.code(), Some(1), "{said}");
    assert!(
        said.contains("upgrade runwarden on this machine to a version that knows schema"),
        "{said}"
    );
}

/// The admission table (`tests/fixtures/admission-cases.json`) against
/// PostgreSQL's `runwarden_admit`, as releases before 0.4 call it (they
/// decide in SQL, and still roll with this one), with the duplicate window
/// they pass: the same outcomes as the rules this release decides by, on
/// this machine (`state::local::tests::the_admission_table_on_this_machines_own_state`)
/// and across the fleet (`state::fleet::tests::the_admission_table_on_postgres_decided_in_rust`).
#[test]
fn the_admission_table_on_postgres() {
    let pg = Pg::start();
    let r = Replica::prepare(&pg, "a", LONG, "", &|e| {
        e.host("h", &local_host("h", "paths: [/tmp]"));
    });
    let migrate = r.e.run(&["db", "migrate"]);
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let cases: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/fixtures/admission-cases.json")).unwrap(),
    )
    .unwrap();
    assert!(cases.len() >= 10);
    let window = runwarden::rules::admission::DUPLICATE_WINDOW.as_millis();
    for (i, case) in cases.iter().enumerate() {
        let runbook = pg.seed_admission_case(i, case);
        let cooldown = match case["cooldown_s"].as_u64() {
            Some(s) => (s * 1000).to_string(),
            None => "NULL".into(),
        };
        let (count, per) = match case["cap"].as_object() {
            Some(c) => (
                c["count"].to_string(),
                (c["per_s"].as_u64().unwrap() * 1000).to_string(),
            ),
            None => ("NULL".into(), "NULL".into()),
        };
        let got = pg.sql(&format!(
            "SELECT outcome FROM runwarden_admit('{runbook}', 'h', {}, {cooldown}, 'run-{i}', 'table', 60000, 'alert', {window}, {count}, {per})",
            pg::text_array(&case["keys"])
        ));
        assert_eq!(
            got.trim(),
            case["expect"].as_str().unwrap(),
            "{}",
            case["case"]
        );
    }
    // Replicas of earlier versions call the eight- and nine-argument forms:
    // they still decide, by the same rule (a run in flight deduplicates).
    let old = |n: u32| {
        pg.sql(&format!(
            "SELECT outcome FROM runwarden_admit('previous', 'h', ARRAY['fp:p']::text[], NULL, 'old-{n}', 'old', 60000, 'alert')"
        ))
    };
    assert_eq!(old(1).trim(), "started");
    assert_eq!(old(2).trim(), "deduplicated");
    let nine = pg.sql(&format!(
        "SELECT outcome FROM runwarden_admit('previous', 'h', ARRAY['fp:q']::text[], NULL, 'nine', 'old', 60000, 'alert', {window})"
    ));
    assert_eq!(nine.trim(), "deduplicated");
}

//! Shared state on PostgreSQL under load, as root: `sudo cargo bench --bench ha`.
//!
//! 1. alert to first tool call, p50/p99, with the embedded store and with
//!    PostgreSQL (one replica), alerts one at a time;
//! 2. an alert storm (20,000 alerts in 200 notifications over 200 hosts)
//!    against one replica and against three (round-robin): accept p50/p99,
//!    throughput, and every alert's one outcome in `runwarden_triggers`;
//! 3. database round trips per call: transactions committed for a run of
//!    60 calls minus one of 10, over 50 (every statement outside a
//!    transaction block is one round trip and one commit), for tier-1
//!    calls and for tier-2 calls under a fleet budget (each reserved in
//!    the fence, decided in Rust);
//! 4. fan-out: one runbook on 500 hosts whose tool takes 20 ms, 4 run
//!    permits per replica, triggered by its schedule (firing on every
//!    replica at once) and by one `POST /api/v1/runs` with `all_hosts` to
//!    one replica: three replicas' time to the last verdict against one
//!    replica's, how many runs each replica ran, and whether any host ran
//!    twice. Rounds interleave one and three replicas.
//!
//! `RUNWARDEN_BENCH_PREVIOUS=PATH` (a previous release's binary) adds a
//! storm over three replicas in the middle of a roll: replica `a` that
//! release, `b` and `c` this build; its figures are the check that a
//! mixed fleet records every alert once and starts no host twice.
//! `RUNWARDEN_BENCH_ONLY=fanout` runs part 4 alone, `=roundtrips` part 3;
//! `RUNWARDEN_BENCH_ROUNDS` sets its rounds (default 3).
//! The database is a cluster of the bench's own (tests/support/pg.rs).
//! Figures only; nothing here asserts a time.

// A measurement harness: a failed setup step should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::*;

#[path = "../tests/support/pg.rs"]
mod pg;

const HOSTS: usize = 200;

/// `runwarden ARGS --config DIR`.
fn runwarden(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runwarden"));
    c.env("RUNWARDEN_LOG", "warn")
        .args(args)
        .arg("--config")
        .arg(dir);
    c
}

/// A config directory: `HOSTS` local hosts whose `ps` records when it
/// ran, a runbook of `calls` calls taken by the `Bench` alert, and
/// `state:` when `pg` is given.
fn estate(pg: Option<(&pg::Pg, &str)>, calls: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-ha-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = dir.path();
    let (marks, hosts) = marking_hosts(root, HOSTS);
    let mut yaml = "audit_head: none\nmax_concurrent_runs: 8\n".to_string();
    if let Some((pg, replica)) = pg {
        yaml += &shared_state(root, pg, replica);
    }
    write(root, "runwarden.yaml", &yaml);
    let steps = "  - call: list_processes\n".repeat(calls);
    write(
        root,
        "runbooks/bench.yaml",
        &format!(
            "name: bench\ndescription: b\nhosts: [{}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"Bench\"']\n  host_label: instance\ncooldown: 1h\ntools: {{ observe: [list_processes] }}\nbudget: {{ max_steps: 100 }}\nsteps:\n{steps}",
            hosts.join(", ")
        ),
    );
    (dir, marks)
}

/// `replica:` and `state:` of runwarden.yaml for replica `replica` of
/// `pg`, whose URL it writes to `root/pg-url` (mode 0600).
fn shared_state(root: &Path, pg: &pg::Pg, replica: &str) -> String {
    let url = root.join("pg-url");
    std::fs::write(&url, pg.url()).unwrap();
    std::fs::set_permissions(&url, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    format!("replica: {replica}\nstate:\n  postgres:\n    url_file: pg-url\n    lease: 15s\n")
}

fn alert(n: usize, i: usize) -> String {
    let host = (n * 100 + i) % HOSTS;
    format!(
        r#"{{"status":"firing","labels":{{"alertname":"Bench","instance":"h{host:03}:9100","n":"{n}-{i}"}},"annotations":{{}},"startsAt":"2026-12-01T00:00:00Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"{n:04x}{i:04x}"}}"#
    )
}

fn notification(n: usize, alerts: &[String]) -> String {
    format!(
        r#"{{"receiver":"rw","status":"firing","alerts":[{}],"groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"","version":"4","groupKey":"g-{n}","truncatedAlerts":0}}"#,
        alerts.join(",")
    )
}

/// 1. Alert to first call, one alert at a time, each on a host of its own.
fn first_call(dir: &Path, marks: &Path, alerts: usize) -> Vec<Duration> {
    let d = start_logging(dir, "warn");
    let seen = || {
        std::fs::read_to_string(marks)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let now = || jiff::Timestamp::now().as_nanosecond() as f64 / 1e9;
    let mut out = Vec::new();
    for i in 0..alerts {
        let sent = now();
        let resp = post(&d.addr, "/api/v1/alerts", &notification(i, &[alert(0, i)]));
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let t = Instant::now();
        while seen() < i + 1 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no call for alert {i}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let last: f64 = std::fs::read_to_string(marks)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .parse()
            .unwrap();
        out.push(Duration::from_secs_f64((last - sent).max(0.0)));
    }
    out.sort();
    out
}

/// 2. The storm over `addrs`, round-robin: accept latencies and wall time.
fn storm(addrs: &[String], notifications: usize) -> (Vec<Duration>, Duration) {
    let started = Instant::now();
    let mut latencies = std::thread::scope(|s| {
        let workers: Vec<_> = addrs
            .iter()
            .enumerate()
            .map(|(w, addr)| {
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for n in (w..notifications).step_by(addrs.len()) {
                        let alerts: Vec<String> = (0..100).map(|i| alert(n, i)).collect();
                        let t = Instant::now();
                        let resp = post(addr, "/api/v1/alerts", &notification(n, &alerts));
                        mine.push(t.elapsed());
                        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    let wall = started.elapsed();
    latencies.sort();
    (latencies, wall)
}

/// How many hosts the fan-out runs on, and how long its tool takes.
const FAN: usize = 500;
const TOOL: Duration = Duration::from_millis(20);

/// A config directory for fan-out replica `replica`: `FAN` hosts whose
/// `ps` takes `TOOL`, runbook `fan` on all of them, scheduled (6 fields, in
/// UTC) at `at`.
fn fan_estate(pg: &pg::Pg, replica: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-fan-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = dir.path();
    let (_, hosts) = marking_hosts_taking(root, FAN, TOOL);
    // A fleet that has run before: each host's run lock is there already
    // (made once, on a host's first run, and kept), so the rounds time the
    // runs, not ext4 allocating 500 inodes.
    for h in &hosts {
        write(root, &format!("state/locks/fan@{h}.lock"), "");
    }
    write(
        root,
        "runwarden.yaml",
        &format!(
            "audit_head: none\nmax_concurrent_runs: 4\n{}",
            shared_state(root, pg, replica)
        ),
    );
    write(root, "hosts.list", &hosts.join(", "));
    dir
}

/// Runbook `fan` on every host of the estate at `root`, scheduled (6
/// fields, in UTC) at `at`.
fn fan_runbook(root: &Path, at: jiff::Timestamp) {
    let hosts = std::fs::read_to_string(root.join("hosts.list")).unwrap();
    let t = at.to_zoned(jiff::tz::TimeZone::UTC);
    write(
        root,
        "runbooks/fan.yaml",
        &format!(
            "name: fan\ndescription: b\nhosts: [{hosts}]\nautonomy: L3\nschedule: \"{} {} {} * * *\"\ntools: {{ observe: [list_processes] }}\nsteps:\n  - call: list_processes\n",
            t.second(),
            t.minute(),
            t.hour()
        ),
    );
}

/// One fan-out: `replicas` daemons, triggered by the schedule (all of them)
/// or by one API request to the first. Time to the last verdict, runs per
/// replica, hosts that ran twice.
fn fan_out(pg: &pg::Pg, replicas: usize, by_schedule: bool) -> (Duration, Vec<i64>, i64) {
    pg.sql("TRUNCATE runwarden_triggers, runwarden_runs, runwarden_leases, runwarden_queue");
    let names = ["a", "b", "c"];
    let dirs: Vec<_> = (0..replicas).map(|r| fan_estate(pg, names[r])).collect();
    // Once the estates are made (rustc and 500 host files each take a
    // while), far enough ahead for every replica to be listening; a whole
    // second, as a schedule fires at the second's start.
    let fire = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 3).unwrap();
    let at = if by_schedule {
        fire
    } else {
        // Not today: only the API starts it.
        fire + jiff::SignedDuration::from_hours(12)
    };
    for d in &dirs {
        fan_runbook(d.path(), at);
    }
    let daemons: Vec<Daemon> = dirs
        .iter()
        .map(|d| start_logging(d.path(), "warn"))
        .collect();
    let started = if by_schedule {
        assert!(
            jiff::Timestamp::now() < fire,
            "the daemons were listening only after the schedule's time: a slower machine needs more than 3 s"
        );
        let wait = fire.duration_since(jiff::Timestamp::now());
        std::thread::sleep(Duration::try_from(wait).unwrap_or_default());
        fire
    } else {
        let t = jiff::Timestamp::now();
        let resp = post(
            &daemons[0].addr,
            "/api/v1/runs",
            r#"{"runbook":"fan","all_hosts":true}"#,
        );
        assert!(resp.starts_with("HTTP/1.1 202"), "{resp}");
        t
    };
    // Looked at seldom, so the looking costs the daemons nothing: the
    // time is the last verdict's, as the database recorded it.
    let waited = Instant::now();
    let last: f64 = loop {
        let row = pg.sql(
            "SELECT count(*), extract(epoch FROM max(ended_at)) FROM runwarden_runs WHERE status = 'ended'",
        );
        let (ended, last) = row.split_once('|').unwrap();
        if ended.parse::<usize>().unwrap() >= FAN {
            break last.parse().unwrap();
        }
        assert!(
            waited.elapsed() < Duration::from_secs(300),
            "{ended} of {FAN} ended"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let took = Duration::from_secs_f64(last - started.as_nanosecond() as f64 / 1e9);
    let per: Vec<i64> = names[..replicas]
        .iter()
        .map(|r| {
            pg.sql(&format!(
                "SELECT count(*) FROM runwarden_runs WHERE replica = '{r}'"
            ))
            .parse()
            .unwrap()
        })
        .collect();
    let twice: i64 = pg
        .sql("SELECT count(*) FROM (SELECT host FROM runwarden_runs GROUP BY host HAVING count(*) > 1) t")
        .parse()
        .unwrap();
    drop(daemons);
    (took, per, twice)
}

/// 4. Fan-out, one replica against three, rounds interleaved.
fn fan_outs(pg: &pg::Pg) {
    let rounds: usize = std::env::var("RUNWARDEN_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    println!(
        "fan-out to {FAN} hosts, a {} ms tool, 4 run permits per replica, {rounds} round(s):",
        TOOL.as_millis()
    );
    for (by_schedule, what) in [
        (true, "schedule on every replica"),
        (false, "one API request to one replica"),
    ] {
        let mut ratios = Vec::new();
        for round in 0..rounds {
            let (one, _, twice_one) = fan_out(pg, 1, by_schedule);
            let (three, per, twice) = fan_out(pg, 3, by_schedule);
            let busiest = *per.iter().max().unwrap() as f64 / FAN as f64;
            let ratio = three.as_secs_f64() / one.as_secs_f64();
            ratios.push(ratio);
            println!(
                "  {what}, round {}: one replica {:.2} s, three {:.2} s = {ratio:.2} of one; runs per replica {per:?} (busiest {:.0} %); hosts run twice: {}",
                round + 1,
                one.as_secs_f64(),
                three.as_secs_f64(),
                busiest * 100.0,
                twice + twice_one
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "  {what}: three replicas take {:.2} of one replica's time (median of {rounds})",
            ratios[ratios.len() / 2]
        );
    }
}

fn main() {
    let pg = pg::Pg::start();
    let migrated = {
        let (dir, _) = estate(Some((&pg, "a")), 1);
        runwarden(dir.path(), &["db", "migrate"]).output().unwrap()
    };
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    match std::env::var("RUNWARDEN_BENCH_ONLY").as_deref() {
        Ok("fanout") => return fan_outs(&pg),
        Ok("roundtrips") => return round_trips(&pg),
        _ => {}
    }

    // 1. Alert to first call.
    let (embedded, marks) = estate(None, 1);
    let local = first_call(embedded.path(), &marks, HOSTS);
    let (shared, marks) = estate(Some((&pg, "a")), 1);
    let postgres = first_call(shared.path(), &marks, HOSTS);
    println!("alert to first tool call, {HOSTS} alerts one at a time:");
    for (name, l) in [("embedded store", &local), ("PostgreSQL", &postgres)] {
        println!(
            "  {name:<15} p50 / p99 : {:>6.2} / {:.2} ms",
            ms(percentile(l, 0.5)),
            ms(percentile(l, 0.99))
        );
    }
    println!(
        "  PostgreSQL / embedded  p50 {:.2}x, p99 {:.2}x",
        ms(percentile(&postgres, 0.5)) / ms(percentile(&local, 0.5)),
        ms(percentile(&postgres, 0.99)) / ms(percentile(&local, 0.99))
    );

    // 2. The storm, against one replica and against three (and, given a
    // previous release, three of which `a` is that release).
    let notifications = 200;
    let previous = std::env::var_os("RUNWARDEN_BENCH_PREVIOUS").map(PathBuf::from);
    let mut rounds = vec![(1, None), (3, None)];
    if let Some(bin) = &previous {
        rounds.push((3, Some(bin.as_path())));
    }
    for (replicas, previous) in rounds {
        pg.sql("TRUNCATE runwarden_triggers, runwarden_runs, runwarden_leases");
        let dirs: Vec<_> = (0..replicas)
            .map(|r| estate(Some((&pg, ["a", "b", "c"][r])), 1).0)
            .collect();
        let daemons: Vec<Daemon> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| match previous {
                Some(bin) if i == 0 => start_binary(bin, d.path(), "warn"),
                _ => start_logging(d.path(), "warn"),
            })
            .collect();
        let addrs: Vec<String> = daemons.iter().map(|d| d.addr.clone()).collect();
        let (lat, wall) = storm(&addrs, notifications);
        let alerts = notifications * 100;
        let counted = pg.sql("SELECT count(*) FROM runwarden_triggers");
        let started = pg.sql("SELECT count(*) FROM runwarden_triggers WHERE outcome = 'started'");
        let twice = pg.sql(
            "SELECT count(*) FROM (SELECT host FROM runwarden_triggers WHERE outcome = 'started' GROUP BY host HAVING count(*) > 1) t",
        );
        let mixed = match previous {
            Some(bin) => format!(" (a: {})", bin.display()),
            None => String::new(),
        };
        println!(
            "storm, {alerts} alerts in {notifications} notifications over {HOSTS} hosts, {replicas} replica(s){mixed}:"
        );
        println!(
            "  accept p50 / p99 : {:.2} / {:.2} ms; {:.0} alerts/s",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            alerts as f64 / wall.as_secs_f64()
        );
        println!(
            "  recorded {counted} of {alerts}; {started} started; hosts started twice: {twice}"
        );
        drop(daemons);
    }

    round_trips(&pg);

    // 4. Fan-out.
    fan_outs(&pg);
}

/// Part 3, round trips per call, from the database's own commit count: a
/// person's run of 60 calls against one of 10, tier 1 (`list_processes`)
/// and tier 2 under a fleet budget (`rotate_logs` of a log of its own).
fn round_trips(pg: &pg::Pg) {
    let commits = |dir: &Path| -> (i64, String) {
        let count = || -> i64 {
            pg.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'runwarden'")
                .parse()
                .unwrap()
        };
        pg.sql("TRUNCATE runwarden_leases, runwarden_runs, runwarden_fleet_calls");
        // The statistics collector reports at most every 500 ms.
        std::thread::sleep(Duration::from_millis(1200));
        let before = count();
        let out = runwarden(dir, &["run", "bench", "--host", "h000"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("verdict: ok"),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(1200));
        let counted = pg.sql("SELECT count(*) FROM runwarden_fleet_calls");
        (count() - before, counted)
    };
    for (kind, make) in [
        (
            "tier-1 call",
            (|pg, calls| estate(Some((pg, "cli")), calls).0)
                as fn(&pg::Pg, usize) -> tempfile::TempDir,
        ),
        ("tier-2 call under a fleet budget", changing),
    ] {
        let (short, long) = (make(pg, 10), make(pg, 60));
        let ((short, _), (long, counted)) = (commits(short.path()), commits(long.path()));
        println!(
            "database round trips per {kind}: {:.2} ((run of 60 calls: {long} commits) - (run of 10: {short})) / 50; calls the fleet budget counted in the run of 60: {counted}",
            (long - short) as f64 / 50.0
        );
    }
}

/// A config directory with shared state and a fleet budget, one host
/// `h000` with a log of its own, and runbook `bench` of `calls` tier-2
/// calls rotating that log.
fn changing(pg: &pg::Pg, calls: usize) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-ha-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = dir.path();
    write(
        root,
        "runwarden.yaml",
        &format!(
            "audit_head: none\nfleet_budget: {{ max_mutations: 1000, per: 1h }}\n{}",
            shared_state(root, pg, "cli")
        ),
    );
    write(root, "kill-switch/README", "");
    let log = root.join("out/app.log");
    write(root, "out/app.log", "line\n");
    let conf = root.join("out/app.conf");
    write(
        root,
        "out/app.conf",
        &format!(
            "{} {{\n  rotate 1000\n  ifempty\n  missingok\n  create\n}}\n",
            log.display()
        ),
    );
    write(
        root,
        "hosts/h000.yaml",
        &format!(
            "name: h000\nconnection: local\npaths: [/var/tmp]\nlogrotate_configs: [{}]\nlogrotate_state: {}\n",
            conf.display(),
            root.join("out/logrotate.state").display()
        ),
    );
    let steps = format!(
        "  - call: rotate_logs\n    args: {{ config: \"{}\" }}\n    reason: bench\n",
        conf.display()
    )
    .repeat(calls);
    write(
        root,
        "runbooks/bench.yaml",
        &format!(
            "name: bench\ndescription: b\nhosts: [h000]\nautonomy: L3\ntools: {{ approve: [rotate_logs] }}\nbudget: {{ max_steps: 100, max_mutations: 100 }}\nsteps:\n{steps}"
        ),
    );
    dir
}

//! The fleet's queue: admitted work the receiving replica cannot start now
//! waits in PostgreSQL for whichever replica has a free run permit, so work
//! spreads whichever replica received the trigger; a queued run outlives
//! the replica that admitted it, and none runs twice.

use super::*;

/// `n` hosts `h1`... whose `ps` takes `seconds`, and the runbook `rot` on
/// all of them with one slow look after its rotation.
fn slow_hosts(site: &Site, n: usize, seconds: f64) -> (Vec<String>, impl Fn(&Estate) + '_) {
    let hosts: Vec<String> = (1..=n).map(|i| format!("h{i}")).collect();
    let ps = site.slow_ps(seconds);
    let list = hosts.clone();
    let setup = move |e: &Estate| {
        for h in &list {
            e.host(
                h,
                &site.host(h, &format!("binaries: {{ ps: {} }}", ps.display())),
            );
        }
        e.runbook("rot", &rot_runbook(site, &list.join(", "), 1));
    };
    (hosts, setup)
}

/// The `queued` lines of `r`'s log that handed a run to the fleet, and
/// those that took one from it (with the replica that admitted it).
fn handed_and_taken(r: &Replica) -> (usize, Vec<String>) {
    let queued = r.e.audit_phase("queued");
    let handed = queued
        .iter()
        .filter(|l| l["detail"]["queue"] == "fleet")
        .count();
    let taken = queued
        .iter()
        .filter_map(|l| l["detail"]["taken_from"].as_str().map(String::from))
        .collect();
    (handed, taken)
}

/// Replica `a` alone receives an API request for nine hosts, then `c` alone
/// an alert for six more; each replica may run one run at a time. Every
/// replica runs some of them, each host exactly once (its own record of
/// rotations says so), and the logs say where each run went.
#[test]
fn work_one_replica_receives_spreads_over_three_and_no_host_runs_twice() {
    let pg = Pg::start();
    let site = Site::new();
    let (hosts, setup) = slow_hosts(&site, 15, 0.4);
    let fleet = fleet(&pg, 3, LONG, "max_concurrent_runs: 1\n", &setup);
    let api: Vec<&str> = hosts[..9].iter().map(String::as_str).collect();
    let results = fleet[0].start_runs("rot", &api);
    assert!(results.iter().all(|r| r == "started"), "{results:?}");
    let alerted: Vec<&str> = hosts[9..].iter().map(String::as_str).collect();
    let (status, answer) = fleet[2].post("/api/v1/alerts", &notification(&alerted));
    assert_eq!(status, 200, "{answer}");
    let verdicts = wait_verdicts(&fleet, 15, Duration::from_secs(90));
    assert!(
        verdicts.iter().all(|v| v["outcome"] == "ok"),
        "{verdicts:#?}"
    );
    for h in &hosts {
        assert_eq!(site.rotations(h).len(), 1, "{h} ran once");
    }
    // One run per host in the fleet's record, spread over the three.
    assert_eq!(
        pg.sql("SELECT count(DISTINCT host), count(*) FROM runwarden_runs WHERE status = 'ended'"),
        "15|15"
    );
    let per: Vec<usize> = fleet.iter().map(|r| r.verdicts().len()).collect();
    assert_eq!(per.iter().sum::<usize>(), 15, "{per:?}");
    assert!(
        per.iter().all(|&n| n >= 1) && per.iter().all(|&n| n <= 11),
        "every replica ran some of the work: {per:?}"
    );
    // The receivers handed what they could not start (they had one permit
    // at most), and each taker says whose work it took.
    let (handed_a, _) = handed_and_taken(&fleet[0]);
    let (handed_c, _) = handed_and_taken(&fleet[2]);
    assert!((8..=9).contains(&handed_a), "a handed {handed_a}");
    assert!((5..=6).contains(&handed_c), "c handed {handed_c}");
    let taken: Vec<String> = fleet.iter().flat_map(|r| handed_and_taken(r).1).collect();
    assert_eq!(taken.len(), handed_a + handed_c, "{taken:?}");
    assert_eq!(taken.iter().filter(|t| *t == "a").count(), handed_a);
    // The receiver's history says where a handed run went; every chain holds.
    let runs = fleet[0].e.run(&["runs"]);
    let said = String::from_utf8_lossy(&runs.stdout);
    assert!(runs.status.success(), "{said}");
    assert!(said.contains("handed"), "{said}");
    for r in &fleet {
        let verify = r.e.run(&["audit", "verify"]);
        assert!(
            verify.status.success(),
            "{}",
            String::from_utf8_lossy(&verify.stderr)
        );
    }
}

/// Replica `a` admits six runs, starts the one it has a permit for, queues
/// five, and is killed. The others take what is still queued (all five,
/// or four if `a` took one as its first run ended); `a`'s run in flight is
/// closed `interrupted` once its lease lapses; no host runs twice.
#[test]
fn a_replica_killed_with_work_queued_leaves_it_to_the_others_and_nothing_runs_twice() {
    let pg = Pg::start();
    let site = Site::new();
    let (hosts, setup) = slow_hosts(&site, 6, 1.0);
    let fleet_ = fleet(&pg, 3, SHORT, "max_concurrent_runs: 1\n", &setup);
    let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
    // Only `a` has free permits while it admits: `b` and `c` are stopped
    // until it is gone, so none of the work can have moved before.
    fleet_[1].signal(nix::sys::signal::Signal::SIGSTOP);
    fleet_[2].signal(nix::sys::signal::Signal::SIGSTOP);
    let results = fleet_[0].start_runs("rot", &names);
    assert!(results.iter().all(|r| r == "started"), "{results:?}");
    assert_eq!(
        pg.sql("SELECT count(*) FROM runwarden_queue WHERE ready"),
        "5"
    );
    fleet_[0].signal(nix::sys::signal::Signal::SIGKILL);
    fleet_[1].signal(nix::sys::signal::Signal::SIGCONT);
    fleet_[2].signal(nix::sys::signal::Signal::SIGCONT);
    let done = wait_for("every run closed", Duration::from_secs(60), || {
        let open =
            pg.sql("SELECT count(*) FROM runwarden_runs WHERE status IN ('queued', 'running')");
        let all = pg.sql("SELECT count(*) FROM runwarden_runs");
        (open == "0" && all == "6").then(|| {
            pg.sql("SELECT host, status, replica, coalesce(closed_by, '-') FROM runwarden_runs ORDER BY host")
        })
    });
    let rows: Vec<Vec<&str>> = done.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), 6, "{done}");
    let hosts_seen: std::collections::HashSet<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(hosts_seen.len(), 6, "one run per host: {done}");
    let interrupted: Vec<&Vec<&str>> = rows.iter().filter(|r| r[1] == "interrupted").collect();
    assert!(interrupted.len() <= 1, "only a's own run: {done}");
    for r in &interrupted {
        assert_eq!(r[2], "a", "{done}");
        assert!(r[3] == "b" || r[3] == "c", "closed by another: {done}");
    }
    for r in rows.iter().filter(|r| r[1] != "interrupted") {
        assert_eq!(r[1], "ended", "{done}");
    }
    // What was still queued when `a` died was run by the others.
    let by_others = rows.iter().filter(|r| r[2] == "b" || r[2] == "c").count();
    assert!(by_others >= 4, "the queued runs went to b and c: {done}");
    for h in &hosts {
        assert!(site.rotations(h).len() <= 1, "{h} rotated at most once");
    }
    let ran = hosts
        .iter()
        .filter(|h| site.rotations(h).len() == 1)
        .count();
    assert!(ran >= 5, "the queued five ran: {ran}");
}

/// A run queued by a replica that never said its trigger was on disk (it
/// stopped in between, as one of the previous version would) is taken by
/// nobody; after a lease the fleet removes it, and its host is free. The
/// sender of that trigger heard no 2xx and retries, perhaps to another
/// replica: the retry must not be told "deduplicated" by the run it
/// retries, or the alert is lost until its next repeat.
#[test]
fn a_queued_run_never_handed_over_is_taken_by_nobody_and_frees_its_host_after_a_lease() {
    let pg = Pg::start();
    let site = Site::new();
    let (_, setup) = slow_hosts(&site, 1, 0.0);
    let fleet = fleet(&pg, 2, SHORT, "", &setup);
    let request =
        r#"{"trigger":"alert","keys":["fp:ghost"],"alert":null,"dry_run":false,"planner":"auto"}"#;
    // The previous version's form, which confirms nothing itself.
    let admitted = pg.sql(&format!(
        "SELECT outcome, queued FROM runwarden_admit_all(ARRAY['rot'], ARRAY['h1'], ARRAY['[\"fp:ghost\"]'], ARRAY[NULL::bigint], ARRAY['ghost-run'], 'ghost', 3000, ARRAY['alert'], 60000, ARRAY[NULL::integer], ARRAY[NULL::bigint], ARRAY['{request}'], 0)"
    ));
    assert_eq!(admitted, "started|t");
    // Every replica counts it among the runs waiting for the fleet.
    wait_for("the queue's gauge", Duration::from_secs(3), || {
        let (_, text) = http(&fleet[1].addr, "GET", "/metrics", "")?;
        text.lines()
            .any(|l| l == "runwarden_fleet_queued_runs{store=\"postgres\"} 1")
            .then_some(())
    });
    // While it waits, it holds the host, and the retry is told to retry.
    let (status, answer) = fleet[0].post("/api/v1/alerts", &notification(&["h1"]));
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["outcomes"][0]["result"], "pending", "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("retry"),
        "{answer}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_queue"), "1");
    assert!(site.rotations("h1").is_empty(), "nobody took it");
    let removed = wait_for("the stale run removed", Duration::from_secs(10), || {
        let row = pg.sql("SELECT status FROM runwarden_runs WHERE run_id = 'ghost-run'");
        (row == "not_started").then_some(row)
    });
    assert_eq!(removed, "not_started");
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_queue"), "0");
    // Too late to hand it over now.
    assert_eq!(pg.sql("SELECT runwarden_ready(ARRAY['ghost-run'])"), "0");
    // The host is free, with no cooldown from a run that never ran: the
    // sender's next retry starts the run.
    let (status, answer) = fleet[1].post("/api/v1/alerts", &notification(&["h1"]));
    assert_eq!(status, 200);
    assert_eq!(answer["outcomes"][0]["result"], "started", "{answer}");
    wait_for("the rotation", Duration::from_secs(20), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    // The fleet's record: the pending answer once, then the start.
    assert_eq!(
        pg.sql("SELECT string_agg(outcome, ',' ORDER BY id) FROM runwarden_triggers WHERE host = 'h1' AND replica <> 'ghost'"),
        "pending,started"
    );
}

/// The same with a run a replica claimed for itself (it had a free run
/// permit) and then stopped before its disk held the trigger: the retry is
/// answered 503 until that claim's lease runs out, then starts the run. A
/// run whose replica did confirm it is a plain duplicate, and a trigger
/// that meets a run confirmed while it asks again is one too (200).
#[test]
fn a_run_claimed_by_a_replica_that_stopped_before_recording_it_does_not_swallow_the_retry() {
    let pg = Pg::start();
    let site = Site::new();
    let (_, setup) = slow_hosts(&site, 4, 0.0);
    // One run an hour: the claim that never ran must not use it up.
    let fleet = fleet(&pg, 2, SHORT, "", &|e| {
        setup(e);
        let path = e.path().join("runbooks/rot.yaml");
        let rb = std::fs::read_to_string(&path).unwrap();
        std::fs::write(path, format!("{rb}max_runs: {{ count: 1, per: 1h }}\n")).unwrap();
    });
    // As this version admits: claimed here (one permit), to be confirmed.
    let claim = |host: &str, run: &str| {
        pg.sql(&format!(
            "SELECT outcome, queued FROM runwarden_admit_all(ARRAY['rot'], ARRAY['{host}'], ARRAY['[\"fp:{host}\"]'], ARRAY[NULL::bigint], ARRAY['{run}'], 'ghost', 3000, ARRAY['alert'], 60000, ARRAY[NULL::integer], ARRAY[NULL::bigint], ARRAY['{{}}'], 1, NULL, true)"
        ))
    };
    assert_eq!(claim("h1", "lost-run"), "started|f");
    assert_eq!(claim("h2", "kept-run"), "started|f");
    assert_eq!(
        pg.sql("SELECT runwarden_recorded(ARRAY['kept-run'], ARRAY[]::text[])"),
        "0"
    );
    // Unconfirmed, but it proved its lease for a call: it counts as a run
    // that ran, however its replica ends.
    assert_eq!(claim("h4", "fenced-run"), "started|f");
    assert_eq!(
        pg.sql("SELECT verdict FROM runwarden_fence('rot', 'h4', 'fenced-run', 1, 3000, 'ghost', false, ARRAY[]::text[], ARRAY[]::bigint[], ARRAY[]::bigint[], 0)"),
        "ok"
    );
    let asked = std::time::Instant::now();
    let (status, answer) = fleet[0].post("/api/v1/alerts", &notification(&["h1", "h2"]));
    assert_eq!(status, 503, "{answer}");
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "asked again for a second first: {:?}",
        asked.elapsed()
    );
    let results: Vec<&str> = (0..2)
        .map(|i| answer["outcomes"][i]["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["pending", "deduplicated"], "{answer}");
    assert!(site.rotations("h1").is_empty());
    // A run confirmed while the trigger asks again: a duplicate, answered 200.
    assert_eq!(claim("h3", "late-run"), "started|f");
    let (status, answer) = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            pg.sql("SELECT runwarden_recorded(ARRAY['late-run'], ARRAY[]::text[])")
        });
        fleet[1].post("/api/v1/alerts", &notification(&["h3"]))
    });
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcomes"][0]["result"], "deduplicated", "{answer}");
    // The lost claim's lease runs out (3 s, never renewed): the retry starts.
    let started = wait_for("the retry to start", Duration::from_secs(10), || {
        let (status, answer) = fleet[1].post("/api/v1/alerts", &notification(&["h1"]));
        (status == 200).then_some(answer)
    });
    assert_eq!(started["outcomes"][0]["result"], "started", "{started}");
    let closed = wait_for("the claims closed", Duration::from_secs(10), || {
        let rows = pg.sql(
            "SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id) FROM runwarden_runs WHERE run_id IN ('lost-run', 'fenced-run')",
        );
        (!rows.contains("running")).then_some(rows)
    });
    assert_eq!(closed, "fenced-run:interrupted,lost-run:not_started");
    wait_for("the rotation", Duration::from_secs(20), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
}

/// The same through a real Alertmanager: the replica that claimed the
/// host stopped before recording its run (its admission is made here as it
/// makes it), so the notification Alertmanager sends is answered 503
/// `pending`; Alertmanager retries on its own, and once the claim's lease
/// runs out a retry starts the run. The alert is not lost.
#[test]
fn alertmanager_retries_a_pending_alert_until_the_stopped_replicas_claim_runs_out() {
    let pg = Pg::start();
    let site = Site::new();
    let (_, setup) = slow_hosts(&site, 1, 0.0);
    let fleet = fleet(&pg, 2, SHORT, "", &setup);
    let config = format!(
        "route:\n  receiver: runwarden\n  group_by: [alertname, instance]\n  group_wait: 1s\n  group_interval: 30s\n  repeat_interval: 1h\nreceivers:\n  - name: runwarden\n    webhook_configs:\n      - url: http://{}/api/v1/alerts\n        send_resolved: false\n",
        fleet[0].addr
    );
    let work = tempfile::tempdir().unwrap();
    let am = alertmanager(work.path(), &config);
    // A 6 s lease, from now: Alertmanager is up.
    let claimed = pg.sql(
        "SELECT outcome, queued FROM runwarden_admit_all(ARRAY['rot'], ARRAY['h1'], ARRAY['[\"fp:x\"]'], ARRAY[NULL::bigint], ARRAY['lost-run'], 'stopped', 6000, ARRAY['alert'], 60000, ARRAY[NULL::integer], ARRAY[NULL::bigint], ARRAY['{}'], 1, NULL, true)",
    );
    assert_eq!(claimed, "started|f");
    let alert =
        json!([{ "labels": { "alertname": "LogsFull", "instance": "h1:9100" } }]).to_string();
    let (status, body) = http(&am.1, "POST", "/api/v2/alerts", &alert).unwrap();
    assert_eq!(status, 200, "{body}");
    // Well inside the 30 s group interval: Alertmanager's own retries.
    wait_for("the rotation", Duration::from_secs(25), || {
        (site.rotations("h1").len() == 1).then_some(())
    });
    let record = pg.sql(
        "SELECT string_agg(outcome, ',' ORDER BY id) FROM runwarden_triggers WHERE replica = 'a'",
    );
    let (last, before) = record
        .rsplit_once(',')
        .map(|(b, l)| (l, b))
        .unwrap_or(("", ""));
    assert!(
        last == "started" && !before.is_empty() && before.split(',').all(|o| o == "pending"),
        "answered pending until the claim ran out, then started: {record}"
    );
    // The claim that never ran is closed as such (by the next reaping), and
    // no cooldown counted from it held the retry back.
    let closed = wait_for("the lost claim closed", Duration::from_secs(5), || {
        let row = pg.sql(
            "SELECT status, coalesce(verdict, '-') FROM runwarden_runs WHERE run_id = 'lost-run'",
        );
        (row != "running|-").then_some(row)
    });
    assert_eq!(closed, "not_started|-");
    let (_, metrics) = http(&am.1, "GET", "/metrics", "").unwrap();
    let failed: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("alertmanager_notification_requests_failed_total")
                && l.contains("webhook")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(failed >= 1.0, "Alertmanager saw the 503: {failed}");
    assert_eq!(site.rotations("h1").len(), 1);
}

/// A schedule fires on all three replicas at the same second. The first
/// replica to admit the fire decides its six hosts; the others see it
/// taken and decide nothing (no second row per host in the fleet's record
/// of triggers); the work spreads over the three through the queue, and
/// each host runs once.
#[test]
fn a_schedule_firing_on_three_replicas_is_decided_once_and_each_host_runs_once() {
    let pg = Pg::start();
    let site = Site::new();
    let (hosts, setup) = slow_hosts(&site, 6, 0.4);
    // A second of the day a few seconds from now: the fire comes once.
    let at = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(6))
        .to_zoned(jiff::tz::TimeZone::UTC);
    let schedule = format!(
        "schedule: \"{} {} {} * * *\"\n",
        at.second(),
        at.minute(),
        at.hour()
    );
    let fleet = fleet(
        &pg,
        3,
        LONG,
        "max_concurrent_runs: 1\ntimezone: UTC\n",
        &|e| {
            setup(e);
            let rb = std::fs::read_to_string(e.path().join("runbooks/rot.yaml")).unwrap();
            e.runbook("rot", &rb.replace("cooldown: 1h\n", &schedule));
        },
    );
    let verdicts = wait_verdicts(&fleet, 6, Duration::from_secs(60));
    assert!(
        verdicts.iter().all(|v| v["outcome"] == "ok"),
        "{verdicts:#?}"
    );
    for h in &hosts {
        assert_eq!(site.rotations(h).len(), 1, "{h} ran once");
    }
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_fires"), "1");
    assert_eq!(
        pg.sql("SELECT outcome, count(*) FROM runwarden_triggers GROUP BY outcome"),
        "started|6",
        "the fire was decided once"
    );
    let per: Vec<usize> = fleet.iter().map(|r| r.verdicts().len()).collect();
    assert!(per.iter().filter(|&&n| n >= 1).count() >= 2, "{per:?}");
}

/// Driven in SQL: a fire whose admission rolled back (its replica died
/// before committing) is not taken: the next replica to admit it decides
/// its hosts. A committed fire is: admitting it again decides nothing.
#[test]
fn a_fire_whose_admission_rolled_back_is_admitted_by_the_next_replica() {
    let pg = Pg::start();
    let site = Site::new();
    let (_, setup) = slow_hosts(&site, 1, 0.1);
    let fleet = fleet(&pg, 1, LONG, "", &setup);
    drop(fleet);
    let admit = |run_id: &str| {
        format!(
            "SELECT outcome FROM runwarden_admit_all(ARRAY['rot'], ARRAY['h1'], ARRAY['[\"cron:1\"]'], ARRAY[NULL::bigint], \
             ARRAY['{run_id}'], 'x', 15000, ARRAY['schedule'], 60000, ARRAY[NULL::integer], ARRAY[NULL::bigint], \
             ARRAY['{{}}'], 0, 'rot cron:1')"
        )
    };
    pg.sql(&format!("BEGIN; {}; ROLLBACK", admit("r0")));
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_fires"), "0");
    assert_eq!(pg.sql(&admit("r1")), "started");
    assert_eq!(pg.sql(&admit("r2")), "deduplicated");
    assert_eq!(
        pg.sql("SELECT count(*) FROM runwarden_runs WHERE run_id = 'r2'"),
        "0",
        "the second admission claimed nothing"
    );
}

/// A replica stopping with runs it claimed that made no call yet (each
/// waits for its run lock, which another process on its machine holds)
/// hands them to the fleet's queue: the other replica runs each once, the
/// stopping replica's verdict lines name the run each went to, and every
/// alert answered 200 has its one `started` row. Before, they ended
/// `halted` there and the other replicas had answered the same alerts
/// `deduplicated`: accepted, and never remediated.
#[test]
fn a_stopping_replica_hands_its_runs_that_made_no_call_to_the_others() {
    let pg = Pg::start();
    let site = Site::new();
    let (hosts, setup) = slow_hosts(&site, 4, 0.1);
    let mut fleet_ = fleet(&pg, 2, LONG, "", &setup);
    let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
    // Another process on a's machine holds every host's run lock; b is
    // stopped, so a claims all four and each waits for its lock.
    let locks = fleet_[0].e.path().join("state/locks");
    let holders: Vec<Proc> = hosts
        .iter()
        .map(|h| {
            let file = locks.join(format!("rot@{h}.lock"));
            Proc(
                Command::new("/usr/bin/flock")
                    .arg(&file)
                    .args(["/usr/bin/sleep", "120"])
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    fleet_[1].signal(nix::sys::signal::Signal::SIGSTOP);
    let (status, answer) = fleet_[0].post("/api/v1/alerts", &notification(&names));
    assert_eq!(status, 200, "{answer}");
    wait_for("a's four runs waiting", Duration::from_secs(20), || {
        let n = pg
            .sql("SELECT count(*) FROM runwarden_runs WHERE status = 'running' AND replica = 'a'");
        (n == "4").then_some(())
    });
    fleet_[0].signal(nix::sys::signal::Signal::SIGTERM);
    let exited = fleet_[0].d.as_mut().unwrap().0.wait().unwrap();
    assert!(exited.success(), "{exited:?}");
    fleet_[0].d = None;
    fleet_[1].signal(nix::sys::signal::Signal::SIGCONT);
    let done = wait_verdicts(&fleet_[1..], 4, Duration::from_secs(60));
    assert!(done.iter().all(|v| v["outcome"] == "ok"), "{done:#?}");
    for h in &hosts {
        assert_eq!(site.rotations(h).len(), 1, "{h} ran once, on b");
    }
    // a's lines: halted, handed back, each naming the run b ran.
    let ran_on_b: std::collections::HashSet<String> = done
        .iter()
        .map(|v| v["run_id"].as_str().unwrap().to_string())
        .collect();
    let handed: Vec<Value> = fleet_[0].verdicts();
    assert_eq!(handed.len(), 4, "{handed:#?}");
    for v in &handed {
        assert_eq!(v["outcome"], "halted", "{v:#}");
        assert_eq!(v["detail"]["handed_back"], true, "{v:#}");
        let to = v["detail"]["handed_to"].as_str().expect("names its run");
        assert!(ran_on_b.contains(to), "{to} ran on b: {ran_on_b:?}");
    }
    // The fleet's record: one trigger row per alert, each started once; the
    // handed runs never ran, so neither a cooldown nor max_runs counts them.
    assert_eq!(
        pg.sql(
            "SELECT count(*), count(*) FILTER (WHERE outcome = 'started') FROM runwarden_triggers"
        ),
        "4|4"
    );
    assert_eq!(
        pg.sql("SELECT status, coalesce(verdict, '-'), count(*) FROM runwarden_runs GROUP BY 1, 2 ORDER BY 1"),
        "ended|ok|4\nnot_started|halted|4"
    );
    drop(holders);
}

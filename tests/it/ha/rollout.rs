//! A staged rollout shared by three replicas on one PostgreSQL: a schedule
//! every replica fires starts one rollout; a person's decision through a
//! replica that does not drive it is applied by the one that does; the
//! driver killed mid-wave is taken over, and no host runs twice or is
//! skipped.

use super::*;
use crate::rollout::outcome as host_outcome;

/// Hosts h1..h6, h1 `bad` (its fix does not verify) with `bad_canary`;
/// tool `fix` (tier 2) sleeps 2 s. Runbook `weekly` on all six, scheduled
/// at `at` (a six-field cron), canary 1, then 50%, then 100%, `pause`
/// between waves.
fn weekly(e: &Estate, at: &str, bad_canary: bool, pause: &str) {
    let bad: &[&str] = if bad_canary { &["h1"] } else { &[] };
    crate::rollout::hosts_and_fix(e, 6, bad, 2);
    e.runbook(
        "weekly",
        &format!(
            "name: weekly\ndescription: t\nhosts: [h1, h2, h3, h4, h5, h6]\nautonomy: L3\nschedule: \"{at}\"\ntools: {{ approve: [fix] }}\nsteps:\n  - call: fix\n    reason: weekly maintenance\nrollout:\n  canary: 1\n  waves: [\"50%\", \"100%\"]\n  max_failures: 0\n  pause: {pause}\n"
        ),
    );
}

/// The rollout as replica `r` shows it (every replica reads the fleet's).
fn shown(r: &Replica, id: &str) -> Value {
    let (status, text) =
        http(&r.addr, "GET", &format!("/api/v1/rollouts/{id}"), "").expect("the replica answers");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Resume rollout `id` through replica `r` with the CLI a person uses: what it printed.
fn resume_through(r: &Replica, id: &str, why: &str) -> String {
    let daemon = format!("http://{}", r.addr);
    let out = r.e.run(&[
        "rollout", "resume", id, "--reason", why, "--daemon", &daemon,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn three_replicas_share_one_rollout_and_a_driver_killed_mid_wave_runs_no_host_twice() {
    let pg = Pg::start();
    // One fire, far enough ahead for the three replicas to be up.
    let at = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(12))
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC);
    let cron = format!(
        "{} {} {} {} {} *",
        at.second(),
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    );
    let mut fleet = fleet(&pg, 3, SHORT, "", &|e| weekly(e, &cron, true, "0s"));

    // The fire every replica saw is one rollout, started by one of them.
    let id = wait_for("the scheduled rollout", Duration::from_secs(40), || {
        let v: Value =
            serde_json::from_str(&http(&fleet[2].addr, "GET", "/api/v1/rollouts", "")?.1).ok()?;
        v["rollouts"][0]["id"].as_str().map(String::from)
    });
    // The canary's fix does not verify: halted, nothing else started.
    let halted = wait_for("the canary's halt", Duration::from_secs(30), || {
        let v = shown(&fleet[0], &id);
        (v["state"] == "halted").then_some(v)
    });
    assert_eq!(host_outcome(&halted, "h1"), "failed", "{halted:#}");
    assert_eq!(pg.sql("SELECT count(*) FROM runwarden_rollouts"), "1");
    let started: Vec<&str> = fleet
        .iter()
        .filter(|r| {
            r.e.audit_phase("rollout")
                .iter()
                .any(|l| l["outcome"] == "started")
        })
        .map(|r| r.name.as_str())
        .collect();
    let first = halted["driver"].as_str().unwrap().to_string();
    assert_eq!(started, [first.as_str()], "one replica started it");

    // Resumed through a replica that does not drive it: sent, applied there.
    let other = fleet.iter().find(|r| r.name != first).unwrap();
    let said = resume_through(other, &id, "h1's check is known to be flaky");
    assert!(said.contains(&format!("sent to replica {first}")), "{said}");
    let driver = fleet.iter().position(|r| r.name == first).unwrap();
    wait_for("wave 2 running", Duration::from_secs(20), || {
        let v = shown(&fleet[driver], &id);
        (host_outcome(&v, "h2") == "running" && host_outcome(&v, "h3") == "running").then_some(())
    });
    let resumed = fleet[driver]
        .e
        .audit_phase("rollout")
        .into_iter()
        .find(|l| l["outcome"] == "resumed")
        .expect("the driver's log has the resume");
    let by = resumed["detail"]["by"].as_str().unwrap();
    assert!(
        by.contains(&format!("through replica {}", other.name)),
        "{resumed:#}"
    );

    // The driver dies mid-wave: its two runs are closed interrupted, and
    // another replica goes on with the rollout, which halts on them.
    fleet[driver].signal(nix::sys::signal::Signal::SIGKILL);
    let _ = fleet[driver].d.as_mut().unwrap().0.wait();
    let alive: Vec<usize> = (0..3).filter(|&i| i != driver).collect();
    let again = wait_for("the takeover's halt", Duration::from_secs(30), || {
        let v = shown(&fleet[alive[0]], &id);
        (v["state"] == "halted" && v["driver"] != first.as_str()).then_some(v)
    });
    for h in ["h2", "h3"] {
        assert_eq!(host_outcome(&again, h), "interrupted", "{again:#}");
    }
    for h in ["h4", "h5", "h6"] {
        assert_eq!(host_outcome(&again, h), "waiting", "{again:#}");
    }
    let second = again["driver"].as_str().unwrap().to_string();
    let taker = fleet.iter().find(|r| r.name == second).unwrap();
    let took = taker
        .e
        .audit_phase("rollout")
        .into_iter()
        .find(|l| l["outcome"] == "taken_over")
        .expect("the taker's log has the takeover");
    assert_eq!(took["detail"]["from"], first.as_str(), "{took:#}");

    // Resumed through the third replica: the last wave runs on the taker.
    let third = fleet
        .iter()
        .find(|r| r.name != first && r.name != second)
        .unwrap();
    resume_through(third, &id, "the replica was killed, not the hosts");
    let done = wait_for("the rollout's end", Duration::from_secs(40), || {
        let v = shown(third, &id);
        (v["state"] == "finished").then_some(v)
    });
    for h in ["h4", "h5", "h6"] {
        assert_eq!(host_outcome(&done, h), "ok", "{done:#}");
    }

    // Each host ran once: one run in the fleet's table, one fix dispatched
    // in all three logs together (the dead replica's too).
    assert_eq!(runs_per_host(&pg), "h1=1,h2=1,h3=1,h4=1,h5=1,h6=1");
    let mut fixes: Vec<String> = fleet
        .iter()
        .flat_map(|r| r.e.audit_phase("intent"))
        .filter(|l| l["tool"] == "fix")
        .map(|l| l["host"].as_str().unwrap().to_string())
        .collect();
    fixes.sort();
    assert_eq!(fixes, ["h1", "h2", "h3", "h4", "h5", "h6"]);

    // The dead replica comes back: it drives nothing and runs nothing.
    fleet[driver].d = None;
    fleet[driver].start();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(shown(&fleet[driver], &id)["state"], "finished");
    assert_eq!(
        pg.sql("SELECT count(*) FROM runwarden_runs WHERE runbook = 'weekly'"),
        "6"
    );
}

/// Each host's runs in the fleet's table, `h1=1,h2=1,...`.
fn runs_per_host(pg: &Pg) -> String {
    pg.sql("SELECT string_agg(host || '=' || n, ',' ORDER BY host) FROM (SELECT host, count(*) n FROM runwarden_runs WHERE runbook = 'weekly' GROUP BY host) c")
}

/// A driver frozen past its lease (not dead: stopped, as a VM paused or a
/// replica cut off from the database) wakes after another replica took
/// its rollout over: it dispatches nothing more, and each host runs once.
#[test]
fn a_driver_frozen_past_its_lease_wakes_fenced_and_dispatches_nothing() {
    let pg = Pg::start();
    // Scheduled for a day that is not today: started through the API.
    let fleet = fleet(&pg, 3, SHORT, "", &|e| {
        weekly(e, "0 0 0 1 1 *", false, "6s")
    });
    let (status, answer) = fleet[0].post(
        "/api/v1/runs",
        &json!({ "runbook": "weekly", "all_hosts": true }).to_string(),
    );
    assert_eq!(status, 202, "{answer}");
    let id = answer["rollout"]["id"].as_str().unwrap().to_string();
    // The canary ran; the driver is frozen in the pause before wave 2.
    wait_for(
        "the pause after the canary",
        Duration::from_secs(20),
        || (shown(&fleet[1], &id)["state"] == "pausing").then_some(()),
    );
    assert_eq!(shown(&fleet[1], &id)["driver"], "a");
    fleet[0].signal(nix::sys::signal::Signal::SIGSTOP);
    let taken = wait_for("a takeover", Duration::from_secs(20), || {
        let v = shown(&fleet[1], &id);
        (v["driver"] != "a").then_some(v)
    });
    let taker = taken["driver"].as_str().unwrap().to_string();
    // Woken in the middle of the wave the taker dispatched.
    wait_for("wave 2 running", Duration::from_secs(20), || {
        let v = shown(&fleet[1], &id);
        (host_outcome(&v, "h2") == "running").then_some(())
    });
    fleet[0].signal(nix::sys::signal::Signal::SIGCONT);
    let done = wait_for("the rollout's end", Duration::from_secs(60), || {
        let v = shown(&fleet[2], &id);
        (v["state"] == "finished").then_some(v)
    });
    assert_eq!(done["driver"], taker.as_str(), "{done:#}");
    assert_eq!(done["failures"], 0, "{done:#}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(runs_per_host(&pg), "h1=1,h2=1,h3=1,h4=1,h5=1,h6=1");
    let woken: Vec<String> = fleet[0]
        .e
        .audit_phase("intent")
        .iter()
        .map(|l| l["host"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(woken, ["h1"], "the frozen driver ran only the canary");
    // It knows it lost the rollout, and shows the fleet's answer.
    assert_eq!(shown(&fleet[0], &id)["driver"], taker.as_str());
}

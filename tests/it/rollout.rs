//! Staged rollouts on the release binary: five local hosts, a tier-2 fix
//! whose verify probe passes on a host marked `good` and fails elsewhere,
//! one daemon (restarted where the test says), the verbs a person uses.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::Daemon;
use crate::util::*;

/// Hosts h1..h5; `bad` ones have a fix that does not verify. Tool `fix`
/// (tier 2) sleeps `slow` seconds, then its verify probe tests the host's
/// var. Runbook `weekly` on every host with `rollout`, and `settings`.
fn estate(bad: &[&str], slow: u32, rollout: &str, settings: &str) -> Estate {
    let e = Estate::new();
    hosts_and_fix(&e, 5, bad, slow);
    e.runbook(
        "weekly",
        &format!(
            "name: weekly\ndescription: t\nhosts: [h1, h2, h3, h4, h5]\nautonomy: L3\ntools: {{ approve: [fix] }}\nsteps:\n  - call: fix\n    reason: weekly maintenance\nrollout:\n{rollout}\n"
        ),
    );
    std::fs::write(e.path().join("runwarden.yaml"), settings).unwrap();
    e
}

/// Local hosts h1..h`n` (`bad` ones have the var `verdict: bad`) and the
/// tool `fix` (tier 2): it sleeps `slow` seconds, then its verify probe
/// passes only where the host's `verdict` is `good`.
pub(crate) fn hosts_and_fix(e: &Estate, n: usize, bad: &[&str], slow: u32) {
    for i in 1..=n {
        let name = format!("h{i}");
        let verdict = if bad.contains(&name.as_str()) {
            "bad"
        } else {
            "good"
        };
        e.host(
            &name,
            &local_host(&name, &format!("vars:\n  verdict: {{ string: {verdict} }}")),
        );
    }
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/fix.yaml"),
        format!(
            "name: fix\ntier: 2\ndescription: A fix that verifies where the host is good.\nverb: fix\nrun: [/bin/sleep, \"{slow}\"]\ntimeout: 30s\nverify:\n  run: [/usr/bin/test, \"{{{{ host.verdict }}}}\", \"=\", good]\n"
        ),
    )
    .unwrap();
}

/// Start a rollout of `weekly` through the API: its id.
fn start(d: &Daemon) -> String {
    let (status, body) = d.request(
        "POST",
        "/api/v1/runs",
        &[("Content-Type", "application/json")],
        br#"{"runbook": "weekly", "all_hosts": true}"#,
    );
    assert_eq!(status, 202, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["rollout"]["id"].as_str().unwrap().to_string()
}

/// Wait until rollout `id` is in `state`: its status.
fn until(d: &Daemon, id: &str, state: &str, within: Duration) -> Value {
    wait_for(&format!("rollout {id} {state}"), within, || {
        let v = d.get_json(&format!("/api/v1/rollouts/{id}"));
        (v["state"] == state).then_some(v)
    })
}

/// Each host's runs in the audit log (their `queued` lines).
fn runs_per_host(e: &Estate) -> std::collections::BTreeMap<String, usize> {
    let mut n = std::collections::BTreeMap::new();
    for l in e.audit_phase("queued") {
        *n.entry(l["host"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    n
}

/// Host `host`'s outcome in a rollout's status.
pub(crate) fn outcome(status: &Value, host: &str) -> String {
    status["waves"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w.as_array().unwrap().iter())
        .find(|h| h["host"] == host)
        .map(|h| h["outcome"].as_str().unwrap().to_string())
        .unwrap()
}

const WAVES: &str = "  canary: 1\n  waves: [\"40%\", \"100%\"]\n  max_failures: 0\n";

/// `check` prints the waves the runbook's hosts freeze into.
#[test]
fn check_prints_the_waves() {
    let e = estate(&[], 0, WAVES, "");
    let out = e.run(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "rollout wave 1: h1",
        "rollout wave 2: h2",
        "rollout wave 3: h3 h4 h5",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    // A canary that is not among the hosts is refused at its line.
    let e = estate(&[], 0, "  canary: [h9]\n  waves: [\"0%\"]\n", "");
    let out = e.run(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("weekly.yaml:") && err.contains("\"h9\" is not among"),
        "{err}"
    );
    assert!(err.contains("rollout.waves: each wave"), "{err}");
}

/// The canary's change does not verify: no other host starts; the halt
/// is audited with the hosts never started and counted on /metrics; a
/// person resumes it and the rest run, each host once.
#[test]
fn a_canary_that_does_not_verify_halts_the_rollout_until_a_person_resumes_it() {
    let e = estate(&["h1"], 0, WAVES, "");
    let d = Daemon::start(&e);
    let id = start(&d);
    let halted = until(&d, &id, "halted", Duration::from_secs(30));
    assert_eq!(outcome(&halted, "h1"), "failed", "{halted:#}");
    for h in ["h2", "h3", "h4", "h5"] {
        assert_eq!(outcome(&halted, h), "waiting", "{halted:#}");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(runs_per_host(&e).keys().collect::<Vec<_>>(), vec!["h1"]);
    let line = e
        .audit_phase("rollout")
        .into_iter()
        .find(|l| l["outcome"] == "halted")
        .expect("a halted line");
    assert_eq!(
        line["detail"]["never_started"],
        serde_json::json!(["h2", "h3", "h4", "h5"])
    );
    assert!(
        line["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("h1 failed"),
        "{line}"
    );
    assert_eq!(
        d.metric("runwarden_rollouts_halted{runbook=\"weekly\"}"),
        1.0
    );
    // `status` exits with the worst verdict: failed.
    let daemon = format!("http://{}", d.addr);
    let out = e.run(&["rollout", "status", &id[..13], "--daemon", &daemon]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Resuming needs a halted rollout and a reason; it is audited with the person.
    let out = e.run(&[
        "rollout", "resume", &id, "--reason", "", "--daemon", &daemon,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let out = e.run(&[
        "rollout",
        "resume",
        &id,
        "--reason",
        "h1 is a known flake",
        "--daemon",
        &daemon,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = until(&d, &id, "finished", Duration::from_secs(60));
    for h in ["h2", "h3", "h4", "h5"] {
        assert_eq!(outcome(&done, h), "ok", "{done:#}");
    }
    assert!(
        runs_per_host(&e).values().all(|&n| n == 1),
        "{:?}",
        runs_per_host(&e)
    );
    let resumed = e
        .audit_phase("rollout")
        .into_iter()
        .find(|l| l["outcome"] == "resumed")
        .unwrap();
    assert_eq!(resumed["detail"]["reason"], "h1 is a known flake");
    assert!(!resumed["detail"]["by"].as_str().unwrap().is_empty());
    assert_eq!(
        d.metric("runwarden_rollouts_halted{runbook=\"weekly\"}"),
        0.0
    );
    let out = e.run(&[
        "rollout", "resume", &id, "--reason", "again", "--daemon", &daemon,
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a finished rollout is not resumed"
    );
}

/// A failure in wave 2 of 3: wave 3 never starts. The runs of wave 2
/// already in flight finish.
#[test]
fn a_failure_in_wave_two_keeps_wave_three_from_starting() {
    let e = estate(&["h2"], 0, WAVES, "");
    let d = Daemon::start(&e);
    let id = start(&d);
    let halted = until(&d, &id, "halted", Duration::from_secs(30));
    assert_eq!(outcome(&halted, "h1"), "ok");
    assert_eq!(outcome(&halted, "h2"), "failed");
    for h in ["h3", "h4", "h5"] {
        assert_eq!(outcome(&halted, h), "waiting", "{halted:#}");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(runs_per_host(&e).len(), 2);
    // Abort: nothing more starts, and the log says which never did.
    let daemon = format!("http://{}", d.addr);
    let out = e.run(&[
        "rollout",
        "abort",
        &id,
        "--reason",
        "h2 needs a person",
        "--daemon",
        &daemon,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let aborted = e
        .audit_phase("rollout")
        .into_iter()
        .find(|l| l["outcome"] == "aborted")
        .unwrap();
    assert_eq!(
        aborted["detail"]["never_started"],
        serde_json::json!(["h3", "h4", "h5"])
    );
}

/// All good, with a pause: every wave in order, each after the pause;
/// `run --all-hosts --via-daemon` follows it and exits 0.
#[test]
fn all_good_runs_every_wave_in_order_with_the_pauses_kept() {
    let rollout = format!("{WAVES}  pause: 2s\n");
    let e = estate(&[], 0, &rollout, "");
    let d = Daemon::start(&e);
    let started = Instant::now();
    let out = e.run(&[
        "run",
        "weekly",
        "--all-hosts",
        "--via-daemon",
        &format!("http://{}", d.addr),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("wave 3: h3 h4 h5") && text.contains(": finished"),
        "{text}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "two pauses of 2 s"
    );
    // The queued lines: wave by wave, each wave at least a pause after the last.
    let at = |host: &str| -> jiff::Timestamp {
        e.audit_phase("queued")
            .into_iter()
            .find(|l| l["host"] == host)
            .unwrap()["ts"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let gap = |a: &str, b: &str| at(b).as_millisecond() - at(a).as_millisecond();
    assert!(gap("h1", "h2") >= 2000, "{}", gap("h1", "h2"));
    assert!(gap("h2", "h3") >= 2000, "{}", gap("h2", "h3"));
    assert!(runs_per_host(&e).values().all(|&n| n == 1));
}

/// A guard that returns a series during the pause halts the rollout, on a
/// real Prometheus; one that cannot be evaluated halts it too.
#[test]
fn a_guard_that_fires_or_cannot_be_asked_halts_the_rollout() {
    let prom_dir = tempfile::tempdir().unwrap();
    let (_prom, prom) = prometheus(prom_dir.path(), "global: { evaluation_interval: 1s }\n");
    wait_for("prometheus ready", Duration::from_secs(30), || {
        http(&prom, "GET", "/-/ready", "").filter(|(s, _)| *s == 200)
    });
    let settings = format!("prometheus: {{ url: \"http://{prom}\" }}\n");
    for (guard, why) in [
        ("vector(1) > 0", "returned 1 series"),
        ("sum(rate(", "could not be evaluated"),
    ] {
        let rollout = format!("{WAVES}  pause: 1s\n  guard: \"{guard}\"\n");
        let e = estate(&[], 0, &rollout, &settings);
        let d = Daemon::start(&e);
        let id = start(&d);
        let halted = until(&d, &id, "halted", Duration::from_secs(30));
        assert!(
            halted["reason"].as_str().unwrap().contains(why),
            "{halted:#}"
        );
        assert_eq!(outcome(&halted, "h1"), "ok");
        assert_eq!(runs_per_host(&e).len(), 1, "only the canary ran");
    }
}

/// The kill switch during a wave halts the rollout; releasing it does not
/// resume it.
#[test]
fn the_kill_switch_halts_a_rollout_and_releasing_it_does_not_resume_it() {
    let e = estate(
        &[],
        2,
        "  canary: 1\n  waves: [\"100%\"]\n  max_failures: 4\n",
        "",
    );
    let d = Daemon::start(&e);
    let id = start(&d);
    // While the canary runs (its fix takes 2 s), the switch.
    std::thread::sleep(Duration::from_millis(500));
    let out = e.run(&["kill-switch", "engage", "--reason", "incident"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let halted = until(&d, &id, "halted", Duration::from_secs(30));
    assert!(
        halted["reason"].as_str().unwrap().contains("kill switch"),
        "{halted:#}"
    );
    let out = e.run(&["kill-switch", "release"]);
    assert!(out.status.success());
    std::thread::sleep(Duration::from_secs(2));
    let still = d.get_json(&format!("/api/v1/rollouts/{id}"));
    assert_eq!(still["state"], "halted", "{still:#}");
    assert_eq!(runs_per_host(&e).len(), 1);
}

/// A daemon killed in a pause, and one stopped while wave 2's runs are
/// in flight: the next daemon takes the rollout up where it was (a run
/// the stop cut short is a failure a person resumes past), and every host
/// runs exactly once.
#[test]
fn a_restart_takes_the_rollout_up_where_it_was_with_each_host_run_once() {
    let rollout = format!("{WAVES}  pause: 3s\n");
    let e = estate(&[], 1, &rollout, "");
    let mut d = Daemon::start(&e);
    let id = start(&d);
    // The canary ends (1 s), then the pause: killed in it.
    wait_for("the canary's end", Duration::from_secs(30), || {
        let v = d.get_json(&format!("/api/v1/rollouts/{id}"));
        (v["state"] == "pausing").then_some(())
    });
    d.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = d.child.wait();
    d = Daemon::start(&e);
    // Wave 2 starts after the pause; stopped (SIGTERM) while it runs.
    wait_for("wave 2 running", Duration::from_secs(30), || {
        let v = d.get_json(&format!("/api/v1/rollouts/{id}"));
        (outcome(&v, "h2") == "running").then_some(())
    });
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let _ = d.child.wait();
    d = Daemon::start(&e);
    // The stop halted h2's run before it could finish (a run stops at its
    // next step when the daemon stops): that is a failure, and the rollout
    // waits for a person; nothing of wave 3 started.
    let halted = until(&d, &id, "halted", Duration::from_secs(30));
    assert_eq!(outcome(&halted, "h1"), "ok", "{halted:#}");
    assert_eq!(outcome(&halted, "h2"), "halted", "{halted:#}");
    for h in ["h3", "h4", "h5"] {
        assert_eq!(outcome(&halted, h), "waiting", "{halted:#}");
    }
    let daemon = format!("http://{}", d.addr);
    let out = e.run(&[
        "rollout",
        "resume",
        &id,
        "--reason",
        "the daemon was restarted",
        "--daemon",
        &daemon,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = until(&d, &id, "finished", Duration::from_secs(60));
    for h in ["h3", "h4", "h5"] {
        assert_eq!(outcome(&done, h), "ok", "{done:#}");
    }
    let n = runs_per_host(&e);
    assert_eq!(n.len(), 5, "{n:?}");
    assert!(n.values().all(|&k| k == 1), "each host once: {n:?}");
}

/// A schedule's fire is a rollout too; while it is not over, the next
/// fire and a person's `all_hosts` start no second one (409).
#[test]
fn a_schedule_fires_a_rollout_and_one_rollout_of_a_runbook_runs_at_a_time() {
    let e = estate(&[], 0, &format!("{WAVES}  pause: 60s\n"), "");
    let path = e.path().join("runbooks/weekly.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "autonomy: L3\n",
            "autonomy: L3\nschedule: \"*/2 * * * * *\"\n",
        ),
    )
    .unwrap();
    let d = Daemon::start(&e);
    let first = wait_for("a scheduled rollout", Duration::from_secs(20), || {
        let v = d.get_json("/api/v1/rollouts");
        v["rollouts"].as_array().and_then(|r| r.first().cloned())
    });
    assert_eq!(first["trigger"], "schedule", "{first:#}");
    std::thread::sleep(Duration::from_secs(5));
    let all = d.get_json("/api/v1/rollouts");
    assert_eq!(all["rollouts"].as_array().unwrap().len(), 1, "{all:#}");
    let (status, body) = d.request(
        "POST",
        "/api/v1/runs",
        &[("Content-Type", "application/json")],
        br#"{"runbook": "weekly", "all_hosts": true}"#,
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("one rollout of a runbook at a time"),
        "{body}"
    );
    assert_eq!(runs_per_host(&e).len(), 1, "only the canary ran");
}

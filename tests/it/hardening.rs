//! Hostile input and faults: config files built to hurt (alias bombs, deep
//! nesting, a 100 MB file, 10,000 steps, invalid UTF-8, a symlink to
//! /etc/shadow), each a clear error in bounded time and memory with nothing
//! loaded.

use std::time::{Duration, Instant};

use crate::util::*;

/// `runwarden check` on `e`: (exit code, stderr, wall time, its peak RSS in KiB).
fn check(e: &Estate) -> (Option<i32>, String, Duration, i64) {
    let started = Instant::now();
    let err = e.work().join("check.err");
    let cmd = e.cmd(&["check"]);
    let (_, code, rss) = run_measured_to(cmd, std::fs::File::create(&err).unwrap().into());
    (
        code,
        std::fs::read_to_string(&err).unwrap(),
        started.elapsed(),
        rss,
    )
}

#[test]
fn hostile_config_files_are_refused_whole_in_bounded_time_and_memory() {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    let rb = |name: &str, body: &str| {
        e.runbook(
            name,
            &format!("name: {name}\ndescription: x\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\n{body}"),
        );
    };
    // Billion laughs where any value is accepted (tool arguments are JSON values).
    let mut laughs = "steps:\n  - call: disk_usage\n    args:\n      a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n".to_string();
    for i in 1..9 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        laughs += &format!("      a{i}: &a{i} [{refs}]\n");
    }
    rb("laughs", &laughs);
    // Nesting 100,000 deep.
    rb(
        "deep",
        &format!(
            "steps:\n  - call: disk_usage\n    args: {{ path: {}{} }}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        ),
    );
    // 10,000 steps.
    rb(
        "many",
        &"steps:\n"
            .chars()
            .chain(
                "  - call: disk_usage\n    args: { path: /tmp }\n"
                    .repeat(10_000)
                    .chars(),
            )
            .collect::<String>(),
    );
    // Template delimiters inside a `when` expression (crashed minijinja's lexer; found by fuzzing).
    rb(
        "crash",
        "steps:\n  - call: disk_usage\n    when: \"steps.a.b }} c {{ d\"\n    args: { path: /tmp }\n",
    );
    // Invalid UTF-8 on line 2.
    std::fs::write(
        e.path().join("runbooks/utf8.yaml"),
        b"name: utf8\ndescription: \xff\xfe\n",
    )
    .unwrap();
    // 100 MB (sparse).
    let huge = std::fs::File::create(e.path().join("runbooks/huge.yaml")).unwrap();
    huge.set_len(100 << 20).unwrap();
    // A host file that is a link to /etc/shadow, and one to a file inside the directory (allowed).
    std::os::unix::fs::symlink("/etc/shadow", e.path().join("hosts/shadow.yaml")).unwrap();
    std::fs::create_dir_all(e.path().join("shared")).unwrap();
    std::fs::write(
        e.path().join("shared/inside.yaml"),
        local_host("inside", "paths: [/tmp]"),
    )
    .unwrap();
    std::os::unix::fs::symlink("../shared/inside.yaml", e.path().join("hosts/inside.yaml"))
        .unwrap();

    let (code, err, took, rss) = check(&e);
    assert_eq!(code, Some(2), "{err}");
    let root = e.path().display();
    for expected in [
        format!("{root}/runbooks/laughs.yaml:"),
        "the document is too large once its aliases are expanded".to_string(),
        format!("{root}/runbooks/deep.yaml:"),
        format!("{root}/runbooks/many.yaml:1:7: 10000 steps; a runbook has at most 1000"),
        format!("{root}/runbooks/utf8.yaml:2:14: file is not valid UTF-8"),
        format!("{root}/runbooks/crash.yaml:8:11: `when` is an expression, not a template"),
        format!(
            "{root}/runbooks/huge.yaml:1:1: file is 104857600 bytes; config files are limited to 4194304 bytes"
        ),
        format!(
            "{root}/hosts/shadow.yaml:1:1: is a symlink to /etc/shadow, outside the configuration directory"
        ),
        "nothing was loaded".to_string(),
    ] {
        assert!(err.contains(&expected), "missing {expected:?} in:\n{err}");
    }
    assert!(
        !err.contains("root:"),
        "nothing of /etc/shadow is quoted:\n{err}"
    );
    assert!(
        !err.contains("inside.yaml"),
        "a link inside the directory is fine:\n{err}"
    );
    assert!(!err.contains("panicked"));
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(rss < 512 * 1024, "peak RSS {rss} KiB");
}

#[test]
fn processes_that_escape_a_tools_process_group_do_not_outlive_the_call() {
    let e = Estate::new();
    let t = tag();
    // A `ps` that leaves three processes behind in sessions of their own
    // (one directly, two through a double fork), holding the output pipe
    // open. It waits (at most 10 s) until all three run, however loaded the
    // machine, then runs the real ps; if they never do, it fails the call.
    let ps = e.script(
        "leaky-ps",
        &format!(
            "setsid /bin/sleep 300.{t} &\nsetsid /bin/sh -c '/bin/sleep 301.{t} & exec /bin/sleep 302.{t}' &\ni=0; while [ \"$(/usr/bin/pgrep -fc 'sleep 30[012][.]{t}')\" -lt 3 ] && [ $i -lt 100 ]; do /bin/sleep 0.1; i=$((i+1)); done\n[ $i -lt 100 ] || exit 3\nexec /bin/ps \"$@\""
        ),
    );
    e.host(
        "h",
        &local_host("h", &format!("binaries:\n  ps: {}", ps.display())),
    );
    e.runbook(
        "procs",
        "name: procs\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n  - call: list_processes\n  - call: list_processes\n",
    );
    let started = Instant::now();
    let (code, report) = e.run_json("procs", "h", &[]);
    assert_eq!(code, 0, "each call's escapes started: {report:#}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let left = alive_with(&format!(".{t}"));
    assert!(
        left.is_empty(),
        "escaped the call and still running: {left:?}"
    );
}

/// A `runwarden` command in a private mount namespace whose state directory
/// (the audit log's) is a 64 KiB tmpfs, filled by a file `state/filler`.
fn on_full_state_dir(e: &Estate, args: &str) -> std::process::Command {
    let state = e.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let script = format!(
        "set -e; mount -t tmpfs -o size=64k rw-state {s}; dd if=/dev/zero of={s}/filler bs=4k 2>/dev/null || true; exec {bin} {args} --config {cfg}",
        s = state.display(),
        bin = bin(),
        cfg = e.path().display()
    );
    in_private_mount_namespace(&script)
}

fn rotation_estate() -> (Estate, std::path::PathBuf) {
    let e = Estate::new();
    let conf = rotating_host(&e, "h");
    e.runbook(
        "rotate",
        &format!("name: rotate\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage], approve: [rotate_logs] }}\non_alert:\n  matchers: ['alertname=\"LogsFull\"']\n  host_label: instance\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n  - call: rotate_logs\n    args: {{ config: {conf} }}\n    reason: logs full\n"),
    );
    (e, e_logs(&conf))
}

fn e_logs(conf: &str) -> std::path::PathBuf {
    std::path::Path::new(conf).parent().unwrap().join("logs")
}

#[test]
fn a_full_audit_filesystem_stops_every_call_and_the_daemon_recovers_when_space_returns() {
    // The command line: nothing runs, the run is broken, the reason is named.
    let (e, logs) = rotation_estate();
    let out = on_full_state_dir(&e, "run rotate --host h --json")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    // The run lock or the audit line, whichever the full disk refuses first.
    assert!(
        err.contains("No space left on device")
            && (err.contains("no call runs without its audit line") || err.contains("nothing ran")),
        "{err}"
    );
    assert!(!logs.join("app.log.1").exists(), "nothing was rotated");

    // The daemon: unhealthy while full, and an alert it cannot record is
    // refused with 503 (Alertmanager retries), never answered 200 and lost;
    // healthy and working again once space returns.
    let (e, logs) = rotation_estate();
    let (child, addr) = start_serve(on_full_state_dir(&e, "serve --listen 127.0.0.1:0"));
    let _daemon = Proc(child);
    let pid = _daemon.0.id().to_string();
    let alert = |fp: &str| {
        format!(
            r#"{{"version":"4","status":"firing","receiver":"rw","groupKey":"{fp}","alerts":[{{"status":"firing","labels":{{"alertname":"LogsFull","instance":"h"}},"annotations":{{}},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"{fp}"}}]}}"#
        )
    };
    let settled = |n: usize| {
        wait_for("the run", Duration::from_secs(20), || {
            let runs: serde_json::Value =
                serde_json::from_str(&http(&addr, "GET", "/api/v1/runs", "")?.1).ok()?;
            let runs = runs["runs"].as_array()?.clone();
            (runs.len() == n
                && runs
                    .iter()
                    .all(|r| r["status"] != "running" && r["status"] != "queued"))
            .then_some(runs)
        })
    };
    let (status, body) = http(&addr, "POST", "/api/v1/alerts", &alert("a1")).unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("could not be recorded"), "{body}");
    let runs = http(&addr, "GET", "/api/v1/runs", "").unwrap().1;
    assert!(runs.contains("\"runs\":[]"), "no run started: {runs}");
    let (status, body) = http(&addr, "GET", "/healthz", "").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("audit"), "{body}");
    assert!(!logs.join("app.log.1").exists());
    let metrics = http(&addr, "GET", "/metrics", "").unwrap().1;
    assert!(
        !metrics.contains("runwarden_audit_write_failures_total 0"),
        "{metrics}"
    );

    // Space returns.
    sh(
        "/usr/bin/nsenter",
        &[
            "-t",
            &pid,
            "-m",
            "rm",
            &e.path().join("state/filler").display().to_string(),
        ],
    );
    let (status, body) = http(&addr, "POST", "/api/v1/alerts", &alert("a2")).unwrap();
    assert_eq!(status, 200, "{body}");
    let runs = settled(1);
    assert!(runs.iter().any(|r| r["status"] == "ok"), "{runs:#?}");
    assert_eq!(http(&addr, "GET", "/healthz", "").unwrap().0, 200);
    assert!(logs.join("app.log.1").exists(), "the second run rotated");
    let verify = sh(
        "/usr/bin/nsenter",
        &[
            "-t",
            &pid,
            "-m",
            bin(),
            "audit",
            "verify",
            "--config",
            &e.path().display().to_string(),
        ],
    );
    assert!(verify.contains("chain intact"), "{verify}");
}

#[test]
fn a_kill_switch_directory_removed_or_replaced_while_runs_are_in_flight_fails_closed() {
    for (what, sabotage) in [
        ("removed", "rm -rf {ks}"),
        ("replaced by a file", "rm -rf {ks} && echo x > {ks}"),
        (
            "replaced by a symlink to nowhere",
            "rm -rf {ks} && ln -s /nonexistent {ks}",
        ),
    ] {
        let e = Estate::new();
        let ps = e.script("slow-ps", "sleep 0.3\nexec /bin/ps \"$@\"");
        e.host(
            "h",
            &local_host("h", &format!("binaries:\n  ps: {}", ps.display())),
        );
        let mut rb = "name: slow\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n".to_string();
        for _ in 0..10 {
            rb += "  - call: list_processes\n";
        }
        e.runbook("slow", &rb);
        let run = e
            .cmd(&["run", "slow", "--host", "h", "--json"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(800));
        let ks = e.path().join("kill-switch").display().to_string();
        sh("/bin/sh", &["-c", &sabotage.replace("{ks}", &ks)]);
        let out = run.wait_with_output().unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["verdict"], "halted", "{what}: {report:#}");
        let ran = steps_with(&report, "ok").len();
        assert!((1..10).contains(&ran), "{what}: {ran} calls ran");
        let denied = steps_with(&report, "denied");
        assert_eq!(
            denied.len(),
            1,
            "{what}: the run stops at the first refusal"
        );
        assert!(
            denied[0]["detail"]
                .as_str()
                .unwrap()
                .contains("kill_switch"),
            "{what}: {:#}",
            denied[0]
        );
    }
}

#[test]
fn sigkill_of_the_daemon_mid_runs_loses_no_audit_line_and_repeats_no_change() {
    const HOSTS: usize = 10;
    const CYCLES: usize = 10;
    let e = Estate::new();
    let count = e.work().join("rotations");
    let lr = e.script(
        "counting-logrotate",
        &format!(
            "echo x >> {}\nsleep 0.05\nexec /usr/sbin/logrotate \"$@\"",
            count.display()
        ),
    );
    for i in 0..HOSTS {
        let dir = e.work().join(format!("h{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("app.log"), "line\n").unwrap();
        std::fs::write(
            dir.join("lr.conf"),
            format!(
                "{}/app.log {{\n  rotate 500\n  missingok\n  create\n}}\n",
                dir.display()
            ),
        )
        .unwrap();
        e.host(
            &format!("h{i}"),
            &local_host(
                &format!("h{i}"),
                &format!(
                    "paths: [/tmp]\nlogrotate_configs: [{d}/lr.conf]\nlogrotate_state: {d}/lr.state\nbinaries:\n  logrotate: {}",
                    lr.display(),
                    d = dir.display()
                ),
            ),
        );
    }
    let hosts: Vec<String> = (0..HOSTS).map(|i| format!("h{i}")).collect();
    e.runbook(
        "churn",
        &format!(
            "name: churn\ndescription: t\nhosts: [{}]\nautonomy: L3\ntools: {{ observe: [disk_usage], approve: [rotate_logs] }}\non_alert:\n  matchers: ['alertname=\"Churn\"']\n  host_label: instance\nsteps:\n  - call: disk_usage\n    args: {{ path: /tmp }}\n  - call: rotate_logs\n    args: {{ config: \"{}/{{{{ run.host }}}}/lr.conf\" }}\n    reason: churn\n  - call: disk_usage\n    args: {{ path: /tmp }}\n",
            hosts.join(", "),
            e.work().display()
        ),
    );
    std::fs::write(e.path().join("runwarden.yaml"), "max_concurrent_runs: 10\n").unwrap();
    // A reproducible spread of kill points (0-400 ms after the alerts).
    let mut seed: u64 = 0x5eed_1234;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % 400
    };
    for cycle in 0..CYCLES {
        let (mut child, addr) = spawn_serve(&e);
        let alerts: Vec<String> = hosts
            .iter()
            .map(|h| format!(r#"{{"status":"firing","labels":{{"alertname":"Churn","instance":"{h}"}},"annotations":{{}},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"c{cycle}-{h}"}}"#))
            .collect();
        let body = format!(
            r#"{{"version":"4","status":"firing","receiver":"rw","groupKey":"g{cycle}","alerts":[{}]}}"#,
            alerts.join(",")
        );
        let (status, _) = http(&addr, "POST", "/api/v1/alerts", &body).unwrap();
        assert_eq!(status, 200);
        std::thread::sleep(Duration::from_millis(next()));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // The restart closes what the kills interrupted.
    let (mut child, _) = spawn_serve(&e);
    child.kill().unwrap();
    child.wait().unwrap();

    let audit = e.audit();
    let runs: std::collections::BTreeSet<&str> = audit
        .iter()
        .filter(|l| l["phase"] == "queued")
        .map(|l| l["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        runs.len(),
        HOSTS * CYCLES,
        "every alert was accepted, on disk"
    );
    let mut interrupted = 0;
    for run in &runs {
        let lines: Vec<&serde_json::Value> = audit.iter().filter(|l| l["run_id"] == *run).collect();
        let verdicts: Vec<&str> = lines
            .iter()
            .filter(|l| l["phase"] == "verdict")
            .map(|l| l["outcome"].as_str().unwrap())
            .collect();
        assert_eq!(verdicts.len(), 1, "run {run}: {verdicts:?}");
        let intents = lines.iter().filter(|l| l["phase"] == "intent").count();
        let results = lines.iter().filter(|l| l["phase"] == "result").count();
        if intents > results || verdicts[0] == "interrupted" {
            assert_eq!(
                verdicts[0], "interrupted",
                "run {run}: an intent without a result"
            );
            interrupted += 1;
        }
    }
    // Every rotation ran after its intent line, and none ran twice.
    let tier2_intents = audit
        .iter()
        .filter(|l| l["phase"] == "intent" && l["tier"] == 2)
        .count();
    let tier2_results = audit
        .iter()
        .filter(|l| l["phase"] == "result" && l["tool"] == "rotate_logs")
        .count();
    let rotations = std::fs::read_to_string(&count)
        .unwrap_or_default()
        .lines()
        .count();
    assert!(
        tier2_results <= rotations && rotations <= tier2_intents,
        "{tier2_results} results <= {rotations} rotations <= {tier2_intents} intents"
    );
    assert!(e.run(&["audit", "verify"]).status.success());
    println!(
        "{} runs, {CYCLES} kills: {interrupted} interrupted, {tier2_intents} tier-2 intents, {rotations} rotations, {tier2_results} results",
        runs.len()
    );
    assert!(interrupted > 0, "the kills landed mid-run at least once");
}

#[test]
fn a_config_reload_racing_100_runs_in_flight_leaves_each_run_on_one_version() {
    const HOSTS: usize = 100;
    let e = Estate::new();
    let ps = e.script("slow-ps", "sleep 0.1\nexec /bin/ps \"$@\"");
    let hosts: Vec<String> = (0..HOSTS).map(|i| format!("h{i}")).collect();
    for h in &hosts {
        e.host(
            h,
            &local_host(h, &format!("binaries:\n  ps: {}", ps.display())),
        );
    }
    let runbook = |version: usize| {
        format!(
            "name: race\ndescription: version {version}\nhosts: [{}]\nautonomy: L3\non_alert:\n  matchers: ['alertname=\"Race\"']\n  host_label: instance\ntools: {{ observe: [list_processes] }}\nsteps:\n  - call: list_processes\n  - call: list_processes\n  - call: list_processes\n",
            hosts.join(", ")
        )
    };
    e.runbook("race", &runbook(0));
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "max_concurrent_runs: 100\n",
    )
    .unwrap();
    let (child, addr) = spawn_serve(&e);
    let daemon = Proc(child);
    let notify = |tag: &str, hosts: &[String]| {
        let alerts: Vec<String> = hosts
            .iter()
            .map(|h| format!(r#"{{"status":"firing","labels":{{"alertname":"Race","instance":"{h}"}},"annotations":{{}},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"{tag}-{h}"}}"#))
            .collect();
        let body = format!(
            r#"{{"version":"4","status":"firing","receiver":"rw","groupKey":"{tag}","alerts":[{}]}}"#,
            alerts.join(",")
        );
        assert_eq!(http(&addr, "POST", "/api/v1/alerts", &body).unwrap().0, 200);
    };
    let settled = |n: usize| {
        wait_for("the runs", Duration::from_secs(240), || {
            let runs: serde_json::Value =
                serde_json::from_str(&http(&addr, "GET", "/api/v1/runs", "")?.1).ok()?;
            let runs = runs["runs"].as_array()?.clone();
            (runs.len() >= n
                && runs
                    .iter()
                    .all(|r| r["status"] != "running" && r["status"] != "queued"))
            .then_some(runs)
        })
    };
    notify("first", &hosts);
    // Five new versions while the 100 runs work, each announced with SIGHUP too.
    for v in 1..=5 {
        std::thread::sleep(Duration::from_millis(120));
        e.runbook("race", &runbook(v));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(daemon.0.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
    }
    let runs = settled(HOSTS);
    assert!(runs.iter().all(|r| r["status"] == "ok"), "{runs:#?}");
    // After the reloads settle, a new run uses the last version.
    std::thread::sleep(Duration::from_millis(500));
    notify("second", &hosts[..1]);
    settled(HOSTS + 1);

    let audit = e.audit();
    let mut per_run: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for l in audit.iter().filter(|l| l["phase"] != "queued") {
        per_run
            .entry(l["run_id"].as_str().unwrap())
            .or_default()
            .insert(l["runbook_version"].as_str().unwrap());
    }
    assert_eq!(per_run.len(), HOSTS + 1);
    for (run, versions) in &per_run {
        assert_eq!(versions.len(), 1, "run {run} saw versions {versions:?}");
    }
    let last_version = {
        use sha2::Digest;
        let bytes = std::fs::read(e.path().join("runbooks/race.yaml")).unwrap();
        format!("{:x}", sha2::Sha256::digest(&bytes))
    };
    let last_run = audit.iter().rev().find(|l| l["phase"] == "start").unwrap();
    assert_eq!(last_run["runbook_version"], last_version.as_str());
}

/// The audit log closes segments whoever writes: the daemon's user, or root
/// running `runwarden run` beside it. A segment root closes, and the file
/// it starts, stay the owner's (mode and owner copied), so the daemon's
/// next write goes on; the chain stays one across every segment.
#[test]
fn a_segment_closed_by_root_leaves_the_log_to_its_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::process::Command;
    let e = Estate::new();
    e.host("local", &local_host("local", "paths: [/tmp]"));
    e.runbook(
        "probe",
        "name: probe\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "audit_head: none\naudit_rotation:\n  max_size: 4KiB\n",
    )
    .unwrap();
    // The program and the configuration readable by `nobody`; the state its own.
    let program = e.work().join("runwarden");
    std::fs::copy(bin(), &program).unwrap();
    for p in [e.path(), &e.work()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let state = e.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    nix::unistd::chown(&state, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let run = |as_nobody: bool| {
        let mut c = if as_nobody {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                .arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = c
            .args(["run", "probe", "--host", "local", "--config"])
            .arg(e.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "as nobody: {as_nobody}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // The owner writes first (as the daemon does when it starts), then
    // root and the owner take turns.
    for _ in 0..6 {
        run(true);
        run(false);
    }
    run(true);
    let files: Vec<std::fs::DirEntry> = std::fs::read_dir(&state)
        .unwrap()
        .map(Result::unwrap)
        .filter(|f| f.file_name().to_string_lossy().starts_with("audit.jsonl"))
        .collect();
    assert!(files.len() >= 3, "segments were closed: {}", files.len());
    for f in &files {
        let m = f.metadata().unwrap();
        assert_eq!(
            (m.uid(), m.mode() & 0o777),
            (nobody.uid.as_raw(), 0o640),
            "{}",
            f.path().display()
        );
    }
    let verify = e.run(&["audit", "verify"]);
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && said.contains("chain intact"),
        "{said}"
    );
    assert!(said.contains("segment(s)"), "{said}");
}

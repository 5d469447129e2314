//! On-call's commands as typed from anywhere: which configuration they act on.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::config;

fn runwarden_in(cwd: &Path, args: &[&str], env: Option<&Path>) -> (Option<i32>, String) {
    let mut c = Command::new(crate::bin());
    c.args(args).current_dir(cwd).env_remove("RUNWARDEN_CONFIG");
    if let Some(dir) = env {
        c.env("RUNWARDEN_CONFIG", dir);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `kill-switch engage` typed in a directory that is no configuration (an
/// empty one, `/`) refuses and writes nothing there; with RUNWARDEN_CONFIG,
/// or from a directory holding runwarden.yaml, it engages that directory's
/// switch, the one its daemon reads. (On a machine with the package's
/// /etc/runwarden, that directory is the fallback: then only `status` is
/// asked, to see that it is the one used.)
#[test]
fn the_kill_switch_acts_only_on_a_configuration_a_daemon_reads() {
    let packaged = Path::new("/etc/runwarden").is_dir();
    let empty = tempfile::tempdir().unwrap();
    for cwd in [empty.path(), Path::new("/")] {
        if packaged {
            let (_, said) = runwarden_in(cwd, &["kill-switch", "status"], None);
            assert!(said.contains("/etc/runwarden"), "{said}");
            continue;
        }
        let (code, said) =
            runwarden_in(cwd, &["kill-switch", "engage", "--reason", "INC-123"], None);
        assert_eq!(code, Some(2), "{said}");
        assert!(
            said.contains("which configuration?") && said.contains("--config DIR"),
            "{said}"
        );
        assert!(
            !cwd.join("kill-switch").exists(),
            "nothing written in {}",
            cwd.display()
        );
        for args in [
            &["run", "x", "--host", "y"][..],
            &["check"][..],
            &["serve"][..],
        ] {
            let (code, said) = runwarden_in(cwd, args, None);
            assert_eq!(code, Some(2), "{args:?}: {said}");
        }
    }
    let conf = tempfile::tempdir().unwrap();
    config(conf.path());
    let (code, said) = runwarden_in(
        empty.path(),
        &["kill-switch", "engage", "--reason", "INC-123"],
        Some(conf.path()),
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(conf.path().join("kill-switch/ENGAGED").exists());
    assert!(!empty.path().join("kill-switch").exists());
    let (code, said) = runwarden_in(conf.path(), &["kill-switch", "release"], None);
    assert_eq!(code, Some(0), "{said}");
    assert!(!conf.path().join("kill-switch/ENGAGED").exists(), "{said}");
}

/// A timed switch: `engage --for 2s` stops runs, `status` says how long is
/// left, the daemon shows when it ends; at its time the daemon removes it,
/// with an audit line naming who engaged it and why, and runs go on. An
/// untimed one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_kill_switch_releases_itself_with_an_audit_line() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = super::Daemon::start(dir.path()).await;
    let cli = |args: &[&str]| runwarden_in(dir.path(), args, None);
    let (code, said) = cli(&["kill-switch", "engage", "--reason", "INC-9", "--for", "3s"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("releases itself at"), "{said}");
    let (code, said) = cli(&["kill-switch", "status"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("INC-9") && said.contains("left"), "{said}");
    super::wait_metric(
        &d,
        "runwarden_kill_switch_until_timestamp_seconds{scope=\"global\"}",
        |t| t > 0.0,
    )
    .await;
    // Its time comes; the daemon looks at least every 5 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while dir.path().join("kill-switch/ENGAGED").exists() {
        assert!(std::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (code, said) = cli(&["kill-switch", "status"]);
    assert_eq!(code, Some(0), "{said}");
    let audit = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    let line: serde_json::Value = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["phase"] == "kill_switch")
        .unwrap_or_else(|| panic!("no kill_switch line: {audit}"));
    assert_eq!(line["detail"]["reason"], "INC-9", "{line}");
    assert_eq!(line["detail"]["source"], "file", "{line}");
    assert!(
        line["detail"]["engaged_by"]
            .as_str()
            .is_some_and(|w| !w.is_empty())
    );
    // The run the switch held off now starts.
    let (status, body) = super::post_alerts(&d, &super::notification()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcomes"][0]["result"], "started", "{body}");
    // An untimed switch stays, and a run refused through the daemon exits
    // 7 (the kill switch), not 75 (busy, try again).
    let (code, said) = cli(&["kill-switch", "engage", "--reason", "INC-10"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(!said.contains("releases itself"), "{said}");
    let (code, said) = cli(&[
        "run",
        "disk",
        "--host",
        "web-02",
        "--via-daemon",
        &d.url(""),
        "--token-file",
        dir.path().join("token").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(7), "{said}");
    assert!(said.contains("kill_switch"), "{said}");
    d.shutdown().await.unwrap();
}

/// "What ran last night, and why": the alert that started a run (its labels
/// and summary, escaped) is in its start line and shows in `runs`, the runs
/// API, `transcript` and `audit show`; `audit show` prints the verdict's
/// detail as `transcript` does; a dry run is marked as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_says_which_alert_started_a_run_and_marks_dry_runs() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = super::Daemon::start(dir.path()).await;
    let mut n = super::notification();
    n["alerts"][0]["annotations"]["summary"] = "Disk / is 93% full \u{1b}[31m(red)".into();
    n["alerts"][0]["annotations"]["description"] = "Clean it up".into();
    let run = super::run_to_its_verdict(&d, &n).await;
    let run_id = run["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        run["alert"]["labels"]["alertname"], "DiskAlmostFull",
        "{run:#}"
    );
    assert_eq!(
        run["alert"]["summary"], "Disk / is 93% full \\u{1b}[31m(red)",
        "{run:#}"
    );
    assert_eq!(run["alert"]["description"], "Clean it up", "{run:#}");
    let cli = |args: &[&str]| runwarden_in(dir.path(), args, None);
    let (code, said) = cli(&["runs"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("alert DiskAlmostFull: Disk / is 93% full"),
        "{said}"
    );
    assert!(!said.contains('\u{1b}'), "escaped: {said:?}");
    let (_, said) = cli(&["transcript", &run_id]);
    assert!(
        said.contains("alert alertname=DiskAlmostFull")
            && said.contains("summary: Disk / is 93% full"),
        "{said}"
    );
    let (_, said) = cli(&["audit", "show", &run_id]);
    assert!(said.contains("alert alertname=DiskAlmostFull"), "{said}");
    assert!(
        said.contains("every call succeeded"),
        "the verdict's detail: {said}"
    );
    // A dry run through the API is marked as one in both listings.
    let r = super::client()
        .post(d.url("/api/v1/runs"))
        .bearer_auth(super::TOKEN)
        .header("content-type", "application/json")
        .body(
            serde_json::json!({ "runbook": "disk", "hosts": ["web-02"], "dry_run": true })
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let answer: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    let dry_id = answer["outcomes"][0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let dry = super::verdict_of(&d, &dry_id).await;
    assert_eq!(dry["dry_run"], true, "{dry:#}");
    assert!(run.get("dry_run").is_none(), "{run:#}");
    let (_, said) = cli(&["runs"]);
    assert!(
        said.lines()
            .any(|l| l.contains(&dry_id) && l.contains("(dry run)")),
        "{said}"
    );
    d.shutdown().await.unwrap();
}

/// `run --via-daemon` waits for the run and prints the same report as a
/// local run (each step, the verdict and its detail); `--no-wait` prints
/// the run's id and returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_through_the_daemon_prints_its_report() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = super::Daemon::start(dir.path()).await;
    let token = dir.path().join("token");
    let url = d.url("");
    let args = |host: &str, extra: &[&'static str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "run",
            "disk",
            "--host",
            host,
            "--via-daemon",
            &url,
            "--token-file",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.push(token.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let a = args("web-01", &[]);
    let (code, said) = runwarden_in(
        dir.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("disk_usage")
            && said.contains("verdict: ok")
            && said.contains("every call succeeded"),
        "{said}"
    );
    let a = args("web-02", &["--no-wait", "--dry-run"]);
    let (code, said) = runwarden_in(
        dir.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("started") && !said.contains("verdict:"),
        "{said}"
    );
    d.shutdown().await.unwrap();
}

/// `check` compares a host that goes through this machine's agent with the
/// agent's own policy (agent.yaml beside the config) and names each entry
/// the agent would refuse; `install print` says which units the package
/// already installs.
#[test]
fn check_names_what_the_local_agent_policy_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    super::agent_config(dir.path());
    std::fs::write(
        dir.path().join("agent.yaml"),
        format!(
            "name: me\nconnection: local\npaths: [{}]\nunits: [other.service]\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let (code, said) = runwarden_in(dir.path(), &["check"], None);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("units: \"demo.service\" is in")
            && said.contains("but not in the agent's policy")
            && said.contains("units: \"other.service\" is allowed by the agent's policy"),
        "{said}"
    );
    let printed = super::install_print(dir.path());
    assert!(
        printed.contains("The Debian package installs both agent units"),
        "{printed}"
    );
}

/// A timed switch for one runbook shows when it ends on its own series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_runbook_switch_shows_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = super::Daemon::start(dir.path()).await;
    let (code, said) = runwarden_in(
        dir.path(),
        &[
            "kill-switch",
            "engage",
            "--runbook",
            "disk",
            "--reason",
            "INC-11",
            "--for",
            "1h",
        ],
        None,
    );
    assert_eq!(code, Some(0), "{said}");
    let soon = jiff::Timestamp::now().as_second() as f64 + 3600.0;
    super::wait_metric(
        &d,
        "runwarden_kill_switch_until_timestamp_seconds{scope=\"disk\"}",
        |t| (t - soon).abs() < 30.0,
    )
    .await;
    d.shutdown().await.unwrap();
}

/// How often the kill-switch directory (and its files) are opened while
/// `during` runs: each open is one look by the daemon's kill-switch worker
/// or gate.
async fn opens_of(dir: &Path, during: impl std::future::Future<Output = ()>) -> usize {
    use notify::Watcher;
    let opens = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = opens.clone();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if let Ok(e) = e
            && matches!(
                e.kind,
                notify::EventKind::Access(notify::event::AccessKind::Open(_))
            )
        {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    })
    .unwrap();
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .unwrap();
    during.await;
    drop(watcher);
    opens.load(std::sync::atomic::Ordering::SeqCst)
}

/// An idle daemon looks at its kill switch on a change and every few
/// seconds, not in a loop woken by its own looks: opening the directory
/// to read it is no change. Nor is a person reading the switch's files
/// (`ls`, `cat`, `kill-switch status`) a reason to look again and again,
/// and no read of the configuration reloads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_looks_at_its_kill_switch_on_a_change_not_on_its_own_reads() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::write(
        dir.path().join("kill-switch/README"),
        "engage: touch ENGAGED\n",
    )
    .unwrap();
    let d = super::Daemon::start(dir.path()).await;
    let ks = dir.path().join("kill-switch");
    let idle = opens_of(&ks, tokio::time::sleep(Duration::from_secs(2))).await;
    assert!(
        idle <= 4,
        "{idle} opens of the kill-switch directory in 2 s of idling"
    );
    let reloads = "runwarden_config_reloads_total";
    let before = super::metric(&d, reloads).await;
    // A person reads the switch's files and the configuration, often.
    let reads = opens_of(&ks, async {
        for _ in 0..50 {
            let _ = std::fs::read_dir(&ks).unwrap().count();
            let _ = std::fs::read_to_string(ks.join("README")).unwrap();
            let _ = std::fs::read_to_string(dir.path().join("runbooks/disk.yaml")).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The person's own 100 opens, and the daemon's few looks.
    assert!(
        reads <= 100 + 4,
        "{reads} opens while a person read 100 times"
    );
    // A reload waits for 300 ms of quiet: give it that, and more.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(super::metric(&d, reloads).await, before, "a read reloaded");
    // A real change is still seen at once.
    std::fs::write(ks.join("ENGAGED"), "INC-1\n").unwrap();
    super::wait_metric(&d, "runwarden_kill_switch_engaged{scope=\"global\"}", |v| {
        v == 1.0
    })
    .await;
    d.shutdown().await.unwrap();
}

/// A configuration named by `--config` or RUNWARDEN_CONFIG that is not
/// there is an error for every command: nothing is created where it was
/// meant to be (a typo never becomes a kill-switch directory nothing reads).
#[test]
fn a_named_configuration_that_is_not_there_is_an_error_for_every_command() {
    let cwd = tempfile::tempdir().unwrap();
    let typo = cwd.path().join("typo");
    let commands: [&[&str]; 6] = [
        &["kill-switch", "engage", "--reason", "INC-1"],
        &["kill-switch", "status"],
        &["kill-switch", "release"],
        &["check"],
        &["run", "disk", "--host", "web-01"],
        &["runs"],
    ];
    for args in commands {
        let mut with_flag: Vec<&str> = args.to_vec();
        with_flag.extend(["--config", typo.to_str().unwrap()]);
        for (how, args, env) in [
            ("--config", with_flag.as_slice(), None),
            ("RUNWARDEN_CONFIG", args, Some(typo.as_path())),
        ] {
            let (code, said) = runwarden_in(cwd.path(), args, env);
            assert_eq!(code, Some(2), "{how} {args:?}: {said}");
            assert!(
                said.contains(how) && said.contains("typo"),
                "{how} {args:?}: {said}"
            );
            assert!(!typo.exists(), "{how} {args:?} created {}", typo.display());
        }
    }
}

/// A configuration found in the current directory is used only when no one
/// but this user (or root) could have written it: one writable by its
/// group or by everyone, or (as root) owned by another user, is refused
/// with the owner and the fix; named with --config it is used.
#[test]
fn a_configuration_in_the_current_directory_is_used_only_if_it_is_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let conf = tempfile::tempdir().unwrap();
    config(conf.path());
    let yaml = conf.path().join("runwarden.yaml");
    let (code, said) = runwarden_in(conf.path(), &["check"], None);
    assert_eq!(code, Some(0), "{said}");
    let mode =
        |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    for (what, path, m) in [
        ("its group", yaml.as_path(), 0o664),
        ("everyone", conf.path(), 0o777),
    ] {
        let before = std::fs::metadata(path).unwrap().permissions().mode();
        mode(path, m);
        for args in [
            &["check"][..],
            &["kill-switch", "engage", "--reason", "x"][..],
        ] {
            let (code, said) = runwarden_in(conf.path(), args, None);
            assert_eq!(code, Some(2), "{what}: {said}");
            assert!(
                said.contains("not trusted")
                    && said.contains(&format!("writable by {what}"))
                    && said.contains("--config"),
                "{what}: {said}"
            );
        }
        assert!(!conf.path().join("kill-switch/ENGAGED").exists());
        let dir = conf.path().to_str().unwrap();
        let (code, said) = runwarden_in(conf.path(), &["check", "--config", dir], None);
        assert_eq!(code, Some(0), "named, it is used: {said}");
        mode(path, before & 0o7777);
    }
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(conf.path(), Some(65534), Some(65534)).unwrap();
        let (code, said) = runwarden_in(conf.path(), &["run", "disk", "--host", "web-01"], None);
        assert_eq!(code, Some(2), "{said}");
        assert!(
            said.contains("is owned by nobody, not by you or root"),
            "{said}"
        );
        assert!(!conf.path().join("state").exists(), "nothing ran");
    }
}

/// `engage --for` that would stop nothing, or that is past any time, is
/// refused (exit 2, never a panic); a timed engage over an untimed switch
/// keeps it untimed and both reasons; with no daemon running, `status`
/// removes an expired timed switch (with its audit line) and says
/// released, as the gate lets runs through.
#[test]
fn the_kill_switch_is_never_weakened_and_status_agrees_with_the_gate() {
    let conf = tempfile::tempdir().unwrap();
    config(conf.path());
    let ks = |args: &[&str]| {
        let mut all = vec!["kill-switch"];
        all.extend(args);
        runwarden_in(conf.path(), &all, None)
    };
    for d in ["0s", "1ns", "999ms", "100000000y"] {
        let (code, said) = ks(&["engage", "--reason", "x", "--for", d]);
        assert_eq!(code, Some(2), "--for {d}: {said}");
        assert!(said.contains("--for"), "{said}");
        assert!(
            !conf.path().join("kill-switch/ENGAGED").exists(),
            "--for {d}"
        );
    }
    let (code, said) = ks(&["engage", "--reason", "INC-7 hands off"]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = ks(&["engage", "--reason", "maintenance", "--for", "2s"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("stays untimed") && said.contains("INC-7 hands off"),
        "{said}"
    );
    std::thread::sleep(Duration::from_millis(2500));
    let (code, said) = ks(&["status"]);
    assert_eq!(code, Some(1), "still engaged: {said}");
    assert!(
        said.contains("INC-7 hands off") && said.contains("maintenance"),
        "{said}"
    );
    ks(&["release"]);
    // Expired, no daemon: status removes it, audits it, and says released.
    let (code, said) = ks(&["engage", "--reason", "short", "--for", "1s"]);
    assert_eq!(code, Some(0), "{said}");
    std::thread::sleep(Duration::from_millis(1500));
    let (code, said) = ks(&["status"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("released") && said.contains("ended"),
        "{said}"
    );
    assert!(!conf.path().join("kill-switch/ENGAGED").exists());
    let audit = std::fs::read_to_string(conf.path().join("state/audit.jsonl")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"released\"") && l.contains("short")),
        "{audit}"
    );
}

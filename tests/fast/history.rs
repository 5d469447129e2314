//! The audit log as history: a torn log set aside, the report and the
//! transcript read back from it.

use super::*;

/// What the kernel leaves when a writer is killed in the middle of a write
/// larger than a page (SIGKILL cuts a multi-page `write` short on ext4): the
/// log's whole lines, then part of the next one.
fn tear(audit: &Path) -> Vec<u8> {
    use std::io::Write;
    let fragment = br#"{"ts":"2026-12-01T20:31:53.9Z","run_id":"01a2334e","phase":"que"#.to_vec();
    std::fs::OpenOptions::new()
        .append(true)
        .open(audit)
        .unwrap()
        .write_all(&fragment)
        .unwrap();
    fragment
}

/// The captured notification, for `web-02` (a second host of the runbook):
/// no cooldown or dedupe of `web-01`'s run stands in its way.
fn for_web_02() -> Value {
    let mut n = notification();
    n["groupKey"] = "web-02".into();
    for a in n["alerts"].as_array_mut().unwrap() {
        a["labels"]["instance"] = "web-02:9100".into();
        a["fingerprint"] = format!("web-02-{}", a["fingerprint"].as_str().unwrap()).into();
    }
    n
}

/// A daemon killed mid-write must not keep the next one from starting: the
/// torn fragment (never acknowledged: its writer died inside the write) is
/// set aside beside the log, the chain goes on from the last whole line, and
/// `audit verify` passes and says where the fragment went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_torn_by_a_killed_writer_is_set_aside_and_the_next_daemon_starts() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let audit = dir.path().join("state/audit.jsonl");
    let d = Daemon::start(dir.path()).await;
    run_to_its_verdict(&d, &notification()).await;
    d.shutdown().await.unwrap();
    let whole = std::fs::read(&audit).unwrap();
    let fragment = tear(&audit);

    let d = Daemon::start(dir.path()).await;
    assert_eq!(
        std::fs::read(&audit).unwrap(),
        whole,
        "the fragment is cut off"
    );
    let aside = std::fs::read(dir.path().join("state/audit.jsonl.torn")).unwrap();
    assert!(
        aside.windows(fragment.len()).any(|w| w == fragment),
        "the fragment is kept: {}",
        String::from_utf8_lossy(&aside)
    );
    // The chain goes on: a run for another host appends to it.
    assert_eq!(run_to_its_verdict(&d, &for_web_02()).await["status"], "ok");
    d.shutdown().await.unwrap();
    let out = std::process::Command::new(crate::bin())
        .args(["audit", "verify", "--config"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("audit.jsonl.torn"),
        "verify names the set-aside fragment: {text}"
    );
}

/// The same tear while a daemon has the log open (a command-line run killed
/// mid-write beside it): the daemon's next trigger is still recorded and
/// answered 200, not refused with 503 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_torn_under_a_running_daemon_is_set_aside_at_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let audit = dir.path().join("state/audit.jsonl");
    let d = Daemon::start(dir.path()).await;
    run_to_its_verdict(&d, &notification()).await;
    let fragment = tear(&audit);

    // Another host's alert: no cooldown or dedupe stands in its way.
    let (status, body) = post_alerts(&d, &for_web_02()).await;
    assert_ne!(status, 503, "{body}");
    let aside = std::fs::read(dir.path().join("state/audit.jsonl.torn")).unwrap();
    assert!(aside.windows(fragment.len()).any(|w| w == fragment));
    d.shutdown().await.unwrap();
    let v = runwarden::audit::verify(&audit).unwrap();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
}

/// The text report and the transcript say what each result said in a
/// person's words (the `use_pct` the run looked at, the largest entries),
/// one line per step, not a JSON blob cut short.
#[test]
fn the_report_and_the_transcript_say_what_each_result_said() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::create_dir_all(dir.path().join("data/big")).unwrap();
    std::fs::write(dir.path().join("data/big/file"), vec![1u8; 3 << 20]).unwrap();
    let report = runwarden_ok(&[
        "run".as_ref(),
        "disk".as_ref(),
        "--host".as_ref(),
        "web-01".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    let said = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("said: "))
        .unwrap_or_else(|| panic!("no said line: {report}"));
    assert!(said.contains("% used of "), "{report}");
    assert!(
        said.contains(&format!(
            "largest: {}/big 3.0 MiB",
            dir.path().join("data").display()
        )),
        "{report}"
    );
    assert!(
        !report.contains("{\""),
        "no JSON in the text report: {report}"
    );
    let run_id = report.split_whitespace().nth(1).unwrap().to_string();
    let transcript = runwarden_ok(&[
        "transcript".as_ref(),
        run_id.as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(
        transcript.contains(&format!("   said: {said}")),
        "{transcript}"
    );
}

/// History in segments, as a person meets it: command-line runs close
/// several segments; a daemon started afterwards still knows the last run of
/// each host (its cooldown holds, though that run's lines are all in a
/// closed segment), and `runs`, `transcript` and `audit verify` read across
/// every segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_starts_on_rotated_history_and_every_reader_sees_all_of_it() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let settings = dir.path().join("runwarden.yaml");
    let mut yaml = std::fs::read_to_string(&settings).unwrap();
    yaml.push_str("audit_rotation:\n  max_size: 4KiB\n");
    std::fs::write(&settings, yaml).unwrap();
    let run = |host: &str| {
        let (code, report) = run_json_on(dir.path(), "disk", host);
        assert_eq!(code, Some(0), "{report:#}");
        report["run_id"].as_str().unwrap().to_string()
    };
    let mut ids: Vec<String> = (0..3).map(|_| run("web-01")).collect();
    ids.extend((0..6).map(|_| run("web-02")));
    let audit = dir.path().join("state/audit.jsonl");
    let current = std::fs::read_to_string(&audit).unwrap();
    assert!(
        !current.contains(&ids[2]),
        "web-01's last run is in a closed segment: {current}"
    );
    let closed = std::fs::read_dir(dir.path().join("state"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("audit.jsonl.") && name.ends_with(|c: char| c.is_ascii_digit())
        })
        .count();
    assert!(closed >= 2, "{closed} closed segment(s)");

    let d = Daemon::start(dir.path()).await;
    let (status, answer) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["outcomes"][0]["result"], "cooldown",
        "web-01's last run, read from the segment line: {answer:#}"
    );
    d.shutdown().await.unwrap();

    let listed: Value = serde_json::from_str(&runwarden_ok(&[
        "runs".as_ref(),
        "--json".as_ref(),
        "--limit".as_ref(),
        "100".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]))
    .unwrap();
    let listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ids.iter().map(String::as_str).collect::<Vec<_>>());
    let transcript = runwarden_ok(&[
        "transcript".as_ref(),
        ids[0][..13].as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(transcript.contains("disk_usage"), "{transcript}");
    let verify = runwarden_ok(&[
        "audit".as_ref(),
        "verify".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(
        verify.contains(&format!("in {} segment(s)", closed + 1))
            && verify.contains("chain intact"),
        "{verify}"
    );
}

/// A run by hand records whose it was, and `runs` shows it, with why a run
/// that did not end `ok` ended as it did (here the gate's denial: the path
/// to measure is gone).
#[test]
fn the_history_says_who_ran_it_by_hand_and_why_it_failed() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::remove_dir(dir.path().join("data")).unwrap();
    let cfg = dir.path().to_str().unwrap();
    let out = runwarden(&["run", "disk", "--host", "web-01", "--config", cfg]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs = runwarden(&["runs", "--config", cfg]);
    let text = String::from_utf8_lossy(&runs.stdout);
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name;
    assert!(text.contains(&format!("by {me}")), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("denied"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("(step 1"), "the verdict's why: {line}");
    let json = runwarden(&["runs", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v[0]["user"], me.as_str(), "{v:#}");
}

/// A downgrade refuses what a newer runwarden wrote instead of misreading
/// it: with the history's marker saying a newer format, `run`, `runs` and
/// `audit verify` each exit non-zero, name the version that wrote it and
/// write nothing; the daemon does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_a_newer_runwarden_wrote_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().as_os_str();
    runwarden_ok(&[
        "run".as_ref(),
        "disk".as_ref(),
        "--host".as_ref(),
        "web-01".as_ref(),
        "--config".as_ref(),
        cfg,
    ]);
    let audit = dir.path().join("state/audit.jsonl");
    let marker = dir.path().join("state/audit.jsonl.format");
    assert!(
        std::fs::read_to_string(&marker)
            .unwrap()
            .starts_with("format 2\n")
    );
    std::fs::write(&marker, "format 3\nwritten by runwarden 0.9.0 (0123abcd)\n").unwrap();
    let before = std::fs::read(&audit).unwrap();
    for args in [
        vec!["run", "disk", "--host", "web-01"],
        vec!["runs"],
        vec!["audit", "verify"],
    ] {
        let mut argv: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        argv.extend(["--config".as_ref(), cfg]);
        let out = runwarden(&argv);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(
            said.contains("written by runwarden 0.9.0 (0123abcd)")
                && said.contains("would misread it"),
            "{args:?}: {said}"
        );
    }
    assert_eq!(
        std::fs::read(&audit).unwrap(),
        before,
        "nothing was written"
    );
    // The daemon refuses to start on it too.
    let served = runwarden::app::serve(
        runwarden::app::ServeOptions {
            config_dir: dir.path().to_path_buf(),
            listen: Some("127.0.0.1:0".parse().unwrap()),
        },
        std::future::pending(),
        None,
    );
    let ended = tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .expect("it ends at once");
    let said = format!("{:#}", ended.unwrap_err());
    assert!(said.contains("would misread it"), "{said}");
}

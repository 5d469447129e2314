//! The command line as a person meets it: exit codes, one message per
//! failure, JSON output, completions and the manual page.

use super::*;

#[test]
fn a_closed_stdout_ends_a_command_quietly_with_141() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    // Closed before the command starts: its first write meets no reader,
    // however quickly it writes (it could fit a whole pipe's buffer).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = Command::new(crate::bin())
        .args(["tools", "--json"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `run --alert` takes a whole notification as Alertmanager sends it (its
/// first firing alert starts the run, which sees all of them as `alerts`),
/// and `promote-report` of a runbook that is not there is a usage error
/// with a did-you-mean.
#[test]
fn run_takes_a_whole_notification_and_promote_report_names_a_misspelt_runbook() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::remove_file(dir.path().join("runbooks/disk.yaml")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["runbooks/disk-almost-full.yaml", "hosts/web-01.yaml"] {
        std::fs::copy(repo.join(f), dir.path().join(f)).unwrap();
    }
    let fixture = repo.join("tests/fixtures/alertmanager/firing-two-alerts.json");
    let out = runwarden_ok(&[
        "run".as_ref(),
        "disk-almost-full".as_ref(),
        "--host".as_ref(),
        "web-01".as_ref(),
        "--json".as_ref(),
        "--alert".as_ref(),
        fixture.as_os_str(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    let report: Value = serde_json::from_str(&out).unwrap();
    let measured: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["args"]["path"].as_str())
        .collect();
    assert_eq!(measured, ["/", "/var"], "{report:#}");

    let out = std::process::Command::new(crate::bin())
        .args(["promote-report", "disk-almost-ful", "--config"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean \"disk-almost-full\"?"), "{err}");
}

/// `--json` where a script reads the answer: `kill-switch status` (with the
/// same exit codes as the text), `check` (problems with file, line, column);
/// and `audit show` lines up its columns and says why the gate denied a call.
#[test]
fn kill_switch_status_and_check_speak_json_and_audit_show_names_a_denial() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cli = |args: &[&str]| {
        std::process::Command::new(crate::bin())
            .args(args)
            .arg("--config")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let status = cli(&["kill-switch", "status", "--json"]);
    assert_eq!(status.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["state"], "released", "{v}");
    std::fs::write(dir.path().join("kill-switch/disk.ENGAGED"), "disk work").unwrap();
    let status = cli(&["kill-switch", "status", "--json"]);
    assert_eq!(status.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["state"], "engaged", "{v}");
    assert_eq!(v["engaged"][0]["scope"], "disk", "{v}");
    std::fs::remove_file(dir.path().join("kill-switch/disk.ENGAGED")).unwrap();

    let check = cli(&["check", "--json"]);
    assert_eq!(check.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["runbooks"][0]["name"], "disk", "{v}");
    // Which alert starts it, as Alertmanager writes a matcher.
    assert_eq!(
        v["runbooks"][0]["on_alert"]["matchers"][0], "alertname=\"DiskAlmostFull\"",
        "{v}"
    );
    assert_eq!(
        v["runbooks"][0]["on_alert"]["host_label"], "instance",
        "{v}"
    );
    std::fs::write(
        dir.path().join("runbooks/broken.yaml"),
        "name: broken\ndescription: t\nhosts: [web-01]\nautonomy: L1\nschedule: \"0 3 31 2 *\"\n",
    )
    .unwrap();
    let check = cli(&["check", "--json"]);
    assert_eq!(check.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    let p = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["message"].as_str().unwrap().contains("can never fire"))
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        (p["line"].as_u64(), p["column"].as_u64()),
        (Some(5), Some(11)),
        "{v}"
    );
    assert!(
        p["message"].as_str().unwrap().contains("can never fire"),
        "{v}"
    );
    std::fs::remove_file(dir.path().join("runbooks/broken.yaml")).unwrap();

    // A call the gate refuses: its reason is on its line of `audit show`.
    std::fs::write(
        dir.path().join("runbooks/outside.yaml"),
        "name: outside\ndescription: t\nhosts: [web-01]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /etc }\n",
    )
    .unwrap();
    let run = cli(&["run", "outside", "--host", "web-01", "--json"]);
    let report: Value = serde_json::from_slice(&run.stdout).unwrap();
    let run_id = report["run_id"].as_str().unwrap().to_string();
    let show = cli(&["audit", "show", &run_id]);
    let text = String::from_utf8_lossy(&show.stdout);
    let denied = text
        .lines()
        .find(|l| l.contains(" denied "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        denied.contains("DENIED invalid_arguments: ") && denied.contains("path=/etc"),
        "{text}"
    );
    // The tool column starts at the same place on every line with a step.
    let starts: std::collections::BTreeSet<usize> = text
        .lines()
        .filter(|l| l.contains(" step "))
        .filter_map(|l| l.find("disk_usage"))
        .collect();
    assert_eq!(starts.len(), 1, "{text}");
}

/// Shell completions and the manual page come from the command line's own
/// definitions, so they name every command there is.
#[test]
fn completions_and_the_manual_page_name_every_command() {
    let bash = runwarden_ok(&["completions".as_ref(), "bash".as_ref()]);
    let man = runwarden_ok(&["man".as_ref()]);
    assert!(bash.contains("_runwarden()"), "{bash}");
    assert!(
        man.starts_with(".ie") && man.contains(".TH runwarden 1"),
        "{man}"
    );
    for command in [
        "run",
        "serve",
        "kill-switch",
        "alerts",
        "audit",
        "approvals",
        "check",
    ] {
        assert!(bash.contains(command), "completions lack {command}");
        assert!(
            man.contains(&command.replace('-', "\\-")),
            "the manual page lacks {command}"
        );
    }
    let fish = runwarden_ok(&["completions".as_ref(), "fish".as_ref()]);
    assert!(fish.contains("complete -c runwarden"), "{fish}");
}

/// A command that cannot do its work says so once, on stderr, as one
/// `runwarden: ...` line (after the loader's own FILE:LINE lines), prints
/// nothing on stdout, and exits with the documented code.
#[test]
fn every_failure_is_said_once_with_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["promote-report", "dsik", "--config", cfg],
            2,
            "no runbook \"dsik\"",
        ),
        (
            &["runs", "--since", "yesterday-ish", "--config", cfg],
            2,
            "yesterday-ish",
        ),
        (&["transcript", "0000", "--config", cfg], 1, "0000"),
        (
            &[
                "kill-switch",
                "engage",
                "--reason",
                "t",
                "--runbook",
                "nope",
                "--config",
                cfg,
            ],
            2,
            "is not a runbook",
        ),
        (
            &[
                "run", "disk", "--host", "web-01", "--host", "web-02", "--config", cfg,
            ],
            2,
            "give one --host",
        ),
        (
            &["run", "disk", "--host", "web-09", "--config", cfg],
            2,
            "web-09",
        ),
        (
            &["install", "print", "--host", "web-09", "--config", cfg],
            2,
            "no host named \"web-09\"",
        ),
        (
            &["alerts", "test", "/nonexistent.json", "--config", cfg],
            2,
            "cannot read /nonexistent.json",
        ),
        (&["approvals", "list", "--config", cfg], 2, "--token-file"),
        (&["agent"], 2, "only speaks on stdio"),
    ];
    for (args, code, says) in cases {
        let out = runwarden(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("runwarden: "))
            .collect();
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert_eq!(said.len(), 1, "{args:?}: said once: {stderr}");
        assert!(said[0].contains(says), "{args:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // A configuration that does not load: its problems as FILE:LINE lines,
    // then one line that sums them up.
    std::fs::write(
        dir.path().join("runbooks/disk.yaml"),
        "name: disk\nhosts: [web-01]\nautonomy: L9\n",
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines[0].contains("runbooks/disk.yaml:"), "{stderr}");
    assert!(
        lines.last().unwrap().starts_with("runwarden: ")
            && lines.last().unwrap().contains("nothing was loaded"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("runwarden: ").count(), 1, "{stderr}");
}

/// `--version` names the version and the commit it was built from.
#[test]
fn the_version_names_its_commit() {
    let out = runwarden(&["--version"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("runwarden {} (", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&want), "{text}");
    let commit = text.trim().trim_start_matches(&want).trim_end_matches(')');
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{text}"
    );
}

//! Verdicts that tell the truth: a failed step is what the run reports, not
//! a `when` that could not read it, and a host that cannot be reached ends
//! the run early with its name and the reason.

use serde_json::Value;

use crate::util::*;

fn two_steps(e: &Estate, first: &str, when: &str) -> (i32, Value) {
    e.runbook(
        "look",
        &format!("name: look\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage, list_processes] }}\nsteps:\n  - id: root\n{first}  - id: after\n    when: \"{when}\"\n    call: list_processes\n"),
    );
    e.run_json("look", "h", &[])
}

#[test]
fn a_when_over_a_step_that_did_not_succeed_is_false_and_the_run_reports_that_step() {
    let e = Estate::new();
    let df = e.script(
        "failing-df",
        "echo 'df: /tmp: Input/output error' >&2\nexit 1",
    );
    e.host(
        "h",
        &local_host(
            "h",
            &format!("paths: [/tmp]\nbinaries:\n  df: {}", df.display()),
        ),
    );
    let call = |path: &str| format!("    call: disk_usage\n    args: {{ path: {path} }}\n");
    // The call fails: the verdict is failed, naming that step.
    let (code, report) = two_steps(&e, &call("/tmp"), "steps.root.use_pct >= 90");
    assert_eq!(report["verdict"], "failed", "{report:#}");
    assert_eq!(code, 1);
    assert_eq!(step(&report, "after")["status"], "skipped");
    assert!(
        step(&report, "after")["detail"]
            .as_str()
            .unwrap()
            .contains("step root did not succeed")
    );
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("disk_usage"),
        "{report:#}"
    );
    // The call is refused: the verdict is denied.
    let (code, report) = two_steps(&e, &call("/etc"), "steps.root.use_pct >= 90");
    assert_eq!(
        (code, report["verdict"].as_str().unwrap()),
        (3, "denied"),
        "{report:#}"
    );
    assert_eq!(step(&report, "after")["status"], "skipped");
    // A skipped step read by a later `when`.
    e.runbook(
        "chain",
        "name: chain\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage, list_processes] }\nsteps:\n  - id: never\n    when: \"false\"\n    call: list_processes\n  - id: after\n    when: \"steps.never.total > 0\"\n    call: list_processes\n",
    );
    let (code, report) = e.run_json("chain", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(step(&report, "after")["status"], "skipped");
    // A `when` with a real mistake over a step that succeeded is still broken.
    let ok = e.script("ok-ps", "exec /bin/ps \"$@\"");
    e.host(
        "h",
        &local_host(
            "h",
            &format!("paths: [/tmp]\nbinaries:\n  ps: {}", ok.display()),
        ),
    );
    let (code, report) = two_steps(
        &e,
        "    call: list_processes\n",
        "steps.root.no_such_field.x > 1",
    );
    assert_eq!(
        (code, report["verdict"].as_str().unwrap()),
        (6, "broken"),
        "{report:#}"
    );
}

#[test]
fn a_host_that_cannot_be_reached_ends_the_run_after_two_calls_naming_it() {
    let e = Estate::new();
    let key = e.work().join("id");
    keygen(&key);
    let kh = e.work().join("known_hosts");
    std::fs::write(&kh, "").unwrap();
    // Nothing listens on this loopback port: every connection is refused.
    let port = free_port();
    e.host(
        "far",
        &format!("name: far\nconnection:\n  ssh:\n    address: 127.0.0.1\n    port: {port}\n    user: rw-agent\n    identity: {}\n    known_hosts: {}\n", key.display(), kh.display()),
    );
    let mut steps = String::new();
    for i in 0..6 {
        steps += &format!("  - id: s{i}\n    call: list_processes\n");
    }
    e.runbook(
        "far",
        &format!("name: far\ndescription: t\nhosts: [far]\nautonomy: L3\ntools: {{ observe: [list_processes] }}\nsteps:\n{steps}"),
    );
    let (code, report) = e.run_json("far", "far", &[]);
    assert_eq!(report["verdict"], "failed", "{report:#}");
    assert_eq!(code, 1);
    let detail = report["verdict_detail"].as_str().unwrap();
    assert!(detail.contains("host far cannot be reached"), "{detail}");
    assert_eq!(
        e.audit_phase("intent").len(),
        2,
        "the run stopped after two calls"
    );
}

/// A host with a rotatable log and runbook `rot` at `autonomy`: look, then rotate.
fn rotation(e: &Estate, autonomy: &str) -> String {
    let (conf, state) = rotatable_log(e);
    e.host(
        "h",
        &local_host(
            "h",
            &format!("paths: [/tmp]\nlogrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    e.runbook(
        "rot",
        &format!("name: rot\ndescription: t\nhosts: [h]\nautonomy: {autonomy}\ntools: {{ observe: [disk_usage], approve: [rotate_logs] }}\nsteps:\n  - id: look\n    call: disk_usage\n    args: {{ path: /tmp }}\n  - id: rotate\n    call: rotate_logs\n    args: {{ config: {conf} }}\n    reason: the log is large\n"),
    );
    state
}

#[test]
fn a_dry_run_says_what_would_change_and_how_it_would_be_verified() {
    for autonomy in ["L3", "L2"] {
        let e = Estate::new();
        let state = rotation(&e, autonomy);
        let (code, report) = e.run_json("rot", "h", &["--dry-run"]);
        assert_eq!(code, 0, "{autonomy}: {report:#}");
        assert_eq!(report["mutations"], 0, "{autonomy}: nothing changed");
        let detail = report["verdict_detail"].as_str().unwrap();
        assert!(
            detail.contains("dry run: 1 change(s) would run"),
            "{autonomy}: {detail}"
        );
        let rotate = step(&report, "rotate");
        assert_eq!(rotate["status"], "dry_run", "{autonomy}: {rotate:#}");
        assert_eq!(rotate["argv"][0][0], "/usr/sbin/logrotate", "{autonomy}");
        if autonomy == "L2" {
            assert!(
                rotate["detail"]
                    .as_str()
                    .unwrap()
                    .contains("a person would be asked")
            );
        }
        let out = e.run(&["run", "rot", "--host", "h", "--dry-run"]);
        let text = String::from_utf8_lossy(&out.stdout);
        for says in [
            "would run (dry run: not run)",
            "would run: [\"/usr/sbin/logrotate\"",
            "would verify: exit status, no error lines, state file updated",
        ] {
            assert!(text.contains(says), "{autonomy}: no {says:?} in:\n{text}");
        }
        assert!(!text.contains("every change verified"), "{text}");
        assert!(
            !std::path::Path::new(&state).exists(),
            "{autonomy}: logrotate never ran"
        );
    }
}

/// `host check` says whether the host refused, timed out or answered garbage.
#[test]
fn host_check_names_how_a_host_could_not_be_reached() {
    use std::io::{Read, Write};
    // Refused: nothing listens. Timed out: a listener that never speaks.
    // Garbage: a listener that answers something that is not SSH.
    let closed = free_port();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let junk = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let junk_port = junk.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in junk.incoming().flatten() {
            let mut c = c;
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n\x00\x01garbage\r\n");
            let mut buf = [0u8; 256];
            let _ = c.read(&mut buf);
        }
    });
    let e = Estate::new();
    let key = e.work().join("id");
    keygen(&key);
    let kh = e.work().join("known_hosts");
    std::fs::write(&kh, "").unwrap();
    for (port, kind) in [
        (closed, "refused"),
        (silent.local_addr().unwrap().port(), "timed out"),
        (junk_port, "answered garbage"),
    ] {
        e.host(
            "far",
            &format!("name: far\nconnection:\n  ssh:\n    address: 127.0.0.1\n    port: {port}\n    user: rw-agent\n    identity: {}\n    known_hosts: {}\n", key.display(), kh.display()),
        );
        let out = e.run(&["host", "check", "far"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{kind}: {text}");
        assert!(
            text.contains(&format!("host far: {kind}: ")),
            "{kind}: {text}"
        );
    }
    drop(silent);
}

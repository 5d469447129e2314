//! The shipped binary with a user's own tool, the kill switch's command,
//! and what it prints for a person to install or to read.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

/// A tier-2 tool of the user's own: it writes a marker file, its verify
/// reads the marker back, and its undo removes it. `expect` is what verify
/// must see.
fn marker_tool(e: &Estate, expect: &str) {
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/mark_ready.yaml"),
        format!(
            "name: mark_ready\ntier: 2\ndescription: Mark a directory ready for the app.\nverb: marked\nargs:\n  dir: {{ type: path }}\n\
             run: [/usr/bin/touch, \"{{{{ dir }}}}/READY\"]\n\
             verify:\n  run: [/usr/bin/ls, \"{{{{ dir }}}}\"]\n  expect_stdout: '^{expect}$'\n\
             undo:\n  run: [/usr/bin/rm, -f, \"{{{{ dir }}}}/READY\"]\n"
        ),
    )
    .unwrap();
}

fn marker_estate(expect: &str) -> (Estate, std::path::PathBuf) {
    let e = Estate::new();
    let dir = e.work().join("app");
    std::fs::create_dir_all(&dir).unwrap();
    marker_tool(&e, expect);
    e.host(
        "h",
        &local_host("h", &format!("paths: [{}]", dir.display())),
    );
    e.runbook(
        "ready",
        &format!(
            "name: ready\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ approve: [mark_ready] }}\nsteps:\n  - call: mark_ready\n    args: {{ dir: {} }}\n    reason: the app waits for its marker\n",
            dir.display()
        ),
    );
    (e, dir)
}

/// A declared tier-2 tool that verifies: `ok`, its change on disk, its
/// evidence in the report. One whose verify does not see the change: its
/// undo runs, the change is gone, and the run failed.
#[test]
fn a_declared_tier2_tool_verifies_and_one_that_does_not_is_undone() {
    let (e, dir) = marker_estate("READY");
    let (code, report) = e.run_json("ready", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["steps"][0]["result"]["verified"], true, "{report:#}");
    assert!(dir.join("READY").exists());
    assert_eq!(report["mutations"], 1);

    std::fs::remove_file(dir.join("READY")).unwrap();
    let (e, dir) = marker_estate("SOMETHING-ELSE");
    let (code, report) = e.run_json("ready", "h", &[]);
    assert_eq!(report["verdict"], "failed", "{report:#}");
    assert_eq!(code, 1);
    let data = &report["steps"][0]["result"]["data"];
    assert_eq!(data["undo"]["ok"], true, "{report:#}");
    assert!(!dir.join("READY").exists(), "undone");
    assert!(e.run(&["audit", "verify"]).status.success());
}

/// `kill-switch engage` during a run: the call in flight finishes, the
/// next is refused, the run is `halted` (exit 7); `status` says engaged
/// (exit 1) and `release` lets the next run through.
#[test]
fn the_kill_switch_engaged_by_its_command_during_a_run_halts_it() {
    let e = Estate::new();
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/slow_look.yaml"),
        "name: slow_look\ntier: 1\ndescription: Take a while to look.\nargs:\n  secs: { type: integer, min: 1, max: 10 }\nrun: [/usr/bin/sleep, \"{{ secs }}\"]\n",
    )
    .unwrap();
    e.host("h", &local_host("h", ""));
    let mut rb =
        "name: slow\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [slow_look] }\nsteps:\n"
            .to_string();
    for _ in 0..3 {
        rb += "  - call: slow_look\n    args: { secs: 2 }\n";
    }
    e.runbook("slow", &rb);
    let child = e
        .cmd(&["run", "slow", "--host", "h", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the first call", Duration::from_secs(10), || {
        (!e.audit_phase("intent").is_empty()).then_some(())
    });
    let engaged = e.run(&[
        "kill-switch",
        "engage",
        "--reason",
        "on-call looks at web-01",
    ]);
    assert!(
        engaged.status.success(),
        "{}",
        String::from_utf8_lossy(&engaged.stderr)
    );
    let out = child.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "halted", "{report:#}");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(e.audit_phase("intent").len(), 1, "no call after the switch");
    let denied = e.audit_phase("denied");
    assert_eq!(denied[0]["detail"]["reason"], "kill_switch", "{denied:#?}");
    assert!(denied[0].to_string().contains("on-call looks at web-01"));
    assert_eq!(e.run(&["kill-switch", "status"]).status.code(), Some(1));
    assert!(e.run(&["kill-switch", "release"]).status.success());
    assert_eq!(e.run(&["kill-switch", "status"]).status.code(), Some(0));
}

/// `install print` writes what a host needs (the agent's policy among
/// them), and `tools --json` lists every tool with its tier from the
/// registry and its schema, the user's own included.
#[test]
fn install_print_and_tools_json() {
    let (e, _) = marker_estate("READY");
    let out = e.run(&["install", "print", "--host", "h"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("### /usr/lib/sysusers.d/runwarden-observe.conf"),
        "{text}"
    );
    assert!(
        text.contains("m runwarden-observe systemd-journal"),
        "{text}"
    );
    let out = e.run(&["tools", "--json"]);
    assert!(out.status.success());
    let tools: Value = serde_json::from_slice(&out.stdout).unwrap();
    let all = tools
        .as_array()
        .or_else(|| tools["tools"].as_array())
        .unwrap_or_else(|| panic!("{tools:#}"));
    let of = |name: &str| {
        all.iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {tools:#}"))
    };
    assert_eq!(of("disk_usage")["tier"], 1);
    assert_eq!(of("restart_service")["tier"], 2);
    assert_eq!(of("mark_ready")["tier"], 2);
    assert_eq!(
        of("disk_usage")["parameters"]["type"],
        "object",
        "{tools:#}"
    );
}

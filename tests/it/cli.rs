//! The command line: `check` errors with locations, `tools`, `audit verify/show`, the kill switch.

use std::process::Command;

use crate::util::*;

#[test]
fn check_accepts_the_repository_config() {
    let out = std::process::Command::new(bin())
        .args(["check", "--config"])
        .arg(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for rb in [
        "staging-disk-full",
        "worker-pool-recycle",
        "cert-expiry",
        "local-health",
        "disk-almost-full",
    ] {
        assert!(text.contains(&format!("runbook {rb}")), "{text}");
    }
}

#[test]
fn check_reports_every_problem_with_file_line_and_column() {
    let e = Estate::new();
    e.host("web", "name: web\nconnection: local\npaths: [/var, relative/path]\nunits: [nginx.service, \"nginx.service; rm -rf /\"]\n");
    e.runbook(
        "bad",
        "name: bad\ndescription: d\nhosts: [web, nowhere]\nautonomy: L3\nschedule: \"61 * * *\"\ntools:\n  observe: [disk_usage, restart_service, restart_svc]\nbudget: { max_duration: forever }\nsteps:\n  - call: disk_usage\n    args: { path: /, depth: 3 }\n",
    );
    e.runbook(
        "dup",
        "name: bad\ndescription: d\nhosts: [web]\nautonomy: L2\n",
    );
    e.runbook(
        "typo",
        "name: typo\ndescription: d\nhosts: [web]\nautonomy: L3\nstepz: []\ncooldwn: 1h\n",
    );
    let out = e.run(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let root = e.path().display().to_string();
    for expected in [
        format!("{root}/hosts/web.yaml:3:15: paths: \"relative/path\" is not an absolute path"),
        format!(
            "{root}/hosts/web.yaml:4:24: units: \"nginx.service; rm -rf /\" is not a unit name"
        ),
        format!("{root}/runbooks/bad.yaml:3:14: host \"nowhere\" is not defined in hosts/"),
        format!("{root}/runbooks/bad.yaml:5:11: schedule \"61 * * *\" has 4 fields, not 5"),
        format!(
            "{root}/runbooks/bad.yaml:7:25: \"restart_service\" is a tier-2 tool (it changes the host); list it under tools.approve"
        ),
        format!(
            "{root}/runbooks/bad.yaml:7:42: unknown tool \"restart_svc\" (did you mean \"restart_service\"?)"
        ),
        format!("{root}/runbooks/bad.yaml:8:25: budget.max_duration \"forever\" is not a duration"),
        format!(
            "{root}/runbooks/bad.yaml:11:29: arguments of \"disk_usage\": unknown field `depth`"
        ),
        format!(
            "{root}/runbooks/dup.yaml:1:7: runbook \"bad\" is defined twice (also in {root}/runbooks/bad.yaml)"
        ),
        format!("{root}/runbooks/typo.yaml:5:1: unknown field `stepz` (did you mean \"steps\"?)"),
        // Every unknown field of the file at once, not one per `check`.
        format!(
            "{root}/runbooks/typo.yaml:6:1: unknown field `cooldwn` (did you mean \"cooldown\"?)"
        ),
    ] {
        assert!(err.contains(&expected), "missing {expected:?} in:\n{err}");
    }
    assert!(out.stdout.is_empty(), "nothing is reported as loaded");
}

#[test]
fn tools_json_lists_every_tool_with_its_schema() {
    let out = std::process::Command::new(bin())
        .args(["tools", "--json"])
        .output()
        .unwrap();
    let tools: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    // Every built-in, and every tool this repository's tools/ declares.
    let declared = std::fs::read_dir("tools").unwrap().count();
    assert_eq!(tools.len(), runwarden::tools::Builtin::ALL.len() + declared);
    assert_eq!(
        tools.iter().filter(|t| t["source"] == "declared").count(),
        declared,
        "{tools:#?}"
    );
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let failed = tools.iter().find(|t| t["name"] == "failed_units").unwrap();
    assert_eq!(failed["tier"], 1, "{failed:#}");
    assert!(
        !names
            .iter()
            .any(|n| n.contains("shell") || n.contains("exec"))
    );
    for t in &tools {
        let tier = t["tier"].as_u64().unwrap();
        assert!(tier == 1 || tier == 2);
        let required = t["parameters"]["required"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(required.contains(&"reason".into()), tier == 2, "{t:#}");
    }
}

#[test]
fn audit_verify_and_show_follow_a_real_run() {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    e.runbook("look", "name: look\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n  - suggest: \"rm -rf /tmp/old (a person decides)\"\n");
    let (code, report) = e.run_json("look", "h", &[]);
    assert_eq!(code, 0);
    let run_id = report["run_id"].as_str().unwrap().to_string();
    let lines = e.audit();
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(
        phases,
        ["start", "intent", "result", "suggestion", "verdict"]
    );
    assert!(
        lines.iter().all(|l| l["run_id"] == run_id.as_str()
            && l["runbook_version"].as_str().unwrap().len() == 64)
    );

    let out = e.run(&["audit", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = e.run(&["audit", "show", &run_id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("intent") && text.contains("disk_usage") && !text.contains("INTERRUPTED"),
        "{text}"
    );

    // Drop the result line: the chain breaks there, and `show` marks the intent.
    let raw = std::fs::read_to_string(e.audit_path()).unwrap();
    let mut kept: Vec<&str> = raw.lines().collect();
    kept.remove(2);
    std::fs::write(e.audit_path(), kept.join("\n") + "\n").unwrap();
    let out = e.run(&["audit", "verify"]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("audit.jsonl:3: chain broken"), "{text}");
    let out = e.run(&["audit", "show", &run_id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("INTERRUPTED"));
}

#[test]
fn kill_switch_cli_engages_and_releases() {
    let e = Estate::new();
    let out = e.run(&["kill-switch", "engage", "--reason", "INC-1 testing"]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(e.path().join("kill-switch/ENGAGED")).unwrap();
    assert!(text.contains("reason: INC-1 testing") && text.contains("engaged_by: "));
    let out = e.run(&["kill-switch", "status"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ENGAGED global"));
    assert!(e.run(&["kill-switch", "release"]).status.success());
    assert!(!e.path().join("kill-switch/ENGAGED").exists());
}

#[test]
fn the_quick_start_runbook_runs_on_this_machine() {
    let e = Estate::new();
    e.shipped_runbook("local-health");
    e.host(
        "local",
        &std::fs::read_to_string(repo().join("hosts/local.yaml")).unwrap(),
    );
    let (code, report) = e.run_json("local-health", "local", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(steps_with(&report, "ok").len(), 4);
    assert!(
        step(&report, "root")["result"]["data"]["use_pct"]
            .as_u64()
            .unwrap()
            <= 100
    );
    assert!(
        !step(&report, "cpu")["result"]["data"]["processes"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(e.run(&["audit", "verify"]).status.success());
}

/// `check` refuses exactly what `serve` refuses, with the same words.
#[test]
fn check_refuses_what_serve_refuses() {
    let missing = std::path::Path::new("/nonexistent/runwarden-config");
    let out = Command::new(bin())
        .args(["check", "--config"])
        .arg(missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    let empty = Estate::new();
    let out = empty.run(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no runbook and no host"), "{err}");

    type Break = (&'static str, fn(&Estate), &'static str);
    let cases: [Break; 5] = [
        (
            "listen beyond loopback, no token",
            |e| std::fs::write(e.path().join("runwarden.yaml"), "listen: 0.0.0.0:9731\n").unwrap(),
            "refusing to listen on 0.0.0.0:9731 without a webhook token",
        ),
        (
            "a token file that is missing",
            |e| {
                std::fs::write(
                    e.path().join("runwarden.yaml"),
                    "webhook_token_file: token\n",
                )
                .unwrap()
            },
            "cannot read webhook_token_file",
        ),
        (
            "an approvers file that is missing",
            |e| {
                std::fs::write(
                    e.path().join("runwarden.yaml"),
                    "approvers_file: approvers\n",
                )
                .unwrap()
            },
            "cannot read principals file",
        ),
        (
            "an approvers file others can read",
            |e| {
                std::fs::write(e.path().join("approvers"), "alice alice-token-0123456789\n")
                    .unwrap();
                std::fs::write(
                    e.path().join("runwarden.yaml"),
                    "approvers_file: approvers\n",
                )
                .unwrap()
            },
            "chmod 600",
        ),
        (
            "an L2 runbook and no approvers",
            |e| {
                e.runbook("l2", "name: l2\ndescription: t\nhosts: [h]\nautonomy: L2\ntools: { observe: [disk_usage], approve: [restart_service] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n");
            },
            "is autonomy L2, but runwarden.yaml sets no principals_file",
        ),
    ];
    for (what, break_it, says) in cases {
        let e = Estate::new();
        e.host("h", &local_host("h", "paths: [/tmp]"));
        e.runbook("df", "name: df\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n");
        assert_eq!(
            e.run(&["check"]).status.code(),
            Some(0),
            "{what}: the base is fine"
        );
        break_it(&e);
        let check = e.run(&["check"]);
        // Bounded: a serve that accepted it would run until stopped.
        let mut serve = Command::new("/usr/bin/timeout");
        serve.args(["10", bin(), "serve", "--config"]).arg(e.path());
        if !what.starts_with("listen") {
            serve.args(["--listen", "127.0.0.1:0"]);
        }
        let serve = serve.output().unwrap();
        for (cmd, out) in [("check", &check), ("serve", &serve)] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{what}: {cmd} accepted it");
            assert!(err.contains(says), "{what}: {cmd} says:\n{err}");
        }
    }
}

#[test]
fn check_and_serve_warn_of_ssh_files_that_are_not_there() {
    let e = Estate::new();
    e.host("remote", "name: remote\nconnection:\n  ssh:\n    address: 127.0.0.1\n    user: rw-agent\n    identity: /nonexistent/id_ed25519\n    known_hosts: /nonexistent/known_hosts\n");
    let out = e.run(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for says in [
        "warning: ",
        "ssh.identity /nonexistent/id_ed25519",
        "ssh.known_hosts /nonexistent/known_hosts",
        "every call to host \"remote\" fails",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
}

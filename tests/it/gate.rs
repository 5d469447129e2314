//! The gate, seen from outside: every refusal is audited, never crashes a
//! run, and nothing refused ever runs.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

fn rotating_runbook(autonomy: &str, max_mutations: u32, calls: usize, conf: &str) -> String {
    let mut rb = format!(
        "name: rot\ndescription: t\nhosts: [h]\nautonomy: {autonomy}\ntools:\n  approve: [rotate_logs]\nbudget: {{ max_steps: 12, max_mutations: {max_mutations} }}\nsteps:\n"
    );
    for i in 0..calls {
        rb += &format!(
            "  - id: r{i}\n    call: rotate_logs\n    args: {{ config: {conf} }}\n    reason: \"rotation {i}\"\n"
        );
    }
    rb
}

#[test]
fn fourth_mutation_is_refused_and_audited() {
    let e = Estate::new();
    let (conf, state) = rotatable_log(&e);
    e.host(
        "h",
        &local_host(
            "h",
            &format!("logrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    e.runbook("rot", &rotating_runbook("L3", 3, 4, &conf));
    let (code, report) = e.run_json("rot", "h", &[]);
    assert_eq!(report["verdict"], "budget_exhausted", "{report:#}");
    assert_eq!(code, 5);
    assert_eq!(steps_with(&report, "ok").len(), 3);
    let denied = steps_with(&report, "denied");
    assert_eq!(denied.len(), 1);
    assert!(
        denied[0]["detail"]
            .as_str()
            .unwrap()
            .contains("mutation_budget")
    );
    assert_eq!(
        e.audit_phase("intent").len(),
        3,
        "only three calls were dispatched"
    );
    let d = e.audit_phase("denied");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["detail"]["reason"], "mutation_budget");
    assert_eq!(d[0]["step"], 4);
    for i in e.audit_phase("intent") {
        assert_eq!(i["approved_by"], "standing:rot");
        assert_eq!(i["tier"], 2);
    }
    assert!(std::path::Path::new(&format!("{}/logs/app.log.3", e.work().display())).exists());
    assert!(!std::path::Path::new(&format!("{}/logs/app.log.4", e.work().display())).exists());
}

#[test]
fn l1_records_proposals_and_runs_nothing() {
    let e = Estate::new();
    let (conf, state) = rotatable_log(&e);
    e.host(
        "h",
        &local_host(
            "h",
            &format!("logrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    e.runbook("rot", &rotating_runbook("L1", 3, 1, &conf));
    let (code, report) = e.run_json("rot", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    let p = steps_with(&report, "proposed");
    assert_eq!(p.len(), 1);
    assert!(
        p[0]["argv"][0]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--force")
    );
    assert!(
        !std::path::Path::new(&state).exists(),
        "logrotate never ran"
    );
    assert!(e.audit_phase("intent").is_empty());
    assert_eq!(e.audit_phase("proposal").len(), 1);
}

#[test]
fn dry_run_shows_argv_and_runs_no_change() {
    let e = Estate::new();
    let (conf, state) = rotatable_log(&e);
    e.host(
        "h",
        &local_host(
            "h",
            &format!("paths: [/tmp]\nlogrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    let mut rb = rotating_runbook("L3", 3, 1, &conf);
    rb = rb.replace("tools:\n", "tools:\n  observe: [disk_usage]\n");
    rb += "  - id: look\n    call: disk_usage\n    args: { path: /tmp }\n";
    e.runbook("rot", &rb);
    let (code, report) = e.run_json("rot", "h", &["--dry-run"]);
    assert_eq!(code, 0, "{report:#}");
    let dry = step(&report, "r0");
    assert_eq!(dry["status"], "dry_run");
    let argv: Vec<String> = serde_json::from_value(dry["argv"][0].clone()).unwrap();
    assert_eq!(
        argv,
        [
            "/usr/sbin/logrotate",
            "--verbose",
            "--force",
            "--state",
            state.as_str(),
            conf.as_str()
        ]
    );
    assert_eq!(
        step(&report, "look")["status"],
        "ok",
        "tier-1 calls run for real in a dry run"
    );
    assert!(
        !std::path::Path::new(&state).exists(),
        "logrotate never ran"
    );
    assert_eq!(e.audit_phase("dry_run").len(), 1);
}

#[test]
fn a_host_the_runbook_does_not_name_is_a_usage_error_and_nothing_starts() {
    let e = Estate::new();
    e.host("inside", &local_host("inside", "paths: [/tmp]"));
    e.host("outside", &local_host("outside", "paths: [/tmp]"));
    e.runbook(
        "look",
        "name: look\ndescription: t\nhosts: [inside]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    // Asked for on the command line: a usage error, and nothing starts. (The
    // gate's own refusal of every such call is a unit test of the gate.)
    let out = e.run(&["run", "look", "--host", "outside"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("runbook \"look\" does not name host \"outside\" (its hosts: inside)"),
        "{err}"
    );
    assert!(e.audit().is_empty(), "nothing ran, nothing was audited");
}

#[test]
fn templated_and_symlinked_paths_are_checked_like_literals() {
    let e = Estate::new();
    let allowed = e.work().join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    std::os::unix::fs::symlink("/etc", allowed.join("escape")).unwrap();
    e.host(
        "h",
        &local_host("h", &format!("paths: [{}]", allowed.display())),
    );
    e.runbook(
        "paths",
        &format!(
            "name: paths\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nsteps:
  - id: fine
    call: disk_usage
    args: {{ path: {a} }}
  - id: templated
    call: disk_usage
    args: {{ path: \"{{{{ '/etc' }}}}\" }}
  - id: symlink
    call: disk_usage
    args: {{ path: {a}/escape }}
  - id: dotdot
    call: disk_usage
    args: {{ path: {a}/../../../etc }}
  - id: shell
    call: disk_usage
    args: {{ path: \"{a}; rm -rf /\" }}
",
            a = allowed.display()
        ),
    );
    let (code, report) = e.run_json("paths", "h", &[]);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(step(&report, "fine")["status"], "ok");
    for id in ["templated", "symlink", "dotdot", "shell"] {
        let s = step(&report, id);
        assert_eq!(s["status"], "denied", "{id}: {s:#}");
        assert!(
            s["detail"].as_str().unwrap().contains("invalid_arguments"),
            "{id}: {s:#}"
        );
    }
    assert!(
        step(&report, "symlink")["detail"]
            .as_str()
            .unwrap()
            .contains("resolves to \\\"/etc\\\"")
            || step(&report, "symlink")["detail"]
                .as_str()
                .unwrap()
                .contains("/etc")
    );
    assert_eq!(e.audit_phase("intent").len(), 1);
}

#[test]
fn step_limit_stops_the_run() {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    let mut rb = "name: many\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nbudget: { max_steps: 2 }\nsteps:\n".to_string();
    for _ in 0..4 {
        rb += "  - call: disk_usage\n    args: { path: /tmp }\n";
    }
    e.runbook("many", &rb);
    let (code, report) = e.run_json("many", "h", &[]);
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(report["verdict"], "step_limit");
    assert_eq!(
        report["steps"].as_array().unwrap().len(),
        3,
        "the run stops at the first refused step"
    );
    assert_eq!(e.audit_phase("intent").len(), 2);
}

#[test]
fn kill_switch_engaged_before_the_run_halts_it_before_any_call() {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    e.runbook("look", "name: look\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n");
    std::fs::write(e.path().join("kill-switch/ENGAGED"), "").unwrap();
    let (code, report) = e.run_json("look", "h", &[]);
    assert_eq!(code, 7, "{report:#}");
    assert_eq!(report["verdict"], "halted");
    assert!(e.audit_phase("intent").is_empty());
    assert_eq!(
        e.audit_phase("denied")[0]["detail"]["reason"],
        "kill_switch"
    );
    // A missing kill-switch directory is engaged too.
    std::fs::remove_dir_all(e.path().join("kill-switch")).unwrap();
    let (code, report) = e.run_json("look", "h", &[]);
    assert_eq!(code, 7);
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("fail closed"),
        "{report:#}"
    );
}

#[test]
fn kill_switch_engaged_during_a_run_stops_it_before_the_next_call() {
    let e = Estate::new();
    let slow = e.script("slow-ps", "sleep 1.5\necho '1 0 root S 1 0.0 100 init'");
    e.host(
        "h",
        &local_host("h", &format!("binaries: {{ ps: {} }}", slow.display())),
    );
    let mut rb = "name: slow\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n".to_string();
    for _ in 0..3 {
        rb += "  - call: list_processes\n";
    }
    e.runbook("slow", &rb);
    let child = e
        .cmd(&["run", "slow", "--host", "h", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    std::fs::write(e.path().join("kill-switch/ENGAGED"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "halted", "{report:#}");
    assert_eq!(
        steps_with(&report, "ok").len(),
        1,
        "the call in flight finished"
    );
    assert_eq!(e.audit_phase("intent").len(), 1, "no call after the switch");
}

#[test]
fn kill_switch_engaged_while_an_intent_line_syncs_stops_that_call_before_dispatch() {
    let e = Estate::new();
    let ran = e.work().join("ps-ran");
    let ps = e.script(
        "recording-ps",
        &format!(
            "date +%s.%N >> {}\necho '1 0 root S 1 0.0 100 init'",
            ran.display()
        ),
    );
    e.host(
        "h",
        &local_host("h", &format!("binaries: {{ ps: {} }}", ps.display())),
    );
    let mut rb = "name: many\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n".to_string();
    for _ in 0..20 {
        rb += "  - call: list_processes\n";
    }
    e.runbook("many", &rb);
    let child = e
        .cmd(&["run", "many", "--host", "h", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A stalling disk: each sync held 2 s, so the run spends its time in
    // intent lines' syncs, after the gate's check and before dispatch.
    let stall = StalledDisk::hold(
        child.id(),
        Duration::from_secs(2),
        &e.work().join("strace.log"),
    );
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::write(e.path().join("kill-switch/ENGAGED"), "").unwrap();
    let engaged = jiff::Timestamp::now().as_nanosecond() as f64 / 1e9;
    let out = child.wait_with_output().unwrap();
    stall.release();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "halted", "{report:#}");
    no_call_after(&ran, engaged, "the switch engaged");
    // The held intent is closed: not dispatched, refused by the kill switch.
    let last_intent = e.audit_phase("intent").last().cloned().unwrap();
    let closing: Vec<Value> = e
        .audit_phase("result")
        .into_iter()
        .filter(|l| l["step"] == last_intent["step"])
        .collect();
    assert_eq!(closing.len(), 1, "{closing:#?}");
    assert!(
        closing[0]["detail"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("not dispatched")),
        "{closing:#?}"
    );
    let denied = e.audit_phase("denied");
    assert_eq!(denied[0]["step"], last_intent["step"], "{denied:#?}");
    assert_eq!(denied[0]["detail"]["reason"], "kill_switch");
}

#[test]
fn unwritable_audit_log_means_no_call_runs() {
    let e = Estate::new();
    let (conf, state) = rotatable_log(&e);
    e.host(
        "h",
        &local_host(
            "h",
            &format!("logrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    e.runbook("rot", &rotating_runbook("L3", 3, 1, &conf));
    // /dev/full would accept the open and fail every write with ENOSPC; it
    // is no regular file, so the log refuses it before anything (a full
    // filesystem's ENOSPC is `hardening::a_full_audit_filesystem_...`).
    std::fs::write(e.path().join("runwarden.yaml"), "audit_log: /dev/full\n").unwrap();
    let out = e.run(&["run", "rot", "--host", "h"]);
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/dev/full is a character device, not a regular file"),
        "{err}"
    );
    assert!(
        !std::path::Path::new(&state).exists(),
        "logrotate never ran"
    );
}

#[test]
fn a_hanging_tool_is_killed_with_its_process_group() {
    let e = Estate::new();
    let t = tag();
    let hang = e.script(
        "hang",
        &format!("trap '' TERM\n/bin/sleep 60.{t} &\nexec /bin/sleep 61.{t}\n"),
    );
    e.host(
        "h",
        &local_host(
            "h",
            &format!("tool_timeout: 1s\nbinaries: {{ ps: {} }}", hang.display()),
        ),
    );
    e.runbook("hang", "name: hang\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n  - id: ps\n    call: list_processes\n");
    let started = Instant::now();
    let (code, report) = e.run_json("hang", "h", &[]);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "timeout plus grace, not the sleep"
    );
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(step(&report, "ps")["status"], "timeout");
    // The tool and its child: gone, or dead orphans waiting for PID 1 to
    // reap them (never runwarden's zombies).
    let left = alive_with(&format!(".{t}"));
    assert!(left.is_empty(), "survived: {left:?}");
}

#[test]
fn a_tool_printing_100_mb_is_capped_without_memory_blowup() {
    let e = Estate::new();
    let big = e.script("big", "head -c 100000000 /dev/zero");
    e.host(
        "h",
        &local_host("h", &format!("binaries: {{ ps: {} }}", big.display())),
    );
    e.runbook("big", "name: big\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n  - id: ps\n    call: list_processes\n");
    let mut cmd = e.cmd(&["run", "big", "--host", "h", "--json"]);
    cmd.env_remove("RUST_BACKTRACE");
    let (out, _, rss) = run_measured(cmd);
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let s = step(&report, "ps");
    assert_eq!(s["status"], "ok", "{s:#}");
    assert_eq!(s["result"]["truncated"], true);
    assert!(rss < 100 * 1024, "peak RSS of runwarden was {rss} KiB");
}

/// `fleet_budget` in runwarden.yaml: eight `runwarden run` processes at
/// once, each wanting one rotation on a host of its own, under a budget of
/// three per hour: exactly three logs rotate, the other five calls are
/// refused as `fleet_budget` and audited, and their runs end
/// `budget_exhausted`. A dry run before them counts nothing; a runbook's
/// own budget then holds for its calls alone.
#[test]
fn the_fleet_budget_holds_across_concurrent_processes() {
    let e = Estate::new();
    let hosts: Vec<String> = (1..=8).map(|i| format!("h{i}")).collect();
    let work = e.work();
    for h in &hosts {
        let (conf, state) = rotatable_log_in(&e, &format!("logs-{h}"), &format!("lr-{h}"));
        e.host(
            h,
            &local_host(
                h,
                &format!("logrotate_configs: [{conf}]\nlogrotate_state: {state}"),
            ),
        );
    }
    let runbook = |name: &str, own: &str| {
        format!(
            "name: {name}\ndescription: t\nhosts: [{}]\nautonomy: L3\ntools:\n  approve: [rotate_logs]\n{own}steps:\n  - call: rotate_logs\n    args: {{ config: \"{}/lr-{{{{ run.host }}}}.conf\" }}\n    reason: \"the fleet test\"\n",
            hosts.join(", "),
            work.display()
        )
    };
    e.runbook("fleet", &runbook("fleet", ""));
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "fleet_budget: { max_mutations: 3, per: 1h }\n",
    )
    .unwrap();
    let out = e.run(&["check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (code, report) = e.run_json("fleet", "h1", &["--dry-run"]);
    assert_eq!(
        (code, report["verdict"].as_str()),
        (0, Some("ok")),
        "{report:#}"
    );

    let runs: Vec<_> = hosts
        .iter()
        .map(|h| {
            e.cmd(&["run", "fleet", "--host", h, "--json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let verdicts: Vec<String> = runs
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let r: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&out.stderr)));
            r["verdict"].as_str().unwrap().to_string()
        })
        .collect();
    let ok = verdicts.iter().filter(|v| *v == "ok").count();
    let spent = verdicts.iter().filter(|v| *v == "budget_exhausted").count();
    assert_eq!((ok, spent), (3, 5), "{verdicts:?}");
    let rotated = hosts
        .iter()
        .filter(|h| work.join(format!("logs-{h}/app.log.1")).exists())
        .count();
    assert_eq!(rotated, 3, "the hosts' own record: three logs rotated");
    let denied = e.audit_phase("denied");
    assert_eq!(denied.len(), 5);
    for d in &denied {
        assert_eq!(d["detail"]["reason"], "fleet_budget", "{d}");
        assert!(
            d["detail"]["message"]
                .as_str()
                .unwrap()
                .contains("every runbook's 3 tier-2 calls in 1h are taken"),
            "{d}"
        );
    }
    assert_eq!(e.audit_phase("intent").len(), 3);

    // A runbook's own budget: one call per hour for `once`, whatever the
    // fleet-wide one says (raised here so only the runbook's can refuse).
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "fleet_budget: { max_mutations: 100, per: 1h }\n",
    )
    .unwrap();
    e.runbook(
        "once",
        &runbook("once", "fleet_budget: { max_mutations: 1, per: 10m }\n"),
    );
    let (code, first) = e.run_json("once", "h1", &[]);
    assert_eq!(
        (code, first["verdict"].as_str()),
        (0, Some("ok")),
        "{first:#}"
    );
    let (code, second) = e.run_json("once", "h2", &[]);
    assert_eq!(second["verdict"], "budget_exhausted", "{second:#}");
    assert_eq!(code, 5);
    let detail = steps_with(&second, "denied")[0]["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        detail.contains("runbook \"once\"'s") && detail.contains("fleet_budget in the runbook"),
        "{detail}"
    );
}

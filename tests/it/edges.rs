//! The edges where runwarden is operated: each class of finding from the
//! adversarial review, with variants. Every test here failed before its fix.
//!
//! Classes: the model-turn budget (a planner that never proposes a runnable
//! call), the audit line's shape (values no verifier could read), the
//! kill-switch command line, the webhook's durability (no 2xx for a trigger
//! that was not recorded), and process trees that detach from a tool call.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::model::{ModelServer, Turn, answer, call, calls};
use crate::util::*;

const KEY: &str = "sk-runwarden-edges-key";

/// Host `h` (/tmp) and model-planned runbook `agent` (max_steps 12) on `server`.
fn model_estate(server: &ModelServer, budget: &str) -> Estate {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    e.runbook(
        "agent",
        &format!(
            "name: agent\ndescription: t\nhosts: [h]\nautonomy: L3\ntools:\n  observe: [disk_usage]\nbudget: {{ {budget} }}\nagent:\n  goal: Look at /tmp.\n"
        ),
    );
    std::fs::write(e.path().join("runwarden.yaml"), server.settings("")).unwrap();
    e
}

fn run_model(e: &Estate) -> (i32, Value) {
    let out = e
        .cmd(&["run", "agent", "--host", "h", "--json"])
        .env("RUNWARDEN_MODEL_KEY", KEY)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "no report (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

// ---- the model-turn budget -------------------------------------------------

#[test]
fn a_model_stuck_on_calls_the_gate_never_runs_ends_with_step_limit_in_seconds() {
    type Stuck = (&'static str, fn() -> Turn);
    let stuck: [Stuck; 5] = [
        ("a tool that does not exist", || {
            call("run_shell", json!({ "cmd": "df" }))
        }),
        ("a tool the runbook does not list", || {
            call(
                "restart_service",
                json!({ "unit": "nginx.service", "reason": "x" }),
            )
        }),
        ("arguments that are not JSON", || {
            calls(&[("disk_usage", "{not json".to_string())])
        }),
        ("a path outside the allowlist", || {
            call("disk_usage", json!({ "path": "/etc" }))
        }),
        ("five unknown tools in every reply", || {
            calls(&vec![("nope", "{}".to_string()); 5])
        }),
    ];
    for (what, turn) in stuck {
        let server = ModelServer::start(move |_, _| turn());
        let e = model_estate(&server, "max_steps: 12, max_duration: 10m");
        let started = Instant::now();
        let (code, report) = run_model(&e);
        assert_eq!(report["verdict"], "step_limit", "{what}: {report:#}");
        assert_eq!(code, 4, "{what}");
        assert!(
            server.requests().len() <= 13,
            "{what}: {} model requests for a 12-step budget",
            server.requests().len()
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: {:?}",
            started.elapsed()
        );
        assert!(e.run(&["audit", "verify"]).status.success(), "{what}");
    }
}

#[test]
fn the_kill_switch_is_checked_before_every_model_request() {
    // Every turn asks for a slow call; the switch is engaged during the first.
    let server = ModelServer::start(|_, _| call("list_processes", json!({})));
    let e = model_estate(&server, "max_steps: 12, max_duration: 10m");
    let ps = e.script("slow-ps", "/bin/sleep 1.5\nexec /bin/ps \"$@\"");
    e.host(
        "h",
        &local_host(
            "h",
            &format!("paths: [/tmp]\nbinaries:\n  ps: {}", ps.display()),
        ),
    );
    let rb = std::fs::read_to_string(e.path().join("runbooks/agent.yaml")).unwrap();
    e.runbook(
        "agent",
        &rb.replace("[disk_usage]", "[disk_usage, list_processes]"),
    );
    let switch = e.path().join("kill-switch/ENGAGED");
    let engage = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        std::fs::write(&switch, "reason: test\n").unwrap();
    });
    let (code, report) = run_model(&e);
    engage.join().unwrap();
    assert_eq!(report["verdict"], "halted", "{report:#}");
    assert_eq!(code, 7);
    assert_eq!(
        server.requests().len(),
        1,
        "no model request is sent once the switch is engaged"
    );
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("kill switch"),
        "{report:#}"
    );
}

#[test]
fn a_model_stuck_past_max_steps_is_not_kept_alive_by_the_kill_switch_either() {
    // Two real calls, then a tool that does not exist, forever, slowly: the
    // run ends at its step limit, long before anyone reaches for the switch.
    let server = ModelServer::start(|n, _| {
        let turn = if n < 2 {
            call("disk_usage", json!({ "path": "/tmp" }))
        } else {
            call("nope", json!({}))
        };
        Turn::Sleep(Duration::from_millis(100), Box::new(turn))
    });
    let e = model_estate(&server, "max_steps: 2, max_duration: 10m");
    let started = Instant::now();
    let (_, report) = run_model(&e);
    assert_eq!(report["verdict"], "step_limit", "{report:#}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(server.requests().len() <= 3, "{}", server.requests().len());
    assert_eq!(steps_with(&report, "ok").len(), 2, "its findings are kept");
}

#[test]
fn max_duration_ends_a_model_that_never_proposes_a_runnable_call() {
    let server = ModelServer::start(|_, _| {
        Turn::Sleep(
            Duration::from_millis(300),
            Box::new(calls(&[("disk_usage", "[[[".to_string())])),
        )
    });
    let e = model_estate(&server, "max_steps: 1000, max_duration: 2s");
    let started = Instant::now();
    let (code, report) = run_model(&e);
    assert_eq!(report["verdict"], "budget_exhausted", "{report:#}");
    assert_eq!(code, 5);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_stuck_model_in_the_daemon_frees_its_runbook_and_host() {
    let server = ModelServer::start(|_, _| call("nope", json!({})));
    let e = model_estate(&server, "max_steps: 12, max_duration: 10m");
    let rb = std::fs::read_to_string(e.path().join("runbooks/agent.yaml")).unwrap();
    e.runbook(
        "agent",
        &format!("{rb}on_alert:\n  matchers: ['alertname=\"Stuck\"']\n  host_label: instance\n"),
    );
    let mut cmd = e.cmd(&["serve", "--listen", "127.0.0.1:0"]);
    cmd.env("RUNWARDEN_MODEL_KEY", KEY);
    let (child, addr) = start_serve(cmd);
    let _daemon = Proc(child);
    let addr = addr.as_str();
    let alert = |fp: &str| {
        format!(
            r#"{{"version":"4","status":"firing","receiver":"rw","groupKey":"{fp}","alerts":[{{"status":"firing","labels":{{"alertname":"Stuck","instance":"h"}},"annotations":{{}},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"{fp}"}}]}}"#
        )
    };
    let (status, body) = http(addr, "POST", "/api/v1/alerts", &alert("s1")).unwrap();
    assert_eq!(status, 200, "{body}");
    let verdict = wait_for("the stuck run to end", Duration::from_secs(30), || {
        let runs: Value = serde_json::from_str(&http(addr, "GET", "/api/v1/runs", "")?.1).ok()?;
        let status = runs["runs"][0]["status"].as_str()?.to_string();
        (status != "running" && status != "queued").then_some(status)
    });
    assert_eq!(verdict, "step_limit");
    assert!(server.requests().len() <= 13);
}

// ---- the audit line's shape --------------------------------------------------

fn nested(depth: usize) -> Value {
    (0..depth).fold(json!("x"), |v, _| json!({ "a": v }))
}

#[test]
fn any_value_a_planner_proposes_becomes_a_line_the_verifier_accepts() {
    let variants: [(&str, Value); 4] = [
        ("objects 120 deep", json!({ "path": nested(120) })),
        (
            "arrays 126 deep",
            serde_json::from_str(&format!("{}1{}", "[".repeat(126), "]".repeat(126))).unwrap(),
        ),
        (
            "objects 40 deep beside a valid path",
            json!({ "path": "/tmp", "x": nested(40) }),
        ),
        ("a 600 KB string", json!({ "path": "x".repeat(600 << 10) })),
    ];
    for (what, args) in variants {
        let args = args.to_string();
        let server = ModelServer::start(move |n, _| match n {
            0 => calls(&[("disk_usage", args.clone())]),
            _ => answer("done"),
        });
        let e = model_estate(&server, "max_steps: 12");
        let (_, report) = run_model(&e);
        let denied = e.audit_phase("denied");
        assert_eq!(denied.len(), 1, "{what}: {report:#}");
        assert_eq!(denied[0]["detail"]["reason"], "invalid_arguments", "{what}");
        let verify = e.run(&["audit", "verify"]);
        assert!(
            verify.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
        let size = std::fs::metadata(e.audit_path()).unwrap().len();
        assert!(size < 256 << 10, "{what}: the log grew to {size} bytes");
        let run_id = report["run_id"].as_str().unwrap();
        let show = e.run(&["audit", "show", run_id]);
        let text = String::from_utf8_lossy(&show.stdout);
        assert!(
            text.contains("denied"),
            "{what}: audit show lost the line: {text}"
        );
    }
}

#[test]
fn verify_reports_every_bad_line_and_keeps_checking_after_it() {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    e.runbook(
        "df",
        "name: df\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    for _ in 0..3 {
        assert_eq!(e.run_json("df", "h", &[]).0, 0);
    }
    let text = std::fs::read_to_string(e.audit_path()).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let n = lines.len();
    assert!(n >= 12, "{n}");
    // Line 3 is garbage, line 9 is edited: both are reported.
    lines[2] = format!("{}{}", "[".repeat(200), "]".repeat(200));
    lines[8] = lines[8].replacen("\"h\"", "\"db\"", 1);
    std::fs::write(e.audit_path(), lines.join("\n") + "\n").unwrap();
    let out = e.run(&["audit", "verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    for line in [
        ":3: chain broken: not a JSON audit line",
        ":4: chain broken",
        ":10: chain broken",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(!text.contains(":5: chain broken"), "{text}");
}

// ---- the kill-switch command line ----------------------------------------------

/// A config whose kill switch lives elsewhere, with one valid runbook `df`.
fn switch_estate() -> (Estate, std::path::PathBuf) {
    let e = Estate::new();
    let ks = e.work().join("elsewhere/switch");
    std::fs::create_dir_all(&ks).unwrap();
    std::fs::write(
        e.path().join("runwarden.yaml"),
        format!("kill_switch_dir: {}\n", ks.display()),
    )
    .unwrap();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    e.runbook(
        "df",
        "name: df\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    (e, ks)
}

#[test]
fn kill_switch_engage_acts_on_the_configured_directory_even_when_runbooks_are_broken() {
    let (e, ks) = switch_estate();
    for (what, broken) in [
        (
            "a half-edited runbook",
            ("runbooks/half.yaml", "name: half\nhosts: [\n"),
        ),
        (
            "a host file with an unknown field",
            ("hosts/bad.yaml", "name: bad\nconnection: local\nfoo: 1\n"),
        ),
        (
            "a runbook naming a missing host",
            (
                "runbooks/lost.yaml",
                "name: lost\ndescription: t\nhosts: [nowhere]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps: [{ call: disk_usage, args: { path: /tmp } }]\n",
            ),
        ),
    ] {
        std::fs::write(e.path().join(broken.0), broken.1).unwrap();
        assert_eq!(e.run(&["check"]).status.code(), Some(2), "{what}");
        let out = e.run(&["kill-switch", "engage", "--reason", "test"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {text}");
        assert!(
            ks.join("ENGAGED").exists(),
            "{what}: the configured switch is engaged"
        );
        assert!(
            text.contains(&ks.display().to_string()),
            "{what}: it names the directory it acted on: {text}"
        );
        assert!(
            !e.path().join("kill-switch/ENGAGED").exists(),
            "{what}: not a directory nothing watches"
        );
        let status = e.run(&["kill-switch", "status"]);
        assert_eq!(status.status.code(), Some(1), "{what}: engaged exits 1");
        let out = e.run(&["kill-switch", "release"]);
        assert!(out.status.success(), "{what}");
        assert!(!ks.join("ENGAGED").exists(), "{what}");
        std::fs::remove_file(e.path().join(broken.0)).unwrap();
    }
    // runwarden.yaml itself broken: no guess, a clear error.
    std::fs::write(e.path().join("runwarden.yaml"), "kill_switch_dir: [\n").unwrap();
    let out = e.run(&["kill-switch", "engage", "--reason", "test"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("runwarden.yaml") && err.contains("touch"),
        "{err}"
    );
    assert!(!e.path().join("kill-switch/ENGAGED").exists());
}

#[test]
fn kill_switch_refuses_a_runbook_that_is_not_a_runbook_name() {
    let (e, ks) = switch_estate();
    let before = |dir: &std::path::Path| std::fs::read_dir(dir).unwrap().count();
    let (in_ks, in_default) = (before(&ks), before(&e.path().join("kill-switch")));
    for rb in ["../x", "/tmp/rw-abs", "dff", "df/../../y", "DF", ""] {
        for verb in ["engage", "release"] {
            let mut args = vec!["kill-switch", verb, "--runbook", rb];
            if verb == "engage" {
                args.extend(["--reason", "t"]);
            }
            let out = e.run(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{verb} --runbook {rb:?}: {err}");
            assert!(err.contains("not a runbook"), "{err}");
        }
    }
    let typo = e.run(&["kill-switch", "engage", "--runbook", "dff", "--reason", "t"]);
    assert!(String::from_utf8_lossy(&typo.stderr).contains("did you mean \"df\""));
    assert_eq!(
        before(&ks),
        in_ks,
        "nothing written in the switch directory"
    );
    assert_eq!(before(&e.path().join("kill-switch")), in_default);
    assert!(!e.work().join("x.ENGAGED").exists());
    assert!(!std::path::Path::new("/tmp/rw-abs.ENGAGED").exists());
    // A real runbook name works, and stops that runbook.
    let out = e.run(&["kill-switch", "engage", "--runbook", "df", "--reason", "t"]);
    assert!(out.status.success());
    assert_eq!(e.run_json("df", "h", &[]).1["verdict"], "halted");
}

#[test]
fn kill_switch_status_exits_by_state() {
    let (e, ks) = switch_estate();
    let code = |e: &Estate| e.run(&["kill-switch", "status"]).status.code();
    assert_eq!(code(&e), Some(0), "released");
    std::fs::write(ks.join("df.ENGAGED"), "").unwrap();
    assert_eq!(code(&e), Some(1), "one runbook engaged");
    std::fs::remove_file(ks.join("df.ENGAGED")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", ks.join("ENGAGED")).unwrap();
    assert_eq!(code(&e), Some(1), "a dangling link is engaged");
    std::fs::remove_file(ks.join("ENGAGED")).unwrap();
    std::fs::remove_dir(&ks).unwrap();
    assert_eq!(code(&e), Some(1), "a missing directory is engaged");
}

#[test]
fn the_kill_switch_gauge_agrees_with_the_gate() {
    let (e, ks) = switch_estate();
    let (_daemon, addr) = serve(&e);
    let gauge = |scope: &str| {
        let m = http(&addr, "GET", "/metrics", "").unwrap().1;
        m.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "runwarden_kill_switch_engaged{{scope=\"{scope}\"}}"
                ))
            })
            .and_then(|l| l.split_whitespace().last().map(String::from))
    };
    let is = |scope: &str, v: &str| {
        wait_for(
            &format!("gauge {scope} = {v}"),
            Duration::from_secs(15),
            || (gauge(scope).as_deref() == Some(v)).then_some(()),
        )
    };
    is("global", "0");
    std::os::unix::fs::symlink("/nonexistent", ks.join("ENGAGED")).unwrap();
    is("global", "1");
    std::fs::remove_file(ks.join("ENGAGED")).unwrap();
    is("global", "0");
    std::os::unix::fs::symlink("/nonexistent", ks.join("df.ENGAGED")).unwrap();
    is("df", "1");
    assert_eq!(e.run_json("df", "h", &[]).1["verdict"], "halted");
}

// ---- the webhook's durability ------------------------------------------------------

/// Let `cmd` write files of at most `bytes` (RLIMIT_FSIZE), with SIGXFSZ
/// ignored so that a write past it fails with EFBIG instead of killing it.
fn file_size_limit(cmd: &mut Command, bytes: u64) {
    // SAFETY: between fork and exec only async-signal-safe calls are made.
    unsafe {
        cmd.pre_exec(move || {
            nix::libc::signal(nix::libc::SIGXFSZ, nix::libc::SIG_IGN);
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE, bytes, bytes)
                .map_err(std::io::Error::from)
        });
    }
}

fn alert_estate() -> Estate {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    e.runbook(
        "df",
        "name: df\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\non_alert:\n  matchers: ['alertname=\"Df\"']\n  host_label: instance\nsteps:\n  - call: disk_usage\n    args: { path: /tmp }\n",
    );
    e
}

// The webhook's 503 for triggers it cannot record is proven on a full
// filesystem in `hardening::a_full_audit_filesystem_stops_every_call_and_the_daemon_recovers_when_space_returns`.

#[test]
fn a_run_whose_verdict_line_cannot_be_written_does_not_exit_0() {
    let e = alert_estate();
    // Measure what the run writes before its verdict, then allow exactly that.
    assert_eq!(e.run_json("df", "h", &[]).0, 0);
    let text = std::fs::read_to_string(e.audit_path()).unwrap();
    let verdict_len = text.lines().last().unwrap().len() as u64 + 1;
    let before_verdict = text.len() as u64 - verdict_len;
    assert!(verdict_len > 200, "{verdict_len}");
    std::fs::remove_file(e.audit_path()).unwrap();
    let mut cmd = e.cmd(&["run", "df", "--host", "h", "--json"]);
    file_size_limit(&mut cmd, before_verdict + 60);
    let out = cmd.output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(6), "{report:#}");
    assert_eq!(report["verdict"], "broken");
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("verdict line"),
        "{report:#}"
    );
    assert!(e.audit_phase("verdict").is_empty());
    assert_eq!(e.audit_phase("result").len(), 1, "the call itself ran");
}

// ---- process trees that detach ---------------------------------------------------------

#[test]
fn every_process_a_tool_starts_is_gone_when_the_call_returns_however_it_detaches() {
    let trees = [
        (
            "a setsid shell with children of its own",
            "setsid /bin/sh -c '/bin/sleep 311.{t} & /bin/sleep 312.{t} & wait' </dev/null >/dev/null 2>&1 &",
        ),
        (
            "three generations, each in a session of its own",
            "setsid /bin/sh -c 'setsid /bin/sh -c \"/bin/sleep 313.{t} & wait\" & wait' </dev/null >/dev/null 2>&1 &",
        ),
        (
            "a respawning loop that ignores TERM and HUP",
            "setsid /bin/sh -c 'trap \"\" TERM HUP; while :; do /bin/sleep 314.{t} & /bin/sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
        ),
        (
            "a double fork whose middle process exits at once",
            // The middle shell is reaped here, before `exec ps`: its exit
            // would otherwise be a SIGCHLD to ps, which ps takes for a bug
            // in itself ("please report this bug") and dies of.
            "/bin/sh -c 'setsid /bin/sh -c \"/bin/sleep 315.{t} & exec /bin/sleep 316.{t}\" & exit 0' </dev/null >/dev/null 2>&1 &\nwait $!",
        ),
    ];
    for (what, leak) in trees {
        let e = Estate::new();
        let t = tag();
        let ps = e.script(
            "leaky-ps",
            &format!(
                // Until the tree has started (at most 10 s, however loaded
                // the machine; the call fails if it never does), then the
                // real ps. Confined, the tool can write no file to say so:
                // the tree is found by its own sleeps' arguments.
                "{}\ni=0; while ! /usr/bin/pgrep -f 'sleep 31[1-6][.]{t}' >/dev/null && [ $i -lt 100 ]; do /bin/sleep 0.1; i=$((i+1)); done\n[ $i -lt 100 ] || exit 3\nexec /bin/ps \"$@\"",
                leak.replace("{t}", &t),
            ),
        );
        e.host(
            "h",
            &local_host("h", &format!("binaries:\n  ps: {}", ps.display())),
        );
        e.runbook(
            "procs",
            "name: procs\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n  - call: list_processes\n",
        );
        let (code, report) = e.run_json("procs", "h", &[]);
        assert_eq!(code, 0, "{what}: the tree started: {report:#}");
        let alive = alive_with(&format!(".{t}"));
        assert!(
            alive.is_empty(),
            "{what}: still running after the run: {alive:?}"
        );
    }
}

// ---- the HTTP surface ---------------------------------------------------------------

/// One raw HTTP/1.1 request: (status, body); `None` if the server closed first.
fn raw(addr: &str, request: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    // Generous: a loaded two-core machine can be slow to answer.
    c.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    c.write_all(request.as_bytes()).ok()?;
    let mut resp = Vec::new();
    let _ = c.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.get(9..12)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n")?.1.to_string()))
}

fn request(method: &str, path: &str, headers: &[&str], body: &str) -> String {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        r += h;
        r += "\r\n";
    }
    r + "\r\n" + body
}

const TOKEN: &str = "wh-token-0123456789abcdef";

#[test]
fn with_a_token_every_api_route_needs_it_and_metrics_and_healthz_stay_open() {
    let e = alert_estate();
    let token_file = e.work().join("token");
    write_secret(&token_file, TOKEN);
    std::fs::write(
        e.path().join("runwarden.yaml"),
        format!("webhook_token_file: {}\n", token_file.display()),
    )
    .unwrap();
    let (_daemon, addr) = serve(&e);
    let host = format!("Host: {addr}");
    let json = "Content-Type: application/json";
    let alert = r#"{"version":"4","status":"firing","receiver":"rw","groupKey":"g","alerts":[{"status":"firing","labels":{"alertname":"Df","instance":"h"},"annotations":{},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"f1"}]}"#;
    let (status, body) = raw(
        &addr,
        &request(
            "POST",
            "/api/v1/alerts",
            &[&host, json, &format!("Authorization: Bearer {TOKEN}")],
            alert,
        ),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let run_id = wait_for("a run", Duration::from_secs(20), || {
        let (s, b) = raw(
            &addr,
            &request(
                "GET",
                "/api/v1/runs",
                &[&host, &format!("authorization: bearer {TOKEN}")],
                "",
            ),
        )?;
        let v: Value = serde_json::from_str(&b).ok()?;
        (s == 200).then_some(())?;
        v["runs"][0]["run_id"].as_str().map(String::from)
    });
    for path in ["/api/v1/runs".to_string(), format!("/api/v1/runs/{run_id}")] {
        for auth in [
            "",
            "Authorization: Bearer wrong-token-0000000000",
            "Authorization: Basic dXNlcjpwYXNz",
            "Authorization: Bearer",
        ] {
            let mut hs = vec![host.as_str()];
            if !auth.is_empty() {
                hs.push(auth);
            }
            let (status, body) = raw(&addr, &request("GET", &path, &hs, "")).unwrap();
            assert_eq!(status, 401, "GET {path} with {auth:?}: {body}");
            assert!(
                !body.contains("disk_usage"),
                "nothing of the run leaks: {body}"
            );
        }
        for scheme in ["Bearer", "bearer", "BEARER", "BeArEr"] {
            let auth = format!("Authorization: {scheme} {TOKEN}");
            let (status, _) = raw(&addr, &request("GET", &path, &[&host, &auth], "")).unwrap();
            assert_eq!(status, 200, "{scheme}");
        }
    }
    let (status, _) = raw(
        &addr,
        &request("POST", "/api/v1/alerts", &[&host, json], alert),
    )
    .unwrap();
    assert_eq!(status, 401);
    for open in ["/metrics", "/healthz"] {
        assert_eq!(
            raw(&addr, &request("GET", open, &[&host], "")).unwrap().0,
            200,
            "{open}"
        );
    }
}

#[test]
fn without_a_token_a_web_page_can_neither_start_runs_nor_read_them() {
    let e = alert_estate();
    let (_daemon, addr) = serve(&e);
    let host = format!("Host: {addr}");
    let alert = r#"{"version":"4","status":"firing","receiver":"rw","groupKey":"g","alerts":[{"status":"firing","labels":{"alertname":"Df","instance":"h"},"annotations":{},"startsAt":"2026-11-30T10:00:00Z","fingerprint":"f1"}]}"#;
    let cases: [(&str, &str, Vec<String>, u16); 8] = [
        (
            "a form POST (text/plain)",
            "POST",
            vec![host.clone(), "Content-Type: text/plain".into()],
            415,
        ),
        (
            "a form POST (urlencoded)",
            "POST",
            vec![
                host.clone(),
                "Content-Type: application/x-www-form-urlencoded".into(),
            ],
            415,
        ),
        ("no content type", "POST", vec![host.clone()], 415),
        (
            "a cross-site fetch",
            "POST",
            vec![
                host.clone(),
                "Content-Type: application/json".into(),
                "Origin: http://evil.example".into(),
            ],
            403,
        ),
        (
            "Sec-Fetch-Site: cross-site",
            "POST",
            vec![
                host.clone(),
                "Content-Type: application/json".into(),
                "Sec-Fetch-Site: cross-site".into(),
            ],
            403,
        ),
        (
            "DNS rebinding (POST)",
            "POST",
            vec![
                "Host: evil.example:9731".into(),
                "Content-Type: application/json".into(),
            ],
            421,
        ),
        (
            "DNS rebinding (GET runs)",
            "GET",
            vec!["Host: rebind.evil.example".into()],
            421,
        ),
        (
            "a null origin",
            "GET",
            vec![host.clone(), "Origin: null".into()],
            403,
        ),
    ];
    for (what, method, headers, want) in cases {
        let hs: Vec<&str> = headers.iter().map(String::as_str).collect();
        let path = if method == "POST" {
            "/api/v1/alerts"
        } else {
            "/api/v1/runs"
        };
        let body = if method == "POST" { alert } else { "" };
        let (status, answer) = raw(&addr, &request(method, path, &hs, body)).unwrap();
        assert_eq!(status, want, "{what}: {answer}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(e.audit().is_empty(), "no trigger was accepted");
    // What Alertmanager and curl send still works.
    let (status, body) = raw(
        &addr,
        &request(
            "POST",
            "/api/v1/alerts",
            &[&host, "Content-Type: application/json; charset=utf-8"],
            alert,
        ),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    for h in ["Host: localhost:1", "Host: 127.0.0.2", "Host: [::1]:9731"] {
        assert_eq!(
            raw(&addr, &request("GET", "/api/v1/runs", &[h], ""))
                .unwrap()
                .0,
            200,
            "{h}"
        );
    }
}

#[test]
fn slow_and_idle_connections_are_cut_and_capped() {
    use std::io::{Read, Write};
    let e = alert_estate();
    let (daemon, addr) = serve(&e);
    let pid = daemon.0.id();
    // A client that never finishes its headers is cut off.
    let started = Instant::now();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 512];
    let _ = slow.read(&mut buf);
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "held {:?}",
        started.elapsed()
    );
    // 400 idle connections: the daemon holds at most its cap of them open.
    let idle: Vec<_> = (0..400)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(
        fds < 256 + 64,
        "{fds} descriptors open for 400 idle connections"
    );
    // Once they are cut, the daemon answers again.
    let answer = wait_for(
        "healthz after the idle connections",
        Duration::from_secs(30),
        || raw(&addr, &request("GET", "/healthz", &["Host: 127.0.0.1"], "")),
    );
    assert_eq!(answer.0, 200);
    drop(idle);
}

// ---- what people read -----------------------------------------------------------------

#[test]
fn escape_sequences_from_outside_are_printed_escaped_never_obeyed() {
    let fake = "\u{1b}[1A\u{1b}[2K\rverdict: ok (every call succeeded)";
    let server = ModelServer::start(move |n, _| match n {
        0 => calls(&[("disk\u{1b}[2Jusage", "{}".to_string())]),
        _ => answer(&format!(
            "All good.{fake}\nSUGGEST: rm -rf /var/tmp/x{fake}"
        )),
    });
    let e = model_estate(&server, "max_steps: 12");
    let out = e
        .cmd(&["run", "agent", "--host", "h"])
        .env("RUNWARDEN_MODEL_KEY", KEY)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let run_id = text.split_whitespace().nth(1).unwrap().to_string();
    let transcript = e.run(&["transcript", &run_id]);
    let show = e.run(&["audit", "show", &run_id]);
    for (what, bytes) in [
        ("run", out.stdout.clone()),
        ("transcript", transcript.stdout),
        ("audit show", show.stdout),
    ] {
        assert!(!bytes.contains(&0x1b), "{what} printed a raw escape");
        assert!(
            !bytes.contains(&b'\r'),
            "{what} printed a raw carriage return"
        );
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("\\u{1b}"), "{what} shows the escape: {text}");
    }
    assert_eq!(text.matches("\nverdict: ").count(), 1, "{text}");
}

#[test]
fn arguments_by_position_are_refused() {
    for args in ["[\"/tmp\"]", "\"/tmp\"", "42", "[[\"/tmp\"]]"] {
        let a = args.to_string();
        let server = ModelServer::start(move |n, _| match n {
            0 => calls(&[("disk_usage", a.clone())]),
            _ => answer("done"),
        });
        let e = model_estate(&server, "max_steps: 12");
        run_model(&e);
        let denied = e.audit_phase("denied");
        assert_eq!(denied.len(), 1, "{args}");
        assert_eq!(denied[0]["detail"]["reason"], "invalid_arguments", "{args}");
        assert!(e.audit_phase("intent").is_empty(), "{args} ran");
    }
}

#[test]
fn a_denial_tells_the_planner_nothing_about_what_is_on_the_host() {
    let e0 = Estate::new();
    let link = e0.work().join("to-ssh");
    std::os::unix::fs::symlink("/etc/ssh", &link).unwrap();
    let probes = [
        "/etc/shadow".to_string(),
        "/etc/no-such-dir-runwarden".to_string(),
        link.display().to_string(),
        "/root".to_string(),
    ];
    let mut seen = Vec::new();
    for path in &probes {
        let p = path.clone();
        let server = ModelServer::start(move |n, _| match n {
            0 => call("disk_usage", json!({ "path": p })),
            _ => answer("done"),
        });
        let e = model_estate(&server, "max_steps: 12");
        run_model(&e);
        let told = crate::model::results(&server.requests()[1].1);
        let error = told[0]["error"].as_str().unwrap().to_string();
        assert!(
            !error.contains("resolves to")
                && !error.contains("No such file")
                && !error.contains("/etc/ssh"),
            "{path}: {error}"
        );
        seen.push(error);
        let denied = e.audit_phase("denied");
        assert!(
            denied[0]["detail"]["message"]
                .as_str()
                .unwrap()
                .contains("path"),
            "the audit line keeps the detail"
        );
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:#?}");
}

// ---- runs of other processes -------------------------------------------------------

#[test]
fn daemon_start_up_closes_only_runs_whose_process_is_gone() {
    let e = Estate::new();
    let ps = e.script("slow-ps", "/bin/sleep 3\nexec /bin/ps \"$@\"");
    e.host(
        "h",
        &local_host("h", &format!("binaries:\n  ps: {}", ps.display())),
    );
    e.runbook(
        "slow",
        "name: slow\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n  - call: list_processes\n",
    );
    // One run killed mid-call, one still going on the command line.
    let mut killed = e.cmd(&["run", "slow", "--host", "h"]).spawn().unwrap();
    wait_for("the first start line", Duration::from_secs(10), || {
        (!e.audit_phase("intent").is_empty()).then_some(())
    });
    killed.kill().unwrap();
    killed.wait().unwrap();
    let live = e
        .cmd(&["run", "slow", "--host", "h", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the second start line", Duration::from_secs(10), || {
        (e.audit_phase("intent").len() == 2).then_some(())
    });
    let (_daemon, _) = serve(&e);
    let out = live.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "ok", "{report:#}");
    let verdicts = e.audit_phase("verdict");
    let live_id = report["run_id"].as_str().unwrap();
    let of_live: Vec<_> = verdicts.iter().filter(|v| v["run_id"] == live_id).collect();
    assert_eq!(
        of_live.len(),
        1,
        "one verdict for the live run: {verdicts:#?}"
    );
    assert_eq!(of_live[0]["outcome"], "ok");
    let others: Vec<_> = verdicts.iter().filter(|v| v["run_id"] != live_id).collect();
    assert_eq!(others.len(), 1, "{verdicts:#?}");
    assert_eq!(
        others[0]["outcome"], "interrupted",
        "the killed run is closed"
    );
}

// ---- tamper evidence -------------------------------------------------------------------

/// `audit verify` with extra arguments: (exit code, stdout).
fn verify(e: &Estate, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["audit", "verify"];
    args.extend_from_slice(extra);
    let out = e.run(&args);
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_head_kept_elsewhere_catches_an_edited_last_line_a_cut_and_a_whole_rewrite() {
    let e = alert_estate();
    for _ in 0..2 {
        assert_eq!(e.run_json("df", "h", &[]).0, 0);
    }
    let (code, out) = verify(&e, &[]);
    assert_eq!(code, Some(0), "{out}");
    let head = out
        .lines()
        .find_map(|l| l.strip_prefix("head: "))
        .unwrap()
        .to_string();
    let pin = ["--head", head.as_str()];
    assert_eq!(verify(&e, &pin).0, Some(0));
    let original = std::fs::read_to_string(e.audit_path()).unwrap();
    let lines: Vec<&str> = original.lines().collect();

    // 1. The verdict, the last line, edited: the chain alone cannot see it.
    let last = lines
        .last()
        .unwrap()
        .replace("\"outcome\":\"ok\"", "\"outcome\":\"failed\"");
    assert_ne!(&last, lines.last().unwrap());
    let mut v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    *v.last_mut().unwrap() = last;
    std::fs::write(e.audit_path(), v.join("\n") + "\n").unwrap();
    assert_eq!(
        verify(&e, &[]).0,
        Some(0),
        "the chain alone misses it (documented)"
    );
    let (code, out) = verify(&e, &pin);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("does not match the head recorded"), "{out}");

    // 2. The last run cut off the end.
    std::fs::write(e.audit_path(), lines[..lines.len() - 3].join("\n") + "\n").unwrap();
    assert_eq!(verify(&e, &[]).0, Some(0));
    let (code, out) = verify(&e, &pin);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("cut off the end"), "{out}");

    // 3. The whole chain rewritten consistently, a verdict changed on the way.
    let forged = e.work().join("forged.jsonl");
    {
        // What someone with write access to the file can do: rewrite every
        // line and recompute the whole chain.
        use sha2::Digest;
        let mut prev = runwarden::audit::GENESIS.to_string();
        let mut out = String::new();
        for l in &lines {
            let mut entry: serde_json::Value = serde_json::from_str(l).unwrap();
            if entry["outcome"] == "ok" {
                entry["outcome"] = "failed".into();
            }
            entry["prev"] = prev.clone().into();
            let line = entry.to_string();
            prev = sha2::Sha256::digest(line.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            out += &line;
            out.push('\n');
        }
        std::fs::write(&forged, out).unwrap();
    }
    std::fs::rename(&forged, e.audit_path()).unwrap();
    assert_eq!(
        verify(&e, &[]).0,
        Some(0),
        "a rewritten chain verifies on its own"
    );
    let (code, out) = verify(&e, &pin);
    assert_eq!(code, Some(2), "{out}");

    // A head that is not one.
    for bad in ["abc:3", "nothex:x", &("z".repeat(64) + ":2")] {
        assert_eq!(verify(&e, &["--head", bad]).0, Some(2), "{bad}");
    }
}

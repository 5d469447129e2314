//! Declared tools on real programs: haproxy's admin socket (the shipped
//! `tools/haproxy_drain.yaml`: drain, verified by haproxy's own view of the
//! server, undone when that view does not show it) and a program restarted
//! through supervisor's own CLI. Each with the gate's refusals.
//!
//! (A container engine cannot run on these machines, crun's rlimits being
//! refused, so `tools/restart_container.yaml` is loaded and checked, not run.)

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

/// haproxy in the foreground with an admin socket in `dir`, backend `web`
/// of servers `app1` and `app2` (no health checks: their state is what the
/// admin socket sets).
pub(crate) fn haproxy(dir: &std::path::Path) -> (Proc, std::path::PathBuf) {
    let socket = dir.join("admin.sock");
    let cfg = dir.join("haproxy.cfg");
    // The read-only socket the drain's tier-1 verify reads, as the
    // observer's group (the shipped tool's comment shows this line).
    std::fs::write(
        &cfg,
        format!(
            "global\n  stats socket {} mode 600 level admin\n  stats socket {}/stats.sock mode 660 group runwarden-observe level user\n\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 1s\n  timeout server 1s\n\n\
             frontend fe\n  bind 127.0.0.1:{}\n  default_backend web\n\nbackend web\n  server app1 127.0.0.1:9 \n  server app2 127.0.0.1:9\n\n\
             backend api\n  server api1 127.0.0.1:9\n",
            socket.display(),
            dir.display(),
            free_port()
        ),
    )
    .unwrap();
    let child = Command::new("/usr/sbin/haproxy")
        .args(["-db", "-f"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let p = Proc(child);
    wait_for("haproxy's sockets", Duration::from_secs(10), || {
        (socket.exists() && dir.join("stats.sock").exists()).then_some(())
    });
    (p, socket)
}

/// What haproxy says of `server` in `backend`: its admin state (8: drain).
pub(crate) fn admin_state(socket: &std::path::Path, backend: &str, server: &str) -> String {
    let out = Command::new("/usr/bin/socat")
        .args(["-", &format!("UNIX-CONNECT:{}", socket.display())])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(format!("show servers state {backend}\n").as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(3) == Some(&server))
        .map(|f| f[6].to_string())
        .unwrap_or_else(|| panic!("no {server} in {text}"))
}

/// The shipped `haproxy_drain`, on this test's socket.
fn drain_tool(socket: &std::path::Path) -> String {
    std::fs::read_to_string(repo().join("tools/haproxy_drain.yaml"))
        .unwrap()
        .replace("/run/haproxy/admin.sock", &socket.display().to_string())
        .replace(
            "/run/haproxy/stats.sock",
            &socket.with_file_name("stats.sock").display().to_string(),
        )
}

fn drain_runbook(server: &str, backend: &str) -> String {
    format!(
        "name: drain\ndescription: drain one server\nhosts: [lb]\nautonomy: L3\ntools: {{ approve: [haproxy_drain] }}\n\
         steps:\n  - call: haproxy_drain\n    args: {{ backend: {backend}, server: {server} }}\n    reason: app1 answers 500s\n"
    )
}

/// The shipped drain tool on a real haproxy: the server is drained and
/// verified by haproxy's own view; a backend outside the host's list, a
/// server name carrying a second admin command or a flag, and a tool that
/// is not the runbook's are refused by the gate, and haproxy is untouched.
#[test]
fn haproxy_drain_drains_through_the_admin_socket_and_refuses_what_the_host_does_not_allow() {
    let e = Estate::new();
    let (_haproxy, socket) = haproxy(&e.work());
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/haproxy_drain.yaml"),
        drain_tool(&socket),
    )
    .unwrap();
    e.host(
        "lb",
        &local_host("lb", "allow: { haproxy_backends: [web] }"),
    );
    e.runbook("drain", &drain_runbook("app1", "web"));
    assert_eq!(admin_state(&socket, "web", "app1"), "0");
    let (code, report) = e.run_json("drain", "lb", &[]);
    assert_eq!(code, 0, "{report:#}");
    let result = &report["steps"][0]["result"];
    assert_eq!(result["verified"], true, "{report:#}");
    assert_eq!(admin_state(&socket, "web", "app1"), "8", "drained");
    assert_eq!(admin_state(&socket, "web", "app2"), "0", "only app1");
    let intent = e.audit_phase("intent");
    assert_eq!(intent[0]["tool"], "haproxy_drain");
    assert!(
        intent[0]["declaration"]
            .as_str()
            .is_some_and(|s| s.len() == 64)
    );

    // A backend outside the host's list: the gate refuses the call.
    e.runbook("drain", &drain_runbook("api1", "api"));
    let (code, report) = e.run_json("drain", "lb", &[]);
    assert_eq!(code, 3, "{report:#}");
    let detail = report["steps"][0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("is not allowed on host"), "{detail}");
    // A server name carrying a second admin command, text the pattern does
    // not take, a flag: refused where the runbook writes it, nothing runs.
    for (server, says) in [
        (
            "app2\\nshutdown sessions server web/app2",
            "newline or control character",
        ),
        ("app2 state maint", "holds whitespace"),
        ("--help", "starts with '-'"),
        ("APP2", "does not match"),
    ] {
        e.runbook("drain", &drain_runbook(&format!("\"{server}\""), "web"));
        let out = e.run(&["run", "drain", "--host", "lb"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{server}: {said}");
        assert!(
            said.contains("runbooks/drain.yaml:") && said.contains(says),
            "{server}: {said}"
        );
    }
    assert_eq!(admin_state(&socket, "web", "app2"), "0");
    assert_eq!(admin_state(&socket, "api", "api1"), "0");
}

/// A drain whose probe cannot show it took (the expected admin state is
/// wrong) is not verified: its undo puts the server back to ready, the run
/// fails, and the report says what was undone.
#[test]
fn a_drain_that_does_not_verify_is_undone_on_a_real_haproxy() {
    let e = Estate::new();
    let (_haproxy, socket) = haproxy(&e.work());
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    let tool = drain_tool(&socket)
        .replace("\\S+ \\S+ 8 ", "\\S+ \\S+ 9 ")
        .replace("  expect_exit: 0\n", "  expect_exit: 0\n  within: 1s\n");
    std::fs::write(e.path().join("tools/haproxy_drain.yaml"), tool).unwrap();
    e.host(
        "lb",
        &local_host("lb", "allow: { haproxy_backends: [web] }"),
    );
    e.runbook("drain", &drain_runbook("app1", "web"));
    let (code, report) = e.run_json("drain", "lb", &[]);
    assert_eq!(code, 1, "{report:#}");
    let data = &report["steps"][0]["result"]["data"];
    assert_eq!(
        report["steps"][0]["result"]["verified"], false,
        "{report:#}"
    );
    assert_eq!(data["undo"]["ok"], true, "{report:#}");
    assert_eq!(
        admin_state(&socket, "web", "app1"),
        "0",
        "undone: ready again"
    );
}

/// supervisord and its program, stopped together: `supervisorctl shutdown`
/// stops the program first (a SIGKILL of supervisord alone would leave it
/// running, and the next test's `pgrep` would find two).
struct Supervisord {
    conf: std::path::PathBuf,
    _proc: Proc,
}

impl Drop for Supervisord {
    fn drop(&mut self) {
        let _ = Command::new("/usr/bin/supervisorctl")
            .arg("-c")
            .arg(&self.conf)
            .arg("shutdown")
            .output();
    }
}

/// supervisord with one program, `worker` (the returned command line, one
/// of its own: no other process has it), and its control socket in `dir`.
fn supervisor(dir: &std::path::Path) -> (Supervisord, std::path::PathBuf, String) {
    let conf = dir.join("supervisord.conf");
    let command = format!(
        "/bin/sleep 1000.{}{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_micros()
    );
    std::fs::write(
        &conf,
        format!(
            "[unix_http_server]\nfile={d}/supervisor.sock\nchmod=0700\n\n[supervisord]\nnodaemon=true\nlogfile={d}/supervisord.log\npidfile={d}/supervisord.pid\nchildlogdir={d}\n\n\
             [rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n\
             [supervisorctl]\nserverurl=unix://{d}/supervisor.sock\n\n[program:worker]\ncommand={command}\nstartsecs=0\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let child = Command::new("/usr/bin/supervisord")
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let p = Supervisord {
        conf: conf.clone(),
        _proc: Proc(child),
    };
    wait_for("the worker running", Duration::from_secs(20), || {
        worker_pid(&conf)
    });
    (p, conf, command)
}

/// The worker's pid, as supervisorctl says it, while it runs.
fn worker_pid(conf: &std::path::Path) -> Option<String> {
    let out = Command::new("/usr/bin/supervisorctl")
        .arg("-c")
        .arg(conf)
        .args(["pid", "worker"])
        .output()
        .ok()?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (pid.parse::<u32>().is_ok_and(|p| p > 0)).then_some(pid)
}

/// A program restarted through its supervisor's own CLI, declared in YAML:
/// a new process, under the runbook's standing approval; a program outside
/// the host's list is refused and keeps its process. The verify is tier 1:
/// it runs as the observer, which supervisord's control socket (root's,
/// 0700, and able to restart anything) refuses, so it reads the process
/// list instead.
#[test]
fn a_program_is_restarted_through_its_supervisors_own_cli() {
    let e = Estate::new();
    let (_supervisord, conf, worker) = supervisor(&e.work());
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/restart_program.yaml"),
        format!(
            "name: restart_program\ntier: 2\ndescription: Restart one program through supervisor.\nverb: restarted\n\
             args:\n  program: {{ type: allowlist, list: programs }}\n\
             run: [/usr/bin/supervisorctl, -c, {c}, {verb}, \"{{{{ program }}}}\"]\n\
             capture:\n  run: [/usr/bin/pgrep, -x, -f, \"{worker}\"]\n  values: '^(?P<pid>\\d+)$'\n\
             verify:\n  run: [/usr/bin/pgrep, -x, -f, \"{worker}\"]\n  expect_changed: pid\n  within: 10s\n",
            c = conf.display(),
            verb = "restart"
        ),
    )
    .unwrap();
    e.host("app", &local_host("app", "allow: { programs: [worker] }"));
    let runbook = |program: &str| {
        format!(
            "name: bounce\ndescription: restart the worker\nhosts: [app]\nautonomy: L3\ntools: {{ approve: [restart_program] }}\n\
             steps:\n  - call: restart_program\n    args: {{ program: {program} }}\n    reason: the worker stopped taking jobs\n"
        )
    };
    e.runbook("bounce", &runbook("worker"));
    let before = worker_pid(&conf).unwrap();
    let (code, report) = e.run_json("bounce", "app", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["steps"][0]["result"]["verified"], true, "{report:#}");
    let after = worker_pid(&conf).expect("running again");
    assert_ne!(before, after, "a new process");

    let evidence = report["steps"][0]["result"]["data"]["evidence"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        evidence.contains(&format!("pid {before} -> {after}")),
        "the evidence shows before and after: {evidence}"
    );

    e.runbook("bounce", &runbook("supervisord"));
    let (code, report): (i32, Value) = e.run_json("bounce", "app", &[]);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(worker_pid(&conf).unwrap(), after, "untouched");

    // A "restart" that restarts nothing (its command exits 0 and the
    // worker runs throughout) no longer verifies: the pid did not change.
    let tool = e.path().join("tools/restart_program.yaml");
    let text = std::fs::read_to_string(&tool).unwrap();
    std::fs::write(&tool, text.replace(", restart,", ", status,")).unwrap();
    e.runbook("bounce", &runbook("worker"));
    let (code, report): (i32, Value) = e.run_json("bounce", "app", &[]);
    assert_eq!(code, 1, "{report:#}");
    let result = &report["steps"][0]["result"];
    assert_eq!(result["verified"], false, "{report:#}");
    let evidence = result["data"]["evidence"].as_str().unwrap();
    assert!(
        evidence.contains(&format!("pid is still {after}")),
        "{evidence}"
    );
    assert_eq!(worker_pid(&conf).unwrap(), after, "nothing restarted it");
}

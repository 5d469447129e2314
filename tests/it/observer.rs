//! Tier 1 changes nothing, through any channel: tier-1 tools declared as a
//! careless author would write them, each aimed at a channel a file-write
//! rule does not cover, on real programs. Each is refused by the observer's
//! sandbox (its own unprivileged user, Landlock's TCP and scope rules; see
//! `src/sandbox/`), and what it aimed at is unchanged; what a tier-1 tool
//! is meant to do (read a user-level socket, connect to the port its
//! declaration names) still works.

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

#[path = "../support/agent.rs"]
mod local_agent;

/// Where a tier-1 tool runs: in the runner's own process tree, or under
/// the host's agent (root's, on a unix socket, as the package's
/// `runwarden-agent.socket` serves it).
#[derive(Clone, Copy, Debug)]
enum Via {
    Local,
    Agent,
}

/// A tier-1 tool of the user's own, and runbook `look` calling it once
/// with `args` on host `h`, reached `via`.
fn with_tool_via(via: Via, yaml: &str, args: &str) -> Estate {
    let e = Estate::new();
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(e.path().join("tools/probe.yaml"), yaml).unwrap();
    match via {
        Via::Local => {
            e.host("h", &local_host("h", "paths: [/tmp]"));
        }
        Via::Agent => {
            let socket = e.path().join("agent.sock");
            e.host(
                "h",
                &format!(
                    "name: h\nconnection:\n  agent: {}\npaths: [/tmp]\n",
                    socket.display()
                ),
            );
        }
    }
    e.runbook(
        "look",
        &format!(
            "name: look\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [probe] }}\nsteps:\n  - call: probe\n    args: {args}\n"
        ),
    );
    if let Via::Agent = via {
        serve_agent(&e, "h");
    }
    e
}

/// Root's agent for host `host` of `e`: its policy as `install print`
/// writes it, one `runwarden agent --stdio` per connection on the host
/// file's socket. The listener lives until the test process ends.
fn serve_agent(e: &Estate, host: &str) {
    let print = e.run(&["install", "print", "--host", host]);
    assert!(
        print.status.success(),
        "{}",
        String::from_utf8_lossy(&print.stderr)
    );
    let policy = e.path().join("agent.yaml");
    std::fs::write(
        &policy,
        local_agent::policy_from_print(
            &String::from_utf8_lossy(&print.stdout),
            &e.work().join("agent-jail"),
        ),
    )
    .unwrap();
    local_agent::listen(
        bin(),
        &e.path().join("agent.sock"),
        &policy,
        &e.work().join("agent-audit.jsonl"),
    );
}

/// The one step's result: (exit code of the run, its result's data).
fn probe(e: &Estate) -> (i32, Value) {
    let (code, report) = e.run_json("look", "h", &[]);
    (code, report["steps"][0]["result"].clone())
}

/// A tier-1 process is the observer: its own user, the journal's group,
/// `CAP_DAC_READ_SEARCH` as its only capability, no new privileges.
#[test]
fn a_tier1_process_runs_as_the_observer_with_only_the_right_to_read() {
    for via in [Via::Local, Via::Agent] {
        let e = with_tool_via(
            via,
            "name: probe\ntier: 1\ndescription: Who am I.\nrun: [/usr/bin/grep, -E, '^(Uid|Gid|Groups|CapEff|CapPrm|CapAmb|NoNewPrivs):', /proc/self/status]\n",
            "{}",
        );
        let (code, result) = probe(&e);
        assert_eq!(code, 0, "{result:#}");
        let status = result["data"]["stdout"].to_string();
        let observe = sh("/usr/bin/id", &["-u", "runwarden-observe"]);
        let journal = sh("/usr/bin/getent", &["group", "systemd-journal"]);
        let journal_gid = journal.split(':').nth(2).unwrap().to_string();
        assert!(
            status.contains(&format!("Uid:\\t{}", observe.trim())),
            "{status}"
        );
        assert!(status.contains(&journal_gid), "{status}");
        for cap in ["CapEff", "CapPrm", "CapAmb"] {
            assert!(
                status.contains(&format!("{cap}:\\t0000000000000004")),
                "{cap}: {status}"
            );
        }
        assert!(status.contains("NoNewPrivs:\\t1"), "{via:?}: {status}");
        if let Via::Agent = via {
            assert!(
                e.work().join("agent-audit.jsonl").exists(),
                "the call went through the agent"
            );
        }
    }
}

fn socat_tool(socket: &std::path::Path, stdin: &str) -> String {
    format!(
        "name: probe\ntier: 1\ndescription: Ask haproxy.\nrun: [/usr/bin/socat, \"-\", \"UNIX-CONNECT:{}\"]\nstdin: \"{stdin}\"\n",
        socket.display()
    )
}

/// A root-only admin socket refuses a tier-1 `set server ... state maint`:
/// haproxy keeps the server in service. The read-only socket its group
/// may use answers `show servers state`.
#[test]
fn a_root_only_admin_socket_refuses_a_tier1_tool_and_a_user_level_one_answers() {
    let work = tempfile::tempdir().unwrap();
    let (_haproxy, admin) = crate::declared::haproxy(work.path());
    let stats = admin.with_file_name("stats.sock");
    let app1 = || crate::declared::admin_state(&admin, "web", "app1");
    for via in [Via::Local, Via::Agent] {
        assert_eq!(app1(), "0");
        let e = with_tool_via(
            via,
            &socat_tool(&admin, "set server web/app1 state maint\\n"),
            "{}",
        );
        let (code, result) = probe(&e);
        assert_ne!(code, 0, "{via:?}: {result:#}");
        assert!(
            result.to_string().contains("Permission denied"),
            "{via:?}: {result:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(app1(), "0", "{via:?}: app1 stays in service");

        let e = with_tool_via(via, &socat_tool(&stats, "show servers state web\\n"), "{}");
        let (code, result) = probe(&e);
        assert_eq!(code, 0, "{via:?}: {result:#}");
        assert!(result.to_string().contains("app1"), "{via:?}: {result:#}");
    }
}

/// `kill -TERM` of a root process, whatever pid a model or agent picks:
/// the process lives on.
#[test]
fn a_tier1_kill_of_a_root_process_is_refused() {
    for via in [Via::Local, Via::Agent] {
        let mut victim = Command::new("/bin/sleep").arg("60").spawn().unwrap();
        let e = with_tool_via(
            via,
            "name: probe\ntier: 1\ndescription: Signal a process.\nargs:\n  pid: { type: integer, min: 2, max: 4194304 }\nrun: [/bin/kill, -TERM, \"{{ pid }}\"]\n",
            &format!("{{ pid: {} }}", victim.id()),
        );
        let (code, result) = probe(&e);
        assert_ne!(code, 0, "{result:#}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            victim.try_wait().unwrap().is_none(),
            "{via:?}: the root process still runs"
        );
        victim.kill().unwrap();
        let _ = victim.wait();
    }
}

/// A loopback admin API: a POST to a port the declaration does not name
/// never connects; with the port in `connect:`, the same tool reaches it.
#[test]
fn a_tier1_connect_reaches_only_the_ports_its_declaration_names() {
    for via in [Via::Local, Via::Agent] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let tool = |connect: &str| {
            format!(
                "name: probe\ntier: 1\ndescription: Flush a cache.\nrun: [/usr/bin/curl, -sS, --max-time, \"2\", -X, POST, \"http://127.0.0.1:{port}/cache/flush\"]\n{connect}"
            )
        };
        let e = with_tool_via(via, &tool(""), "{}");
        let (code, result) = probe(&e);
        assert_ne!(code, 0, "{via:?}: {result:#}");
        assert!(
            listener.accept().is_err(),
            "{via:?}: no connection reached the API"
        );

        let e = with_tool_via(
            via,
            &tool(&format!("connect: [\"127.0.0.1:{port}\"]\n")),
            "{}",
        );
        let child = std::thread::spawn(move || probe(&e));
        let (mut conn, _) = wait_for("the declared connect", Duration::from_secs(10), || {
            listener.accept().ok()
        });
        let mut head = [0u8; 64];
        let n = conn.read(&mut head).unwrap();
        assert!(String::from_utf8_lossy(&head[..n]).starts_with("POST /cache/flush"));
        drop(conn);
        let _ = child.join();
    }
}

/// A datagram to an abstract unix socket (no file to guard it): never
/// delivered.
#[test]
fn a_tier1_datagram_to_an_abstract_socket_is_refused() {
    for via in [Via::Local, Via::Agent] {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("runwarden-test-{}-{via:?}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        receiver.set_nonblocking(true).unwrap();
        let e = with_tool_via(
            via,
            &format!(
                "name: probe\ntier: 1\ndescription: Tell a daemon.\nrun: [/usr/bin/socat, \"-\", \"ABSTRACT-SENDTO:{name}\"]\nstdin: \"reload\\n\"\n"
            ),
            "{}",
        );
        let (code, result) = probe(&e);
        assert_ne!(code, 0, "{result:#}");
        let mut buf = [0u8; 64];
        assert!(receiver.recv(&mut buf).is_err(), "nothing was delivered");
        // The same datagram from outside the sandbox is.
        let out = Command::new("/usr/bin/socat")
            .args(["-", &format!("ABSTRACT-SENDTO:{name}")])
            .stdin(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                std::io::Write::write_all(c.stdin.as_mut().unwrap(), b"reload\n")?;
                drop(c.stdin.take());
                c.wait()
            })
            .unwrap();
        assert!(out.success());
        let n = wait_for("the datagram", Duration::from_secs(5), || {
            receiver.recv(&mut buf).ok()
        });
        assert_eq!(&buf[..n], b"reload\n");
    }
}

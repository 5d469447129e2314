//! No neighbour can forge a verdict's evidence, read runwarden's secrets,
//! or take the machine: tier-1 tools declared as an attacker would write
//! them, on the release binary, with real programs.
//!
//! - One daemon, two runs: run A's tier-1 tool goes after run B's verify
//!   probe (the probe checks a change that did nothing) with `ptrace` (it
//!   rewrites the probe's `exit(3)` into `exit(0)` where it can),
//!   `/proc/PID/mem`, `process_vm_writev`, a write into the probe's stdout
//!   through `/proc/PID/fd/1`, `SIGSTOP` and `pidfd_send_signal`. Each is
//!   refused and B's change does not verify.
//! - A tier-1 tool reads runwarden's own token files and `/etc/shadow`:
//!   refused; a token that reaches a tool's output another way (a log line)
//!   is cut out of the report and the audit log.
//! - A fork loop and a memory hog end `failed`, the limit named.
//! - `connect: ["127.0.0.1:P"]` reaches neither `[::1]:P` nor UDP, and no
//!   tier-1 tool writes a datagram to a unix socket (a forged syslog line).

use std::time::Duration;

use serde_json::Value;

use crate::util::*;

/// The attacker: finds the process whose command line carries `MARKER`,
/// tries every way into it, and prints what each did as JSON. Where
/// `ptrace` works, it turns the target's `exit_group(3)` into
/// `exit_group(0)` (x86_64 registers), as the reported attack did.
const ATTACK: &str = r#"
import ctypes, errno, json, os, signal, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.syscall.restype = ctypes.c_long
marker = sys.argv[1].encode()
me = os.getpid()
def find():
    for _ in range(200):
        for p in os.listdir('/proc'):
            if not p.isdigit() or int(p) == me:
                continue
            try:
                c = open('/proc/%s/cmdline' % p, 'rb').read()
            except OSError:
                continue
            if marker in c.split(b'\0'):
                return int(p)
        time.sleep(0.02)
pid = find()
out = {'pid': pid}
def err(e):
    return errno.errorcode.get(e, str(e))
def attempt(name, f):
    try:
        f()
        out[name] = 'ok'
    except OSError as e:
        out[name] = err(e.errno)
def mem():
    with open('/proc/%d/mem' % pid, 'r+b') as m:
        m.seek(0x400000)
        m.write(b'\0')
attempt('mem', mem)
def fd():
    with open('/proc/%d/fd/1' % pid, 'w') as f:
        f.write('forged\n')
attempt('fd', fd)
def environ():
    open('/proc/%d/environ' % pid, 'rb').read()
attempt('environ', environ)
def vm():
    buf = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)
    r = libc.syscall(311, pid, local, 1, remote, 1, 0)  # process_vm_writev
    if r < 0:
        raise OSError(ctypes.get_errno(), 'process_vm_writev')
attempt('process_vm_writev', vm)
def stop():
    os.kill(pid, signal.SIGSTOP)
    os.kill(pid, signal.SIGCONT)
attempt('kill', stop)
def pidfd():
    fd = libc.syscall(434, pid, 0)  # pidfd_open
    if fd < 0:
        raise OSError(ctypes.get_errno(), 'pidfd_open')
    if libc.syscall(424, fd, signal.SIGSTOP, None, 0) < 0:  # pidfd_send_signal
        raise OSError(ctypes.get_errno(), 'pidfd_send_signal')
    libc.syscall(424, fd, signal.SIGCONT, None, 0)
attempt('pidfd_send_signal', pidfd)
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_SYSCALL = 0x4206, 0x4207, 24
PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 12, 13, 17
def trace():
    if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), 'ptrace')
    libc.ptrace(PTRACE_INTERRUPT, pid, None, None)
    os.waitpid(pid, 0x40000000)  # __WALL
    regs = (ctypes.c_ulonglong * 27)()
    for _ in range(100000):
        libc.ptrace(PTRACE_SYSCALL, pid, None, None)
        os.waitpid(pid, 0x40000000)
        libc.ptrace(PTRACE_GETREGS, pid, None, regs)
        if regs[15] == 231:  # orig_rax: exit_group
            regs[14] = 0      # rdi: its status
            libc.ptrace(PTRACE_SETREGS, pid, None, regs)
            libc.ptrace(PTRACE_DETACH, pid, None, None)
            return
attempt('ptrace', trace)
print(json.dumps(out))
"#;

/// What [`ATTACK`] looks for in its target's command line.
const MARKER: &str = "runwarden-probe-marker";

/// The configuration: host `local`; tool `noop_fix` (tier 2, changes
/// nothing; its verify probe sleeps, then says the change did not take:
/// exit 3) under runbook `fix`; tool `attack` (tier 1) under runbook
/// `look`, given `marker`.
fn neighbours(e: &Estate) {
    e.host("local", &local_host("local", "paths: [/tmp]"));
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    let script = e.work().join("attack.py");
    std::fs::write(&script, ATTACK).unwrap();
    std::fs::write(
        e.path().join("tools/noop_fix.yaml"),
        format!(
            "name: noop_fix\ntier: 2\ndescription: A fix that does nothing.\nverb: fix\nrun: [/bin/true]\nverify:\n  run: [/bin/sh, -c, \"sleep 3; exit 3\", {MARKER}]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        e.path().join("tools/attack.yaml"),
        format!(
            "name: attack\ntier: 1\ndescription: Look at the neighbours.\nrun: [/usr/bin/python3, \"{}\", {MARKER}]\ntimeout: 20s\n",
            script.display()
        ),
    )
    .unwrap();
    e.runbook(
        "fix",
        "name: fix\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: { approve: [noop_fix] }\nsteps:\n  - call: noop_fix\n    reason: the fix\n",
    );
    e.runbook(
        "look",
        "name: look\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: { observe: [attack] }\nsteps:\n  - call: attack\n",
    );
}

/// `run NAME --host local --via-daemon ADDR --json`: exit code and report.
fn via_daemon(e: &Estate, addr: &str, runbook: &str) -> (i32, Value) {
    let out = e.run(&[
        "run",
        runbook,
        "--host",
        "local",
        "--json",
        "--via-daemon",
        &format!("http://{addr}"),
    ]);
    // The report follows the line that names the run.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find("\n{").map_or("", |i| &text[i + 1..]);
    let report = serde_json::from_str(json).unwrap_or_else(|_| {
        panic!(
            "{runbook}: no report: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// The reported attack, in one daemon: run A's tier-1 tool goes after run
/// B's verify probe every way it can. Nothing reaches the probe, which
/// ends as it says (exit 3): B's change does not verify and B fails.
#[test]
fn a_tier1_tool_cannot_reach_another_runs_verify_probe() {
    let e = Estate::new();
    neighbours(&e);
    let (_daemon, addr) = serve(&e);
    let b = {
        let e_path = e.path().to_path_buf();
        let addr = addr.clone();
        std::thread::spawn(move || {
            let out = std::process::Command::new(bin())
                .args(["run", "fix", "--host", "local", "--json", "--via-daemon"])
                .arg(format!("http://{addr}"))
                .arg("--config")
                .arg(&e_path)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let json = text.find("\n{").map_or("", |i| &text[i + 1..]);
            let report: Value = serde_json::from_str(json).unwrap_or(Value::Null);
            (out.status.code(), report)
        })
    };
    let (a_code, a) = via_daemon(&e, &addr, "look");
    let (b_code, b) = b.join().unwrap();
    assert_eq!(a_code, 0, "the attacker's own run: {a:#}");
    let said: Value = serde_json::from_str(
        a["steps"][0]["result"]["data"]["stdout"]
            .as_str()
            .unwrap_or("{}"),
    )
    .unwrap_or(Value::Null);
    assert!(said["pid"].is_u64(), "it found the probe: {a:#}");
    for way in [
        "ptrace",
        "mem",
        "process_vm_writev",
        "fd",
        "environ",
        "kill",
        "pidfd_send_signal",
    ] {
        let answer = said[way].as_str().unwrap_or("?");
        assert!(
            answer == "EPERM" || answer == "EACCES",
            "{way} reached the other run's probe: {answer} ({said})"
        );
    }
    assert_eq!(b_code, Some(1), "{b:#}");
    assert_eq!(b["verdict"], "failed", "{b:#}");
    assert_eq!(b["steps"][0]["result"]["verified"], false, "{b:#}");
    assert_eq!(b["mutations"], 1, "{b:#}");
}

/// A tier-1 tool that prints a file, given the file: `cat` as a careless
/// author declares it, with a path argument the host allows anywhere.
fn cat_tool(e: &Estate) {
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    std::fs::write(
        e.path().join("tools/show.yaml"),
        "name: show\ntier: 1\ndescription: Print a file.\nargs:\n  file: { type: path }\nrun: [/usr/bin/cat, \"{{ file }}\"]\n",
    )
    .unwrap();
    e.host("local", &local_host("local", "paths: [/]"));
    e.runbook(
        "show",
        "name: show\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: { observe: [show] }\nsteps: []\n",
    );
}

/// `show` of `file`, run by hand: the exit code and the step's result.
fn show(e: &Estate, file: &std::path::Path) -> (i32, Value, Value) {
    let steps = format!(
        "name: show\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: {{ observe: [show] }}\nsteps:\n  - call: show\n    args: {{ file: \"{}\" }}\n",
        file.display()
    );
    e.runbook("show", &steps);
    let (code, report) = e.run_json("show", "local", &[]);
    (code, report["steps"][0]["result"].clone(), report)
}

/// runwarden's own secret files, its state, and the system's
/// credentials: a tier-1 tool reads none of them, though it reads the
/// file beside each; a secret that reaches a tool's output another way
/// is cut out of the report and the audit log.
#[test]
fn a_tier1_tool_reads_no_secret_of_runwardens_nor_the_systems() {
    let e = Estate::new();
    cat_tool(&e);
    let token = format!("webhook-{}-0123456789abcdef", tag());
    let mcp = format!("mcp-{}-fedcba9876543210", tag());
    write_secret(&e.path().join("webhook.token"), &token);
    write_secret(&e.path().join("mcp.token"), &mcp);
    std::fs::write(
        e.path().join("runwarden.yaml"),
        "audit_head: none\nwebhook_token_file: webhook.token\nmcp_token_file: mcp.token\n",
    )
    .unwrap();
    // A first run makes the state directory (the permit key, the log).
    let (code, _, report) = show(&e, &e.path().join("runwarden.yaml"));
    assert_eq!(
        code, 0,
        "the settings beside the tokens are read: {report:#}"
    );
    // The permit key, as the daemon makes it for a host's agent.
    let key = e.path().join("state/permit.key");
    if !key.exists() {
        write_secret(&key, "permit-key-0123456789abcdef0123456789abcdef");
    }
    for (secret, what) in [
        (e.path().join("webhook.token"), "the webhook token"),
        (e.path().join("mcp.token"), "the MCP token"),
        (e.audit_path(), "the audit log"),
        (e.path().join("state/permit.key"), "the permit key"),
        ("/etc/shadow".into(), "/etc/shadow"),
    ] {
        let (code, result, report) = show(&e, &secret);
        assert_ne!(code, 0, "{what} was read: {report:#}");
        let text = result.to_string();
        assert!(text.contains("Permission denied"), "{what}: {text}");
        assert!(
            !text.contains(&token) && !text.contains(&mcp),
            "{what}: {text}"
        );
    }
    // The token, quoted in a log line the tool may read: cut out.
    let log = e.work().join("app.log");
    std::fs::write(&log, format!("GET /hook Authorization: Bearer {token}\n")).unwrap();
    let (code, result, report) = show(&e, &log);
    assert_eq!(code, 0, "{report:#}");
    let text = result.to_string();
    assert!(text.contains("Bearer [redacted]"), "{text}");
    let audit = std::fs::read_to_string(e.audit_path()).unwrap();
    assert!(!audit.contains(&token), "the token is in the audit log");
    assert!(!report.to_string().contains(&token), "{report:#}");
}

/// A fork loop and a memory hog: each ends `failed`, its error naming the
/// observer's limits; the machine is left as it was (no process of the
/// loop outlives the call).
#[test]
fn a_fork_loop_and_a_memory_hog_end_failed_with_the_limit_named() {
    let e = Estate::new();
    e.host("local", &local_host("local", "paths: [/tmp]"));
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    let loop_ = e.script(
        "forks.sh",
        "i=0; while [ $i -lt 600 ]; do /bin/sleep 30 & i=$((i+1)); done; wait",
    );
    std::fs::write(
        e.path().join("tools/forks.yaml"),
        format!(
            "name: forks\ntier: 1\ndescription: Fork.\nrun: [/bin/sh, \"{}\"]\ntimeout: 15s\n",
            loop_.display()
        ),
    )
    .unwrap();
    std::fs::write(
        e.path().join("tools/hog.yaml"),
        "name: hog\ntier: 1\ndescription: Hold memory.\nrun: [/usr/bin/python3, -c, \"b = bytearray(1 << 30); print(len(b))\"]\n",
    )
    .unwrap();
    for tool in ["forks", "hog"] {
        e.runbook(
            tool,
            &format!(
                "name: {tool}\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: {{ observe: [{tool}] }}\nsteps:\n  - call: {tool}\n"
            ),
        );
        let (code, report) = e.run_json(tool, "local", &[]);
        assert_eq!(code, 1, "{tool}: {report:#}");
        assert_eq!(report["verdict"], "failed", "{tool}: {report:#}");
        let error = step_error(&report, report["steps"][0]["id"].as_str().unwrap_or("1"));
        assert!(
            error.contains("what a tier-1 process may take") && error.contains("MiB of data"),
            "{tool}: {error}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let left = alive_with(&loop_.display().to_string());
    assert!(
        left.is_empty(),
        "the loop's processes outlived it: {left:?}"
    );
}

/// `connect: ["127.0.0.1:P"]`: TCP to 127.0.0.1:P only, not `[::1]:P`, not
/// UDP to the same port; with `127.0.0.1:P/udp` the datagram goes. No
/// tier-1 tool writes to a unix datagram socket (a syslog line).
#[test]
fn a_declaration_holds_the_family_and_the_transport() {
    let e = Estate::new();
    e.host("local", &local_host("local", "paths: [/tmp]"));
    std::fs::create_dir_all(e.path().join("tools")).unwrap();
    let v6 = std::net::TcpListener::bind("[::1]:0").expect("IPv6 loopback");
    let port = v6.local_addr().unwrap().port();
    v6.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let uport = udp.local_addr().unwrap().port();
    let log = e.work().join("log.sock");
    let syslog = std::os::unix::net::UnixDatagram::bind(&log).unwrap();
    syslog.set_nonblocking(true).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    let tool = |name: &str, target: &str, connect: &str| {
        std::fs::write(
            e.path().join(format!("tools/{name}.yaml")),
            format!(
                "name: {name}\ntier: 1\ndescription: Send.\nrun: [/usr/bin/socat, \"-\", \"{target}\"]\nstdin: \"sshd[1]: Accepted publickey for root\\n\"\nconnect: {connect}\n"
            ),
        )
        .unwrap();
        e.runbook(
            name,
            &format!(
                "name: {name}\ndescription: t\nhosts: [local]\nautonomy: L3\ntools: {{ observe: [{name}] }}\nsteps:\n  - call: {name}\n"
            ),
        );
        e.run_json(name, "local", &[])
    };
    let mut buf = [0u8; 128];
    let (code, report) = tool(
        "six",
        &format!("TCP6:[::1]:{port}"),
        &format!("[\"127.0.0.1:{port}\"]"),
    );
    assert_ne!(code, 0, "{report:#}");
    assert!(v6.accept().is_err(), "an IPv4 declaration reached [::1]");
    let (code, report) = tool(
        "udp",
        &format!("UDP4:127.0.0.1:{uport}"),
        &format!("[\"127.0.0.1:{uport}\"]"),
    );
    assert_ne!(code, 0, "{report:#}");
    assert!(udp.recv(&mut buf).is_err(), "a TCP declaration sent UDP");
    let (code, report) = tool("syslog", &format!("UNIX-SENDTO:{}", log.display()), "[]");
    assert_ne!(code, 0, "{report:#}");
    assert!(syslog.recv(&mut buf).is_err(), "a forged log line was sent");
    let (code, report) = tool(
        "udp_declared",
        &format!("UDP4:127.0.0.1:{uport}"),
        &format!("[\"127.0.0.1:{uport}/udp\"]"),
    );
    assert_eq!(code, 0, "{report:#}");
    let n = wait_for("the declared datagram", Duration::from_secs(5), || {
        udp.recv(&mut buf).ok()
    });
    assert!(String::from_utf8_lossy(&buf[..n]).contains("Accepted publickey"));
}

//! Helpers for the integration tests: a config directory per test, the real
//! binary, and readers for its report and audit log.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The binary under test: the shipped build when `RUNWARDEN_BIN` names it
/// (`tests/run.sh` builds it with `cargo build --release --locked`, as the
/// package does, so every tier drives what users run), else this test
/// build's.
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("RUNWARDEN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_runwarden").into())
    })
}

/// This test build's binary, whatever `RUNWARDEN_BIN` says: the only one
/// with the `fault-injection` hook (`RUNWARDEN_FAULT`), never shipped.
pub fn test_build_bin() -> &'static str {
    env!("CARGO_BIN_EXE_runwarden")
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A throw-away config directory: runbooks/, hosts/, kill-switch/, state/.
pub struct Estate {
    pub dir: tempfile::TempDir,
}

impl Estate {
    pub fn new() -> Estate {
        let dir = tempfile::Builder::new()
            .prefix("rw-it-")
            .tempdir()
            .expect("tempdir");
        for d in ["runbooks", "hosts", "kill-switch", "work"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Estate { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A scratch directory for the test's own files (logs, certificates, scripts).
    pub fn work(&self) -> PathBuf {
        self.path().join("work")
    }

    pub fn host(&self, name: &str, yaml: &str) -> &Self {
        std::fs::write(self.path().join(format!("hosts/{name}.yaml")), yaml).unwrap();
        self
    }

    pub fn runbook(&self, name: &str, yaml: &str) -> &Self {
        std::fs::write(self.path().join(format!("runbooks/{name}.yaml")), yaml).unwrap();
        self
    }

    /// Copy one of the repository's shipped runbooks.
    pub fn shipped_runbook(&self, name: &str) -> &Self {
        let text = std::fs::read_to_string(repo().join(format!("runbooks/{name}.yaml"))).unwrap();
        self.runbook(name, &text)
    }

    /// An executable script in the work directory (a hostile or slow "binary" for a tool).
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.work().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args).arg("--config").arg(self.path());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("spawn runwarden")
    }

    /// `runwarden run RUNBOOK --host HOST --json [extra]`: the exit code and the report.
    pub fn run_json(&self, runbook: &str, host: &str, extra: &[&str]) -> (i32, Value) {
        let mut args = vec!["run", runbook, "--host", host, "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON report ({e}); exit {:?}\nstdout: {}\nstderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }

    pub fn audit_path(&self) -> PathBuf {
        self.path().join("state/audit.jsonl")
    }

    /// The log's whole lines. Read while a daemon writes, the text may end
    /// inside a line its writer has not finished copying in: that part,
    /// after the last newline, is not a line yet.
    pub fn audit(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        whole
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }

    /// Audit lines of one phase.
    pub fn audit_phase(&self, phase: &str) -> Vec<Value> {
        self.audit()
            .into_iter()
            .filter(|l| l["phase"] == phase)
            .collect()
    }
}

/// The steps of a report with the given status.
pub fn steps_with(report: &Value, status: &str) -> Vec<Value> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == status)
        .cloned()
        .collect()
}

pub fn step<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no step {id} in {report:#}"))
}

/// The error text of one step's result.
pub fn step_error(report: &Value, id: &str) -> String {
    step(report, id)["result"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("step {id} has no error: {report:#}"))
        .to_string()
}

/// Run a command and insist it succeeds (test setup only).
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A secret file (token, approvers, model key): only its owner may read it.
/// A token's SHA-256 in hex, as a principals file holds it.
pub fn sha256_hex(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

pub fn local_host(name: &str, extra: &str) -> String {
    format!("name: {name}\nconnection: local\n{extra}\n")
}

/// A child process ended when dropped.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Poll `f` until it gives a value, or fail the test after `timeout`.
pub fn wait_for<T>(
    what: &str,
    timeout: std::time::Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// One HTTP/1.0 request on loopback (no chunked answers): (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    http_with(addr, method, path, body, &[])
}

/// [`http`] with extra header lines (`"Authorization: Bearer T"`).
pub fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[&str],
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(
        c,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        headers.iter().map(|h| format!("{h}\r\n")).collect::<String>()
    )
    .ok()?;
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).ok()?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.get(9..12)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n")?.1.to_string()))
}

/// `runwarden serve` on a free loopback port: the process and its address.
pub fn serve(e: &Estate) -> (Proc, String) {
    let (child, addr) = spawn_serve(e);
    (Proc(child), addr)
}

/// Start `runwarden serve` and read the address it says it listens on.
pub fn spawn_serve(e: &Estate) -> (std::process::Child, String) {
    start_serve(e.cmd(&["serve", "--listen", "127.0.0.1:0"]))
}

/// Start a prepared `runwarden serve` command and read the address it says
/// it listens on from its first line of stdout.
pub fn start_serve(mut cmd: Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("runwarden serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .nth(3)
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim_end_matches(';')
        .to_string();
    (child, addr)
}

/// Debian's prometheus-alertmanager with `config`, on a free port, ready.
pub fn alertmanager(dir: &Path, config: &str) -> (Proc, String) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("alertmanager.yml"), config).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let proc = Proc(
        Command::new("/usr/bin/prometheus-alertmanager")
            .arg(format!(
                "--config.file={}",
                dir.join("alertmanager.yml").display()
            ))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-alertmanager (Debian package)"),
    );
    wait_for("alertmanager", std::time::Duration::from_secs(20), || {
        http(&addr, "GET", "/-/ready", "").filter(|r| r.0 == 200)
    });
    (proc, addr)
}

/// Debian's prometheus with `config` (rule files relative to `dir`), on a free port.
pub fn prometheus(dir: &Path, config: &str) -> (Proc, String) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let proc = Proc(
        Command::new("/usr/bin/prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package)"),
    );
    (proc, addr)
}

/// A real log file and a logrotate configuration for it in the work
/// directory: (configuration, state file), both absolute.
pub fn rotatable_log(e: &Estate) -> (String, String) {
    rotatable_log_in(e, "logs", "lr")
}

/// `WORK/LOGS/app.log` and its logrotate configuration `WORK/NAME.conf`
/// (state `WORK/NAME.state`): as paths for a host file.
pub fn rotatable_log_in(e: &Estate, logs: &str, name: &str) -> (String, String) {
    let logs = e.work().join(logs);
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("app.log"), "line\n").unwrap();
    let conf = e.work().join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "{}/app.log {{\n  rotate 9\n  missingok\n  create\n}}\n",
            logs.display()
        ),
    )
    .unwrap();
    (
        conf.display().to_string(),
        e.work().join(format!("{name}.state")).display().to_string(),
    )
}

/// A local host that may look at /tmp and rotate the log of [`rotatable_log`].
pub fn rotating_host(e: &Estate, name: &str) -> String {
    let (conf, state) = rotatable_log(e);
    e.host(
        name,
        &local_host(
            name,
            &format!("paths: [/tmp]\nlogrotate_configs: [{conf}]\nlogrotate_state: {state}"),
        ),
    );
    conf
}

/// Mount a 16 MiB tmpfs at `mnt` in a private mount namespace, run the shell
/// `setup` in it, then `runwarden ARGS --json --config DIR` there.
pub fn run_on_small_tmpfs(
    e: &Estate,
    mnt: &Path,
    setup: &str,
    args: &str,
    env: &[(&str, &str)],
) -> Output {
    let script = format!(
        "set -e; mount -t tmpfs -o size=16M,mode=755 rw-small {m}; {setup}; exec {bin} {args} --json --config {cfg}",
        m = mnt.display(),
        bin = bin(),
        cfg = e.path().display()
    );
    in_private_mount_namespace(&script)
        .envs(env.iter().copied())
        .output()
        .expect("unshare")
}

/// Run a command to the end: its stdout, exit code and its own peak RSS in
/// KiB. GNU time forks the command from its own small image and reports
/// its child's peak: a child spawned straight from this test binary would
/// count the test binary's memory, which it shares until it execs.
pub fn run_measured(cmd: Command) -> (Vec<u8>, Option<i32>, i64) {
    run_measured_to(cmd, Stdio::null())
}

/// [`run_measured`], sending the command's stderr to `stderr`.
pub fn run_measured_to(cmd: Command, stderr: Stdio) -> (Vec<u8>, Option<i32>, i64) {
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut timed = Command::new("/usr/bin/time");
    timed
        .arg("-q")
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(report.path())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => timed.env(k, v),
            None => timed.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        timed.current_dir(dir);
    }
    let out = timed
        .stdout(Stdio::piped())
        .stderr(stderr)
        .output()
        .expect("/usr/bin/time (Debian package time)");
    let rss = std::fs::read_to_string(report.path())
        .unwrap_or_default()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(i64::MAX);
    (out.stdout, out.status.code(), rss)
}

/// `/bin/sh -c SCRIPT` in a private mount namespace: its mounts vanish with it.
pub fn in_private_mount_namespace(script: &str) -> Command {
    let mut c = Command::new("/usr/bin/unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        script,
    ]);
    c
}

/// A new ed25519 key pair at `path` (and `path.pub`), no passphrase.
pub fn keygen(path: &Path) {
    sh(
        "/usr/bin/ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "runwarden",
            "-f",
            path.to_str().unwrap(),
        ],
    );
}

/// A disk made slow to sync for one process: `strace` holds each of its
/// fdatasync calls on entry. A test double for a stalling disk, which
/// cannot be made here on demand; the process and its syscalls are real.
pub struct StalledDisk {
    strace: std::process::Child,
    log: PathBuf,
}

impl StalledDisk {
    /// Hold every fdatasync of `pid` (all its threads) for `each`.
    pub fn hold(pid: u32, each: std::time::Duration, log: &Path) -> StalledDisk {
        let strace = Command::new("/usr/bin/strace")
            .args(["-f", "-qq", "-e", "trace=fdatasync", "-e"])
            .arg(format!(
                "inject=fdatasync:delay_enter={}ms",
                each.as_millis()
            ))
            .arg("-o")
            .arg(log)
            .args(["-p", &pid.to_string()])
            .spawn()
            .unwrap();
        StalledDisk {
            strace,
            log: log.to_path_buf(),
        }
    }

    /// Let go; it held at least one sync.
    pub fn release(mut self) {
        let _ = self.strace.kill();
        let _ = self.strace.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(log.contains("(DELAYED)"), "no sync was held: {log}");
    }
}

/// No call ran at or after `limit` (seconds since the epoch), by the clock
/// of the tool itself: `calls` holds one `date +%s.%N` line per run of a
/// recording tool script.
pub fn no_call_after(calls: &Path, limit: f64, what: &str) {
    let ran: Vec<f64> = std::fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert!(
        ran.iter().all(|t| *t < limit),
        "a call at {ran:?}, {what} at {limit}"
    );
}

/// A number of this test's own for `sleep` arguments (`311.TAG`): the
/// processes a hostile tool leaves behind are found by it in `/proc`, since
/// a tier-1 tool, confined by Landlock, can write no file to name them in.
pub fn tag() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{}{:03}",
        std::process::id() % 100_000,
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1000
    )
}

/// The processes alive (not zombies) whose command line holds `needle`:
/// each `pid: cmdline`. Each is killed on the way, so a failing test
/// leaves none behind.
pub fn alive_with(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .unwrap_or_default()
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if cmdline.contains(needle) && !zombie {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            out.push(format!("{pid}: {cmdline}"));
        }
    }
    out
}

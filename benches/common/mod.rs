//! What the benches share: a config directory written file by file, a
//! `runwarden serve` on a free loopback port, HTTP/1.1 by hand,
//! percentiles.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// `n` local hosts `h000`, `h001`... in `root`, whose `ps` is the compiled
/// program `root/first-call`: the time its `main` began is appended to
/// `root/out/marks` (so a bench sees a tool's first call, and what it sees is
/// the same program's start on every side it compares). The kill switch
/// directory too. The marks file and the host names.
pub fn marking_hosts(root: &Path, n: usize) -> (std::path::PathBuf, Vec<String>) {
    marking_hosts_taking(root, n, Duration::ZERO)
}

/// [`marking_hosts`] whose `ps` then takes `takes` before it answers.
pub fn marking_hosts_taking(
    root: &Path,
    n: usize,
    takes: Duration,
) -> (std::path::PathBuf, Vec<String>) {
    // Not in the config directory itself: the daemon watches that for
    // runwarden.yaml, and a mark is no change to its configuration.
    let marks = root.join("out/marks");
    std::fs::create_dir_all(root.join("out")).unwrap();
    let script = stamp_taking(root, &marks, takes);
    write(root, "kill-switch/README", "");
    let hosts: Vec<String> = (0..n).map(|i| format!("h{i:03}")).collect();
    for h in &hosts {
        write(
            root,
            &format!("hosts/{h}.yaml"),
            &format!(
                "name: {h}\nconnection: local\nbinaries: {{ ps: {} }}\n",
                script.display()
            ),
        );
    }
    (marks, hosts)
}

/// `root/first-call`, compiled with `rustc -O`: the first thing its `main`
/// does is take the time (seconds since the epoch, nanoseconds) and have it
/// appended to `marks`; then it prints one process as `ps` would.
pub fn stamp(root: &Path, marks: &Path) -> std::path::PathBuf {
    stamp_taking(root, marks, Duration::ZERO)
}

/// [`stamp`], sleeping `takes` after its mark: a tool that takes that long.
///
/// The program sends its mark as a datagram on loopback, and a thread of
/// the bench appends it to `marks`: a tier-1 tool cannot write a file (its
/// process is confined by Landlock), and the time in the mark is taken by
/// the program before it sends, so the hop costs the figures nothing.
pub fn stamp_taking(root: &Path, marks: &Path, takes: Duration) -> std::path::PathBuf {
    let collector = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = collector.local_addr().unwrap().port();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(marks)
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(n) = collector.recv(&mut buf) {
            file.write_all(&buf[..n]).unwrap();
            file.write_all(b"\n").unwrap();
        }
    });
    let source = root.join("first-call.rs");
    write(
        root,
        "first-call.rs",
        &format!(
            r#"fn main() {{
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let mark = format!("{{}}.{{:09}}", t.as_secs(), t.subsec_nanos());
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(mark.as_bytes(), ("127.0.0.1", {port})).unwrap();
    std::thread::sleep(std::time::Duration::from_micros({micros}));
    println!("1 0 root S 1 0.0 100 init");
}}
"#,
            micros = takes.as_micros()
        ),
    );
    // A tier-1 tool runs as the observer's user: it must reach the program
    // (a temporary directory is its owner's alone).
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let program = root.join("first-call");
    let out = Command::new("rustc")
        .args(["-O", "--edition", "2021", "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .expect("rustc, to build the stamp program");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    program
}

pub struct Daemon {
    pub child: Child,
    pub addr: String,
    pub startup: Duration,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `runwarden serve` on a free loopback port, logging at info.
pub fn start(dir: &Path) -> Daemon {
    start_logging(dir, "info")
}

/// `runwarden serve` on a free loopback port, logging at `level`.
pub fn start_logging(dir: &Path, level: &str) -> Daemon {
    spawn_daemon(dir, level, Stdio::inherit())
}

/// [`start`] whose log lines go to /dev/null: written, not shown (for a
/// comparison with a server whose own log is discarded).
pub fn start_quiet(dir: &Path) -> Daemon {
    spawn_daemon(dir, "info", Stdio::null())
}

fn spawn_daemon(dir: &Path, level: &str, log: Stdio) -> Daemon {
    // `RUNWARDEN_BENCH_BIN=PATH`: another build (an earlier release) in
    // this build's place, to compare the two on the same machine.
    let bin = std::env::var_os("RUNWARDEN_BENCH_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_runwarden").into());
    spawn_binary(&bin, dir, level, log)
}

/// `bin serve` on a free loopback port, logging at `level`: another build
/// of runwarden (a previous release, for a fleet in the middle of a roll).
pub fn start_binary(bin: &Path, dir: &Path, level: &str) -> Daemon {
    spawn_binary(bin, dir, level, Stdio::inherit())
}

fn spawn_binary(bin: &Path, dir: &Path, level: &str, log: Stdio) -> Daemon {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir)
        .env("RUNWARDEN_LOG", level)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let startup = t.elapsed();
    let addr = line
        .split_whitespace()
        .nth(3)
        .unwrap()
        .trim_end_matches(';')
        .to_string();
    Daemon {
        child,
        addr,
        startup,
    }
}

/// One POST, sent as Alertmanager's Go client sends it: the whole request
/// in one write on a `TCP_NODELAY` socket. (`write!` straight to the socket
/// would send each piece of the format string as its own segment, and how
/// fast a server reassembles those is no part of what a bench compares.)
pub fn post(addr: &str, path: &str, body: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(request.as_bytes()).unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    resp
}

pub fn get(addr: &str, path: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    resp
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

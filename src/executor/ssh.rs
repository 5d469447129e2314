//! The runner side of SSH: the system OpenSSH client, by argv.
//!
//! Why OpenSSH and not a Rust SSH library: it is the client operators already
//! audit and configure; its `known_hosts` pinning, `BatchMode` and connection
//! multiplexing (`ControlMaster`) are well understood; and nothing about keys
//! or host verification is reimplemented here. Every call is one request on
//! the connection's stdin and one JSON line back from the forced-command
//! agent; the remote command line is fixed and ignored by the host anyway.
//! Host keys are never accepted on first use (`StrictHostKeyChecking=yes`
//! against the host file's own `known_hosts`).
//!
//! A run's calls to one host share one connection and one agent: a
//! [`Session`] starts an `ssh -M` master and, through it, one agent session,
//! each in a process group of its own, and sends the run's requests one line
//! at a time (the agent serves requests until EOF). Both end with the run.
//! A reply that does not come by the call's deadline, or a channel that
//! breaks, ends that session (its whole process group is killed) and is a
//! transport error; the next call opens a new one. A session whose master is
//! gone connects on its own, so a dead master costs a round trip, never a call.
//!
//! Transport failures are results. A tier-1 call is retried once. A tier-2
//! call is never retried blindly, it may have happened: the session
//! reconnects with bounded backoff and asks the host's agent what its own
//! audit log says about that exact call (run id and step), and reports that:
//! the result the host recorded (with the tool's own verification), "never
//! received" (it did not run), or "started, no result" (unknown: a person
//! must look).
//!
//! One file: the session's state (connection, agent
//! process, what was sent) is shared by dispatch, recovery after a lost
//! connection and the failure kinds `host check` reports.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use crate::agent::wire::{Call, Reply, ReplyError, Request, read_reply};
use crate::config::Host;
use crate::host::Ssh;
use crate::process::{self, Argv};
use crate::tools::{Failure, Outcome, Tier, ToolResult, Unreachable};

/// OpenSSH's exit status for its own failures (connection, authentication, host key).
const SSH_FAILED: i32 = 255;
/// Reconnect attempts after a transport error during a tier-2 call.
const RECONNECT_ATTEMPTS: u32 = 8;

/// The options every connection uses, before the mode (master, client).
fn base(host: &Host, ssh: &Ssh) -> Argv {
    Argv::new(&host.binaries.ssh)
        .args(["-F", "/dev/null", "-T"])
        .arg("-i")
        .arg(ssh.identity.to_string_lossy())
        .args([
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
        ])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", ssh.known_hosts.display()))
        .args([
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=5",
        ])
        .args(["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2"])
        .arg("-p")
        .arg(ssh.port.to_string())
        .arg("-l")
        .arg(ssh.user.clone())
}

/// One call's client: through the master's socket when there is one.
pub(crate) fn argv(host: &Host, ssh: &Ssh, control: Option<&Path>) -> Argv {
    let argv = base(host, ssh).args(["-o", "ControlMaster=no"]);
    let argv = match control {
        Some(p) => argv.arg("-o").arg(format!("ControlPath={}", p.display())),
        None => argv.args(["-o", "ControlPath=none"]),
    };
    argv.arg("--")
        .arg(ssh.address.clone())
        .arg("runwarden-agent")
}

/// Whether a failed result was the connection's fault.
pub(crate) fn is_transport_error(r: &ToolResult) -> bool {
    r.failure.is_some_and(Failure::is_transport)
}

/// What kind of failure a transport error was, in a person's words:
/// `refused`, `timed out`, `host key mismatch`, `authentication refused`,
/// `answered garbage` or `unreachable`; decided where it happened.
pub(crate) fn failure_kind(r: &ToolResult) -> &'static str {
    match r.failure {
        Some(Failure::Transport(kind)) => kind.as_str(),
        _ if r.outcome == Outcome::Timeout => Unreachable::TimedOut.as_str(),
        _ => Unreachable::Other.as_str(),
    }
}

/// How ssh itself failed (exit 255), from its own words on stderr: the one
/// place its failures are told apart, since ssh says them only as text.
fn ssh_failure(stderr: &str) -> Unreachable {
    let said = |words: &[&str]| words.iter().any(|w| stderr.contains(w));
    if said(&["Connection timed out", "timed out"]) {
        Unreachable::TimedOut
    } else if said(&["Connection refused"]) {
        Unreachable::Refused
    } else if said(&["Host key verification failed", "IDENTIFICATION HAS CHANGED"]) {
        Unreachable::HostKeyMismatch
    } else if said(&["Permission denied"]) {
        Unreachable::AuthenticationRefused
    } else if said(&[
        "kex_exchange_identification",
        "protocol version",
        "invalid characters",
        "invalid format",
        "banner exchange",
    ]) {
        Unreachable::AnsweredGarbage
    } else {
        Unreachable::Other
    }
}

/// The connection of one run to one host.
pub struct Session {
    /// Where and as whom to connect.
    pub(crate) target: Ssh,
    /// Where the master's socket lives; `None` when no private directory could be made.
    control: Option<PathBuf>,
    master: Mutex<Option<std::process::Child>>,
    /// The agent session the run's requests go through.
    channel: tokio::sync::Mutex<Option<Channel>>,
}

impl Session {
    /// A session for one run: its connection master is started on the first call.
    pub(crate) fn new(target: Ssh, run_id: &str) -> Session {
        let control = control_dir().ok().filter(|_| target.multiplex).map(|d| {
            use sha2::Digest;
            let tag = sha2::Sha256::digest(format!("{run_id}\0{}", target.address));
            let hex: String = tag[..6].iter().map(|b| format!("{b:02x}")).collect();
            d.join(format!("{hex}.sock"))
        });
        Session {
            target,
            control,
            master: Mutex::new(None),
            channel: tokio::sync::Mutex::new(None),
        }
    }

    /// The socket to pass to a call: the live master's, if any (the caller made the jail).
    async fn ensure_master(&self, host: &Host) -> Option<&Path> {
        let path = self.control.as_deref()?;
        {
            let mut m = self.master.lock().unwrap_or_else(|p| p.into_inner());
            let alive = m.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if alive && path.exists() {
                return Some(path);
            }
            if let Some(mut old) = m.take() {
                let _ = old.kill();
                let _ = old.wait();
            }
            let _ = std::fs::remove_file(path);
            let master = base(host, &self.target)
                .args(["-N", "-o", "ControlMaster=yes", "-o", "ControlPersist=no"])
                .arg("-o")
                .arg(format!("ControlPath={}", path.display()))
                .arg("--")
                .arg(self.target.address.clone());
            let child = process::spawn_detached(&master, &host.jail);
            match child {
                Ok(c) => *m = Some(c),
                Err(e) => {
                    tracing::warn!(host = %host.name, "ssh master: {e}; calls connect one by one");
                    return None;
                }
            }
        }
        // Ready when the socket appears; a master that exits (unreachable,
        // refused) leaves the call to connect, and fail, on its own.
        for _ in 0..70 {
            if path.exists() {
                return Some(path);
            }
            let exited = {
                let mut m = self.master.lock().unwrap_or_else(|p| p.into_inner());
                m.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
            };
            if exited {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// Send one request to the host's agent and read its answer.
    pub(crate) async fn call(
        &self,
        host: &Host,
        request: &Request,
        deadline: tokio::time::Instant,
    ) -> ToolResult {
        let mut channel = self.channel.lock().await;
        if channel.is_none() {
            if let Err(e) = create_private_dir(&host.jail) {
                return ToolResult::failed(format!("cannot create {}: {e}", host.jail.display()));
            }
            let control = self.ensure_master(host).await;
            match Channel::open(&argv(host, &self.target, control), &host.jail) {
                Ok(c) => *channel = Some(c),
                Err(e) => return ToolResult::failed(format!("cannot start ssh: {e}")),
            }
        }
        let Some(ch) = channel.as_mut() else {
            return ToolResult::failed("no ssh channel");
        };
        let exchanged = ch.exchange(request, deadline).await;
        if exchanged.is_ok()
            && !self.target.multiplex
            && let Some(ch) = channel.take()
        {
            // One connection per call: close it (the agent sees EOF and exits).
            // A failed one is ended below, where ssh's own words are read.
            ch.close().await;
        }
        match exchanged {
            Ok(line) => {
                let reply = serde_json::from_slice::<Reply>(&line);
                match reply {
                    Ok(reply) => reply.into_result(host),
                    Err(e) => {
                        if let Some(ch) = channel.take() {
                            ch.kill();
                        }
                        transport(
                            host,
                            Unreachable::AnsweredGarbage,
                            format!(
                                "malformed reply from the agent on host {}: {e} ({} bytes)",
                                host.name,
                                line.len()
                            ),
                        )
                    }
                }
            }
            Err(broken) => {
                let (code, why) = match channel.take() {
                    Some(ch) => ch.end().await,
                    None => (None, "the connection closed".into()),
                };
                let kind = match broken {
                    Broken::Timeout => Unreachable::TimedOut,
                    Broken::TooLong(_) => Unreachable::AnsweredGarbage,
                    Broken::Closed if code == Some(SSH_FAILED) => ssh_failure(&why),
                    Broken::Closed => Unreachable::AnsweredGarbage,
                };
                let mut r = transport(
                    host,
                    kind,
                    match broken {
                        Broken::Timeout => format!(
                            "host {} ({}) did not answer in time; the ssh process group was killed",
                            host.name, self.target.address
                        ),
                        Broken::TooLong(n) => format!(
                            "malformed reply from the agent on host {}: no end of line in {n} bytes, cut at the cap",
                            host.name
                        ),
                        Broken::Closed if code == Some(SSH_FAILED) => format!(
                            "ssh to host {} ({}:{}) failed: {why}",
                            host.name, self.target.address, self.target.port
                        ),
                        Broken::Closed => {
                            format!("the agent on host {} answered nothing ({why})", host.name)
                        }
                    },
                );
                if matches!(broken, Broken::Timeout) {
                    r.outcome = Outcome::Timeout;
                }
                r
            }
        }
    }

    /// A tool call, with the transport's retry rules (see the module doc).
    pub(crate) async fn dispatch(
        &self,
        host: &Host,
        call: &Call,
        tier: Tier,
        deadline: tokio::time::Instant,
    ) -> ToolResult {
        let request = Request::Call(Box::new(call.clone()));
        let result = self.call(host, &request, deadline).await;
        if !is_transport_error(&result) {
            return result;
        }
        match tier {
            Tier::Observe => self.call(host, &request, deadline).await,
            Tier::Change => self.recover(host, call, result, deadline).await,
        }
    }

    /// After a transport error during a tier-2 call: reconnect (backoff,
    /// bounded by the deadline) and report what the host recorded.
    async fn recover(
        &self,
        host: &Host,
        request: &Call,
        failure: ToolResult,
        deadline: tokio::time::Instant,
    ) -> ToolResult {
        let first = failure.error.clone().unwrap_or_default();
        let status = Request::Status {
            run_id: request.run_id.clone(),
            step: request.step,
        };
        let mut last = first.clone();
        let mut backoff = Duration::from_millis(500);
        for attempt in 1..=RECONNECT_ATTEMPTS {
            if tokio::time::Instant::now() + backoff >= deadline {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(8));
            let answer = self.call(host, &status, deadline).await;
            if is_transport_error(&answer) {
                last = answer.error.unwrap_or_default();
                continue;
            }
            let state = answer.data["state"].as_str().unwrap_or("");
            let after = format!(
                "the connection failed during the call ({first}); reconnected (attempt {attempt})"
            );
            match state {
                "done" => {
                    if let Ok(mut recorded) =
                        serde_json::from_value::<ToolResult>(answer.data["result"].clone())
                    {
                        recorded.data["reconnected"] = json!(after);
                        return recorded;
                    }
                }
                "never_received" | "refused" => {
                    let why = if state == "refused" {
                        "refused it"
                    } else {
                        "never received it"
                    };
                    return ToolResult {
                        data: json!({ "host": host.name, "reconnected": after, "ran": false }),
                        ..ToolResult::failed(format!(
                            "not run: {after}, and host {}'s agent {why}",
                            host.name
                        ))
                    };
                }
                "in_progress" => {
                    // The host's agent is still on it: ask again until the deadline.
                    last = format!("the call is still running on host {}", host.name);
                    continue;
                }
                _ => {}
            }
            last = answer
                .error
                .unwrap_or_else(|| format!("unexpected status answer: {}", answer.data));
        }
        ToolResult {
            outcome: if failure.outcome == Outcome::Timeout {
                Outcome::Timeout
            } else {
                Outcome::Error
            },
            verified: Some(false),
            data: json!({ "transport": true, "host": host.name, "outcome_unknown": true }),
            failure: Some(Failure::OutcomeUnknown),
            ..ToolResult::failed(format!(
                "outcome unknown: the connection to host {} failed during this change ({first}) and it could not be verified afterwards ({last}); check the host and its agent audit log",
                host.name
            ))
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(ch) = self.channel.get_mut().take() {
            ch.kill();
        }
        let mut m = self.master.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = m.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(p) = &self.control {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A private directory for control sockets (unix socket paths are short:
/// the temp dir, not the state dir). Refused unless it is ours and 0700.
fn control_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = nix::unistd::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("runwarden-ssh-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of this user",
            dir.display()
        )));
    }
    Ok(dir)
}

fn transport(host: &Host, kind: Unreachable, what: String) -> ToolResult {
    ToolResult {
        data: json!({ "transport": true, "host": host.name }),
        failure: Some(Failure::Transport(kind)),
        ..ToolResult::failed(what)
    }
}

/// Why a channel could not answer.
enum Broken {
    Timeout,
    TooLong(usize),
    Closed,
}

/// One `ssh ... runwarden-agent` client: requests in, one reply line each out.
struct Channel {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    /// The end of stderr, for the error message when the channel breaks.
    stderr: std::sync::Arc<Mutex<Vec<u8>>>,
    stderr_reader: tokio::task::JoinHandle<()>,
}

impl Channel {
    fn open(argv: &Argv, jail: &Path) -> std::io::Result<Channel> {
        use std::process::Stdio;
        let mut command = tokio::process::Command::from(process::command(argv, jail));
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = process::escapees::spawn(|| command.spawn())?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut err = child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("no stderr"))?;
        let stderr: std::sync::Arc<Mutex<Vec<u8>>> = Default::default();
        let tail = stderr.clone();
        let stderr_reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(8192);
                t.drain(..excess);
            }
        });
        Ok(Channel {
            child,
            stdin,
            stdout: tokio::io::BufReader::new(stdout),
            stderr,
            stderr_reader,
        })
    }

    /// One request line out, one reply line back, by the deadline and under the cap.
    async fn exchange(
        &mut self,
        request: &Request,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<u8>, Broken> {
        use tokio::io::AsyncWriteExt;
        let mut line = serde_json::to_vec(request).unwrap_or_default();
        line.push(b'\n');
        let cap = crate::tools::OUTPUT_CAP * 2;
        let io = async {
            self.stdin
                .write_all(&line)
                .await
                .map_err(|_| Broken::Closed)?;
            self.stdin.flush().await.map_err(|_| Broken::Closed)?;
            read_reply(&mut self.stdout, cap)
                .await
                .map_err(|e| match e {
                    ReplyError::Closed(_) => Broken::Closed,
                    ReplyError::TooLong(n) => Broken::TooLong(n),
                })
        };
        match tokio::time::timeout_at(deadline, io).await {
            Ok(r) => r,
            Err(_) => Err(Broken::Timeout),
        }
    }

    /// Kill the client's process group; its exit code and how it ended.
    async fn end(mut self) -> (Option<i32>, String) {
        // A closed stdout is usually an exit on its way: give it a moment.
        let status = match tokio::time::timeout(Duration::from_millis(500), self.child.wait()).await
        {
            Ok(s) => s,
            Err(_) => {
                process::kill_group(self.child.id());
                self.child.wait().await
            }
        };
        // Its last words: stderr closes with the process group.
        let _ = tokio::time::timeout(Duration::from_millis(500), &mut self.stderr_reader).await;
        match status {
            Ok(status) => (status.code(), self.describe(status)),
            Err(e) => (None, e.to_string()),
        }
    }

    fn describe(&self, status: std::process::ExitStatus) -> String {
        use std::os::unix::process::ExitStatusExt;
        let tail = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let text = String::from_utf8_lossy(&tail);
        let last: String = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .chars()
            .take(300)
            .collect();
        match (status.code(), status.signal()) {
            (Some(c), _) if last.is_empty() => format!("exited with status {c}"),
            (Some(c), _) => format!("exited with status {c}: {last}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended without an exit status".into(),
        }
    }

    /// End a healthy session: EOF to the agent, then the process group.
    async fn close(self) {
        let Channel {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let _ = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
        process::kill_group(child.id());
    }

    fn kill(self) {
        if let Some(pid) = self.child.id() {
            process::escapees::forget(pid);
        }
        process::kill_group(self.child.id());
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

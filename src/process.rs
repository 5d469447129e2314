//! Spawning one command safely: the only place runwarden starts a process.
//!
//! - argv only, program by absolute path: there is no shell anywhere, so no
//!   value can be read as syntax;
//! - stdin is `/dev/null`, so nothing can wait for input;
//! - the environment is a fixed stub (`PATH`, `LANG`), so nothing of the
//!   runner's environment (a token, `LD_PRELOAD`) reaches a tool;
//! - the working directory is the host's empty jail;
//! - the command leads its own process group; at the deadline the whole group
//!   gets SIGTERM, then SIGKILL after a grace, and the leader is always reaped
//!   (no zombie). When the leader exits, whatever it left in its group is
//!   killed too (before the leader is reaped, so the group id cannot have been
//!   reused): a tool call does not outlive itself;
//! - stdout and stderr are read concurrently (a full pipe cannot block the
//!   child) and kept up to a cap; the rest is drained and dropped, and the
//!   result says `truncated`.
//!
//! One thread watches both pipes and a pidfd of the child with `poll(2)`:
//! no epoll registrations per spawn. On a run's own thread (see
//! [`on_own_thread`]) that is the run's thread itself, with no hand-off at
//! all; otherwise a thread of the blocking pool. Escapees are swept once
//! per call, when its last process has ended (`tools::execute`). This keeps
//! the runner's own cost per call near that of a bare spawn.
//!
//! One file: the spawn, the wait, the kill of the
//! process group and the sweep of escapees are one lifecycle; a third of the
//! file is its unit tests.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

/// The only environment a tool sees: a fixed PATH and the C locale (stable,
/// parseable output, and no locale files to load on every spawn).
pub const STUB_ENV: [(&str, &str); 2] = [("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), ("LANG", "C")];

/// A command: an absolute program and its arguments. There is no way to build one from a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argv {
    program: PathBuf,
    args: Vec<String>,
}

impl Argv {
    /// A command of `program` (absolute, or it will not start) and no arguments yet.
    pub fn new(program: &Path) -> Argv {
        Argv {
            program: program.to_path_buf(),
            args: Vec::new(),
        }
    }

    /// One more argument.
    pub(crate) fn arg(mut self, a: impl Into<String>) -> Argv {
        self.args.push(a.into());
        self
    }

    /// More arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, it: I) -> Argv {
        self.args.extend(it.into_iter().map(Into::into));
        self
    }

    /// `prefix pre... self...`, e.g. `sudo -n -- systemctl restart x.service`.
    pub(crate) fn with_prefix(self, program: &Path, pre: &[&str]) -> Argv {
        let mut args: Vec<String> = pre.iter().map(|s| s.to_string()).collect();
        args.push(self.program.to_string_lossy().into_owned());
        args.extend(self.args);
        Argv {
            program: program.to_path_buf(),
            args,
        }
    }

    /// The command after `program pre...`, when this argv starts with them
    /// (the inverse of [`Argv::with_prefix`]).
    pub(crate) fn strip_prefix(&self, program: &Path, pre: &[&str]) -> Option<Argv> {
        let n = pre.len();
        if self.program != program
            || self.args.len() <= n
            || self.args[..n].iter().zip(pre).any(|(a, p)| a != p)
        {
            return None;
        }
        Some(Argv {
            program: PathBuf::from(&self.args[n]),
            args: self.args[n + 1..].to_vec(),
        })
    }

    /// Program first, then the arguments: as reports and audit lines show it.
    pub(crate) fn to_vec(&self) -> Vec<String> {
        std::iter::once(self.program.to_string_lossy().into_owned())
            .chain(self.args.iter().cloned())
            .collect()
    }
}

impl fmt::Display for Argv {
    /// As a JSON array: unambiguous, copy-pasteable into a review.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            serde_json::to_string(&self.to_vec()).unwrap_or_default()
        )
    }
}

/// What one process may take.
#[derive(Debug, Clone)]
pub struct Limits {
    /// It is ended (SIGTERM, then SIGKILL) by then.
    pub deadline: Instant,
    /// How much of each output stream is kept.
    pub output_cap: usize,
    /// How long it has after SIGTERM before SIGKILL.
    pub kill_grace: Duration,
    /// Its working directory: an empty one.
    pub jail: PathBuf,
    /// What else confines it.
    pub confine: Confine,
    /// What it reads on stdin (at most [`STDIN_CAP`] bytes); `None`: `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// An open file of this process handed to it as its stdin instead (a
    /// directory it measures, reached as `/proc/self/fd/0`: an observer of
    /// another user cannot reach this process's files through `/proc`).
    pub stdin_from: Option<std::sync::Arc<OwnedFd>>,
}

/// How a process is confined beyond its jail, stub environment and process
/// group. No default: `tools::confinement` decides it from a tool's tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confine {
    /// Nothing more (a tier-2 change, which must write).
    Jail,
    /// A tier-1 process: an observer, which changes nothing (see
    /// [`crate::sandbox`]). Where this machine cannot enforce every layer,
    /// it starts with those there are unless `required`, and then does not
    /// start.
    Observer {
        /// Refuse to start it without every layer.
        required: bool,
        /// What it may reach over the network (a declaration's `connect:`).
        net: std::sync::Arc<crate::sandbox::Net>,
    },
}

impl Confine {
    /// A built-in tier-1 tool's: every layer there is, no network.
    pub fn observer() -> Confine {
        Confine::Observer {
            required: false,
            net: std::sync::Arc::new(crate::sandbox::Net::none()),
        }
    }
}

/// The most a process may be given on stdin: less than a pipe holds, so
/// writing it never waits on a child that does not read.
pub const STDIN_CAP: usize = 16 * 1024;

/// What one process left behind.
#[derive(Debug, Clone, Default)]
pub struct ProcessOutput {
    /// The process's id while it ran (a tool that lists processes leaves itself out).
    pub(crate) pid: u32,
    /// Its exit status, when it exited.
    pub(crate) exit_code: Option<i32>,
    /// The signal that ended the leader, if one did.
    pub(crate) signal: Option<i32>,
    /// What it wrote to stdout, up to the cap.
    pub(crate) stdout: Vec<u8>,
    /// What it wrote to stderr, up to the cap.
    pub(crate) stderr: Vec<u8>,
    /// stdout went past the cap, or was still open at the deadline.
    pub(crate) stdout_truncated: bool,
    /// stderr went past the cap.
    pub(crate) stderr_truncated: bool,
    /// It was ended at the deadline.
    pub(crate) timed_out: bool,
    /// How long it ran.
    pub(crate) duration: Duration,
    /// It ran as an observer, held to the observer's limits.
    pub(crate) observer: bool,
}

impl ProcessOutput {
    /// stdout as text (invalid UTF-8 replaced).
    pub(crate) fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (invalid UTF-8 replaced).
    pub(crate) fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// One line that says why the command failed.
    pub(crate) fn failure_text(&self) -> String {
        let stderr = self.stderr_text();
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let last: String = last.chars().take(300).collect();
        let text = match (self.exit_code, self.signal) {
            (Some(c), _) if last.is_empty() => format!("exited with status {c}"),
            (Some(c), _) => format!("exited with status {c}: {last}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended without an exit status".into(),
        };
        format!("{text}{}", self.limit_hit())
    }

    /// What a failure says of the observer's limits when the process's
    /// own words say it ran out of processes or memory.
    pub(crate) fn limit_hit(&self) -> String {
        const SIGNS: [&str; 7] = [
            "Resource temporarily unavailable",
            "Cannot fork",
            "fork failed",
            "Cannot allocate memory",
            "cannot allocate",
            "MemoryError",
            "out of memory",
        ];
        let stderr = self.stderr_text();
        match self.observer && SIGNS.iter().any(|s| stderr.contains(s)) {
            true => format!(
                " (it ran out of what a tier-1 process may take: {})",
                crate::sandbox::limits_text()
            ),
            false => String::new(),
        }
    }
}

/// Why a process did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program is not an absolute path.
    #[error("refusing to run {0:?}: the program must be an absolute path")]
    RelativeProgram(PathBuf),
    /// The kernel refused to start it.
    #[error("cannot start {program}: {source} (check the host file's `binaries` and `jail`)")]
    Spawn {
        /// The program.
        program: String,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The call's time was up before it could start.
    #[error("the call's deadline passed before {0} could start")]
    NoTimeLeft(String),
    /// A tier-1 process that must not start unconfined, where it cannot be confined.
    #[error(
        "refusing to run {program} as a tier-1 tool without every layer of the observer's sandbox ({why}); tier-1 tools declared in tools/ run only as observers that change nothing (or set `unsandboxed_tier1: allow` in the host file to accept that risk)"
    )]
    Unconfined {
        /// The program.
        program: String,
        /// Why Landlock is not available.
        why: String,
    },
    /// More stdin than [`STDIN_CAP`].
    #[error("refusing to give {program} {len} bytes on stdin (at most {STDIN_CAP})")]
    StdinTooLong {
        /// The program.
        program: String,
        /// How much it was to get.
        len: usize,
    },
}

/// [`run`] for the benches' baseline (feature `internals`, never in a
/// release): spawning is otherwise reachable only through the gate.
#[cfg(feature = "internals")]
pub async fn run_for_bench(argv: &Argv, limits: &Limits) -> Result<ProcessOutput, SpawnError> {
    run(argv, limits).await
}

/// Run `argv` under `limits`. Failures to start are errors; everything after
/// the start (exit status, timeout, truncation) is in the output.
pub(crate) async fn run(argv: &Argv, limits: &Limits) -> Result<ProcessOutput, SpawnError> {
    if !argv.program.is_absolute() {
        return Err(SpawnError::RelativeProgram(argv.program.clone()));
    }
    if Instant::now() >= limits.deadline {
        return Err(SpawnError::NoTimeLeft(argv.program.display().to_string()));
    }
    let multi_thread = || {
        tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
    };
    if OWN_THREAD.get() && multi_thread() {
        return tokio::task::block_in_place(|| run_blocking(argv, limits));
    }
    let (argv, limits) = (argv.clone(), limits.clone());
    let program = argv.program.display().to_string();
    tokio::task::spawn_blocking(move || run_blocking(&argv, &limits))
        .await
        .unwrap_or_else(|e| {
            Err(SpawnError::Spawn {
                program,
                source: std::io::Error::other(e),
            })
        })
}

thread_local! {
    static OWN_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` (a runtime's `block_on`) with this thread marked as a run's
/// own: the tools it starts are waited on right here, which saves the two
/// thread hand-offs per process a wait in the blocking pool costs, the
/// largest share of a call's cost after the spawn and the audit fsync.
/// Only for a thread nothing else needs while a tool runs: the daemon's
/// thread per run, the command line's main thread (not `serve`'s). On a
/// current-thread runtime nothing can block, so there the mark is ignored.
pub fn on_own_thread<R>(f: impl FnOnce() -> R) -> R {
    let before = OWN_THREAD.replace(true);
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            OWN_THREAD.set(self.0);
        }
    }
    let _restore = Restore(before);
    f()
}

/// Niceness of tool processes: remediation is background work, and the
/// daemon's webhook must stay responsive under load.
pub const TOOL_NICE: i32 = 10;

/// Lower a tool process to [`TOOL_NICE`] as soon as it is spawned (what it
/// starts inherits it). The process, not the thread that spawns it: a nice
/// value is per thread and never raised again without privilege, and the
/// threads that start tools are reused for the daemon's own work (the
/// audit log's syncs that the answer to a trigger waits for, the next
/// run's gate and intent line), which must not run as background work.
fn lower_priority_of(pid: u32) {
    let pid = nix::libc::id_t::from(pid);
    // SAFETY: getpriority/setpriority take plain integers; `pid` is our
    // child, not yet reaped, so it cannot be another process.
    unsafe {
        let now = nix::libc::getpriority(nix::libc::PRIO_PROCESS, pid);
        if now < TOOL_NICE {
            nix::libc::setpriority(nix::libc::PRIO_PROCESS, pid, TOOL_NICE);
        }
    }
}

/// A started call process: its pid (the leader of its own group) and the
/// parent's ends of its pipes. Reaped by pid ([`reap`]), whichever way it
/// was started.
struct Running {
    pid: u32,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

impl From<std::process::Child> for Running {
    /// Its pipes taken; the `Child` handle dropped, which neither waits
    /// nor kills.
    fn from(mut c: std::process::Child) -> Running {
        Running {
            pid: c.id(),
            stdin: c.stdin.take().map(OwnedFd::from),
            stdout: c.stdout.take().map(OwnedFd::from),
            stderr: c.stderr.take().map(OwnedFd::from),
        }
    }
}

impl From<crate::sandbox::spawn::Started> for Running {
    fn from(s: crate::sandbox::spawn::Started) -> Running {
        Running {
            pid: s.pid,
            stdin: s.stdin,
            stdout: Some(s.stdout),
            stderr: Some(s.stderr),
        }
    }
}

/// Start `argv` under `limits`, confined as asked. The outer error: it
/// must not start here (a tier-1 process that must be confined, where it
/// cannot be).
fn start(argv: &Argv, limits: &Limits) -> Result<std::io::Result<Running>, SpawnError> {
    let plain = || {
        let mut command = call_command(argv, limits);
        escapees::spawn(|| command.spawn()).map(Running::from)
    };
    let Confine::Observer { required, net } = &limits.confine else {
        return Ok(plain());
    };
    let unconfined = |why| SpawnError::Unconfined {
        program: argv.program.display().to_string(),
        why,
    };
    if *required && let crate::sandbox::Status::Unavailable(why) = crate::sandbox::status() {
        return Err(unconfined(why));
    }
    // Every layer there is; with no Landlock here at all, as it is (a
    // built-in's argv is fixed in code). A spawner that could not be made
    // where Landlock exists fails closed.
    let confined = |e: crate::sandbox::Unconfined| unconfined(e.to_string());
    match crate::sandbox::observing(net).map_err(confined)? {
        Some(observer) => {
            let exec = match observed(argv, limits) {
                Ok(exec) => exec,
                Err(e) => return Ok(Err(e)),
            };
            observer
                .spawn(move || escapees::spawn(|| crate::sandbox::start(exec)))
                .map(|r| r.map(Running::from))
                .map_err(confined)
        }
        None => Ok(plain()),
    }
}

/// A tool call's process as an observer starts it: what [`call_command`]
/// says, as C strings.
fn observed(argv: &Argv, limits: &Limits) -> std::io::Result<crate::sandbox::spawn::Exec> {
    use crate::sandbox::spawn::{Exec, Stdin};
    use std::os::unix::ffi::OsStrExt;
    let c = |bytes: &[u8]| {
        std::ffi::CString::new(bytes).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an argument holds a NUL byte",
            )
        })
    };
    let program = c(argv.program.as_os_str().as_bytes())?;
    let mut args = vec![program.clone()];
    for a in &argv.args {
        args.push(c(a.as_bytes())?);
    }
    let env = STUB_ENV
        .iter()
        .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(Exec {
        program,
        argv: args,
        env,
        cwd: c(limits.jail.as_os_str().as_bytes())?,
        stdin: match (&limits.stdin, &limits.stdin_from) {
            (Some(_), _) => Stdin::Pipe,
            (None, Some(file)) => file.try_clone().map_or(Stdin::Null, Stdin::File),
            (None, None) => Stdin::Null,
        },
    })
}

/// A command for a long-lived helper of the SSH transport (the connection
/// master, an agent session): the same stub environment, in `dir`, in a
/// process group of its own. The caller owns it and ends it
/// ([`kill_group`]); tool calls never use this.
pub(crate) fn command(argv: &Argv, dir: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(&argv.program);
    c.args(argv.args.iter().map(OsString::from))
        .env_clear()
        .envs(STUB_ENV)
        .current_dir(dir)
        .process_group(0);
    c
}

/// A helper with no pipes (the SSH connection master).
pub(crate) fn spawn_detached(argv: &Argv, dir: &Path) -> std::io::Result<std::process::Child> {
    let mut c = command(argv, dir);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    escapees::spawn(|| c.spawn())
}

/// SIGKILL the process group led by `pid` (a helper the SSH transport started).
pub(crate) fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        signal_group(Some(Pid::from_raw(pid as i32)), Signal::SIGKILL);
    }
}

/// Run one tool call's process to its end: spawned in a process group of
/// its own (confined when it is tier 1), its output read as it comes
/// ([`watch`]), then reaped ([`reap`]).
fn run_blocking(argv: &Argv, limits: &Limits) -> Result<ProcessOutput, SpawnError> {
    let started = std::time::Instant::now();
    let spawn_error = |source| SpawnError::Spawn {
        program: argv.program.display().to_string(),
        source,
    };
    if let Some(input) = &limits.stdin
        && input.len() > STDIN_CAP
    {
        return Err(SpawnError::StdinTooLong {
            program: argv.program.display().to_string(),
            len: input.len(),
        });
    }
    let mut child = start(argv, limits)?.map_err(spawn_error)?;
    lower_priority_of(child.pid);
    if let (Some(input), Some(pipe)) = (&limits.stdin, child.stdin.take()) {
        // Less than a pipe holds: never waits. A child that exits without
        // reading it is its own business (SIGPIPE is ignored here).
        let _ = std::io::Write::write_all(&mut std::fs::File::from(pipe), input);
    }
    let _forget = escapees::Forget(child.pid);
    let group = Pid::from_raw(child.pid as i32);
    let pidfd = match pidfd_open(child.pid) {
        Ok(fd) => fd,
        Err(e) => {
            signal_group(Some(group), Signal::SIGKILL);
            let _ = wait_for(group);
            return Err(spawn_error(e));
        }
    };
    let pipes = [child.stdout.take(), child.stderr.take()];
    let watched = watch(pipes, &pidfd, group, limits);
    let status = reap(&pidfd, group, &watched, limits.kill_grace);
    let mut out = ProcessOutput {
        pid: child.pid,
        timed_out: watched.timed_out,
        observer: matches!(limits.confine, Confine::Observer { .. }),
        ..Default::default()
    };
    if let Some((code, signal)) = status {
        out.exit_code = code;
        out.signal = signal;
    }
    let [o, e] = watched.kept;
    (out.stdout, out.stdout_truncated) = o.into_parts();
    (out.stderr, out.stderr_truncated) = e.into_parts();
    out.stdout_truncated |= watched.stdout_open && watched.timed_out;
    out.duration = started.elapsed();
    Ok(out)
}

/// A tool call's command: its argv, the stub environment, in the jail, in
/// a process group of its own, stdin piped only when there is input.
fn call_command(argv: &Argv, limits: &Limits) -> std::process::Command {
    let mut command = std::process::Command::new(&argv.program);
    command
        .args(argv.args.iter().map(OsString::from))
        .env_clear()
        .envs(STUB_ENV)
        .current_dir(&limits.jail)
        .stdin(match (&limits.stdin, &limits.stdin_from) {
            (Some(_), _) => Stdio::piped(),
            // A copy of the file for this process alone; without one it
            // reads nothing, and its path says so when it is used.
            (None, Some(file)) => file.try_clone().map_or_else(|_| Stdio::null(), Stdio::from),
            (None, None) => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    command
}

/// What [`watch`] saw of a process.
struct Watched {
    /// Its stdout and stderr, each capped.
    kept: [Capped; 2],
    /// Its stdout was still open when the watch ended.
    stdout_open: bool,
    /// It was still running at the call's deadline.
    timed_out: bool,
    /// Its group leader's exit was seen.
    exited: bool,
}

/// Read a process's output until it exits and its pipes close, or its
/// deadline passes. On the leader's exit its whole group is killed; a pipe
/// still open well after that is held by an escapee, which is swept.
fn watch(mut pipes: [Option<OwnedFd>; 2], pidfd: &OwnedFd, group: Pid, limits: &Limits) -> Watched {
    let deadline = limits.deadline.into_std();
    let mut kept = [
        Capped::new(limits.output_cap),
        Capped::new(limits.output_cap),
    ];
    thread_local! {
        static CHUNK: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    // One read buffer per thread, kept between calls.
    let mut chunk = CHUNK.take();
    chunk.resize(64 * 1024, 0);
    let mut exited_at: Option<std::time::Instant> = None;
    let mut timed_out = false;

    while exited_at.is_none() || pipes.iter().any(Option::is_some) {
        // Until the leader exits, the call's deadline; afterwards the group
        // is dead and EOF is near, but a descriptor handed to a process
        // outside the group must not keep us here.
        let limit = exited_at.map_or(deadline, |t| t + Duration::from_secs(2));
        let now = std::time::Instant::now();
        if now >= limit {
            timed_out = exited_at.is_none();
            break;
        }
        // Shortly after the exit, wake to sweep whatever still holds a pipe.
        let wake = match exited_at {
            Some(t) if now < t + EOF_GRACE => (t + EOF_GRACE).min(limit),
            _ => limit,
        };
        let mut fds: Vec<PollFd> = Vec::with_capacity(3);
        for p in pipes.iter().flatten() {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        if exited_at.is_none() {
            fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
        }
        let wait = PollTimeout::try_from(wake - now).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, wait) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                // Cannot watch the child any more: treat it like a timeout and end it.
                timed_out = exited_at.is_none();
                break;
            }
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(false)).collect();
        drop(fds);
        let mut i = 0;
        for (slot, buf) in pipes.iter_mut().zip(kept.iter_mut()) {
            if let Some(fd) = slot {
                if ready[i] && !buf.read_once(fd, &mut chunk) {
                    *slot = None;
                }
                i += 1;
            }
        }
        if exited_at.is_none() && ready[i] {
            // The leader is a zombie until reaped, so its group id is still
            // ours: end whatever it left behind.
            signal_group(Some(group), Signal::SIGKILL);
            exited_at = Some(std::time::Instant::now());
        }
        if exited_at.is_some_and(|t| t.elapsed() >= EOF_GRACE) && pipes.iter().any(Option::is_some)
        {
            // A pipe still open well after the group died: whatever holds it
            // left the group (setsid, setpgid) and, orphaned, came to us.
            escapees::sweep();
        }
    }
    CHUNK.set(chunk);
    Watched {
        kept,
        stdout_open: pipes[0].is_some(),
        timed_out,
        exited: exited_at.is_some(),
    }
}

/// Reap the process: one that timed out is asked to stop (SIGTERM to its
/// group), then killed after `kill_grace`; one whose exit the watch did
/// not see (its poll failed) is killed at once.
fn reap(
    pidfd: &OwnedFd,
    group: Pid,
    watched: &Watched,
    kill_grace: Duration,
) -> Option<(Option<i32>, Option<i32>)> {
    if watched.timed_out {
        signal_group(Some(group), Signal::SIGTERM);
        if !wait_readable(pidfd, kill_grace) {
            signal_group(Some(group), Signal::SIGKILL);
        }
    } else if !watched.exited {
        signal_group(Some(group), Signal::SIGKILL);
    }
    wait_for(group)
}

/// Wait for the leader `pid` to end: its exit code, or the signal that
/// ended it.
fn wait_for(pid: Pid) -> Option<(Option<i32>, Option<i32>)> {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return Some((Some(code), None)),
            Ok(WaitStatus::Signaled(_, signal, _)) => return Some((None, Some(signal as i32))),
            Err(nix::errno::Errno::EINTR) | Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// How long a pipe may stay open after its group died before whatever holds
/// it is swept as an escapee. End of file usually comes a moment after the
/// exit is seen; sweeping in that moment would walk `/proc` for nothing.
const EOF_GRACE: Duration = Duration::from_millis(20);

/// A descriptor that becomes readable when the process exits.
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let wait = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, wait), Ok(n) if n > 0)
}

fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(pgid) = group {
        // ESRCH (nobody left in the group) is the normal case.
        let _ = killpg(pgid, signal);
    }
}

/// Output kept up to a cap; the rest is read and dropped so the writer never blocks.
struct Capped {
    kept: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capped {
    fn new(cap: usize) -> Capped {
        Capped {
            kept: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// One read from a descriptor poll said is ready; false at end of file (or error).
    fn read_once(&mut self, fd: &OwnedFd, chunk: &mut [u8]) -> bool {
        match nix::unistd::read(fd, chunk) {
            Ok(0) => false,
            Ok(n) => {
                let room = self.cap.saturating_sub(self.kept.len());
                self.truncated |= n > room;
                self.kept.extend_from_slice(&chunk[..n.min(room)]);
                true
            }
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => true,
            Err(_) => false,
        }
    }

    fn into_parts(self) -> (Vec<u8>, bool) {
        (self.kept, self.truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(secs: f64) -> Limits {
        Limits {
            deadline: Instant::now() + Duration::from_secs_f64(secs),
            output_cap: 1024,
            kill_grace: Duration::from_millis(300),
            jail: std::env::temp_dir(),
            confine: Confine::Jail,
            stdin: None,
            stdin_from: None,
        }
    }

    /// The tool runs at [`TOOL_NICE`]; the thread that started it does
    /// not, so the daemon's own work later on that thread is not slowed.
    #[test]
    fn a_tool_runs_niced_and_the_thread_that_started_it_does_not() {
        // SAFETY: getpriority takes plain integers; 0 is this thread.
        let mine = || unsafe { nix::libc::getpriority(nix::libc::PRIO_PROCESS, 0) };
        let before = mine();
        // A duration no other test uses: how this tool is found in /proc.
        let seconds = format!("0.4{}", std::process::id());
        let wanted = format!("/usr/bin/sleep\0{seconds}\0");
        let nice = std::thread::scope(|s| {
            let seen = s.spawn(|| {
                let until = std::time::Instant::now() + Duration::from_secs(5);
                while std::time::Instant::now() < until {
                    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                        let dir = entry.path();
                        if std::fs::read(dir.join("cmdline")).ok().as_deref()
                            != Some(wanted.as_bytes())
                        {
                            continue;
                        }
                        // Lowered just after the spawn: look once it is well under way.
                        std::thread::sleep(Duration::from_millis(100));
                        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
                        // After the command's name: state is field 3, nice field 19.
                        let fields: Vec<&str> = stat
                            .rsplit_once(')')
                            .map(|(_, rest)| rest.split_whitespace().collect())
                            .unwrap_or_default();
                        if let Some(nice) = fields.get(16).and_then(|n| n.parse::<i32>().ok()) {
                            return Some(nice);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                None
            });
            let out = run_blocking(
                &Argv::new(Path::new("/usr/bin/sleep")).arg(&seconds),
                &limits(5.0),
            )
            .unwrap();
            assert_eq!(out.exit_code, Some(0));
            seen.join().unwrap()
        });
        assert_eq!(nice, Some(TOOL_NICE.max(before)), "the tool's nice value");
        assert_eq!(mine(), before, "the thread that started it keeps its own");
    }

    #[tokio::test]
    async fn relative_programs_are_refused() {
        let err = run(&Argv::new(Path::new("echo")), &limits(5.0))
            .await
            .unwrap_err();
        assert!(matches!(err, SpawnError::RelativeProgram(_)));
    }

    #[tokio::test]
    async fn environment_is_a_stub_and_stdin_is_empty() {
        // SAFETY: tests in this module do not read this variable concurrently.
        unsafe { std::env::set_var("RUNWARDEN_TEST_SECRET", "hunter2") };
        let out = run(&Argv::new(Path::new("/usr/bin/env")), &limits(5.0))
            .await
            .unwrap();
        let env = out.stdout_text();
        assert!(!env.contains("hunter2"), "{env}");
        let mut keys: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
        keys.sort();
        assert_eq!(keys, ["LANG", "PATH"]);
        let out = run(&Argv::new(Path::new("/usr/bin/cat")), &limits(5.0))
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
        assert!(out.stdout.is_empty());
    }

    #[tokio::test]
    async fn arguments_are_never_shell_syntax() {
        let out = run(
            &Argv::new(Path::new("/usr/bin/echo"))
                .arg("a; touch /tmp/pwned-by-runwarden-test $(id)"),
            &limits(5.0),
        )
        .await
        .unwrap();
        assert_eq!(
            out.stdout_text(),
            "a; touch /tmp/pwned-by-runwarden-test $(id)\n"
        );
        assert!(!Path::new("/tmp/pwned-by-runwarden-test").exists());
    }

    #[tokio::test]
    async fn output_is_capped_and_drained() {
        let out = run(
            &Argv::new(Path::new("/usr/bin/head")).args(["-c", "5000000", "/dev/zero"]),
            &limits(10.0),
        )
        .await
        .unwrap();
        assert_eq!(
            out.exit_code,
            Some(0),
            "the child finished: the pipe was drained"
        );
        assert_eq!(out.stdout.len(), 1024);
        assert!(out.stdout_truncated);
    }
}

/// Processes that escape a call's process group (`setsid`, `setpgid`) and
/// outlive it. runwarden is a child subreaper: such a process, once its
/// parents are gone, is adopted by runwarden instead of init. Every process
/// runwarden starts is recorded under a lock held across `fork`; any other
/// child of runwarden is by construction an escapee of some tool call, and
/// `sweep` kills and reaps it.
pub mod escapees {
    use std::collections::HashSet;
    use std::sync::Mutex;

    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::{WaitPidFlag, waitpid};
    use nix::unistd::Pid;

    static SPAWNED: Mutex<Option<HashSet<u32>>> = Mutex::new(None);
    /// Set by [`adopt_orphans`]: only the runwarden process itself sweeps. A
    /// program that uses this library (a test binary) has children of its own
    /// that must not be taken for escapees.
    static ADOPTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Become the subreaper of everything this process starts, and sweep
    /// escapees after each call. The `runwarden` binary calls this first thing.
    pub fn adopt_orphans() {
        match nix::sys::prctl::set_child_subreaper(true) {
            Ok(()) => ADOPTING.store(true, std::sync::atomic::Ordering::SeqCst),
            Err(e) => tracing::warn!(
                "cannot become a child subreaper ({e}): a tool's escaped processes would outlive it"
            ),
        }
    }

    /// Start a process with `f` and record it, so [`sweep`] leaves it alone.
    pub(crate) fn spawn<C: Pid32>(f: impl FnOnce() -> std::io::Result<C>) -> std::io::Result<C> {
        let mut set = SPAWNED.lock().unwrap_or_else(|p| p.into_inner());
        let child = f()?;
        if let Some(pid) = child.pid32() {
            set.get_or_insert_with(HashSet::new).insert(pid);
        }
        Ok(child)
    }

    /// Forget a process when this guard drops (it has been reaped).
    pub(crate) struct Forget(pub u32);

    impl Drop for Forget {
        fn drop(&mut self) {
            forget(self.0);
        }
    }

    /// Forget a process: it has been reaped.
    pub(crate) fn forget(pid: u32) {
        let mut set = SPAWNED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = set.as_mut() {
            s.remove(&pid);
        }
    }

    /// Kill and reap every child of this process that it did not start, and
    /// again, until none is left: killing an escaped process hands its own
    /// children to this subreaper, so a whole detached tree goes pass by pass.
    pub(crate) fn sweep() {
        if !ADOPTING.load(std::sync::atomic::Ordering::SeqCst) || !has_children() {
            return;
        }
        // A tree that forks as fast as it is killed still ends: each pass
        // kills every process it finds, and a bounded number of passes run.
        for _ in 0..MAX_PASSES {
            if sweep_once() == 0 {
                return;
            }
        }
        tracing::error!(
            "processes kept escaping a tool call after {MAX_PASSES} sweeps; some may still run"
        );
    }

    const MAX_PASSES: usize = 10_000;

    /// Whether this process has a child at all, in any state: an escapee is
    /// one, adopted. Asked of the kernel in one call, without reaping
    /// anything (`WNOWAIT`), for every thread's children (waits see the
    /// whole thread group's). The common case, a call whose processes are
    /// all reaped and no other call running, ends the sweep here, before
    /// the walk through `/proc`.
    fn has_children() -> bool {
        use nix::sys::wait::{Id, waitid};
        let flags = WaitPidFlag::WEXITED
            | WaitPidFlag::WNOHANG
            | WaitPidFlag::WNOWAIT
            | WaitPidFlag::__WALL;
        // Only "no child at all" skips the walk; any other answer, an
        // error included, walks.
        !matches!(waitid(Id::All, flags), Err(nix::errno::Errno::ECHILD))
    }

    /// One pass: how many escapees it killed.
    fn sweep_once() -> usize {
        let set = SPAWNED.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        let mut killed = 0;
        let mut children = String::new();
        for task in tasks.flatten() {
            use std::io::Read;
            children.clear();
            // Read as it comes: a procfs file has no size to ask for first.
            let read = std::fs::File::open(task.path().join("children"))
                .and_then(|mut f| f.read_to_string(&mut children));
            if read.is_err() {
                continue;
            }
            for pid in children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                if set.as_ref().is_some_and(|s| s.contains(&pid)) {
                    continue;
                }
                let p = Pid::from_raw(pid as i32);
                tracing::warn!(
                    pid,
                    "killing a process that escaped a tool call's process group"
                );
                let _ = kill(p, Signal::SIGKILL);
                let _ = waitpid(p, Some(WaitPidFlag::__WALL));
                killed += 1;
            }
        }
        killed
    }

    /// A started process's pid.
    pub(crate) trait Pid32 {
        /// Its pid, while it has one.
        fn pid32(&self) -> Option<u32>;
    }

    impl Pid32 for std::process::Child {
        fn pid32(&self) -> Option<u32> {
            Some(self.id())
        }
    }

    impl Pid32 for crate::sandbox::spawn::Started {
        fn pid32(&self) -> Option<u32> {
            Some(self.pid)
        }
    }

    impl Pid32 for tokio::process::Child {
        fn pid32(&self) -> Option<u32> {
            self.id()
        }
    }
}

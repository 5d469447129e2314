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
//!   killed too: a tool call does not outlive itself;
//! - stdout and stderr are read concurrently (a full pipe cannot block the
//!   child) and kept up to a cap; the rest is drained and dropped, and the
//!   result says `truncated`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
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
    pub fn new(program: &Path) -> Argv {
        Argv {
            program: program.to_path_buf(),
            args: Vec::new(),
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Argv {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, it: I) -> Argv {
        self.args.extend(it.into_iter().map(Into::into));
        self
    }

    /// `prefix pre... self...`, e.g. `sudo -n -- systemctl restart x.service`.
    pub fn with_prefix(self, program: &Path, pre: &[&str]) -> Argv {
        let mut args: Vec<String> = pre.iter().map(|s| s.to_string()).collect();
        args.push(self.program.to_string_lossy().into_owned());
        args.extend(self.args);
        Argv {
            program: program.to_path_buf(),
            args,
        }
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    pub fn to_vec(&self) -> Vec<String> {
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

#[derive(Debug, Clone)]
pub struct Limits {
    pub deadline: Instant,
    pub output_cap: usize,
    pub kill_grace: Duration,
    pub jail: PathBuf,
}

#[derive(Debug, Clone, Default)]
pub struct ProcessOutput {
    pub exit_code: Option<i32>,
    /// The signal that ended the leader, if one did.
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
}

impl ProcessOutput {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// One line that says why the command failed.
    pub fn failure_text(&self) -> String {
        let stderr = self.stderr_text();
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let last: String = last.chars().take(300).collect();
        match (self.exit_code, self.signal) {
            (Some(c), _) if last.is_empty() => format!("exited with status {c}"),
            (Some(c), _) => format!("exited with status {c}: {last}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended without an exit status".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("refusing to run {0:?}: the program must be an absolute path")]
    RelativeProgram(PathBuf),
    #[error("cannot start {program}: {source} (check the host file's `binaries` and `jail`)")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the call's deadline passed before {0} could start")]
    NoTimeLeft(String),
}

/// Run `argv` under `limits`. Failures to start are errors; everything after
/// the start (exit status, timeout, truncation) is in the output.
pub async fn run(argv: &Argv, limits: &Limits) -> Result<ProcessOutput, SpawnError> {
    if !argv.program.is_absolute() {
        return Err(SpawnError::RelativeProgram(argv.program.clone()));
    }
    if Instant::now() >= limits.deadline {
        return Err(SpawnError::NoTimeLeft(argv.program.display().to_string()));
    }
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&argv.program);
    cmd.args(argv.args.iter().map(OsString::from))
        .env_clear()
        .envs(STUB_ENV)
        .current_dir(&limits.jail)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| SpawnError::Spawn {
        program: argv.program.display().to_string(),
        source,
    })?;
    let group = child.id().map(|id| Pid::from_raw(id as i32));
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut out = ProcessOutput::default();

    // Wait for the leader (killing its group at the deadline), then end
    // whatever it left in its group: a tool call does not outlive itself.
    let status = async {
        let status = match tokio::time::timeout_at(limits.deadline, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                signal_group(group, Signal::SIGTERM);
                let status = match tokio::time::timeout(limits.kill_grace, child.wait()).await {
                    Ok(status) => status.ok(),
                    Err(_) => {
                        signal_group(group, Signal::SIGKILL);
                        child.wait().await.ok()
                    }
                };
                return (status, true);
            }
        };
        signal_group(group, Signal::SIGKILL);
        (status, false)
    };
    // Both pipes are read in this task, concurrently with the wait, so a
    // full pipe never blocks the child and no task hand-off is paid per call.
    let mut stdout_buf = Capped::new(limits.output_cap);
    let mut stderr_buf = Capped::new(limits.output_cap);
    let (status, timed_out) = {
        let reads = async {
            tokio::join!(stdout_buf.read_from(stdout), stderr_buf.read_from(stderr));
        };
        tokio::pin!(status, reads);
        let mut reads_done = false;
        let ended = tokio::select! {
            s = &mut status => s,
            _ = &mut reads => {
                reads_done = true;
                status.await
            }
        };
        if !reads_done {
            // The group is dead, so EOF is near; the bound guards against a
            // descriptor handed to a process outside the group.
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut reads).await;
        }
        ended
    };
    if let Some(status) = status {
        use std::os::unix::process::ExitStatusExt;
        out.exit_code = status.code();
        out.signal = status.signal();
    }
    out.timed_out = timed_out;
    (out.stdout, out.stdout_truncated) = stdout_buf.into_parts();
    (out.stderr, out.stderr_truncated) = stderr_buf.into_parts();
    out.duration = started.elapsed();
    Ok(out)
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

    async fn read_from<R: AsyncRead + Unpin>(&mut self, reader: Option<R>) {
        let Some(mut r) = reader else { return };
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.kept.len());
                    self.truncated |= n > room;
                    self.kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
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
        }
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

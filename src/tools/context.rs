//! What a tool runs with on this machine: the host, the deadline, the
//! output caps, and how a privileged argv is prefixed.

use std::time::Duration;

use crate::host::Host;
use crate::process::{Argv, Confine, Limits, ProcessOutput, SpawnError};

/// Everything a tool needs to run on this machine.
pub(crate) struct Ctx<'a> {
    /// The host, with its allowlists and binaries.
    pub(crate) host: &'a Host,
    /// The call must be over by then (tool timeout and run budget, whichever is first).
    pub(crate) deadline: tokio::time::Instant,
    /// How much of each output stream is kept.
    pub(crate) output_cap: usize,
    /// How long a process has after SIGTERM before SIGKILL.
    pub(crate) kill_grace: Duration,
    /// How the call's processes are confined: a tier-1 call's cannot write.
    pub(crate) confine: Confine,
    ran: std::sync::Mutex<Vec<Vec<String>>>,
}

/// Cap on each of stdout and stderr of a spawned tool.
pub(crate) const OUTPUT_CAP: usize = 1 << 20;
/// Time between SIGTERM and SIGKILL of a tool's process group.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(2);

impl<'a> Ctx<'a> {
    /// A call's context, its processes confined as `confine` says (what
    /// [`super::confinement`] decides from the tool's tier).
    pub(crate) fn new(host: &'a Host, deadline: tokio::time::Instant, confine: Confine) -> Ctx<'a> {
        Ctx {
            host,
            deadline,
            output_cap: OUTPUT_CAP,
            kill_grace: KILL_GRACE,
            confine,
            ran: Default::default(),
        }
    }

    pub(super) fn limits(&self, deadline: tokio::time::Instant) -> Limits {
        Limits {
            deadline: deadline.min(self.deadline),
            output_cap: self.output_cap,
            kill_grace: self.kill_grace,
            jail: self.host.jail.clone(),
            confine: self.confine.clone(),
            stdin: None,
            stdin_from: None,
        }
    }

    /// Spawn one argv (no shell), recording it for the result.
    pub(crate) async fn run(&self, argv: &Argv) -> Result<ProcessOutput, SpawnError> {
        self.run_until(argv, self.deadline).await
    }

    pub(crate) async fn run_until(
        &self,
        argv: &Argv,
        deadline: tokio::time::Instant,
    ) -> Result<ProcessOutput, SpawnError> {
        self.spawn(argv, self.limits(deadline)).await
    }

    /// Spawn one argv with this process's open `file` as its stdin (it
    /// names it `/proc/self/fd/0`), over by `deadline` (or the call's).
    pub(crate) async fn run_on(
        &self,
        argv: &Argv,
        file: &std::sync::Arc<std::os::fd::OwnedFd>,
        deadline: tokio::time::Instant,
    ) -> Result<ProcessOutput, SpawnError> {
        let mut limits = self.limits(deadline);
        limits.stdin_from = Some(file.clone());
        self.spawn(argv, limits).await
    }

    /// Spawn one argv with `stdin` on its standard input, confined as
    /// `confine` says, over by `deadline` (or the call's, if sooner).
    pub(crate) async fn run_fed(
        &self,
        argv: &Argv,
        stdin: Option<Vec<u8>>,
        confine: Confine,
        deadline: tokio::time::Instant,
    ) -> Result<ProcessOutput, SpawnError> {
        let mut limits = self.limits(deadline);
        limits.stdin = stdin;
        limits.confine = confine;
        self.spawn(argv, limits).await
    }

    async fn spawn(&self, argv: &Argv, limits: Limits) -> Result<ProcessOutput, SpawnError> {
        self.ran
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(argv.to_vec());
        crate::process::run(argv, &limits).await
    }

    pub(super) fn take_argv(&self) -> Vec<Vec<String>> {
        std::mem::take(
            &mut *self
                .ran
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

const SUDO_ARGS: &[&str] = &["-n", "--"];

/// Wrap a mutating command in `sudo -n` when the host says so (never a shell).
pub(crate) fn privileged(host: &Host, argv: Argv) -> Argv {
    if host.sudo {
        argv.with_prefix(&host.binaries.sudo, SUDO_ARGS)
    } else {
        argv
    }
}

/// What sudo runs of an argv [`privileged`] made: the line a sudoers file allows.
pub(crate) fn unprivileged(host: &Host, argv: Argv) -> Argv {
    match argv.strip_prefix(&host.binaries.sudo, SUDO_ARGS) {
        Some(inner) if host.sudo => inner,
        _ => argv,
    }
}

/// Poll `check` until it returns Some or `until` passes.
pub(crate) async fn poll<T, F, Fut>(
    until: tokio::time::Instant,
    every: Duration,
    mut check: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() + every > until {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

//! Tier 1 cannot write, whatever its argv: a property of the process, not
//! of the code that built the argv.
//!
//! A tier-1 tool only observes. For the built-ins that is true by their
//! code; for a tool an operator declared in YAML it is only as true as its
//! author was careful. So every tier-1 process is started under a Landlock
//! ruleset that denies every filesystem write, create, rename, truncate and
//! delete (ABI 3's write rights), except writing to `/dev/null`; anonymous
//! pipes (its stdout and stderr) are no filesystem objects and stay
//! writable. A write fails with `EACCES` and nothing is made.
//!
//! How, without slowing every spawn: Landlock restricts a thread and what
//! it starts, so one thread, the *observer spawner*, restricts itself once
//! (with `no_new_privs`, so nothing it starts gains privileges through a
//! set-uid program) and from then on only spawns: a tier-1 process is
//! handed to it and comes back started. Spawning keeps `posix_spawn` (a
//! `pre_exec` hook would force a full `fork` of the runner), and the cost
//! is one hand-off between threads (`cargo bench --bench gate` measures it).
//!
//! Where Landlock is missing or off, [`status`] says why; `check`, the
//! daemon's start and `runwarden_sandbox_available{kind="landlock"}` say
//! so. Built-in tier-1 tools then run as before (their argv is fixed in
//! code); declared ones refuse unless the host sets
//! `unsandboxed_tier1: allow`.

use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use landlock::{
    ABI, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
};

/// A job for the observer spawner: run on its restricted thread.
type Job = Box<dyn FnOnce() + Send>;

/// Whether tier-1 processes start under Landlock here, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every write right of ABI 3 is denied to tier-1 processes.
    Enforced,
    /// They start without it: the reason (kernel without Landlock, Landlock
    /// not enabled at boot, a ruleset the kernel refused).
    Unavailable(String),
}

impl Status {
    /// Whether tier-1 processes start restricted.
    pub fn enforced(&self) -> bool {
        matches!(self, Status::Enforced)
    }
}

/// The observer spawner, started on first use: its job queue and thread
/// id, or why it could not restrict itself.
static SPAWNER: OnceLock<Result<Spawner, String>> = OnceLock::new();

struct Spawner {
    jobs: SyncSender<Job>,
    tid: i32,
}

fn spawner() -> &'static Result<Spawner, String> {
    SPAWNER.get_or_init(|| {
        let (ready_tx, ready) = sync_channel::<Result<i32, String>>(1);
        let (jobs_tx, jobs) = sync_channel::<Job>(64);
        let started = std::thread::Builder::new()
            .name("runwarden-observe".into())
            .spawn(move || match restrict_this_thread() {
                Ok(()) => {
                    let _ = ready_tx.send(Ok(nix::unistd::gettid().as_raw()));
                    serve(jobs);
                }
                Err(why) => {
                    let _ = ready_tx.send(Err(why));
                }
            });
        if let Err(e) = started {
            return Err(format!("cannot start the observer spawner thread: {e}"));
        }
        match ready.recv() {
            Ok(Ok(tid)) => Ok(Spawner { jobs: jobs_tx, tid }),
            Ok(Err(why)) => Err(why),
            Err(_) => Err("the observer spawner thread ended before it was ready".into()),
        }
    })
}

/// A path by which a process started here reaches this process's open file
/// `fd` (`/proc/PID/.../fd/N`). A confined process may look into the
/// `/proc` entries only of a task in its own Landlock domain: the
/// observer spawner's (the same file table), not the process's own.
pub(crate) fn fd_path(fd: i32) -> String {
    let pid = std::process::id();
    match spawner() {
        Ok(s) => format!("/proc/{pid}/task/{}/fd/{fd}", s.tid),
        Err(_) => format!("/proc/{pid}/fd/{fd}"),
    }
}

/// Run jobs until every sender is gone (never, in a process that spawns).
fn serve(jobs: Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        job();
    }
}

/// Deny this thread, and whatever it starts from now on, every filesystem
/// write but `/dev/null`. Fails unless the kernel enforces all of it.
fn restrict_this_thread() -> Result<(), String> {
    let abi = ABI::V3;
    let write = AccessFs::from_write(abi);
    let ruleset = Ruleset::default()
        .handle_access(write)
        .and_then(|r| r.create())
        .map_err(|e| format!("Landlock refused the ruleset: {e}"))?;
    let null = PathFd::new("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
    let status = ruleset
        .add_rule(PathBeneath::new(null, AccessFs::WriteFile))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("Landlock refused to restrict the spawner: {e}"))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced if status.no_new_privs => Ok(()),
        RulesetStatus::FullyEnforced => Err("no_new_privs could not be set".into()),
        RulesetStatus::PartiallyEnforced => Err(format!(
            "this kernel enforces only part of Landlock ABI {} ({:?})",
            abi as u32, status.landlock
        )),
        RulesetStatus::NotEnforced => Err(format!(
            "this kernel does not enforce Landlock ({:?}): boot it with Landlock in the lsm= list",
            status.landlock
        )),
    }
}

/// The benches' switch (feature `internals`, never in a release): tier-1
/// processes start without Landlock, to measure what it costs the gate.
#[cfg(feature = "internals")]
pub static OFF_FOR_BENCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether tier-1 processes start restricted on this machine, and why not.
pub fn status() -> Status {
    #[cfg(feature = "internals")]
    if OFF_FOR_BENCH.load(std::sync::atomic::Ordering::Relaxed) {
        return Status::Unavailable("switched off by the bench".into());
    }
    match spawner() {
        Ok(_) => Status::Enforced,
        Err(why) => Status::Unavailable(why.clone()),
    }
}

/// Run `spawn` (which starts one process) on the restricted thread, so the
/// process it starts cannot write; `Err` with why when there is no such
/// thread here. `spawn` must only start the process: it runs on a thread
/// that cannot write files either.
pub(crate) fn spawn_observing<T: Send + 'static>(
    spawn: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let jobs = &spawner().as_ref().map_err(Clone::clone)?.jobs;
    let (done, result) = sync_channel::<T>(1);
    jobs.send(Box::new(move || {
        let _ = done.send(spawn());
    }))
    .map_err(|_| "the observer spawner thread is gone".to_string())?;
    result
        .recv()
        .map_err(|_| "the observer spawner thread dropped the spawn".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this kernel (Landlock ABI 3 or later) the spawner restricts
    /// itself, and what it starts cannot create, write, truncate, rename or
    /// remove a file, while it still reads, writes its pipe and /dev/null.
    /// The same commands started the ordinary way can.
    #[test]
    fn a_process_the_observer_spawner_starts_cannot_write() {
        assert_eq!(status(), Status::Enforced, "this kernel has Landlock");
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("existing");
        std::fs::write(&existing, "kept\n").unwrap();
        let sh = |script: String| {
            let mut c = std::process::Command::new("/bin/sh");
            c.args(["-c", &script]);
            c
        };
        let attempts = [
            format!("echo x > {}/new", dir.path().display()),
            format!("echo x >> {}", existing.display()),
            format!(": > {}", existing.display()),
            format!("mv {} {}/moved", existing.display(), dir.path().display()),
            format!("rm {}", existing.display()),
            format!("mkdir {}/d", dir.path().display()),
            format!("ln -s /etc/passwd {}/link", dir.path().display()),
        ];
        for script in &attempts {
            let mut c = sh(script.clone());
            let out = spawn_observing(move || c.output()).unwrap().unwrap();
            assert!(!out.status.success(), "{script} was let through");
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                said.contains("Permission denied") || said.contains("Operation not permitted"),
                "{script}: {said}"
            );
        }
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "kept\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // It still reads and writes its own pipe and /dev/null.
        let mut c = sh(format!("cat {} && echo y > /dev/null", existing.display()));
        let out = spawn_observing(move || c.output()).unwrap().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
        // The same write, started the ordinary way, is made.
        let made = sh(format!("echo x > {}/new", dir.path().display()))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(dir.path().join("new").exists());
    }
}

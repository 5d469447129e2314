//! Starting one observer process, which confines *itself* between the
//! clone and the exec: a Landlock domain of its own, its resource limits,
//! its own process group, its stdio, its working directory.
//!
//! Why not `std::process::Command`: it starts a process with
//! `posix_spawn` (a clone that shares the daemon's memory until the exec)
//! unless a `pre_exec` hook is set, and then with a full `fork` of the
//! daemon, whose page tables are copied for nothing: 1.7 ms a spawn
//! against 0.09 ms, measured on a daemon holding 40 MB. A domain and
//! limits that are the child's alone need code that runs in the child, so
//! this is `posix_spawn`'s own recipe with three more system calls: a
//! `clone(CLONE_VM | CLONE_VFORK)` onto a stack of the spawner thread's,
//! and in the child only raw system calls over memory prepared before the
//! clone (no allocation, no lock, no unwinding), then `execve`. The
//! spawner thread waits (`CLONE_VFORK`) until the child has exec'd or
//! died; a failure before the exec is written into shared memory.
//!
//! What the child takes from the spawner thread as any child does: its
//! credentials (the observer's user), `no_new_privs`, its Landlock domain
//! and its seccomp filter ([`super::filter`]).

use std::ffi::{CString, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;

/// What to start: every string already a C string, so the child copies
/// nothing.
pub(crate) struct Exec {
    /// The program, by absolute path.
    pub(crate) program: CString,
    /// `argv[0]` and the arguments.
    pub(crate) argv: Vec<CString>,
    /// `NAME=VALUE`, the whole environment.
    pub(crate) env: Vec<CString>,
    /// The working directory.
    pub(crate) cwd: CString,
    /// What its stdin is.
    pub(crate) stdin: Stdin,
}

/// A child's stdin.
pub(crate) enum Stdin {
    /// `/dev/null`.
    Null,
    /// A pipe whose writing end comes back in [`Started::stdin`].
    Pipe,
    /// This descriptor (a copy of it becomes fd 0).
    File(OwnedFd),
}

/// A started process: its pid and the parent's ends of its pipes.
#[derive(Debug)]
pub(crate) struct Started {
    /// Its pid, which leads its own process group.
    pub(crate) pid: u32,
    /// The writing end of its stdin, when [`Stdin::Pipe`].
    pub(crate) stdin: Option<OwnedFd>,
    /// The reading end of its stdout.
    pub(crate) stdout: OwnedFd,
    /// The reading end of its stderr.
    pub(crate) stderr: OwnedFd,
}

/// One resource limit the child sets on itself (soft and hard alike).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    /// `RLIMIT_*`.
    pub(crate) resource: c_int,
    /// The limit.
    pub(crate) value: u64,
}

/// What the child does to itself before the exec, beyond its stdio.
pub(crate) struct OnItself<'a> {
    /// Its resource limits.
    pub(crate) limits: &'a [Limit],
    /// A Landlock ruleset it restricts itself with (its own domain, nested
    /// in the spawner's), if any.
    pub(crate) ruleset: Option<RawFd>,
}

/// Where in the child a step failed, with the kernel's errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Signals = 1,
    Group,
    Stdio,
    Cwd,
    Limits,
    Landlock,
    Exec,
}

impl Stage {
    fn of(code: i32) -> &'static str {
        match code {
            1 => "resetting its signals",
            2 => "leading its process group",
            3 => "wiring its stdio",
            4 => "entering its working directory",
            5 => "setting its resource limits",
            6 => "entering its own Landlock domain",
            _ => "exec",
        }
    }
}

/// Everything the child reads: pointers into memory the parent keeps
/// alive and unchanged until the clone returns.
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// To become fds 0, 1 and 2.
    stdio: [RawFd; 3],
    limits: *const Limit,
    limits_len: usize,
    /// -1: none.
    ruleset: RawFd,
    /// `SIGRTMAX`, read before the clone.
    last_signal: c_int,
    /// `stage << 16 | errno` of the step that failed; 0 while none did.
    failed: AtomicI32,
}

/// The child: raw system calls only, then `execve`. It runs on the
/// spawner's stack of its own, in the daemon's memory, while the thread
/// that cloned it waits.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildArgs` the parent passed to clone, alive
    // and unchanged until the parent resumes, which is after this child
    // has exec'd or exited (CLONE_VFORK). Every call below is a system
    // call (or glibc's thin, async-signal-safe wrapper of one) over
    // pointers the parent prepared.
    unsafe {
        let a = &*(arg as *const ChildArgs);
        let fail = |stage: Stage| -> c_int {
            let errno = *libc::__errno_location();
            a.failed
                .store(((stage as i32) << 16) | (errno & 0xffff), Ordering::SeqCst);
            libc::_exit(127)
        };
        // Every signal to its default (handlers point into the daemon's
        // code; ignored ones would stay ignored across the exec), then
        // none blocked (the parent blocked them all around the clone).
        for sig in 1..=a.last_signal {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = libc::SIG_DFL;
            // EINVAL for the numbers glibc keeps for itself: not ours.
            let _ = libc::sigaction(sig, &act, std::ptr::null_mut());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
            return fail(Stage::Signals);
        }
        if libc::setpgid(0, 0) != 0 {
            return fail(Stage::Group);
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            // Each source is 3 or above (see `above_stdio`), so no dup2
            // overwrites a source a later one needs.
            if libc::dup2(fd, target as c_int) < 0 {
                return fail(Stage::Stdio);
            }
        }
        if libc::chdir(a.cwd) != 0 {
            return fail(Stage::Cwd);
        }
        for i in 0..a.limits_len {
            let l = *a.limits.add(i);
            let r = libc::rlimit64 {
                rlim_cur: l.value,
                rlim_max: l.value,
            };
            if libc::prlimit64(0, l.resource as _, &r, std::ptr::null_mut()) != 0 {
                return fail(Stage::Limits);
            }
        }
        if a.ruleset >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, a.ruleset, 0u32) != 0 {
            return fail(Stage::Landlock);
        }
        libc::execve(a.program, a.argv, a.envp);
        fail(Stage::Exec)
    }
}

/// The child's stack: the spawner thread's own, reused by every spawn it
/// makes (the thread waits while the child runs on it).
struct Stack {
    base: *mut c_void,
    len: usize,
}

/// The stack the child runs on until its exec: a few frames of system
/// calls need a fraction of this.
const STACK: usize = 64 * 1024;
/// Below it, a page that faults instead of overwriting the daemon's memory.
const GUARD: usize = 4096;

impl Stack {
    fn new() -> std::io::Result<Stack> {
        let len = STACK + GUARD;
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: the mapping made above, unused.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(Stack { base, len })
    }

    /// Its top, where a stack that grows down starts (16-byte aligned).
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the mapping's end, which the child's first push
        // decrements into it.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, no child running on it (a spawn
        // returns only after its child exec'd or exited).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

thread_local! {
    static STACK_OF_THIS_THREAD: std::cell::RefCell<Option<Stack>> = const { std::cell::RefCell::new(None) };
}

/// A pipe: (read end, write end), close-on-exec.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// `fd` moved to 3 or above (close-on-exec), so that the child's dup2s
/// onto 0, 1 and 2 never overwrite a descriptor a later one reads.
fn above_stdio(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl duplicates a descriptor we own; the new one is ours.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// A null-terminated array of pointers to `strings`, which must outlive it.
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Start `exec`, the child doing `itself` to itself first. Returns once
/// it has exec'd; an error names the step of the child's that failed.
pub(crate) fn start(exec: Exec, itself: &OnItself<'_>) -> std::io::Result<Started> {
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (stdin_child, stdin_parent) = match exec.stdin {
        Stdin::Null => {
            let null = std::fs::File::open("/dev/null")?;
            (OwnedFd::from(null), None)
        }
        Stdin::Pipe => {
            let (r, w) = pipe()?;
            (r, Some(w))
        }
        Stdin::File(fd) => (fd, None),
    };
    let stdio = [
        above_stdio(stdin_child)?,
        above_stdio(out_w)?,
        above_stdio(err_w)?,
    ];
    let argv = pointers(&exec.argv);
    let envp = pointers(&exec.env);
    let args = ChildArgs {
        program: exec.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: exec.cwd.as_ptr(),
        stdio: [
            stdio[0].as_raw_fd(),
            stdio[1].as_raw_fd(),
            stdio[2].as_raw_fd(),
        ],
        limits: itself.limits.as_ptr(),
        limits_len: itself.limits.len(),
        ruleset: itself.ruleset.unwrap_or(-1),
        last_signal: libc::SIGRTMAX(),
        failed: AtomicI32::new(0),
    };
    let pid = STACK_OF_THIS_THREAD.with(|slot| -> std::io::Result<libc::pid_t> {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            *slot = Some(Stack::new()?);
        }
        let top = slot
            .as_ref()
            .map(Stack::top)
            .unwrap_or(std::ptr::null_mut());
        // SAFETY: every signal is blocked on this thread around the clone
        // (the child would otherwise run the daemon's handlers on its
        // stack before it resets them), and restored after; `child` reads
        // `args`, which lives until after the clone returns; the stack is
        // this thread's, which CLONE_VFORK keeps waiting until the child
        // no longer runs on it.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
            let pid = libc::clone(
                child,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::addr_of!(args) as *mut c_void,
            );
            let errno = std::io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            if pid < 0 {
                return Err(errno);
            }
            Ok(pid)
        }
    })?;
    drop(stdio);
    let failed = args.failed.load(Ordering::SeqCst);
    if failed != 0 {
        // It exited before its exec: reap it, say where and why.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        let errno = std::io::Error::from_raw_os_error(failed & 0xffff);
        return Err(std::io::Error::new(
            errno.kind(),
            format!("{errno} ({})", Stage::of(failed >> 16)),
        ));
    }
    Ok(Started {
        pid: pid as u32,
        stdin: stdin_parent,
        stdout: out_r,
        stderr: err_r,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(program: &str, args: &[&str]) -> Exec {
        let c = |s: &str| CString::new(s).unwrap();
        Exec {
            program: c(program),
            argv: std::iter::once(program)
                .chain(args.iter().copied())
                .map(c)
                .collect(),
            env: vec![c("PATH=/usr/bin:/bin"), c("LANG=C")],
            cwd: c("/"),
            stdin: Stdin::Pipe,
        }
    }

    fn wait(pid: u32) -> i32 {
        match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None).unwrap() {
            nix::sys::wait::WaitStatus::Exited(_, code) => code,
            other => panic!("{other:?}"),
        }
    }

    fn read_all(fd: OwnedFd) -> String {
        use std::io::Read;
        let mut s = String::new();
        std::fs::File::from(fd).read_to_string(&mut s).unwrap();
        s
    }

    /// The child gets its stdin, stdout and stderr, its environment and
    /// working directory, its own process group, and the limits it set
    /// on itself, which its parent does not have.
    #[test]
    fn a_child_starts_with_its_stdio_group_and_limits() {
        let limits = [Limit {
            resource: libc::RLIMIT_NOFILE as c_int,
            value: 77,
        }];
        let started = start(
            exec(
                "/bin/sh",
                &[
                    "-c",
                    "read x; echo \"$x $(ulimit -n) $(pwd) $LANG\"; ps -o pgid= -p $$ | tr -d ' ' >&2",
                ],
            ),
            &OnItself {
                limits: &limits,
                ruleset: None,
            },
        )
        .unwrap();
        let mut stdin = std::fs::File::from(started.stdin.unwrap());
        std::io::Write::write_all(&mut stdin, b"hello\n").unwrap();
        drop(stdin);
        assert_eq!(read_all(started.stdout), "hello 77 / C\n");
        assert_eq!(read_all(started.stderr).trim(), started.pid.to_string());
        assert_eq!(wait(started.pid), 0);
        let mine = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap()
            .0;
        assert_ne!(mine, 77, "the limit is the child's alone");
    }

    /// A failure before the exec is an error that names the step, and
    /// leaves no child behind.
    #[test]
    fn a_failure_before_the_exec_names_its_step() {
        let mut e = exec("/bin/true", &[]);
        e.cwd = CString::new("/nonexistent/dir").unwrap();
        let err = start(
            e,
            &OnItself {
                limits: &[],
                ruleset: None,
            },
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("entering its working directory"),
            "{err}"
        );
        let err = start(
            exec("/nonexistent/program", &[]),
            &OnItself {
                limits: &[],
                ruleset: None,
            },
        )
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("(exec)"), "{err}");
    }
}

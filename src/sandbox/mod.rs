//! Tier 1 changes nothing, whatever its argv, and no observer reaches
//! another: properties of each process, not of the code that built its
//! argv.
//!
//! A tier-1 tool only observes. For the built-ins that is true by their
//! code; for a tool an operator declared in YAML it is only as true as its
//! author was careful, and "writes no file" was not enough: a tier-1 `socat`
//! drained a haproxy server through its root-only admin socket, a `curl
//! -X POST` reached a loopback admin API, a `kill` ended a root process,
//! one run's tier-1 tool `ptrace`d another run's verify probe and turned
//! its `exit(3)` into `exit(0)`, and another read the webhook's 0600 token.
//! So every tier-1 process (a tool's, a verify or capture probe's) starts
//! as an *observer*, in these layers:
//!
//! - **`landlock_fs`** (Landlock ABI 3): no filesystem write, create,
//!   rename, truncate or delete, but writing `/dev/null`; its pipes are no
//!   files and stay writable.
//! - **`landlock_reads`**: every file is readable but runwarden's own
//!   secrets and state, the system's credential stores and devices
//!   ([`reads`]).
//! - **`landlock_net`** (ABI 4): no TCP connect or bind, but connects to
//!   the ports its declaration names (`connect:`). Landlock rules name
//!   ports, not addresses.
//! - **`landlock_scope`** (ABI 6): no signal to a process, and no connect
//!   to an abstract unix socket, outside its own domain; and each observer
//!   process has a domain of its own ([`spawn`]), so no observer signals
//!   or traces another (Landlock refuses `ptrace`, `/proc/PID/mem` and
//!   `process_vm_*` across domains at any ABI).
//! - **`seccomp`**: no `ptrace`, `process_vm_*`, `io_uring` or new
//!   namespace at all, no socket of a family or transport its declaration
//!   does not name, no unix datagram ([`filter`]).
//! - **`observer_identity`**: it runs as the unprivileged `runwarden-observe`
//!   user, in the journal's group, with no capability but
//!   `CAP_DAC_READ_SEARCH` (ambient: it reads what root reads, but for
//!   `landlock_reads`). So a root-only named socket (haproxy's admin
//!   socket, D-Bus's privileged methods through polkit) refuses it:
//!   connecting to a named socket needs write permission on it. A daemon
//!   that is not root already runs as an unprivileged user of its own, and
//!   its tier-1 processes run as that.
//!
//! And **limits** ([`LIMITS`]): each observer process may hold
//! [`MAX_MEMORY`] of data, and the observer's account [`MAX_PROCESSES`]
//! processes in all; a fork loop or a memory hog fails, and the call's
//! error names the limit.
//!
//! How, without slowing every spawn: credentials, Landlock and seccomp
//! belong to a thread and to what it starts. One thread per network
//! policy, an *observer spawner*, takes the observer's identity and
//! restricts itself once (with `no_new_privs`, so nothing it starts gains
//! privileges through a set-uid program or file capabilities) and from
//! then on only spawns: a tier-1 process is handed to it and comes back
//! started. What must be the process's own (its domain, its limits) it
//! sets on itself between clone and exec ([`spawn`]), at the cost of a
//! `posix_spawn`, not a `fork` of the daemon (`cargo bench --bench gate`
//! measures it). Credentials are set with the raw system calls: glibc's
//! wrappers would change every thread of the daemon.
//!
//! Where a layer is missing, [`layers`] says why; `check`, the daemon's
//! start and `runwarden_sandbox_available{kind=...}` say so. Built-in
//! tier-1 tools then run with the layers there are (their argv is fixed in
//! code); declared ones refuse unless the host sets `unsandboxed_tier1:
//! allow`.
//!
//! One file: what this machine enforces, the spawner threads that apply
//! it and why a layer is missing are one confinement, found once per
//! process; apart, each would have to agree with the others on it. How a
//! child confines itself, the filter and the read ruleset are modules of
//! their own.

pub(crate) mod filter;
pub mod reads;
pub(crate) mod spawn;

pub use filter::Sockets;
pub use reads::protect;

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};

use landlock::{
    ABI, Access, AccessFs, AccessNet, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The observer's account: the package makes it (sysusers.d).
pub const OBSERVER: &str = "runwarden-observe";
/// Who tier-1 processes run as where [`OBSERVER`] is missing.
const FALLBACK: &str = "nobody";
/// The group whose members read the whole system journal.
pub const JOURNAL_GROUP: &str = "systemd-journal";

/// A job for an observer spawner: run on its restricted thread.
type Job = Box<dyn FnOnce() + Send>;

/// A layer of the observer's confinement (its `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// No filesystem write.
    LandlockFs,
    /// No reading runwarden's secrets and state, credentials, devices.
    LandlockReads,
    /// No TCP connect or bind but to the ports declared.
    LandlockNet,
    /// No signal, no abstract unix socket outside its own domain.
    LandlockScope,
    /// No ptrace, no foreign socket family or transport.
    Seccomp,
    /// An unprivileged user with no capability but reading.
    ObserverIdentity,
}

impl Layer {
    /// As metrics, `check` and errors name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::LandlockFs => "landlock_fs",
            Layer::LandlockReads => "landlock_reads",
            Layer::LandlockNet => "landlock_net",
            Layer::LandlockScope => "landlock_scope",
            Layer::Seccomp => "seccomp",
            Layer::ObserverIdentity => "observer_identity",
        }
    }
}

/// Whether tier-1 processes start with every layer here, and which are
/// missing and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every layer holds.
    Enforced,
    /// They start without some: each missing layer and why.
    Unavailable(String),
}

impl Status {
    /// Whether tier-1 processes start with every layer.
    pub fn enforced(&self) -> bool {
        matches!(self, Status::Enforced)
    }
}

/// Why a layer of the observer's confinement does not hold here, or why a
/// tier-1 process could not be started inside it. A process that cannot be
/// confined is not started (the process runner refuses it); `check`, the daemon's
/// start and the metrics say which layer is missing and this says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unconfined {
    /// The kernel has no Landlock, or it is off.
    #[error("this kernel does not enforce Landlock: boot it with Landlock in the lsm= list ({0})")]
    NoLandlock(&'static str),
    /// The kernel's Landlock is older than the layer needs.
    #[error("this kernel's Landlock is ABI {has}; {what} needs ABI {needs}")]
    OldLandlock {
        /// The kernel's ABI.
        has: i64,
        /// The ABI the layer needs.
        needs: i64,
        /// The layer, in words.
        what: &'static str,
    },
    /// Neither the observer's account nor `nobody` exists.
    #[error(
        "there is no user {OBSERVER} nor {FALLBACK} (the package makes {OBSERVER}; by hand: `useradd --system --no-create-home --shell /usr/sbin/nologin --groups {JOURNAL_GROUP} {OBSERVER}`), so tier-1 processes would run as root"
    )]
    NoObserver,
    /// The account found has uid 0.
    #[error("the user {0} is root")]
    ObserverIsRoot(String),
    /// A credential system call of the spawner thread failed.
    #[error("{what}: {errno}")]
    Credentials {
        /// What it was doing.
        what: &'static str,
        /// What the kernel said.
        errno: nix::errno::Errno,
    },
    /// Landlock refused the ruleset or a rule.
    #[error("Landlock refused the observer's ruleset: {0}")]
    Ruleset(String),
    /// `/dev/null`, the one file an observer may write, cannot be opened.
    #[error("cannot open /dev/null for the observer's ruleset: {0}")]
    DevNull(String),
    /// The ruleset was made but not (wholly) enforced.
    #[error("this kernel enforces {0}")]
    NotEnforced(String),
    /// The seccomp filter was refused.
    #[error("the kernel refused the observer's seccomp filter: {0}")]
    Seccomp(String),
    /// The read ruleset could not be built.
    #[error("the observer's read ruleset could not be built: {0}")]
    Reads(String),
    /// The spawner thread could not be started, or is gone.
    #[error("the observer spawner thread {0}")]
    Spawner(&'static str),
    /// The benches' switch (feature `internals`).
    #[error("switched off by the bench")]
    OffForBench,
}

/// Who a tier-1 process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    /// The observer account (the daemon is root): uid, gid, and the
    /// journal's group when there is one.
    Observer {
        name: String,
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
    /// The daemon's own unprivileged user: nothing to change.
    Unprivileged(u32),
}

/// What this machine can enforce, found once.
#[derive(Debug)]
struct Layers {
    /// The kernel's Landlock ABI (0: none).
    abi: i64,
    /// The observer's identity, or why there is none.
    identity: Result<Identity, Unconfined>,
}

/// This machine's layers, found once.
fn found() -> &'static Layers {
    static FOUND: OnceLock<Layers> = OnceLock::new();
    FOUND.get_or_init(|| Layers {
        abi: kernel_abi(),
        identity: identity(),
    })
}

/// The Landlock ABI this kernel offers (0 where it has none or it is off).
fn kernel_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a null attribute and size 0, this flag only asks the
    // kernel for its ABI version; nothing is created.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}

fn identity() -> Result<Identity, Unconfined> {
    // The bench's question: what the identity alone adds to a spawn
    // (RUNWARDEN_BENCH_NO_IDENTITY).
    #[cfg(feature = "internals")]
    if std::env::var_os("RUNWARDEN_BENCH_NO_IDENTITY").is_some() {
        return Err(Unconfined::OffForBench);
    }
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        return Ok(Identity::Unprivileged(euid.as_raw()));
    }
    // Without the package's account, `nobody`: unprivileged all the same
    // (the other layers keep it from what nobody's other processes own).
    let user = [OBSERVER, FALLBACK]
        .into_iter()
        .find_map(|name| nix::unistd::User::from_name(name).ok().flatten())
        .ok_or(Unconfined::NoObserver)?;
    if user.uid.is_root() {
        return Err(Unconfined::ObserverIsRoot(user.name));
    }
    let mut groups = vec![user.gid.as_raw()];
    if let Ok(Some(journal)) = nix::unistd::Group::from_name(JOURNAL_GROUP) {
        groups.push(journal.gid.as_raw());
    }
    Ok(Identity::Observer {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        groups,
    })
}

/// Who tier-1 processes run as, in words (`check` says it).
pub fn observer() -> String {
    match &found().identity {
        Ok(Identity::Observer { name, uid, .. }) => {
            format!("{name} (uid {uid}), with only CAP_DAC_READ_SEARCH")
        }
        Ok(Identity::Unprivileged(uid)) => format!("this process's own user (uid {uid})"),
        Err(_) => "root: no observer account".into(),
    }
}

/// Each layer: `Ok` where it holds, else why not. Found once: what this
/// machine enforces does not change while the process runs.
pub fn layers() -> Vec<(Layer, Result<(), Unconfined>)> {
    #[cfg(feature = "internals")]
    if OFF_FOR_BENCH.load(std::sync::atomic::Ordering::Relaxed) {
        return found_layers()
            .iter()
            .map(|(l, _)| (*l, Err(Unconfined::OffForBench)))
            .collect();
    }
    found_layers().to_vec()
}

fn found_layers() -> &'static [(Layer, Result<(), Unconfined>)] {
    static LAYERS: OnceLock<Vec<(Layer, Result<(), Unconfined>)>> = OnceLock::new();
    LAYERS.get_or_init(|| {
        let f = found();
        let landlock = |needs: i64, what: &'static str| match f.abi {
            0 => Err(Unconfined::NoLandlock(what)),
            has if has < needs => Err(Unconfined::OldLandlock { has, needs, what }),
            _ => Ok(()),
        };
        vec![
            (
                Layer::LandlockFs,
                landlock(3, "no filesystem write").and_then(|()| spawner(&Net::none()).map(|_| ())),
            ),
            (
                Layer::LandlockReads,
                landlock(3, "no reading runwarden's secrets")
                    .and_then(|()| reads::current(f.abi).map(|_| ()).map_err(Unconfined::Reads)),
            ),
            (
                Layer::LandlockNet,
                landlock(4, "no TCP connect but to the declared ports"),
            ),
            (
                Layer::LandlockScope,
                landlock(6, "no signal or abstract socket outside its own domain"),
            ),
            (
                Layer::Seccomp,
                // The file layer's spawner installed it, or failed.
                landlock(
                    3,
                    "the seccomp filter (installed with the observer's Landlock)",
                ),
            ),
            (
                Layer::ObserverIdentity,
                f.identity.as_ref().map(|_| ()).map_err(Clone::clone),
            ),
        ]
    })
}

/// Whether tier-1 processes start with every layer here, and which not
/// (asked before every tier-1 spawn: found once).
pub fn status() -> Status {
    #[cfg(feature = "internals")]
    if OFF_FOR_BENCH.load(std::sync::atomic::Ordering::Relaxed) {
        return Status::Unavailable("switched off by the bench".into());
    }
    static STATUS: OnceLock<Status> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            let missing: Vec<String> = found_layers()
                .iter()
                .filter_map(|(l, r)| r.as_ref().err().map(|why| format!("{}: {why}", l.as_str())))
                .collect();
            match missing.is_empty() {
                true => Status::Enforced,
                false => Status::Unavailable(missing.join("; ")),
            }
        })
        .clone()
}

/// What an observer may reach over the network: the TCP ports Landlock
/// holds, and the socket families and transports the filter lets it open.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Net {
    /// The TCP ports it may connect to (sorted, once each).
    pub tcp_ports: Vec<u16>,
    /// The internet sockets it may open.
    pub sockets: Sockets,
}

impl Net {
    /// No network at all: a built-in tier-1 tool's.
    pub fn none() -> Net {
        Net::default()
    }
}

/// One observer spawner: its job queue.
struct Spawner {
    jobs: SyncSender<Job>,
}

/// The spawner of tier-1 processes under network policy `net`, made on
/// first use: one thread per policy (a declaration's `connect:` list; the
/// built-ins connect nowhere).
fn spawner(net: &Net) -> Result<Arc<Spawner>, Unconfined> {
    type Spawners = Mutex<BTreeMap<Net, Result<Arc<Spawner>, Unconfined>>>;
    static SPAWNERS: OnceLock<Spawners> = OnceLock::new();
    let mut key = net.clone();
    key.tcp_ports.sort_unstable();
    key.tcp_ports.dedup();
    let mut all = SPAWNERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(key.clone())
        .or_insert_with(|| start_spawner(key))
        .clone()
}

fn start_spawner(net: Net) -> Result<Arc<Spawner>, Unconfined> {
    let (ready_tx, ready) = sync_channel::<Result<(), Unconfined>>(1);
    let (jobs_tx, jobs) = sync_channel::<Job>(64);
    let started = std::thread::Builder::new()
        .name("runwarden-observe".into())
        .spawn(move || match become_observer(&net) {
            Ok(()) => {
                SPAWNER_THREAD.set(true);
                let _ = ready_tx.send(Ok(()));
                serve(jobs);
            }
            Err(why) => {
                let _ = ready_tx.send(Err(why));
            }
        });
    if started.is_err() {
        return Err(Unconfined::Spawner("could not be started"));
    }
    match ready.recv() {
        Ok(Ok(())) => Ok(Arc::new(Spawner { jobs: jobs_tx })),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(Unconfined::Spawner("ended before it was ready")),
    }
}

thread_local! {
    /// Set on an observer spawner's thread once it is one.
    static SPAWNER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The observer spawner for processes under `net`: `None` where this
/// kernel has no Landlock at all (nothing to start them under; a
/// built-in's argv is fixed in code, and `status` refuses a declared
/// tool's), `Err` where there is and the spawner could not be made (its
/// identity, ruleset or filter refused): the spawn fails closed.
pub(crate) fn observing(net: &Net) -> Result<Option<Observing>, Unconfined> {
    #[cfg(feature = "internals")]
    if OFF_FOR_BENCH.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    if found().abi < 3 {
        return Ok(None);
    }
    spawner(net).map(|s| Some(Observing(s)))
}

/// An observer spawner, ready to start a process.
pub(crate) struct Observing(Arc<Spawner>);

impl Observing {
    /// Run `spawn` on the spawner's thread, where it starts one process
    /// with [`start`]. `spawn` must only start the process: it runs on a
    /// thread that changes nothing either.
    pub(crate) fn spawn<T: Send + 'static>(
        &self,
        spawn: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Unconfined> {
        let (done, result) = sync_channel::<T>(1);
        self.0
            .jobs
            .send(Box::new(move || {
                let _ = done.send(spawn());
            }))
            .map_err(|_| Unconfined::Spawner("is gone"))?;
        result
            .recv()
            .map_err(|_| Unconfined::Spawner("dropped the spawn"))
    }
}

/// The limits every observer process sets on itself.
pub(crate) const LIMITS: [spawn::Limit; 3] = [
    spawn::Limit {
        resource: nix::libc::RLIMIT_DATA as i32,
        value: MAX_MEMORY,
    },
    spawn::Limit {
        resource: nix::libc::RLIMIT_NPROC as i32,
        value: MAX_PROCESSES,
    },
    // No core file: an observer's memory holds what it read.
    spawn::Limit {
        resource: nix::libc::RLIMIT_CORE as i32,
        value: 0,
    },
];

/// The data (heap, writable private mappings) one observer process may
/// hold. Files it maps to read (a journal) do not count.
pub const MAX_MEMORY: u64 = 512 << 20;

/// The processes the observer's account may have at once, all its tier-1
/// processes together (the kernel counts a user's processes, not a
/// tree's). Not set where the daemon itself is the unprivileged user its
/// tier-1 processes run as: its own threads would count.
pub const MAX_PROCESSES: u64 = 256;

/// The limits in words (`check`, and the error of a call that hit one).
pub fn limits_text() -> String {
    let processes = match &found().identity {
        Ok(Identity::Unprivileged(_)) => {
            "processes not limited (they run as the daemon's own user, whose threads would count)"
                .to_string()
        }
        _ => format!("{MAX_PROCESSES} processes of the observer's account in all"),
    };
    format!(
        "{} MiB of data per process, {processes}, no core file",
        MAX_MEMORY >> 20
    )
}

/// What `check` says of the observer beyond its layers.
#[derive(Debug)]
pub struct Described {
    /// How observer processes are kept apart, in words.
    pub isolation: String,
    /// What no observer reads.
    pub protected: Vec<std::path::PathBuf>,
    /// How many hierarchies its read ruleset lets be read (0: none built).
    pub readable: usize,
    /// Its limits, in words.
    pub limits: String,
}

/// The observer's isolation, read scope and limits on this machine.
pub fn describe() -> Described {
    let abi = found().abi;
    let isolation = match abi {
        0..=2 => format!("none: this kernel's Landlock is ABI {abi} (each observer process has a domain of its own from ABI 3)"),
        3..=5 => format!(
            "each observer process in a Landlock domain of its own: no ptrace, /proc/PID/mem or process_vm_* into another; signals between observers are not held (Landlock ABI {abi}, scoped signals need 6); seccomp: no ptrace, io_uring or new namespace, sockets only as declared"
        ),
        _ => "each observer process in a Landlock domain of its own: no ptrace, /proc/PID/mem, process_vm_* or signal into another observer or outside; seccomp: no ptrace, io_uring or new namespace, sockets only as declared".to_string(),
    };
    Described {
        isolation,
        protected: reads::protected(),
        readable: match abi {
            0..=2 => 0,
            _ => reads::current(abi).map(|r| r.readable).unwrap_or(0),
        },
        limits: limits_text(),
    }
}

/// Start `exec` as an observer process: on a spawner's thread (in
/// [`Observing::spawn`]'s closure) only, where it enters a Landlock domain
/// of its own (the reads of [`reads`], its signals scoped) and takes
/// [`LIMITS`] before its exec.
pub(crate) fn start(exec: spawn::Exec) -> std::io::Result<spawn::Started> {
    if !SPAWNER_THREAD.get() {
        return Err(std::io::Error::other(
            "an observer process is started on an observer spawner's thread only",
        ));
    }
    let ruleset = reads::current(found().abi).map_err(std::io::Error::other)?;
    let limits: &[spawn::Limit] = match &found().identity {
        Ok(Identity::Unprivileged(_)) => &LIMITS[..1],
        _ => &LIMITS,
    };
    spawn::start(
        exec,
        &spawn::OnItself {
            limits,
            ruleset: Some(ruleset.raw()),
        },
    )
}

/// Run jobs until every sender is gone (never, in a process that spawns).
fn serve(jobs: Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        job();
    }
}

/// Make this thread an observer, for good: the observer's identity where
/// there is one, then Landlock with every layer this kernel has, then the
/// seccomp filter of `net`. Fails unless the file layer and the filter
/// are enforced (the others are reported by [`layers`]).
fn become_observer(net: &Net) -> Result<(), Unconfined> {
    if let Ok(Identity::Observer {
        uid, gid, groups, ..
    }) = &found().identity
    {
        take_identity(*uid, *gid, groups)?;
    }
    restrict_this_thread(found().abi, &net.tcp_ports)?;
    filter::install(&filter::program(net.sockets)).map_err(|e| Unconfined::Seccomp(e.to_string()))
}

/// Capability numbers (linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;

/// This thread becomes `uid`:`gid` in `groups`, keeping only
/// `CAP_DAC_READ_SEARCH`, raised as ambient so what it starts keeps it.
/// Raw system calls: credentials are per thread in the kernel, and glibc's
/// wrappers would change every thread of the process.
fn take_identity(uid: u32, gid: u32, groups: &[u32]) -> Result<(), Unconfined> {
    use nix::libc;
    let err = |what: &'static str| Unconfined::Credentials {
        what,
        errno: nix::errno::Errno::last(),
    };
    // SAFETY: each call is a plain system call on this thread's own
    // credentials with arguments owned here; none keeps a pointer.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
            return Err(err("cannot set the observer's groups"));
        }
        if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
            return Err(err("cannot take the observer's group"));
        }
        if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 {
            return Err(err("cannot keep capabilities across the user change"));
        }
        if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
            return Err(err("cannot take the observer's user"));
        }
        // Permitted, effective and inheritable: CAP_DAC_READ_SEARCH alone.
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        let header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let read = 1u32 << CAP_DAC_READ_SEARCH;
        let data = [
            Data {
                effective: read,
                permitted: read,
                inheritable: read,
            },
            Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            return Err(err("cannot drop the observer's capabilities"));
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE,
            CAP_DAC_READ_SEARCH as libc::c_ulong,
            0,
            0,
        ) != 0
        {
            return Err(err("cannot raise CAP_DAC_READ_SEARCH as ambient"));
        }
    }
    Ok(())
}

/// Deny this thread, and whatever it starts from now on, every filesystem
/// write but `/dev/null`, and (where the kernel has them) TCP but to
/// `ports`, signals and abstract sockets outside. Fails unless the kernel
/// enforces the file layer.
fn restrict_this_thread(abi: i64, ports: &[u16]) -> Result<(), Unconfined> {
    const FS: &str = "no filesystem write";
    if abi < 3 {
        return Err(match abi {
            0 => Unconfined::NoLandlock(FS),
            has => Unconfined::OldLandlock {
                has,
                needs: 3,
                what: FS,
            },
        });
    }
    let refused = |e: landlock::RulesetError| Unconfined::Ruleset(e.to_string());
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_write(ABI::V3))
        .map_err(refused)?;
    if abi >= 4 {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(ABI::V4))
            .map_err(refused)?;
    }
    if abi >= 6 {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(refused)?;
    }
    let mut created = ruleset.create().map_err(refused)?;
    let null = PathFd::new("/dev/null").map_err(|e| Unconfined::DevNull(e.to_string()))?;
    created = created
        .add_rule(PathBeneath::new(null, AccessFs::WriteFile))
        .map_err(refused)?;
    if abi >= 4 {
        for port in ports {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(refused)?;
        }
    }
    let status = created.restrict_self().map_err(refused)?;
    match status.ruleset {
        RulesetStatus::FullyEnforced if status.no_new_privs => Ok(()),
        RulesetStatus::FullyEnforced => Err(Unconfined::NotEnforced(
            "the ruleset but could not set no_new_privs".into(),
        )),
        RulesetStatus::PartiallyEnforced => Err(Unconfined::NotEnforced(format!(
            "only part of the observer's Landlock ruleset ({:?})",
            status.landlock
        ))),
        RulesetStatus::NotEnforced => Err(Unconfined::NotEnforced(format!(
            "none of the observer's Landlock ruleset ({:?}): boot it with Landlock in the lsm= list",
            status.landlock
        ))),
    }
}

/// The benches' switch (feature `internals`, never in a release): tier-1
/// processes start without the observer's layers, to measure what they
/// cost the gate.
#[cfg(feature = "internals")]
pub static OFF_FOR_BENCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// An observer process of `argv` under `net`, started.
    fn start_observing(net: &Net, argv: &[&str]) -> std::io::Result<spawn::Started> {
        let c = |s: &str| CString::new(s).unwrap();
        let exec = spawn::Exec {
            program: c(argv[0]),
            argv: argv.iter().map(|a| c(a)).collect(),
            env: vec![c("PATH=/usr/bin:/bin"), c("LANG=C")],
            cwd: c("/"),
            stdin: spawn::Stdin::Null,
        };
        observing(net)
            .unwrap()
            .expect("this kernel has Landlock")
            .spawn(move || start(exec))
            .unwrap()
    }

    /// Its exit code, stdout and stderr.
    fn observe(net: &Net, argv: &[&str]) -> (i32, String, String) {
        use std::io::Read;
        let started = start_observing(net, argv).unwrap();
        let mut out = String::new();
        let mut err = String::new();
        std::fs::File::from(started.stdout)
            .read_to_string(&mut out)
            .unwrap();
        std::fs::File::from(started.stderr)
            .read_to_string(&mut err)
            .unwrap();
        let code =
            match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(started.pid as i32), None)
                .unwrap()
            {
                nix::sys::wait::WaitStatus::Exited(_, c) => c,
                other => panic!("{other:?}"),
            };
        (code, out, err)
    }

    fn sh(script: &str) -> (i32, String, String) {
        observe(&Net::none(), &["/bin/sh", "-c", script])
    }

    /// On this kernel (Landlock ABI 3 or later) the spawner restricts
    /// itself, and what it starts cannot create, write, truncate, rename or
    /// remove a file, while it still reads, writes its pipe and /dev/null.
    /// The same commands started the ordinary way can.
    #[test]
    fn a_process_the_observer_spawner_starts_cannot_write() {
        assert!(
            layers()[0].1.is_ok(),
            "this kernel has Landlock: {:?}",
            layers()
        );
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("existing");
        std::fs::write(&existing, "kept\n").unwrap();
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
            let (code, _, said) = sh(script);
            assert_ne!(code, 0, "{script} was let through");
            assert!(
                said.contains("Permission denied") || said.contains("Operation not permitted"),
                "{script}: {said}"
            );
        }
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "kept\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // It still reads and writes its own pipe and /dev/null.
        let (code, out, err) = sh(&format!("cat {} && echo y > /dev/null", existing.display()));
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, "kept\n");
        // The same write, started the ordinary way, is made.
        let made = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("echo x > {}/new", dir.path().display())])
            .status()
            .unwrap();
        assert!(made.success());
        assert!(dir.path().join("new").exists());
    }

    /// A TCP listener on loopback: an observer connects only to a port its
    /// policy names (ABI 4), and signals nothing outside its sandbox (ABI 6).
    #[test]
    fn an_observer_connects_only_to_its_ports_and_signals_nothing_outside() {
        if found().abi < 6 {
            eprintln!("skipped: this kernel's Landlock is ABI {}", found().abi);
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
        let ipv4 = Sockets {
            ipv4: true,
            ..Sockets::NONE
        };
        let try_with = |tcp_ports: Vec<u16>| {
            observe(
                &Net {
                    tcp_ports,
                    sockets: ipv4,
                },
                &["/bin/bash", "-c", &connect],
            )
        };
        assert_ne!(try_with(vec![]).0, 0);
        let allowed = try_with(vec![port]);
        assert_eq!(allowed.0, 0, "{allowed:?}");
        // No internet socket at all for a policy that names none.
        let (code, _, err) = observe(&Net::none(), &["/bin/bash", "-c", &connect]);
        assert_ne!(code, 0, "{err}");
        // A process outside the sandbox (a child of this test): no signal.
        let mut outside = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (code, _, err) = sh(&format!("kill -TERM {}", outside.id()));
        assert_ne!(code, 0, "{err}");
        assert!(outside.try_wait().unwrap().is_none(), "it still runs");
        outside.kill().unwrap();
        let _ = outside.wait();
    }

    /// Two observers of one spawner, as two runs' tier-1 processes are:
    /// neither signals the other, reads its environment or memory, nor
    /// traces it; each still signals its own children.
    #[test]
    fn no_observer_reaches_another() {
        if found().abi < 6 {
            eprintln!("skipped: this kernel's Landlock is ABI {}", found().abi);
            return;
        }
        let victim = start_observing(&Net::none(), &["/bin/sleep", "30"]).unwrap();
        let pid = victim.pid;
        for (what, script) in [
            ("a signal", format!("kill -TERM {pid}")),
            ("a stop", format!("kill -STOP {pid}")),
            ("its environment", format!("cat /proc/{pid}/environ")),
            ("its memory", format!("head -c 1 /proc/{pid}/mem")),
            ("its descriptors", format!("ls -l /proc/{pid}/fd/")),
            ("its stdout", format!("echo forged > /proc/{pid}/fd/1")),
            ("its root", format!("ls /proc/{pid}/root/")),
        ] {
            let (code, _, err) = sh(&script);
            assert_ne!(code, 0, "{what} reached the other observer: {err}");
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        assert!(state.contains(") S "), "it sleeps on, untouched: {state}");
        let (code, out, err) = sh("sleep 30 & kill -TERM $! && wait $!; echo $?");
        assert_eq!((code, out.trim()), (0, "143"), "its own child: {err}");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
    }

    /// A path protected, and an observer cannot read it though it reads
    /// the file beside it; a device neither.
    #[test]
    fn an_observer_does_not_read_what_is_protected() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("token");
        let beside = dir.path().join("beside");
        std::fs::write(&secret, "s3cr3t-token-value\n").unwrap();
        std::fs::write(&beside, "plain\n").unwrap();
        protect(&secret);
        let (code, out, err) = sh(&format!("cat {}", secret.display()));
        assert_ne!(code, 0, "{out}");
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(err.contains("Permission denied"), "{err}");
        let (code, out, _) = sh(&format!("cat {}", beside.display()));
        assert_eq!((code, out.as_str()), (0, "plain\n"));
        let (code, _, _) = sh("head -c 1 /dev/zero >/dev/null");
        assert_eq!(code, 0, "/dev/zero stays readable");
        let (code, _, _) = sh("cat /etc/shadow");
        assert_ne!(code, 0, "/etc/shadow is a credential store");
    }

    /// What an observer process may hold: a memory hog fails, and the
    /// limits are its own (this process keeps its own).
    #[test]
    fn an_observer_is_held_to_its_memory() {
        let (code, _, err) = observe(
            &Net::none(),
            &[
                "/usr/bin/python3",
                "-c",
                "b = bytearray(700_000_000); print(len(b))",
            ],
        );
        assert_ne!(code, 0, "700 MB held: {err}");
        assert!(err.contains("MemoryError"), "{err}");
        let (code, out, _) = sh("ulimit -d; ulimit -c");
        assert_eq!(code, 0);
        let want = format!("{}\n0\n", MAX_MEMORY >> 10);
        assert_eq!(out, want);
    }
}

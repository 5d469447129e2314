//! The observer's seccomp filter: the system calls Landlock does not
//! cover, refused before the kernel looks at them.
//!
//! - **Reaching into another process**: `ptrace`, `process_vm_readv`,
//!   `process_vm_writev`, `pidfd_getfd`, `kcmp`, `perf_event_open`.
//!   Landlock already refuses these outside an observer's own domain (each
//!   observer process has one, [`super::spawn`]); this holds where a
//!   kernel's Landlock does not.
//! - **Doors around the other layers**: `io_uring_*` (opens sockets and
//!   files without the system calls this filter sees), new namespaces
//!   (`unshare`, `setns`, `clone` with a `CLONE_NEW*` flag; `clone3`,
//!   whose flags a filter cannot read, answers "not implemented" so that
//!   the C library falls back to `clone`).
//! - **Sockets**: Landlock holds TCP by port and says nothing of UDP or of
//!   the address family. A socket of an internet family is refused unless
//!   the declaration names that family (`127.0.0.1:8404` is IPv4 only, so
//!   no `[::1]`), and a datagram socket unless it declares UDP. A unix
//!   socket may only be a stream (D-Bus, a user-level admin socket): no
//!   datagram to `/dev/log` or the journal, so a tier-1 tool cannot
//!   write a forged log line that a later run would read as evidence.
//!   Netlink stays (reading routes and sockets; changing them needs a
//!   capability the observer lacks).
//!
//! The filter is a short classic-BPF program, assembled here: a crate for
//! it would bring a compiler for what is twenty instructions.

use nix::libc;

/// The internet families and transports an observer may open sockets of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Sockets {
    /// IPv4 (`AF_INET`).
    pub ipv4: bool,
    /// IPv6 (`AF_INET6`).
    pub ipv6: bool,
    /// Datagram sockets of those families (UDP).
    pub udp: bool,
}

impl Sockets {
    /// No internet socket at all (a built-in tier-1 tool's).
    pub const NONE: Sockets = Sockets {
        ipv4: false,
        ipv6: false,
        udp: false,
    };
}

#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// Offsets into `struct seccomp_data`.
const NR: u32 = 0;
const ARCH_AT: u32 = 4;
/// The low word of argument `i` (little-endian).
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

const RET_ALLOW: u32 = 0x7fff_0000;
const fn ret_errno(errno: i32) -> u32 {
    0x0005_0000 | (errno as u32 & 0xffff)
}

/// The system calls refused outright.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_perf_event_open,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_unshare,
    libc::SYS_setns,
];

/// Every `CLONE_NEW*` flag.
const CLONE_NEW: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

/// A jump target, resolved when the program is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Label {
    Native,
    Allow,
    Refuse,
    NotImplemented,
    Clone,
    Socket,
    Unix,
    Inet,
    InetStream,
    InetDatagram,
}

/// One instruction, its jump (if any) still symbolic.
enum Ins {
    /// `A = seccomp_data[at]` (a 32-bit word).
    Load(u32),
    /// `A &= k`.
    And(u32),
    /// `if A == k goto label`.
    Eq(u32, Label),
    /// `if A >= k goto label`.
    AtLeast(u32, Label),
    /// `if A & k goto label`.
    AnyOf(u32, Label),
    /// `return k`.
    Return(u32),
    /// Where a label points (no instruction).
    Here(Label),
}

/// The filter of observers that may open `sockets`.
pub(crate) fn program(sockets: Sockets) -> Vec<libc::sock_filter> {
    use Ins::*;
    let nr = |n: libc::c_long| n as u32;
    let mut p = vec![
        // Another ABI (i386 on x86_64) numbers the same calls otherwise:
        // refused whole.
        Load(ARCH_AT),
        Eq(ARCH, Label::Native),
        Return(ret_errno(libc::EPERM)),
        Here(Label::Native),
        Load(NR),
    ];
    // x32's calls carry this bit on x86_64: refused whole.
    #[cfg(target_arch = "x86_64")]
    p.push(AtLeast(0x4000_0000, Label::Refuse));
    p.extend(REFUSED.iter().map(|&n| Eq(nr(n), Label::Refuse)));
    p.extend([
        Eq(nr(libc::SYS_clone3), Label::NotImplemented),
        Eq(nr(libc::SYS_clone), Label::Clone),
        Eq(nr(libc::SYS_socket), Label::Socket),
        Return(RET_ALLOW),
        // clone(flags, ...): no new namespace.
        Here(Label::Clone),
        Load(arg(0)),
        AnyOf(CLONE_NEW, Label::Refuse),
        Return(RET_ALLOW),
        // socket(domain, type, protocol).
        Here(Label::Socket),
        Load(arg(0)),
        Eq(libc::AF_UNIX as u32, Label::Unix),
        Eq(libc::AF_NETLINK as u32, Label::Allow),
    ]);
    if sockets.ipv4 {
        p.push(Eq(libc::AF_INET as u32, Label::Inet));
    }
    if sockets.ipv6 {
        p.push(Eq(libc::AF_INET6 as u32, Label::Inet));
    }
    p.extend([
        Return(ret_errno(libc::EAFNOSUPPORT)),
        Here(Label::Unix),
        Load(arg(1)),
        And(0xf),
        Eq(libc::SOCK_STREAM as u32, Label::Allow),
        Return(ret_errno(libc::EACCES)),
        Here(Label::Inet),
        Load(arg(1)),
        And(0xf),
        Eq(libc::SOCK_STREAM as u32, Label::InetStream),
    ]);
    if sockets.udp {
        p.push(Eq(libc::SOCK_DGRAM as u32, Label::InetDatagram));
    }
    // The transport is the protocol's, not the type's: a stream of
    // another protocol (MPTCP, SCTP) is beyond Landlock's TCP rules, so
    // only TCP's (0 or IPPROTO_TCP) and UDP's (0 or IPPROTO_UDP) pass.
    p.extend([
        Return(ret_errno(libc::EACCES)),
        Here(Label::InetStream),
        Load(arg(2)),
        Eq(0, Label::Allow),
        Eq(libc::IPPROTO_TCP as u32, Label::Allow),
        Return(ret_errno(libc::EACCES)),
    ]);
    if sockets.udp {
        p.extend([
            Here(Label::InetDatagram),
            Load(arg(2)),
            Eq(0, Label::Allow),
            Eq(libc::IPPROTO_UDP as u32, Label::Allow),
            Return(ret_errno(libc::EACCES)),
        ]);
    }
    p.extend([
        Here(Label::Allow),
        Return(RET_ALLOW),
        Here(Label::Refuse),
        Return(ret_errno(libc::EPERM)),
        Here(Label::NotImplemented),
        Return(ret_errno(libc::ENOSYS)),
    ]);
    assemble(&p)
}

/// Classic BPF from `p`: every jump is forward, to a label below it.
fn assemble(p: &[Ins]) -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const AND_K: u16 = 0x54;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for i in p {
        match i {
            Ins::Here(l) => {
                at.insert(*l, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    let ins = |code, jt, k| libc::sock_filter { code, jt, jf: 0, k };
    for i in p {
        let jump = |l: &Label| {
            // Forward only, and short: the program is a few dozen
            // instructions (a test assembles every variant).
            let to = at[l];
            u8::try_from(to - out.len() - 1).unwrap_or(u8::MAX)
        };
        let next = match i {
            Ins::Load(k) => ins(LD_W_ABS, 0, *k),
            Ins::And(k) => ins(AND_K, 0, *k),
            Ins::Eq(k, l) => ins(JEQ_K, jump(l), *k),
            Ins::AtLeast(k, l) => ins(JGE_K, jump(l), *k),
            Ins::AnyOf(k, l) => ins(JSET_K, jump(l), *k),
            Ins::Return(k) => ins(RET_K, 0, *k),
            Ins::Here(_) => continue,
        };
        out.push(next);
    }
    out
}

/// Install `program` on this thread (and what it starts from now on).
/// Needs `no_new_privs`, which the observer's Landlock restriction set.
pub(crate) fn install(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the kernel copies the program during the call; `prog`
    // points at `program`, alive until it returns.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant assembles with each jump landing on its label (none
    /// longer than an instruction can say), and ends in returns.
    #[test]
    fn every_variant_assembles_with_its_jumps_in_range() {
        for ipv4 in [false, true] {
            for ipv6 in [false, true] {
                for udp in [false, true] {
                    let p = program(Sockets { ipv4, ipv6, udp });
                    assert!(p.len() < 80, "{}", p.len());
                    for (i, f) in p.iter().enumerate().filter(|(_, f)| f.code & 0x07 == 0x05) {
                        assert!(
                            i + 1 + (f.jt as usize) < p.len(),
                            "jump at {i} out of the program"
                        );
                        assert_ne!(f.jt, u8::MAX, "jump at {i} too long");
                    }
                    assert_eq!(p.last().map(|f| f.code), Some(0x06));
                }
            }
        }
    }

    /// On a thread of its own (a filter is for good): ptrace and a UDP or
    /// IPv6 socket are refused, a TCP IPv4 socket and a unix stream are
    /// not, a unix datagram is.
    #[test]
    fn the_filter_refuses_what_it_names_and_nothing_else() {
        std::thread::spawn(|| {
            // SAFETY: prctl with plain integers, on this thread.
            assert_eq!(
                unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
                0
            );
            install(&program(Sockets {
                ipv4: true,
                ipv6: false,
                udp: false,
            }))
            .unwrap();
            let errno = || std::io::Error::last_os_error().raw_os_error();
            let socket_of = |domain, ty, protocol| {
                // SAFETY: socket(2) with plain integers; a descriptor it
                // returns is closed at once.
                let fd = unsafe { libc::socket(domain, ty, protocol) };
                let e = errno();
                if fd >= 0 {
                    // SAFETY: the descriptor just returned.
                    unsafe { libc::close(fd) };
                    Ok(())
                } else {
                    Err(e)
                }
            };
            let socket = |domain, ty| socket_of(domain, ty, 0);
            assert_eq!(
                socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC),
                Ok(())
            );
            assert_eq!(
                socket_of(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP),
                Ok(())
            );
            // MPTCP and SCTP streams are beyond Landlock's TCP port rules.
            for protocol in [libc::IPPROTO_MPTCP, libc::IPPROTO_SCTP] {
                assert_eq!(
                    socket_of(libc::AF_INET, libc::SOCK_STREAM, protocol),
                    Err(Some(libc::EACCES)),
                    "protocol {protocol}"
                );
            }
            assert_eq!(
                socket(libc::AF_INET, libc::SOCK_DGRAM),
                Err(Some(libc::EACCES))
            );
            assert_eq!(
                socket(libc::AF_INET6, libc::SOCK_STREAM),
                Err(Some(libc::EAFNOSUPPORT))
            );
            assert_eq!(socket(libc::AF_UNIX, libc::SOCK_STREAM), Ok(()));
            assert_eq!(
                socket(libc::AF_UNIX, libc::SOCK_DGRAM),
                Err(Some(libc::EACCES))
            );
            // SAFETY: PTRACE_TRACEME with null arguments changes nothing
            // when refused, which it must be.
            let r = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)));
            // SAFETY: unshare with a flag, refused.
            let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
            assert_eq!((r, errno()), (-1, Some(libc::EPERM)));
        })
        .join()
        .unwrap();
    }
}

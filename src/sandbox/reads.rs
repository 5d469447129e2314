//! What an observer may read: every file, but runwarden's own secrets and
//! state, the system's credential stores, and devices.
//!
//! The observer reads with `CAP_DAC_READ_SEARCH`, so file modes do not
//! keep it out of a 0600 token: a tier-1 tool once read the webhook's
//! token and `/etc/shadow` and handed them to an MCP client. Landlock
//! grants reading by hierarchy and denies nothing by name, so "all but
//! these" is built as a ruleset: `ReadFile` beneath every directory that
//! holds nothing protected, and, in a directory that does (an
//! *expanded* one: `/`, `/etc`, the configuration directory...), beneath
//! each of its entries but the protected ones. Listing a directory and
//! `stat` stay open everywhere (`du` of `/` still works); opening a
//! protected file for reading does not.
//!
//! Protected:
//! - what runwarden itself registers with [`protect`] as it reads its
//!   configuration: its secret files (tokens, keys, the approvers, the
//!   PostgreSQL URL, the model's key), its state directory (the audit
//!   log, the permit key, the record of spent permits);
//! - [`CREDENTIALS`]: shadow passwords, SSH host keys, TLS private keys;
//! - `/dev`, but for the few character devices a program expects
//!   ([`DEVICES`]): reading a disk device reads every file on it.
//!
//! A new entry in an expanded directory is unreadable until the ruleset
//! is built again, which happens before the next spawn that sees the
//! directory changed (its mtime, one `stat` per expanded directory).
//! What Landlock cannot tell apart is documented in docs/hardening.md: a
//! hard link to a protected file from another directory reads as that
//! directory's.

use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use landlock::{
    ABI, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

/// The system's credential stores: no tier-1 tool reads them.
pub const CREDENTIALS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/root/.ssh",
    "/root/.gnupg",
];

/// The devices an observer may open for reading.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What runwarden registered, and a count that changes with it.
#[derive(Default)]
struct Registered {
    paths: BTreeSet<PathBuf>,
    generation: u64,
}

static REGISTERED: Mutex<Registered> = Mutex::new(Registered {
    paths: BTreeSet::new(),
    generation: 0,
});

/// Keep observers from reading `path` (a file, or a directory and all
/// beneath it). Called for each secret and state path as the
/// configuration is read; a path that does not exist yet is kept as
/// written (absolute, else it is taken from the working directory).
pub fn protect(path: &Path) {
    let path = real(path);
    let mut r = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if r.paths.insert(path) {
        r.generation += 1;
    }
}

/// Every protected path: registered, credential stores, `/dev`; none
/// beneath another.
pub fn protected() -> Vec<PathBuf> {
    let r = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    let all: BTreeSet<PathBuf> = r
        .paths
        .iter()
        .cloned()
        .chain(CREDENTIALS.iter().map(|c| real(Path::new(c))))
        .chain(std::iter::once(PathBuf::from("/dev")))
        .collect();
    all.iter()
        .filter(|p| !all.iter().any(|q| q != *p && p.starts_with(q)))
        .cloned()
        .collect()
}

/// `path` with every symlink of its longest existing ancestor resolved:
/// Landlock and [`plan`] see the real hierarchy, and a state directory
/// not made yet is protected where it will be.
fn real(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut at = path.as_path();
    loop {
        if let Ok(found) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(found, |p, c| p.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return path,
        }
    }
}

/// Which hierarchies may be read, and the directories that were
/// expanded to say so (with their mtime when they were listed).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// `ReadFile` beneath each.
    pub(crate) readable: Vec<PathBuf>,
    /// Listed entry by entry, because something beneath is protected.
    pub(crate) expanded: Vec<(PathBuf, Option<SystemTime>)>,
}

/// The plan for `denied` (absolute paths), from `/`.
pub(crate) fn plan(denied: &[PathBuf]) -> Plan {
    let mut plan = Plan::default();
    let devices: Vec<PathBuf> = DEVICES.iter().map(|d| Path::new("/dev").join(d)).collect();
    visit(Path::new("/"), denied, &devices, &mut plan);
    plan
}

fn visit(dir: &Path, denied: &[PathBuf], devices: &[PathBuf], plan: &mut Plan) {
    if denied.iter().any(|d| d == dir) {
        // /dev is denied but for a few devices.
        if dir == Path::new("/dev") {
            plan.expanded.push((dir.to_path_buf(), mtime(dir)));
            plan.readable
                .extend(devices.iter().filter(|d| d.exists()).cloned());
        }
        return;
    }
    if !denied.iter().any(|d| d.starts_with(dir)) {
        plan.readable.push(dir.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    plan.expanded.push((dir.to_path_buf(), mtime(dir)));
    let mut children: Vec<PathBuf> = entries
        .flatten()
        // A symlink is read as what it points to, whose own place rules.
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_symlink()))
        .map(|e| e.path())
        .collect();
    children.sort();
    for child in children {
        visit(&child, denied, devices, plan);
    }
}

fn mtime(dir: &Path) -> Option<SystemTime> {
    std::fs::metadata(dir).and_then(|m| m.modified()).ok()
}

/// The ruleset every observer process restricts itself with: its reads
/// as [`plan`] says, and (ABI 6) signals and abstract sockets scoped to
/// its own domain, which is its own process tree: no observer signals or
/// traces another.
pub(crate) struct ReadRuleset {
    fd: OwnedFd,
    generation: u64,
    expanded: Vec<(PathBuf, Option<SystemTime>)>,
    /// How many hierarchies it lets be read (`check` says it).
    pub(crate) readable: usize,
}

impl ReadRuleset {
    /// The descriptor a child passes to `landlock_restrict_self`.
    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn still_current(&self, generation: u64) -> bool {
        self.generation == generation && self.expanded.iter().all(|(d, t)| mtime(d) == *t)
    }
}

/// Build the ruleset anew.
fn build(abi: i64, generation: u64) -> Result<ReadRuleset, String> {
    let plan = plan(&protected());
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::ReadFile)
        .map_err(|e| e.to_string())?;
    if abi >= 6 {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(|e| e.to_string())?;
    }
    let mut created = ruleset.create().map_err(|e| e.to_string())?;
    for path in &plan.readable {
        // Gone since it was listed: nothing to read there.
        let Ok(fd) = PathFd::new(path) else { continue };
        created = created
            .add_rule(PathBeneath::new(fd, AccessFs::ReadFile))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let _ = ABI::V3; // the read right is in every ABI since the first
    let fd: Option<OwnedFd> = created.into();
    Ok(ReadRuleset {
        fd: fd.ok_or("Landlock made no ruleset")?,
        generation,
        expanded: plan.expanded,
        readable: plan.readable.len(),
    })
}

/// The current read ruleset, built again when what is protected or an
/// expanded directory changed since the last one.
pub(crate) fn current(abi: i64) -> Result<Arc<ReadRuleset>, String> {
    static CURRENT: Mutex<Option<Arc<ReadRuleset>>> = Mutex::new(None);
    let generation = REGISTERED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .generation;
    let mut current = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = current.as_ref()
        && r.still_current(generation)
    {
        return Ok(r.clone());
    }
    let fresh = Arc::new(build(abi, generation)?);
    *current = Some(fresh.clone());
    Ok(fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a tree with one protected file and one protected directory:
    /// the protected ones are not readable, their siblings are, and only
    /// their ancestors are expanded.
    #[test]
    fn the_plan_reads_everything_but_what_is_protected() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for d in ["conf/runbooks", "conf/state", "other/deep"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "conf/token",
            "conf/runwarden.yaml",
            "conf/state/audit.jsonl",
        ] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        std::os::unix::fs::symlink(root.join("conf/token"), root.join("link")).unwrap();
        let denied = vec![root.join("conf/token"), root.join("conf/state")];
        let plan = plan(&denied);
        let readable: BTreeSet<&Path> = plan.readable.iter().map(PathBuf::as_path).collect();
        for r in &denied {
            assert!(
                !plan.readable.iter().any(|p| r.starts_with(p)),
                "{} is readable through {:?}",
                r.display(),
                plan.readable
            );
        }
        assert!(readable.contains(root.join("conf/runwarden.yaml").as_path()));
        assert!(readable.contains(root.join("conf/runbooks").as_path()));
        assert!(
            readable.contains(root.join("other").as_path()),
            "not expanded"
        );
        assert!(
            !readable.contains(root.join("link").as_path()),
            "a symlink is not a rule"
        );
        let expanded: Vec<&Path> = plan.expanded.iter().map(|(p, _)| p.as_path()).collect();
        assert!(expanded.contains(&root.as_path()));
        assert!(expanded.contains(&root.join("conf").as_path()));
        assert!(!expanded.contains(&root.join("other").as_path()));
    }

    /// /dev is read only through its harmless devices.
    #[test]
    fn of_dev_only_the_harmless_devices_are_readable() {
        let plan = plan(&[PathBuf::from("/dev")]);
        let dev: Vec<&PathBuf> = plan
            .readable
            .iter()
            .filter(|p| p.starts_with("/dev"))
            .collect();
        assert!(dev.contains(&&PathBuf::from("/dev/null")), "{dev:?}");
        assert!(
            dev.iter().all(|p| DEVICES.iter().any(|d| p.ends_with(d))),
            "{dev:?}"
        );
    }
}

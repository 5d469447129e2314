//! The host's allowlists: which units, paths, files and names a call may
//! touch, checked on the machine that runs it (or by their text, for a host
//! that checks again itself).

use std::path::{Path, PathBuf};

use super::args::*;
use super::*;
use crate::host::Host;

pub(super) fn allowed_unit(
    unit: &UnitName,
    host: &Host,
    journal: bool,
) -> Result<String, ArgError> {
    let u = unit.as_str();
    if host.units.contains(u) || (journal && host.journals.contains(u)) {
        return Ok(u.to_string());
    }
    let mut allowed: Vec<&str> = host.units.iter().map(String::as_str).collect();
    if journal {
        allowed.extend(host.journals.iter().map(String::as_str));
    }
    Err(ArgError::NotAllowed(format!(
        "unit {} is not allowed on host \"{}\" (allowed: {allowed:?})",
        shown(u),
        host.name
    )))
}

pub(super) fn allowed_key<V>(
    name: &EntryName,
    map: &std::collections::BTreeMap<String, V>,
    field: &str,
) -> Result<String, ArgError> {
    if map.contains_key(name.as_str()) {
        Ok(name.as_str().to_string())
    } else {
        let known: Vec<&str> = map.keys().map(String::as_str).collect();
        Err(ArgError::NotAllowed(format!(
            "{} is not defined under {field} on this host (defined: {known:?})",
            shown(name.as_str())
        )))
    }
}

/// A path that must be one of `allowed` or below one of them, after
/// resolution. Resolved (local) paths must also stay on the filesystem of the
/// allowed entry they fall under: a bind mount of /etc placed inside an
/// allowed directory resolves to a path below it, but is another mount.
pub(crate) fn allowed_path(
    raw: &str,
    allowed: &[PathBuf],
    mode: PathMode,
    field: &str,
) -> Result<PathBuf, ArgError> {
    let resolved = resolve_path(raw, mode)?;
    let under = allowed
        .iter()
        .map(|a| match mode {
            PathMode::Resolve => std::fs::canonicalize(a).unwrap_or_else(|_| a.clone()),
            PathMode::Lexical => a.clone(),
        })
        .filter(|a| resolved.starts_with(a))
        .max_by_key(|a| a.components().count());
    match under {
        Some(a)
            if mode == PathMode::Resolve
                && a != resolved
                && mount_of(&a) != mount_of(&resolved) =>
        {
            Err(ArgError::Path(format!(
                "path {} crosses a mount point below the allowed {} (list the mount point in the host's {field} if it may be examined)",
                shown(raw),
                a.display()
            )))
        }
        Some(_) => Ok(resolved),
        None => Err(ArgError::Path(not_allowed(raw, &resolved, allowed, field))),
    }
}

/// A path that may not exist yet (where a command will make a file) and
/// must fall under `allowed`: its deepest existing ancestor is resolved and
/// checked as [`allowed_path`] checks a path, and what follows it may hold
/// no `..` (a name not yet made cannot be a link out).
pub(crate) fn allowed_new_path(
    raw: &str,
    allowed: &[PathBuf],
    mode: PathMode,
    field: &str,
) -> Result<PathBuf, ArgError> {
    let path = Path::new(raw);
    if mode == PathMode::Lexical || path.exists() {
        return allowed_path(raw, allowed, mode, field);
    }
    let mut existing = path;
    let mut rest = Vec::new();
    while !existing.exists() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            return Err(ArgError::Path(format!(
                "cannot resolve path {}",
                shown(raw)
            )));
        };
        rest.push(name);
        existing = parent;
    }
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(ArgError::Path(format!("path {} contains `..`", shown(raw))));
    }
    let base = allowed_path(&existing.to_string_lossy(), allowed, mode, field)?;
    Ok(rest.into_iter().rev().fold(base, |p, n| p.join(n)))
}

/// Which mount a path is on (statx's mount id; the device number where
/// the kernel has no mount ids). `None` when it cannot be told.
pub(super) fn mount_of(path: &Path) -> Option<u64> {
    use nix::libc;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx writes into the zeroed buffer it is given; the path is NUL-terminated.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut buf,
        )
    };
    if rc != 0 {
        return None;
    }
    if buf.stx_mask & libc::STATX_MNT_ID != 0 {
        Some(buf.stx_mnt_id)
    } else {
        Some(((buf.stx_dev_major as u64) << 32) | buf.stx_dev_minor as u64)
    }
}

/// A file that must be exactly one of `allowed`, after resolution.
pub(super) fn allowed_file(
    raw: &str,
    allowed: &[PathBuf],
    mode: PathMode,
    field: &str,
) -> Result<PathBuf, ArgError> {
    let resolved = resolve_path(raw, mode)?;
    let hit = allowed.iter().any(|a| match mode {
        PathMode::Resolve => std::fs::canonicalize(a).is_ok_and(|a| a == resolved),
        PathMode::Lexical => *a == resolved,
    });
    if hit {
        Ok(resolved)
    } else {
        Err(ArgError::Path(not_allowed(raw, &resolved, allowed, field)))
    }
}

pub(super) fn resolve_path(raw: &str, mode: PathMode) -> Result<PathBuf, ArgError> {
    let p = Path::new(raw);
    match mode {
        PathMode::Resolve => std::fs::canonicalize(p)
            .map_err(|e| ArgError::Path(format!("cannot resolve path {}: {e}", shown(raw)))),
        PathMode::Lexical => {
            if p.components().any(|c| c == std::path::Component::ParentDir) {
                return Err(ArgError::Path(format!("path {} contains `..`", shown(raw))));
            }
            Ok(p.components().collect())
        }
    }
}

pub(super) fn not_allowed(raw: &str, resolved: &Path, allowed: &[PathBuf], field: &str) -> String {
    let via = if Path::new(raw) == resolved {
        String::new()
    } else {
        format!(" (it resolves to {})", shown(&resolved.to_string_lossy()))
    };
    format!(
        "path {}{via} is not allowed by the host's {field}: {allowed:?}",
        shown(raw)
    )
}

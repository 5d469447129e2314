//! The kill switch: one file stops everything.
//!
//! `DIR/ENGAGED` stops every run; `DIR/RUNBOOK.ENGAGED` stops one runbook.
//! The gate checks these files synchronously before every call, so a run
//! learns of the switch before its next call however it was engaged (the CLI,
//! `touch`, a config-management tool). Anything unexpected about the
//! directory (missing, unreadable, not a directory) counts as engaged: the
//! switch fails closed.
//!
//! A switch may be timed (`engage --for 2h`, `--until TIME`): its file says
//! `until: TIME`, and from then on it stops nothing; the daemon removes it
//! and writes an audit line naming who engaged it and why. A file that says
//! no `until` (or one that cannot be read) is untimed: it holds until a
//! person releases it.
//!
//! One file: the switch file's format, the lock an engage and a sweep
//! share, and the fleet's view beside the files are one switch, and the
//! rule "never weaken one in force" is reviewed across all three.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::rules::kill_switch::{self, GLOBAL as GLOBAL_SCOPE, Switch};

/// The file name of the global switch.
pub(crate) const GLOBAL: &str = "ENGAGED";

/// The file-based kill switch: a directory where `ENGAGED` stops every
/// run and `RUNBOOK.ENGAGED` stops one runbook's, at their next call.
#[derive(Debug, Clone)]
pub(crate) struct KillSwitch {
    dir: PathBuf,
    /// The fleet's switch, when several daemons share state.
    fleet: Option<std::sync::Arc<FleetSwitch>>,
}

/// The fleet's kill switch as this daemon last heard of it (PostgreSQL,
/// through LISTEN/NOTIFY from the shared store): scope (`global` or a
/// runbook) and what a person reads.
#[derive(Debug, Default)]
pub(crate) struct FleetSwitch {
    engaged: std::sync::RwLock<Vec<(String, String)>>,
    /// When each timed switch ends (Unix seconds), by scope.
    untils: std::sync::RwLock<Vec<(String, f64)>>,
    /// Woken when what the database says changed: the daemon's gauges and
    /// log follow at once.
    pub(crate) changed: tokio::sync::Notify,
}

impl FleetSwitch {
    /// What the database says now.
    pub(crate) fn set(&self, engaged: Vec<(String, String)>) {
        let mut now = self.engaged.write().unwrap_or_else(|p| p.into_inner());
        if *now != engaged {
            *now = engaged;
            self.changed.notify_one();
        }
    }

    /// The earliest time a timed switch of the fleet ends (Unix seconds).
    pub(crate) fn next_end(&self) -> Option<f64> {
        let untils = self.untils.read().unwrap_or_else(|p| p.into_inner());
        untils.iter().map(|(_, t)| *t).reduce(f64::min)
    }

    /// When the timed switches end, as the database says now.
    pub(crate) fn set_untils(&self, untils: Vec<(String, f64)>) {
        *self.untils.write().unwrap_or_else(|p| p.into_inner()) = untils;
    }

    /// When the fleet's switch for `scope` ends (Unix seconds), if it is timed.
    pub(crate) fn until(&self, scope: &str) -> Option<f64> {
        let untils = self.untils.read().unwrap_or_else(|p| p.into_inner());
        untils.iter().find(|(s, _)| s == scope).map(|(_, t)| *t)
    }

    /// Whether the fleet's switch for `scope` (`global` or a runbook) is engaged.
    pub(crate) fn engaged(&self, scope: &str) -> bool {
        self.find(scope).is_some()
    }

    fn find(&self, scope: &str) -> Option<String> {
        let engaged = self.engaged.read().unwrap_or_else(|p| p.into_inner());
        engaged
            .iter()
            .find(|(s, _)| s == scope)
            .map(|(_, detail)| detail.clone())
    }
}

/// Who engages a switch: this process's user name, or its uid.
pub(crate) fn who() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| nix::unistd::getuid().to_string())
}

/// Why calls are stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Engaged {
    /// `global`, or the runbook's name.
    pub(crate) scope: String,
    /// What the switch file says (who engaged it, and why).
    pub(crate) detail: String,
}

impl std::fmt::Display for Engaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kill switch engaged ({}): {}", self.scope, self.detail)
    }
}

impl KillSwitch {
    /// The switch kept in `dir`.
    pub(crate) fn new(dir: impl Into<PathBuf>) -> KillSwitch {
        KillSwitch {
            dir: dir.into(),
            fleet: None,
        }
    }

    /// The same switch, also engaged by the fleet's.
    pub(crate) fn with_fleet(mut self, fleet: Option<std::sync::Arc<FleetSwitch>>) -> KillSwitch {
        self.fleet = fleet;
        self
    }

    /// The fleet's switch beside the files, when several daemons share state.
    pub(crate) fn fleet(&self) -> Option<&std::sync::Arc<FleetSwitch>> {
        self.fleet.as_ref()
    }

    /// The directory of the switch files.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The switch file of one runbook (`None`: the global one).
    pub(crate) fn file_of(&self, runbook: Option<&str>) -> PathBuf {
        self.file(runbook)
    }

    fn file(&self, runbook: Option<&str>) -> PathBuf {
        match runbook {
            None => self.dir.join(GLOBAL),
            Some(r) => self.dir.join(format!("{r}.{GLOBAL}")),
        }
    }

    /// Why the directory itself counts as engaged, if it does (missing, not a directory, unreadable).
    fn dir_problem(&self) -> Option<String> {
        let dir = self.dir.display();
        match std::fs::metadata(&self.dir) {
            Ok(m) if !m.is_dir() => {
                return Some(format!(
                    "{dir} is not a directory; treated as engaged (fail closed). Replace it with a directory to release"
                ));
            }
            Ok(_) => {}
            Err(e) => {
                return Some(format!(
                    "cannot read the kill-switch directory {dir}: {e}; treated as engaged (fail closed). Create it with `mkdir -p {dir}` to release"
                ));
            }
        }
        let flags = nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK;
        nix::unistd::access(&self.dir, flags)
            .err()
            .map(|e| format!("the kill-switch directory {dir} is not readable ({e}); treated as engaged (fail closed)"))
    }

    /// Ok when calls of `runbook` may proceed; every doubt is an `Engaged`.
    pub(crate) fn check(&self, runbook: &str) -> Result<(), Engaged> {
        self.check_scopes(Some(runbook))
    }

    /// Ok unless everything is stopped (the directory, or `ENGAGED`): what
    /// `runwarden_kill_switch_engaged{scope="global"}` shows.
    pub(crate) fn check_global(&self) -> Result<(), Engaged> {
        self.check_scopes(None)
    }

    /// Whether `RUNBOOK.ENGAGED` itself is there (a dangling link counts).
    pub(crate) fn runbook_file_engaged(&self, runbook: &str) -> bool {
        !matches!(std::fs::symlink_metadata(self.file(Some(runbook))), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    }

    fn check_scopes(&self, runbook: Option<&str>) -> Result<(), Engaged> {
        if let Some(detail) = self.dir_problem() {
            return Err(Engaged {
                scope: GLOBAL_SCOPE.into(),
                detail,
            });
        }
        // Every switch found for the scopes asked, with what a person reads
        // of it; the rule says which one stops the runbook.
        let now = jiff::Timestamp::now();
        let mut found: Vec<(Switch<'_>, String)> = Vec::new();
        for (scope, file) in [Some((GLOBAL_SCOPE, None)), runbook.map(|r| (r, Some(r)))]
            .into_iter()
            .flatten()
        {
            let file = self.file(file);
            match std::fs::symlink_metadata(&file) {
                Ok(_) => {
                    let left = until_of(&file).map(|t| t.duration_since(now));
                    found.push((Switch { scope, left }, describe(&file)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => found.push((
                    Switch { scope, left: None },
                    format!(
                        "cannot check {}: {e}; treated as engaged (fail closed)",
                        file.display()
                    ),
                )),
            }
        }
        if let Some(fleet) = &self.fleet {
            let now_s = now.as_millisecond() as f64 / 1000.0;
            for scope in [Some(GLOBAL_SCOPE), runbook].into_iter().flatten() {
                if let Some(detail) = fleet.find(scope) {
                    let left = fleet
                        .until(scope)
                        .map(|t| jiff::SignedDuration::from_secs_f64(t - now_s));
                    found.push((Switch { scope, left }, detail));
                }
            }
        }
        let switches: Vec<Switch<'_>> = found.iter().map(|(s, _)| *s).collect();
        match kill_switch::stops(&switches, runbook) {
            Some(i) => Err(Engaged {
                scope: found[i].0.scope.to_string(),
                detail: found[i].1.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Engage: who, when, why, and until when (`None`: until a person
    /// releases it), written whole and renamed into place. A switch in
    /// force is never weakened: an untimed one stays untimed, of two timed
    /// ones the later end wins, and the earlier reasons are kept.
    pub(crate) fn engage(
        &self,
        runbook: Option<&str>,
        reason: &str,
        until: Option<jiff::Timestamp>,
    ) -> std::io::Result<EngagedFile> {
        self.engage_as(runbook, &who(), reason, until)
    }

    /// [`KillSwitch::engage`] as `by` (a principal, through the API or chat).
    pub(crate) fn engage_as(
        &self,
        runbook: Option<&str>,
        by: &str,
        reason: &str,
        until: Option<jiff::Timestamp>,
    ) -> std::io::Result<EngagedFile> {
        crate::files::make_dir(&self.dir)?;
        let _lock = self.lock()?;
        let target = self.file(runbook);
        let now = jiff::Timestamp::now();
        let before = read_file(&target).filter(|b| !b.expired(now));
        let until = match &before {
            // An untimed switch (or one that cannot be read) holds.
            Some(b) if b.until.is_none() => None,
            Some(b) => until.zip(b.until).map(|(a, b)| a.max(b)),
            None => until,
        };
        let mut body = format!(
            "engaged_by: {}\nengaged_at: {now}\nreason: {}\n",
            crate::text::one_line(by),
            crate::text::one_line(reason)
        );
        if let Some(t) = until {
            body.push_str(&format!("until: {t}\n"));
        }
        let kept = before.as_ref().map(SwitchFile::summary);
        if let Some(b) = &before {
            // What the earlier engagements said, the latest first, bounded.
            body.push_str(&format!("earlier: {}\n", b.summary()));
            for line in b.text.lines().filter(|l| l.starts_with("earlier:")).take(8) {
                body.push_str(line);
                body.push('\n');
            }
        }
        crate::files::replace(&target, body.as_bytes(), 0o644)?;
        Ok(EngagedFile {
            path: target,
            until,
            kept,
        })
    }

    /// An exclusive `flock` of the switch directory itself: an engage and
    /// the removal of an expired switch never interleave (no file is made
    /// for it, so a watcher of the directory sees nothing).
    fn lock(&self) -> std::io::Result<std::fs::File> {
        let dir = std::fs::File::open(&self.dir)?;
        dir.lock()?;
        Ok(dir)
    }

    /// Remove the switch file; false when it was not engaged.
    pub(crate) fn release(&self, runbook: Option<&str>) -> std::io::Result<bool> {
        match std::fs::remove_file(self.file(runbook)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every switch file in force and what it says.
    pub(crate) fn status(&self) -> Result<Vec<(String, String)>, Engaged> {
        if let Some(detail) = self.dir_problem() {
            return Err(Engaged {
                scope: "global".into(),
                detail,
            });
        }
        // What the gate holds to: an expired timed switch stops nothing,
        // so it is not listed as engaged (`sweep_expired` removes it).
        let now = jiff::Timestamp::now();
        let mut out: Vec<(String, String)> = self
            .switch_files()
            .into_iter()
            .filter(|(_, file)| !read_file(file).is_some_and(|r| r.expired(now)))
            .map(|(scope, file)| (scope, describe(&file)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Every switch file in the directory: its scope (`global` or the
    /// runbook) and its path.
    fn switch_files(&self) -> Vec<(String, PathBuf)> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let scope = match name.strip_suffix(&format!(".{GLOBAL}")) {
                    _ if name == GLOBAL => "global".to_string(),
                    Some(rb) => rb.to_string(),
                    None => return None,
                };
                Some((scope, e.path()))
            })
            .collect()
    }
}

/// What [`KillSwitch::engage`] wrote.
#[derive(Debug)]
pub(crate) struct EngagedFile {
    /// The switch file.
    pub(crate) path: PathBuf,
    /// Until when it holds now (`None`: until released).
    pub(crate) until: Option<jiff::Timestamp>,
    /// The switch that was in force before, which this one kept.
    pub(crate) kept: Option<String>,
}

/// The shortest and longest time a timed switch takes: one shorter than
/// a second stops nothing a person could see, and one past a century is
/// a typo for an untimed switch.
const SHORTEST: std::time::Duration = std::time::Duration::from_secs(1);
const LONGEST: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// When a switch engaged now for `d` ends, or why `d` is refused (`what`:
/// how the caller named it, `--for` or `for`).
pub(crate) fn end_for(d: std::time::Duration, what: &str) -> Result<jiff::Timestamp, String> {
    let shown = humantime::format_duration(d);
    if d < SHORTEST {
        return Err(format!(
            "{what} {shown} stops nothing: a timed switch holds at least 1s (omit {what} for a switch that holds until released)"
        ));
    }
    if d > LONGEST {
        return Err(format!(
            "{what} {shown} is past a century: omit {what} for a switch that holds until released"
        ));
    }
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| jiff::Timestamp::now().checked_add(d).ok())
        .ok_or_else(|| {
            format!("{what} is too long: omit {what} for a switch that holds until released")
        })
}

/// What an engage through the daemon did (the API, chat).
#[derive(Debug, Clone)]
pub(crate) struct Switched {
    /// `global`, or the runbook's name.
    pub(crate) scope: String,
    /// Until when it holds now (`None`: until released). An untimed
    /// switch in force stays untimed; of two ends the later wins.
    pub(crate) until: Option<jiff::Timestamp>,
    /// `fleet` (every replica, with shared state) or `replica` (this
    /// machine's file).
    pub(crate) reach: &'static str,
    /// Why it reached less than asked (the fleet's switch was not reached).
    pub(crate) warning: Option<String>,
}

/// A switch file as read: its text, which file it was, and until when it
/// holds.
#[derive(Debug)]
struct SwitchFile {
    text: String,
    /// Device, inode and modification time (ns) of the file read.
    id: (u64, u64, i128),
    /// `None`: untimed (no `until:`, or one that cannot be read, or a file
    /// touched since it was engaged).
    until: Option<jiff::Timestamp>,
}

/// A file touched this long after its `engaged_at` was engaged again by
/// hand (`touch ENGAGED`): it no longer releases itself.
const TOUCHED: jiff::SignedDuration = jiff::SignedDuration::from_secs(2);

impl SwitchFile {
    fn expired(&self, now: jiff::Timestamp) -> bool {
        self.until.is_some_and(|t| t <= now)
    }

    fn summary(&self) -> String {
        let by = field(&self.text, "engaged_by").unwrap_or("?");
        let at = field(&self.text, "engaged_at").unwrap_or("?");
        let reason = field(&self.text, "reason").unwrap_or("(no reason given)");
        let until = self
            .until
            .map_or("untimed".to_string(), |t| format!("until {t}"));
        format!("{by} at {at}, {until}: {reason}")
    }
}

/// The switch file at `file`, if there is one (a FIFO, a link or a file
/// that cannot be read is there, untimed, with no text).
fn read_file(file: &Path) -> Option<SwitchFile> {
    let meta = std::fs::symlink_metadata(file).ok()?;
    let mut text = String::new();
    let mut id = file_id(&meta);
    // Never blocks: a FIFO named ENGAGED still engages, it is just not read.
    if let Ok(f) = crate::files::open_regular(file, false) {
        if let Ok(m) = f.metadata() {
            id = file_id(&m);
        }
        let _ = f.take(2048).read_to_string(&mut text);
    }
    let engaged_at = field(&text, "engaged_at").and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let modified = jiff::Timestamp::from_nanosecond(id.2).ok();
    let until = field(&text, "until")
        .and_then(|u| u.parse::<jiff::Timestamp>().ok())
        // Touched since: engaged again by hand, untimed.
        .filter(|_| match (engaged_at, modified) {
            (Some(at), Some(m)) => at.checked_add(TOUCHED).is_ok_and(|end| m <= end),
            _ => true,
        });
    Some(SwitchFile { text, id, until })
}

/// The `until:` of a switch file in force as it stands (see [`SwitchFile::until`]).
fn until_of(file: &Path) -> Option<jiff::Timestamp> {
    read_file(file)?.until
}

/// One `key: value` line of a switch file.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// How long until `t`, as a person reads it (`1h 59m left`).
pub(crate) fn time_left(t: jiff::Timestamp) -> String {
    let secs = t.as_second() - jiff::Timestamp::now().as_second();
    if secs <= 0 {
        return "expired".into();
    }
    let left =
        std::time::Duration::from_secs(if secs >= 120 { secs / 60 * 60 } else { secs } as u64);
    format!("{} left", humantime::format_duration(left))
}

/// The switch file's content (who, when, why, until when and how long is
/// left), cut short; a bare `touch` says so.
fn describe(file: &Path) -> String {
    let Some(read) = read_file(file) else {
        return format!("{} exists (no reason given)", file.display());
    };
    let mut lines: Vec<String> = read
        .text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(crate::text::one_line)
        .collect();
    match read.until {
        Some(t) => lines.push(time_left(t)),
        None if field(&read.text, "until").is_some() => {
            lines.push("untimed: touched after it was engaged".into())
        }
        None => {}
    }
    if lines.is_empty() {
        format!("{} exists (no reason given)", file.display())
    } else {
        format!("{} ({})", file.display(), lines.join("; "))
    }
}

/// Which file a switch file is: device, inode and modification time (ns).
fn file_id(m: &std::fs::Metadata) -> (u64, u64, i128) {
    use std::os::unix::fs::MetadataExt;
    let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
    (m.dev(), m.ino(), mtime)
}

/// Remove `file` if it is still the file `id` names: renamed aside first,
/// then compared; another file is put back (unless yet another took its
/// name meanwhile, which then stays). True when it was removed.
fn remove_if_same(file: &Path, id: (u64, u64, i128)) -> bool {
    let Some(name) = file.file_name() else {
        return false;
    };
    let mut aside_name = std::ffi::OsString::from(".");
    aside_name.push(name);
    aside_name.push(format!(".expired-{}", std::process::id()));
    let aside = file.with_file_name(aside_name);
    if std::fs::rename(file, &aside).is_err() {
        return false;
    }
    let same = std::fs::symlink_metadata(&aside).is_ok_and(|m| file_id(&m) == id);
    if same {
        return std::fs::remove_file(&aside).is_ok();
    }
    let back = nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        &aside,
        nix::fcntl::AT_FDCWD,
        file,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    );
    if back.is_err() {
        let _ = std::fs::remove_file(&aside);
    }
    false
}

/// A timed switch whose time has come, as the daemon removes it.
#[derive(Debug, Clone)]
pub(crate) struct Expired {
    /// `global`, or the runbook.
    pub(crate) scope: String,
    /// Who engaged it.
    pub(crate) engaged_by: String,
    /// Why.
    pub(crate) reason: String,
    /// Until when it held.
    pub(crate) until: jiff::Timestamp,
}

impl KillSwitch {
    /// Remove every timed switch file whose time has come, and say which.
    /// Only the file that was read goes: under the directory's lock (an
    /// engage waits), it is renamed aside and removed only if it is still
    /// the file read; one engaged or touched by hand in between is put back.
    pub(crate) fn sweep_expired(&self) -> Vec<Expired> {
        let now = jiff::Timestamp::now();
        let mut out = Vec::new();
        let Ok(_lock) = self.lock() else {
            return out;
        };
        for (scope, file) in self.switch_files() {
            let Some(read) = read_file(&file).filter(|r| r.expired(now)) else {
                continue;
            };
            #[cfg(test)]
            tests::before_removal(&file);
            if !remove_if_same(&file, read.id) {
                continue;
            }
            out.push(Expired {
                scope,
                engaged_by: field(&read.text, "engaged_by").unwrap_or("?").to_string(),
                reason: field(&read.text, "reason").unwrap_or("").to_string(),
                until: read.until.unwrap_or(now),
            });
        }
        out
    }

    /// When the switch of `runbook` (`None`: the global one) ends, if it is
    /// engaged and timed.
    pub(crate) fn until(&self, runbook: Option<&str>) -> Option<jiff::Timestamp> {
        until_of(&self.file(runbook))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engage_release_and_fail_closed() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path().join("ks"));
        let missing = ks.check("disk").unwrap_err();
        assert!(missing.detail.contains("fail closed"), "{missing}");
        std::fs::create_dir(ks.dir()).unwrap();
        assert!(ks.check("disk").is_ok());
        ks.engage(Some("disk"), "investigating", None).unwrap();
        let e = ks.check("disk").unwrap_err();
        assert_eq!(e.scope, "disk");
        assert!(e.detail.contains("investigating"));
        assert!(
            ks.check("other").is_ok(),
            "a runbook switch stops only that runbook"
        );
        std::fs::write(ks.dir().join(GLOBAL), "").unwrap();
        assert_eq!(ks.check("other").unwrap_err().scope, "global");
        assert!(ks.release(None).unwrap());
        assert!(ks.release(Some("disk")).unwrap());
        assert!(ks.check("disk").is_ok());
        std::fs::remove_dir(ks.dir()).unwrap();
        std::fs::write(ks.dir(), "not a dir").unwrap();
        assert!(
            ks.check("disk")
                .unwrap_err()
                .detail
                .contains("not a directory")
        );
    }

    /// A timed switch stops runs until its time, then stops nothing and is
    /// swept with who engaged it and why; an untimed one stays.
    #[test]
    fn a_timed_switch_ends_at_its_time_and_an_untimed_one_stays() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600);
        ks.engage(None, "INC-123", Some(soon)).unwrap();
        let e = ks.check("disk").unwrap_err();
        assert!(
            e.detail.contains("INC-123") && e.detail.contains("left"),
            "{e}"
        );
        assert!(ks.sweep_expired().is_empty());
        // Released, then engaged again with an end already past (an
        // engage over a switch in force would keep its later end).
        ks.release(None).unwrap();
        let past = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1);
        ks.engage(None, "INC-124", Some(past)).unwrap();
        ks.engage(Some("disk"), "no end", None).unwrap();
        assert!(ks.check("other").is_ok(), "an expired switch stops nothing");
        let swept = ks.sweep_expired();
        assert_eq!(swept.len(), 1);
        assert_eq!(
            (swept[0].scope.as_str(), swept[0].reason.as_str()),
            ("global", "INC-124")
        );
        assert!(!ks.file_of(None).exists());
        assert_eq!(ks.check("disk").unwrap_err().scope, "disk");
        assert!(ks.until(Some("disk")).is_none());
    }

    type Hook = Box<dyn Fn(&Path)>;
    type Way = (&'static str, fn(&Path));

    thread_local! {
        /// What a test does between a sweep's read of an expired switch and
        /// its removal (the window an on-call's new engage may fall in).
        static BEFORE_REMOVAL: std::cell::RefCell<Option<Hook>> =
            std::cell::RefCell::new(None);
    }

    pub(super) fn before_removal(file: &Path) {
        BEFORE_REMOVAL.with(|h| {
            if let Some(hook) = h.borrow().as_ref() {
                hook(file)
            }
        });
    }

    fn expire_in_place(ks: &KillSwitch, runbook: Option<&str>) {
        // As engage writes it, with an end already past.
        let at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
        let body = format!(
            "engaged_by: alice\nengaged_at: {at}\nreason: maintenance\nuntil: {}\n",
            at + jiff::SignedDuration::from_secs(30)
        );
        let file = ks.file_of(runbook);
        std::fs::write(&file, body).unwrap();
        let mtime = std::time::SystemTime::from(at);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }

    /// A switch engaged (by engage's own rename, by a config tool's, or by
    /// `touch` over the old file) while a sweep removes the expired one it
    /// read is never removed: only the file read goes.
    #[test]
    fn the_sweep_of_an_expired_switch_never_removes_one_engaged_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        let ways: [Way; 3] = [
            ("a new file renamed into place", |file| {
                let tmp = file.with_extension("tmp");
                std::fs::write(&tmp, "engaged_by: bob\nreason: new incident\n").unwrap();
                std::fs::rename(&tmp, file).unwrap();
            }),
            ("a file written in place", |file| {
                std::fs::write(file, "engaged_by: bob\nreason: new incident\n").unwrap();
            }),
            ("touch", |file| {
                std::fs::File::options()
                    .write(true)
                    .open(file)
                    .unwrap()
                    .set_modified(std::time::SystemTime::now())
                    .unwrap();
            }),
        ];
        for (how, engage) in ways {
            expire_in_place(&ks, None);
            assert!(
                ks.check("disk").is_ok(),
                "{how}: the expired switch stops nothing"
            );
            BEFORE_REMOVAL.with(|h| *h.borrow_mut() = Some(Box::new(engage)));
            let swept = ks.sweep_expired();
            BEFORE_REMOVAL.with(|h| *h.borrow_mut() = None);
            assert!(swept.is_empty(), "{how}: {swept:?}");
            let e = ks.check("disk").expect_err(how);
            assert_eq!(e.scope, "global", "{how}");
            assert!(ks.until(None).is_none(), "{how}: the new switch is untimed");
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                1,
                "{how}: nothing left aside"
            );
            ks.release(None).unwrap();
        }
        // Without a race, the expired one goes.
        expire_in_place(&ks, Some("disk"));
        assert_eq!(ks.sweep_expired().len(), 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// An engage never weakens a switch in force: a timed one over an
    /// untimed one stays untimed, of two timed ones the later end wins,
    /// and both reasons are kept; over an expired one it starts afresh.
    #[test]
    fn an_engage_never_weakens_the_switch_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        let in_ = |s| jiff::Timestamp::now() + jiff::SignedDuration::from_secs(s);
        ks.engage(None, "INC-1 hands off", None).unwrap();
        let done = ks.engage(None, "maintenance", Some(in_(2))).unwrap();
        assert_eq!(done.until, None);
        assert!(done.kept.unwrap().contains("INC-1 hands off"));
        assert_eq!(ks.until(None), None);
        let e = ks.check("disk").unwrap_err();
        assert!(
            e.detail.contains("maintenance") && e.detail.contains("INC-1 hands off"),
            "{e}"
        );
        ks.release(None).unwrap();
        // Two timed: the later end, whichever came first.
        let (late, early) = (in_(7200), in_(60));
        ks.engage(Some("disk"), "long", Some(late)).unwrap();
        assert_eq!(
            ks.engage(Some("disk"), "short", Some(early)).unwrap().until,
            Some(late)
        );
        assert_eq!(ks.until(Some("disk")), Some(late));
        // An untimed engage over a timed one: untimed.
        assert_eq!(
            ks.engage(Some("disk"), "for good", None).unwrap().until,
            None
        );
        assert_eq!(ks.until(Some("disk")), None);
        // A `touch` of a timed switch engages it again by hand: untimed.
        ks.release(Some("disk")).unwrap();
        ks.engage(None, "timed", Some(late)).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(ks.file_of(None))
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(ks.until(None), None);
        assert!(
            ks.status().unwrap()[0]
                .1
                .contains("touched after it was engaged")
        );
        // Over an expired one: afresh, as asked.
        expire_in_place(&ks, None);
        let done = ks.engage(None, "next", Some(early)).unwrap();
        assert_eq!((done.until, done.kept), (Some(early), None));
    }

    /// `status` agrees with the gate: an expired switch is not in force.
    #[test]
    fn status_lists_no_expired_switch_as_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        expire_in_place(&ks, None);
        assert!(ks.check_global().is_ok());
        assert_eq!(ks.status().unwrap(), Vec::new());
        ks.engage(Some("disk"), "x", None).unwrap();
        assert_eq!(ks.status().unwrap().len(), 1);
    }

    /// A kill-switch directory configured as a link to a directory (made by
    /// root or by this account, as a person sets one up) still engages, in
    /// the directory it leads to, and the gate sees it.
    #[test]
    fn a_switch_directory_that_is_a_link_still_engages() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("ks");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let ks = KillSwitch::new(&link);
        ks.engage(None, "INC-9", None).unwrap();
        assert!(real.join(GLOBAL).is_file());
        assert!(ks.check("disk").unwrap_err().detail.contains("INC-9"));
        assert!(ks.release(None).unwrap());
    }
}

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

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

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
                scope: "global".into(),
                detail,
            });
        }
        let files = [
            Some(("global", self.file(None))),
            runbook.map(|r| (r, self.file(Some(r)))),
        ];
        for (scope, file) in files.into_iter().flatten() {
            match std::fs::symlink_metadata(&file) {
                Ok(_) if until_of(&file).is_some_and(|t| t <= jiff::Timestamp::now()) => {}
                Ok(_) => {
                    return Err(Engaged {
                        scope: scope.to_string(),
                        detail: describe(&file),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Engaged {
                        scope: scope.to_string(),
                        detail: format!(
                            "cannot check {}: {e}; treated as engaged (fail closed)",
                            file.display()
                        ),
                    });
                }
            }
        }
        if let Some(fleet) = &self.fleet {
            for scope in [Some("global"), runbook].into_iter().flatten() {
                if let Some(detail) = fleet.find(scope) {
                    return Err(Engaged {
                        scope: scope.to_string(),
                        detail,
                    });
                }
            }
        }
        Ok(())
    }

    /// Engage atomically (write a temporary file, then rename): who, when,
    /// why, and until when (`None`: until a person releases it).
    pub(crate) fn engage(
        &self,
        runbook: Option<&str>,
        reason: &str,
        until: Option<jiff::Timestamp>,
    ) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let target = self.file(runbook);
        let tmp = self
            .dir
            .join(format!(".{}.tmp-{}", GLOBAL, std::process::id()));
        let mut body = format!(
            "engaged_by: {}\nengaged_at: {}\nreason: {}\n",
            who(),
            jiff::Timestamp::now(),
            reason.replace('\n', " ")
        );
        if let Some(t) = until {
            body.push_str(&format!("until: {t}\n"));
        }
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)?;
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(target)
    }

    /// Remove the switch file; false when it was not engaged.
    pub(crate) fn release(&self, runbook: Option<&str>) -> std::io::Result<bool> {
        match std::fs::remove_file(self.file(runbook)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every engaged switch file and what it says.
    pub(crate) fn status(&self) -> Result<Vec<(String, String)>, Engaged> {
        if let Some(detail) = self.dir_problem() {
            return Err(Engaged {
                scope: "global".into(),
                detail,
            });
        }
        let mut out: Vec<(String, String)> = self
            .switch_files()
            .into_iter()
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

/// The switch file's text, cut short ("" when it cannot be read).
fn read_switch(file: &Path) -> String {
    let mut text = String::new();
    // Never blocks: a FIFO named ENGAGED still engages, it is just not read.
    if let Ok(f) = crate::files::open_regular(file, false) {
        let _ = f.take(2048).read_to_string(&mut text);
    }
    text
}

/// The `until:` a switch file names, if it names a readable one.
fn until_of(file: &Path) -> Option<jiff::Timestamp> {
    field(&read_switch(file), "until")?.parse().ok()
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
    let text = read_switch(file);
    let mut lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if let Some(t) = field(&text, "until").and_then(|u| u.parse().ok()) {
        lines.push(time_left(t));
    }
    if lines.is_empty() {
        format!("{} exists (no reason given)", file.display())
    } else {
        format!("{} ({})", file.display(), lines.join("; "))
    }
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
    pub(crate) fn sweep_expired(&self) -> Vec<Expired> {
        let now = jiff::Timestamp::now();
        let mut out = Vec::new();
        for (scope, file) in self.switch_files() {
            let text = read_switch(&file);
            let Some(until) = field(&text, "until").and_then(|u| u.parse::<jiff::Timestamp>().ok())
            else {
                continue;
            };
            if until > now || std::fs::remove_file(&file).is_err() {
                continue;
            }
            out.push(Expired {
                scope,
                engaged_by: field(&text, "engaged_by").unwrap_or("?").to_string(),
                reason: field(&text, "reason").unwrap_or("").to_string(),
                until,
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
}

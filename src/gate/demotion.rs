//! Demotion: a runbook whose fixes keep failing loses its standing approval
//! until a person gives it back (`demote_after:` in a runbook).
//!
//! A fix that stops working is the moment an unattended runner does the
//! most harm: it keeps applying a change whose premise no longer holds. So
//! when `failures` runs of an L3 runbook fail within `per`, runwarden itself
//! turns it into L2: every tier-2 call then waits for a person, while its
//! tier-1 calls still run and still report. Only a person lifts it
//! (`runwarden promote RUNBOOK --reason ...`), and not while the evidence
//! is fresh unless they say `--force`.
//!
//! - **What fails**: a run whose verdict is `failed`, or which made a
//!   tier-2 call that did not succeed (its own verification included)
//!   whatever the verdict. The evidence names each run, its host, and the
//!   calls that failed.
//! - **Fleet-wide, per runbook**: standing approval is granted to a
//!   runbook, not to a (runbook, host) pair. A fix that fails on one host
//!   after another, or again and again on one, says the runbook's idea of
//!   the system no longer holds, and the next host is where it would do
//!   harm next. So failures count across hosts (and replicas), and the
//!   demotion holds on every host.
//! - **On one machine**: the failures are a ledger,
//!   `STATE_DIR/demotion-failures.json`, read and replaced under an exclusive
//!   `flock` (the daemon's runs and a person's `runwarden run` count into
//!   one); a demotion is `STATE_DIR/demoted/RUNBOOK.json`. A demotion file
//!   that cannot be read still demotes (fail closed).
//! - **With shared state**: the same, in PostgreSQL
//!   (`runwarden_record_failure`); every replica hears of a
//!   demotion within a second and the gate reads its copy
//!   ([`FleetDemotions`]).
//!
//! The gate asks [`Demotions::check`] before each tier-2 call of an L3
//! runbook, so a demotion reached while other runs of it are under way
//! holds for their next call too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::DemoteAfter;

/// One failed run, as the evidence of a demotion shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Failure {
    /// The run.
    pub(crate) run_id: String,
    /// Its runbook.
    pub(crate) runbook: String,
    /// Its host.
    pub(crate) host: String,
    /// When it ended (RFC 3339).
    pub(crate) at: String,
    /// Its verdict, and why.
    pub(crate) verdict: String,
    /// The verdict's detail.
    pub(crate) detail: String,
    /// The calls that did not succeed.
    pub(crate) calls: Vec<FailedCall>,
}

/// A call of a failed run that did not succeed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FailedCall {
    /// Its step.
    pub(crate) step: u32,
    /// The tool.
    pub(crate) tool: String,
    /// Its tier.
    pub(crate) tier: u8,
    /// What went wrong (a failed verification says so).
    pub(crate) error: String,
}

impl Failure {
    fn at_ms(&self) -> i64 {
        self.at
            .parse::<jiff::Timestamp>()
            .map_or(0, |t| t.as_millisecond())
    }
}

/// A runbook that lost its standing approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Demotion {
    /// The runbook.
    pub(crate) runbook: String,
    /// Since when (RFC 3339).
    pub(crate) since: String,
    /// The replica (or machine) whose run reached it.
    pub(crate) by: String,
    /// `demote_after` as it was: failures ...
    pub(crate) failures: u32,
    /// ... within this window (seconds).
    pub(crate) per_secs: u64,
    /// The failed runs that reached it, oldest first.
    pub(crate) evidence: Vec<Failure>,
}

impl Demotion {
    /// When the evidence leaves its window: until then a promotion needs `--force`.
    pub(crate) fn window_ends(&self) -> jiff::Timestamp {
        let last = self.evidence.iter().map(Failure::at_ms).max().unwrap_or(0);
        jiff::Timestamp::from_millisecond(last.saturating_add(self.per_secs as i64 * 1000))
            .unwrap_or(jiff::Timestamp::MAX)
    }

    /// A demotion whose record does not read (`what`): it still demotes.
    pub(crate) fn unreadable(runbook: &str, what: String) -> Demotion {
        Demotion {
            runbook: runbook.to_string(),
            since: "?".into(),
            by: what,
            failures: 0,
            per_secs: 0,
            evidence: Vec::new(),
        }
    }

    /// One line for a person: since when, why, and how to restore it.
    pub(crate) fn summary(&self) -> String {
        let runs: Vec<String> = self
            .evidence
            .iter()
            .map(|f| format!("{} on {}", f.run_id, f.host))
            .collect();
        format!(
            "runbook \"{}\" was demoted to L2 at {} by {} after {} failed run(s) within {} ({}): every tier-2 call waits for a person until someone runs `runwarden promote {} --reason ...`",
            self.runbook,
            self.since,
            self.by,
            self.evidence.len(),
            humantime::format_duration(Duration::from_secs(self.per_secs)),
            runs.join(", "),
            self.runbook
        )
    }
}

/// The fleet's demotions as this replica last read them from the shared
/// state; kept current by the store's listener.
#[derive(Debug, Default)]
pub(crate) struct FleetDemotions {
    demoted: RwLock<BTreeMap<String, Demotion>>,
}

impl FleetDemotions {
    /// Replace the whole set with what the database holds now.
    pub(crate) fn set(&self, list: Vec<Demotion>) {
        let map = list.into_iter().map(|d| (d.runbook.clone(), d)).collect();
        *self.demoted.write().unwrap_or_else(|p| p.into_inner()) = map;
    }

    fn get(&self, runbook: &str) -> Option<Demotion> {
        let map = self.demoted.read().unwrap_or_else(|p| p.into_inner());
        map.get(runbook).cloned()
    }

    fn all(&self) -> Vec<Demotion> {
        let map = self.demoted.read().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }
}

/// Which runbooks are demoted now: this machine's files and, with shared
/// state, the fleet's record.
#[derive(Debug, Clone)]
pub(crate) struct Demotions {
    state_dir: PathBuf,
    fleet: Option<Arc<FleetDemotions>>,
}

impl Demotions {
    /// This machine's demotions, under `state_dir`.
    pub(crate) fn new(state_dir: &Path) -> Demotions {
        Demotions {
            state_dir: state_dir.to_path_buf(),
            fleet: None,
        }
    }

    /// The fleet's too.
    pub(crate) fn with_fleet(mut self, fleet: Option<Arc<FleetDemotions>>) -> Demotions {
        self.fleet = fleet;
        self
    }

    /// `Some(why)` when `runbook` is demoted: what the gate says of a
    /// tier-2 call it holds for a person instead. A demotion file that
    /// cannot be read demotes too.
    pub(crate) fn check(&self, runbook: &str) -> Option<String> {
        if let Some(d) = self.fleet.as_ref().and_then(|f| f.get(runbook)) {
            return Some(d.summary());
        }
        let file = demoted_file(&self.state_dir, runbook);
        match read_demotion(&file) {
            Ok(None) => None,
            Ok(Some(d)) => Some(d.summary()),
            Err(e) => Some(format!(
                "runbook \"{runbook}\" counts as demoted to L2: its demotion file {} cannot be read ({e}); `runwarden promote {runbook} --force --reason ...` replaces it",
                file.display()
            )),
        }
    }

    /// Every demotion in force, the fleet's first; a file that cannot be
    /// read shows as a demotion with no evidence.
    pub(crate) fn list(&self) -> Vec<Demotion> {
        let mut out: Vec<Demotion> = self.fleet.as_ref().map(|f| f.all()).unwrap_or_default();
        let Ok(dir) = std::fs::read_dir(self.state_dir.join(DIR)) else {
            return out;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            let Some(runbook) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if out.iter().any(|d| d.runbook == runbook) {
                continue;
            }
            let d = read_demotion(&path).ok().flatten().unwrap_or_else(|| {
                Demotion::unreadable(runbook, format!("an unreadable file, {}", path.display()))
            });
            out.push(d);
        }
        out.sort_by(|a, b| a.runbook.cmp(&b.runbook));
        out
    }
}

/// Where this machine keeps its demotions.
const DIR: &str = "demoted";
/// The ledger of failed runs, and its lock.
const LEDGER: &str = "demotion-failures.json";
const LOCK: &str = "demotion-failures.lock";

fn demoted_file(state_dir: &Path, runbook: &str) -> PathBuf {
    state_dir.join(DIR).join(format!("{runbook}.json"))
}

fn read_demotion(file: &Path) -> std::io::Result<Option<Demotion>> {
    match crate::files::read_state(file)? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(std::io::Error::other),
        None => Ok(None),
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    failures: Vec<Failure>,
}

fn read_ledger(state_dir: &Path) -> std::io::Result<Ledger> {
    match crate::files::read_state(&state_dir.join(LEDGER))? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
        None => Ok(Ledger::default()),
    }
}

fn write_ledger(state_dir: &Path, ledger: &Ledger) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(ledger).map_err(std::io::Error::other)?;
    crate::files::replace(&state_dir.join(LEDGER), &bytes, 0o640)
}

/// Failures are kept for the longest window a rule may have.
const KEEP: Duration = crate::config::MaxRuns::LONGEST;

/// Record a failed run of a runbook with `rule` on this machine; the
/// demotion it reached, if it was this one that reached it (`by`: this
/// machine's replica name).
pub(crate) fn record_local(
    state_dir: &Path,
    rule: DemoteAfter,
    failure: Failure,
    by: &str,
) -> std::io::Result<Option<Demotion>> {
    crate::files::make_dir(state_dir)?;
    let _lock = crate::files::locked(&state_dir.join(LOCK))?;
    let now = jiff::Timestamp::now().as_millisecond();
    // A ledger that cannot be read cannot show the rule unreached: it is set
    // aside for a person and this failure demotes (fail closed), and the
    // count starts again in a new ledger.
    let (mut ledger, unreadable) = match read_ledger(state_dir) {
        Ok(ledger) => (ledger, None),
        Err(e) => {
            let from = state_dir.join(LEDGER);
            let aside = state_dir.join(format!("{LEDGER}.unreadable-{now}"));
            std::fs::rename(&from, &aside)?;
            (
                Ledger::default(),
                Some(format!(
                    "{by}, whose failure ledger {} could not be read ({e}; set aside as {})",
                    from.display(),
                    aside.display()
                )),
            )
        }
    };
    ledger
        .failures
        .retain(|f| f.at_ms() > now - KEEP.as_millis() as i64);
    let runbook = failure.runbook.clone();
    ledger.failures.push(failure);
    write_ledger(state_dir, &ledger)?;
    let file = demoted_file(state_dir, &runbook);
    if read_demotion(&file).map_or(true, |d| d.is_some()) {
        return Ok(None);
    }
    let since = now - rule.per.as_millis() as i64;
    let evidence: Vec<Failure> = ledger
        .failures
        .into_iter()
        .filter(|f| f.runbook == runbook && f.at_ms() > since)
        .collect();
    if evidence.len() < rule.failures as usize && unreadable.is_none() {
        return Ok(None);
    }
    let demotion = Demotion {
        runbook,
        since: jiff::Timestamp::from_millisecond(now)
            .unwrap_or_else(|_| jiff::Timestamp::now())
            .to_string(),
        by: unreadable.unwrap_or_else(|| by.to_string()),
        failures: rule.failures,
        per_secs: rule.per.as_secs(),
        evidence,
    };
    crate::files::make_dir(&state_dir.join(DIR))?;
    let bytes = serde_json::to_vec_pretty(&demotion).map_err(std::io::Error::other)?;
    crate::files::replace(&file, &bytes, 0o640)?;
    Ok(Some(demotion))
}

/// Why a promotion did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PromoteRefused {
    /// The runbook is not demoted (here, or in the fleet).
    #[error("runbook \"{0}\" is not demoted: it holds its standing approval already")]
    NotDemoted(String),
    /// The failures that demoted it are still within their window.
    #[error(
        "{}; its evidence stays in its window until {} (the last failed run was less than {} ago): look at those runs first (`runwarden transcript RUN_ID`), then promote after that time, or now with --force",
        .0.summary(),
        .0.window_ends(),
        humantime::format_duration(Duration::from_secs(.0.per_secs))
    )]
    WindowHolds(Box<Demotion>),
    /// The state files could not be used.
    #[error("the demotion state under {} cannot be used: {source}", path.display())]
    State {
        /// The state directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// A person restores `runbook`'s standing approval on this machine: the
/// demotion is removed and its failures forgotten, so the count starts
/// again. Refused while the evidence is in its window, unless `force`.
pub(crate) fn promote_local(
    state_dir: &Path,
    runbook: &str,
    force: bool,
) -> Result<Demotion, PromoteRefused> {
    let state = |source| PromoteRefused::State {
        path: state_dir.to_path_buf(),
        source,
    };
    let _lock = crate::files::locked(&state_dir.join(LOCK)).map_err(state)?;
    let file = demoted_file(state_dir, runbook);
    let demotion = match read_demotion(&file) {
        Ok(Some(d)) => d,
        Ok(None) => return Err(PromoteRefused::NotDemoted(runbook.to_string())),
        // Unreadable: only a forced promotion replaces it.
        Err(source) if !force => return Err(state(source)),
        Err(_) => Demotion::unreadable(runbook, format!("an unreadable file, {}", file.display())),
    };
    if !force && demotion.window_ends() > jiff::Timestamp::now() {
        return Err(PromoteRefused::WindowHolds(Box::new(demotion)));
    }
    let mut ledger = read_ledger(state_dir).unwrap_or_default();
    ledger.failures.retain(|f| f.runbook != runbook);
    write_ledger(state_dir, &ledger).map_err(state)?;
    std::fs::remove_file(&file).map_err(state)?;
    Ok(demotion)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(run: &str, host: &str, secs_ago: i64) -> Failure {
        let at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(secs_ago);
        Failure {
            run_id: run.into(),
            runbook: "fix".into(),
            host: host.into(),
            at: at.to_string(),
            verdict: "failed".into(),
            detail: "step 1 (restart_service): not active after the restart".into(),
            calls: vec![FailedCall {
                step: 1,
                tool: "restart_service".into(),
                tier: 2,
                error: "not active after the restart".into(),
            }],
        }
    }

    const RULE: DemoteAfter = DemoteAfter {
        failures: 2,
        per: Duration::from_secs(3600),
    };

    #[test]
    fn failures_within_the_window_demote_across_hosts_and_only_a_person_restores() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let demotions = Demotions::new(state);
        // One failure long ago and one now: not two within the hour.
        assert_eq!(
            record_local(state, RULE, failure("r0", "web-1", 7200), "m").unwrap(),
            None
        );
        assert_eq!(
            record_local(state, RULE, failure("r1", "web-1", 0), "m").unwrap(),
            None
        );
        assert_eq!(demotions.check("fix"), None);
        // A second host's failure within the hour reaches it.
        let d = record_local(state, RULE, failure("r2", "web-2", 0), "m")
            .unwrap()
            .expect("demoted");
        let runs: Vec<&str> = d.evidence.iter().map(|f| f.run_id.as_str()).collect();
        assert_eq!(runs, ["r1", "r2"]);
        assert!(demotions.check("fix").unwrap().contains("r2 on web-2"));
        assert_eq!(demotions.check("other"), None);
        // Already demoted: a further failure makes no second demotion.
        assert_eq!(
            record_local(state, RULE, failure("r3", "web-1", 0), "m").unwrap(),
            None
        );
        // The evidence is fresh: refused without --force.
        let refused = promote_local(state, "fix", false).unwrap_err();
        assert!(
            matches!(refused, PromoteRefused::WindowHolds(_)),
            "{refused}"
        );
        assert!(refused.to_string().contains("--force"), "{refused}");
        assert!(demotions.check("fix").is_some());
        let lifted = promote_local(state, "fix", true).unwrap();
        assert_eq!(lifted.evidence.len(), 2);
        assert_eq!(demotions.check("fix"), None);
        assert!(matches!(
            promote_local(state, "fix", true),
            Err(PromoteRefused::NotDemoted(_))
        ));
        // The count starts again: one more failure is not two.
        assert_eq!(
            record_local(state, RULE, failure("r4", "web-1", 0), "m").unwrap(),
            None
        );
    }

    #[test]
    fn evidence_out_of_its_window_lets_a_person_promote_and_a_broken_file_demotes() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let rule = DemoteAfter {
            failures: 1,
            per: Duration::from_secs(60),
        };
        record_local(state, rule, failure("old", "web-1", 50), "m")
            .unwrap()
            .expect("one failure is enough");
        // Rewrite the evidence as if it were two minutes old.
        let file = demoted_file(state, "fix");
        let mut d = read_demotion(&file).unwrap().unwrap();
        d.evidence[0] = failure("old", "web-1", 120);
        std::fs::write(&file, serde_json::to_vec(&d).unwrap()).unwrap();
        promote_local(state, "fix", false).expect("the window has passed");
        // A demotion file nobody can read still demotes, and is listed.
        std::fs::create_dir_all(state.join(DIR)).unwrap();
        std::fs::write(demoted_file(state, "fix"), "{ not json").unwrap();
        let demotions = Demotions::new(state);
        assert!(demotions.check("fix").unwrap().contains("cannot be read"));
        assert_eq!(demotions.list()[0].runbook, "fix");
        assert!(promote_local(state, "fix", false).is_err());
        promote_local(state, "fix", true).expect("--force replaces it");
        assert!(demotions.list().is_empty());
    }

    #[test]
    fn the_fleets_record_demotes_on_every_replica() {
        let dir = tempfile::tempdir().unwrap();
        let fleet = Arc::new(FleetDemotions::default());
        let demotions = Demotions::new(dir.path()).with_fleet(Some(fleet.clone()));
        assert_eq!(demotions.check("fix"), None);
        fleet.set(vec![Demotion {
            runbook: "fix".into(),
            since: jiff::Timestamp::now().to_string(),
            by: "replica-b".into(),
            failures: 1,
            per_secs: 3600,
            evidence: vec![failure("r1", "web-1", 0)],
        }]);
        assert!(demotions.check("fix").unwrap().contains("by replica-b"));
        fleet.set(Vec::new());
        assert_eq!(demotions.check("fix"), None);
    }

    /// A demotion file that is a FIFO, a link (dangling or not) or a
    /// directory demotes at once and never blocks; a failure ledger that
    /// cannot be read demotes the runbook whose failure it could not count,
    /// and is set aside for a person.
    #[test]
    fn state_files_that_cannot_be_read_fail_closed_and_never_block() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        std::fs::create_dir_all(state.join(DIR)).unwrap();
        let demotions = Demotions::new(state);
        let file = demoted_file(state, "fix");
        let plants: [(&str, &dyn Fn()); 3] = [
            ("a FIFO", &|| {
                nix::unistd::mkfifo(&file, nix::sys::stat::Mode::S_IRWXU).unwrap()
            }),
            ("a dangling link", &|| {
                std::os::unix::fs::symlink(state.join("gone"), &file).unwrap()
            }),
            ("a directory", &|| std::fs::create_dir(&file).unwrap()),
        ];
        for (what, plant) in plants {
            plant();
            let (tx, rx) = std::sync::mpsc::channel();
            let d = Demotions::new(state);
            std::thread::spawn(move || tx.send(d.check("fix")).unwrap());
            let said = rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{what}: the check blocked"));
            assert!(said.unwrap().contains("cannot be read"), "{what}");
            assert_eq!(demotions.list()[0].runbook, "fix", "{what}");
            if file.is_dir() {
                std::fs::remove_dir(&file).unwrap();
            } else {
                std::fs::remove_file(&file).unwrap();
            }
        }
        // The ledger: a corrupt one demotes at the first failure it could not count.
        std::fs::write(state.join(LEDGER), "{ half").unwrap();
        let d = record_local(state, RULE, failure("r1", "web-1", 0), "m")
            .unwrap()
            .expect("demoted: the failures before it cannot be counted");
        assert!(d.by.contains("could not be read"), "{}", d.by);
        assert!(demotions.check("fix").is_some());
        let aside: Vec<String> = std::fs::read_dir(state)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("demotion-failures.json.unreadable-"))
            .collect();
        assert_eq!(aside.len(), 1, "set aside for a person");
        // A new ledger counts again.
        assert_eq!(read_ledger(state).unwrap().failures.len(), 1);
    }
}

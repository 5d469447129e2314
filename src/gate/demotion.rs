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
//!   (`runwarden_failed`, `runwarden_demote`); every replica hears of a
//!   demotion within a second and the gate reads its copy
//!   ([`FleetDemotions`]).
//!
//! Either way the decisions (does this failure demote, may a person
//! promote yet) are [`crate::rules::demotion`]'s.
//!
//! The gate asks [`Demotions::check`] before each tier-2 call of an L3
//! runbook, so a demotion reached while other runs of it are under way
//! holds for their next call too.
//!
//! One file: the demotion's record, its evidence and its lifting by a
//! person share one ledger; the decision itself is `rules::demotion`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::DemoteAfter;
use crate::rules::demotion as rules;

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

    /// Whether its evidence still holds a promotion back (the rule's
    /// [`rules::window_holds`]): until [`window_ends`](Self::window_ends),
    /// only `--force` promotes.
    pub(crate) fn window_holds(&self) -> bool {
        let newest = self.evidence.iter().map(Failure::at_ms).max().unwrap_or(0);
        let ago = jiff::Timestamp::now()
            .as_millisecond()
            .saturating_sub(newest)
            .max(0);
        rules::window_holds(
            Duration::from_millis(ago as u64),
            Duration::from_secs(self.per_secs),
        )
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
        if self.evidence.is_empty() && self.failures == 0 {
            // A record that holds no evidence (unreadable, or the log's alone).
            return format!(
                "runbook \"{}\" counts as demoted to L2 since {}: so says {}; every tier-2 call waits for a person until someone runs `runwarden promote {} --force --reason ...`",
                self.runbook, self.since, self.by, self.runbook
            );
        }
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
    /// On one machine, the audit log's own record of demotions, followed
    /// as it grows: a demotion file is anyone's to delete who can write the
    /// state directory, a chained line is not.
    logged: Option<Arc<dyn Record>>,
}

/// The audit log's own record of demotions (the `audit` module reads it):
/// the gate holds the files to it.
pub(crate) trait Record: Send + Sync + std::fmt::Debug {
    /// Runbook -> since when the log demotes it (a `demoted` line with no
    /// `promoted` after it); `Err`: the log cannot be read now.
    fn demoted(&self) -> std::io::Result<BTreeMap<String, String>>;
    /// The log.
    fn path(&self) -> &Path;
}

impl Demotions {
    /// Whether these are the demotions of `settings` (its state directory,
    /// held to its audit log).
    pub(crate) fn is_of(&self, settings: &crate::config::Settings) -> bool {
        self.state_dir == settings.state_dir
            && self
                .logged
                .as_ref()
                .is_some_and(|l| l.path() == settings.audit_log)
    }

    /// The files under `state_dir` alone.
    pub(crate) fn new(state_dir: &Path) -> Demotions {
        Demotions {
            state_dir: state_dir.to_path_buf(),
            fleet: None,
            logged: None,
        }
    }

    /// Held to the audit log's `record`: a runbook its last `autonomy`
    /// line demoted stays demoted when its file is gone.
    pub(crate) fn with_record(mut self, record: Arc<dyn Record>) -> Demotions {
        self.logged = Some(record);
        self
    }

    /// A demotion the audit log holds and no file shows: it demotes, and
    /// says why. Only on one machine: with shared state, the fleet's
    /// record is the one every replica and command reads.
    fn logged(&self, runbook: &str) -> Option<Demotion> {
        if self.fleet.is_some() {
            return None;
        }
        let since = match self.logged.as_ref()?.demoted() {
            Ok(mut all) => all.remove(runbook)?,
            Err(e) => {
                tracing::warn!(
                    "the audit log cannot be read for its record of demotions ({e}): the demotion files alone decide until it can"
                );
                return None;
            }
        };
        let file = demoted_file(&self.state_dir, runbook);
        let mut d = Demotion::unreadable(
            runbook,
            format!(
                "the audit log, whose `demoted` line has no `promoted` after it, while the demotion file {} is missing (removed by hand?)",
                file.display()
            ),
        );
        d.since = since;
        Some(d)
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
            Ok(None) => self.logged(runbook).map(|d| d.summary()),
            Ok(Some(d)) => Some(d.summary()),
            Err(e) => Some(format!(
                "runbook \"{runbook}\" counts as demoted to L2: its demotion file {} cannot be read ({e}); `runwarden promote {runbook} --force --reason ...` replaces it",
                file.display()
            )),
        }
    }

    /// Where this machine's demotion files and the audit log's record
    /// disagree, one sentence each (`audit verify` says them): a demotion
    /// the log holds with its file gone (it still demotes), and a file the
    /// log never recorded (it demotes too; someone wrote it by hand).
    pub(crate) fn mismatches(&self) -> Vec<String> {
        let Some(logged) = self.logged.as_ref().filter(|_| self.fleet.is_none()) else {
            return Vec::new();
        };
        let demoted = match logged.demoted() {
            Ok(d) => d,
            Err(e) => {
                return vec![format!(
                    "the audit log's record of demotions cannot be read: {e}"
                )];
            }
        };
        let mut out = Vec::new();
        for (runbook, since) in &demoted {
            let file = demoted_file(&self.state_dir, runbook);
            if matches!(read_demotion(&file), Ok(None)) {
                out.push(format!(
                    "the audit log demoted runbook \"{runbook}\" at {since} and no `promoted` line follows, but its demotion file {} is missing: it stays demoted until `runwarden promote {runbook} --force --reason ...`",
                    file.display()
                ));
            }
        }
        let files = std::fs::read_dir(self.state_dir.join(DIR))
            .into_iter()
            .flatten()
            .flatten();
        for entry in files {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(runbook) = name.strip_suffix(".json")
                && !demoted.contains_key(runbook)
            {
                out.push(format!(
                    "the demotion file {} has no `demoted` line in the audit log (written by hand, or by a log since replaced): it demotes runbook \"{runbook}\" all the same",
                    entry.path().display()
                ));
            }
        }
        out
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
        let logged: Vec<String> = match &self.logged {
            Some(l) if self.fleet.is_none() => l
                .demoted()
                .map(|d| d.into_keys().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        for runbook in logged {
            if !out.iter().any(|d| d.runbook == runbook)
                && let Some(d) = self.logged(&runbook)
            {
                out.push(d);
            }
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
    // An unreadable demotion counts as demoted already: never replaced unasked.
    if read_demotion(&file).map_or(true, |d| d.is_some()) {
        return Ok(None);
    }
    let evidence: Vec<(Duration, Failure)> = ledger
        .failures
        .into_iter()
        .filter(|f| f.runbook == runbook)
        .map(|f| {
            (
                Duration::from_millis(now.saturating_sub(f.at_ms()).max(0) as u64),
                f,
            )
        })
        .collect();
    let ago: Vec<Duration> = evidence.iter().map(|(ago, _)| *ago).collect();
    if unreadable.is_none() && !rules::demotes(false, &ago, rule) {
        return Ok(None);
    }
    let evidence: Vec<Failure> = evidence
        .into_iter()
        .filter(|(ago, _)| rules::counts(*ago, rule))
        .map(|(_, f)| f)
        .collect();
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
    /// The audit log demoted it and its demotion file is gone: without the
    /// evidence, only `--force` lifts it.
    #[error("{}: look at its recent runs (`runwarden runs --runbook {}`), then promote with --force", .0.summary(), .0.runbook)]
    Unrecorded(Box<Demotion>),
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
    demotions: &Demotions,
    runbook: &str,
    force: bool,
) -> Result<Demotion, PromoteRefused> {
    let state_dir = demotions.state_dir.as_path();
    let state = |source| PromoteRefused::State {
        path: state_dir.to_path_buf(),
        source,
    };
    let _lock = crate::files::locked(&state_dir.join(LOCK)).map_err(state)?;
    let file = demoted_file(state_dir, runbook);
    let demotion = match (read_demotion(&file), demotions.logged(runbook)) {
        (Ok(Some(d)), _) => d,
        // The log demoted it and its file is gone: no evidence to weigh,
        // so only a forced promotion lifts it.
        (Ok(None), Some(d)) if !force => return Err(PromoteRefused::Unrecorded(Box::new(d))),
        (Ok(None), Some(d)) => d,
        (Ok(None), None) => return Err(PromoteRefused::NotDemoted(runbook.to_string())),
        // Unreadable: only a forced promotion replaces it.
        (Err(source), _) if !force => return Err(state(source)),
        (Err(_), _) => {
            Demotion::unreadable(runbook, format!("an unreadable file, {}", file.display()))
        }
    };
    if !force && demotion.window_holds() {
        return Err(PromoteRefused::WindowHolds(Box::new(demotion)));
    }
    let mut ledger = read_ledger(state_dir).unwrap_or_default();
    ledger.failures.retain(|f| f.runbook != runbook);
    write_ledger(state_dir, &ledger).map_err(state)?;
    match std::fs::remove_file(&file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(state(e)),
        _ => Ok(demotion),
    }
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
        let refused = promote_local(&Demotions::new(state), "fix", false).unwrap_err();
        assert!(
            matches!(refused, PromoteRefused::WindowHolds(_)),
            "{refused}"
        );
        assert!(refused.to_string().contains("--force"), "{refused}");
        assert!(demotions.check("fix").is_some());
        let lifted = promote_local(&Demotions::new(state), "fix", true).unwrap();
        assert_eq!(lifted.evidence.len(), 2);
        assert_eq!(demotions.check("fix"), None);
        assert!(matches!(
            promote_local(&Demotions::new(state), "fix", true),
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
        promote_local(&Demotions::new(state), "fix", false).expect("the window has passed");
        // A demotion file nobody can read still demotes, and is listed.
        std::fs::create_dir_all(state.join(DIR)).unwrap();
        std::fs::write(demoted_file(state, "fix"), "{ not json").unwrap();
        let demotions = Demotions::new(state);
        assert!(demotions.check("fix").unwrap().contains("cannot be read"));
        assert_eq!(demotions.list()[0].runbook, "fix");
        assert!(promote_local(&Demotions::new(state), "fix", false).is_err());
        promote_local(&Demotions::new(state), "fix", true).expect("--force replaces it");
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

    /// The log's record and the files are held to each other: a file the
    /// log never recorded, and a demotion whose file is gone, are each said
    /// (and both still demote); one the log promoted afterwards is not.
    #[test]
    fn the_log_and_the_files_are_held_to_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let log = dir.path().join("audit.jsonl");
        let audit = crate::audit::AuditLog::open(&log).unwrap();
        let d = record_local(&state, RULE, failure("r1", "web-1", 0), "m").unwrap();
        assert_eq!(d, None);
        let d = record_local(&state, RULE, failure("r2", "web-1", 0), "m")
            .unwrap()
            .unwrap();
        let demotions = crate::audit::follow::demotions_held_to(&state, &log);
        let said = demotions.mismatches();
        assert!(said[0].contains("has no `demoted` line"), "{said:?}");
        audit.demoted(&d).unwrap();
        assert_eq!(demotions.mismatches(), Vec::<String>::new());
        std::fs::remove_file(demoted_file(&state, "fix")).unwrap();
        assert!(demotions.check("fix").unwrap().contains("is missing"));
        assert!(demotions.mismatches()[0].contains("is missing"));
        assert!(matches!(
            promote_local(&demotions, "fix", false),
            Err(PromoteRefused::Unrecorded(_))
        ));
        let lifted = promote_local(&demotions, "fix", true).unwrap();
        audit.promoted(&lifted, "alice", "fixed", true).unwrap();
        assert_eq!(demotions.check("fix"), None);
        assert_eq!(demotions.mismatches(), Vec::<String>::new());
    }
}

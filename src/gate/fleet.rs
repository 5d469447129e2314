//! The fleet budget: tier-2 calls across every run, within a sliding
//! window (`fleet_budget:` in runwarden.yaml for all of them, in a runbook
//! for its own). A run's own budget does not stop 500 runs making one
//! restart each; this does.
//!
//! The count is kept on this machine in `STATE_DIR/fleet-budget.json`: the
//! time and runbook of each tier-2 call permitted, kept for as long as a
//! budget it counts against can still see it. The gate counts a call when it permits it, before its intent
//! line, so a permit whose call never ran still counts (fail closed). The
//! ledger is read, pruned and replaced (written, synced, renamed) under an
//! exclusive `flock` of `fleet-budget.lock`: the daemon's runs and a
//! person's `runwarden run` count into the same one, and two of them can
//! never both take the last call. A ledger that cannot be read or written
//! refuses every tier-2 call until it is fixed or removed. Whether a call
//! fits is the rule's ([`crate::rules::budget`]), as in a fleet.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::runbook::FleetBudget;
use crate::rules::budget::{self, Spent, Window};

/// The fleet budgets one runbook's calls count against.
#[derive(Debug, Clone)]
pub(crate) struct BudgetLedger {
    state_dir: PathBuf,
    runbook: String,
    /// `fleet_budget` of runwarden.yaml: every runbook's calls.
    all: Option<FleetBudget>,
    /// The runbook's own `fleet_budget`: its calls only.
    own: Option<FleetBudget>,
}

/// One counted call.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Counted {
    /// Unix milliseconds.
    at: i64,
    runbook: String,
    /// Until when some budget it counts against still sees it (Unix
    /// milliseconds): the longest of its runbook's window and the fleet's,
    /// as they were when it was counted, and a day at least.
    keep_until: i64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    calls: Vec<Counted>,
}

impl BudgetLedger {
    /// The budgets of `runbook` under `all` (runwarden.yaml's), or `None`
    /// when neither is set.
    pub(crate) fn new(
        state_dir: &Path,
        all: Option<FleetBudget>,
        runbook: &str,
        own: Option<FleetBudget>,
    ) -> Option<BudgetLedger> {
        (all.is_some() || own.is_some()).then(|| BudgetLedger {
            state_dir: state_dir.to_path_buf(),
            runbook: runbook.to_string(),
            all,
            own,
        })
    }

    /// Count one tier-2 call now, or say which budget is spent. With
    /// `count: false` (a dry run, a call put to a person) only look.
    pub(crate) fn take(&self, count: bool) -> Result<(), FleetRefused> {
        self.take_at(jiff::Timestamp::now().as_millisecond(), count)
    }

    fn take_at(&self, now: i64, count: bool) -> Result<(), FleetRefused> {
        let ledger = self.state_dir.join("fleet-budget.json");
        let unusable = |source| FleetRefused::Ledger {
            path: ledger.clone(),
            source,
        };
        let (_lock, mut book) = open(&self.state_dir).map_err(unusable)?;
        // A call no budget sees any more counts for nothing. Each call says
        // how long that is: another runbook's window may be longer than
        // any this one knows of.
        book.calls.retain(|c| c.keep_until > now);
        let windows: Vec<Window<'_>> = [(self.all, None), (self.own, Some(self.runbook.as_str()))]
            .into_iter()
            .filter_map(|(budget, runbook)| {
                let budget = budget?;
                let used = used(&book, &budget, now, runbook);
                Some(Window {
                    budget,
                    runbook,
                    used,
                })
            })
            .collect();
        budget::spend(&windows)?;
        if count {
            let kept = budget::kept(&windows.iter().map(|w| w.budget).collect::<Vec<_>>());
            book.calls.push(Counted {
                at: now,
                runbook: self.runbook.clone(),
                keep_until: now.saturating_add(millis(kept)),
            });
            replace(&ledger, &book).map_err(unusable)?;
        }
        Ok(())
    }
}

/// How much of each fleet budget is used now, as `(scope, used, limit)`:
/// scope `all` for runwarden.yaml's, else the runbook's name. A ledger
/// that cannot be read counts as full, as the gate treats it.
pub(crate) fn usage(
    state_dir: &Path,
    all: Option<FleetBudget>,
    runbooks: &[(&str, FleetBudget)],
) -> Vec<(String, u64, u64)> {
    let now = jiff::Timestamp::now().as_millisecond();
    // Only looking: no lock to wait for behind a run's sync, nothing created.
    let book = read(state_dir).ok();
    let of = |b: &FleetBudget, runbook: Option<&str>| {
        let limit = u64::from(b.max_mutations);
        let n = book
            .as_ref()
            .map_or(limit, |book| used(book, b, now, runbook) as u64);
        (n, limit)
    };
    let mut out = Vec::new();
    if let Some(b) = &all {
        let (n, limit) = of(b, None);
        out.push(("all".to_string(), n, limit));
    }
    for (name, b) in runbooks {
        let (n, limit) = of(b, Some(name));
        out.push((name.to_string(), n, limit));
    }
    out
}

/// The ledger, read under its lock (held until the returned file drops),
/// for a read that may replace it.
fn open(state_dir: &Path) -> std::io::Result<(std::fs::File, Ledger)> {
    crate::files::make_dir(state_dir)?;
    let lock = crate::files::locked(&state_dir.join("fleet-budget.lock"))?;
    Ok((lock, read(state_dir)?))
}

/// The ledger as it stands; empty when there is none yet. It is only ever
/// replaced whole (renamed into place), so a read without the lock sees
/// one ledger or the next, never half of one.
fn read(state_dir: &Path) -> std::io::Result<Ledger> {
    match crate::files::read_state(&state_dir.join("fleet-budget.json"))? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
        None => Ok(Ledger::default()),
    }
}

/// Calls in `b`'s window now (of one runbook, or of all).
fn used(book: &Ledger, b: &FleetBudget, now: i64, runbook: Option<&str>) -> usize {
    let since = now - millis(b.per);
    book.calls
        .iter()
        .filter(|c| c.at > since && runbook.is_none_or(|r| c.runbook == r))
        .count()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Why the fleet budget takes no more tier-2 calls.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FleetRefused {
    /// A window is full.
    #[error(transparent)]
    Spent(#[from] Spent),
    /// The ledger cannot be read or written: fail closed.
    #[error("the fleet budget's ledger {} cannot be used ({source}); no tier-2 call runs until it is fixed or removed", path.display())]
    Ledger {
        /// The ledger.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// The ledger, replaced whole: a crash leaves the old one or the new one.
fn replace(path: &Path, book: &Ledger) -> std::io::Result<()> {
    crate::files::replace(
        path,
        &serde_json::to_vec(book).map_err(std::io::Error::other)?,
        0o640,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max: u32, secs: u64) -> Option<FleetBudget> {
        Some(FleetBudget {
            max_mutations: max,
            per: Duration::from_secs(secs),
        })
    }

    #[test]
    fn every_runbook_counts_into_one_window_and_a_runbook_into_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let a = BudgetLedger::new(dir.path(), budget(3, 3600), "a", budget(1, 600)).unwrap();
        let b = BudgetLedger::new(dir.path(), budget(3, 3600), "b", None).unwrap();
        let t = 1_000_000_000_000;
        assert!(a.take_at(t, true).is_ok());
        let own = a.take_at(t + 1, true).unwrap_err();
        assert!(
            matches!(&own, FleetRefused::Spent(Spent { used: 1, allows: 1, runbook: Some(r), .. }) if r == "a"),
            "{own}"
        );
        // Looking does not count.
        assert!(b.take_at(t + 2, false).is_ok());
        assert!(b.take_at(t + 2, true).is_ok());
        assert!(b.take_at(t + 3, true).is_ok());
        let all = b.take_at(t + 4, true).unwrap_err();
        assert!(
            matches!(
                &all,
                FleetRefused::Spent(Spent {
                    used: 3,
                    runbook: None,
                    ..
                })
            ),
            "{all}"
        );
        // An hour on, the first calls have left the window.
        assert!(b.take_at(t + 3_600_001, true).is_ok());
        assert!(a.take_at(t + 3_600_002, true).is_ok());
        assert!(BudgetLedger::new(dir.path(), None, "c", None).is_none());
    }

    #[test]
    fn usage_says_what_each_budget_has_used() {
        let dir = tempfile::tempdir().unwrap();
        let own = budget(2, 600).unwrap();
        let a = BudgetLedger::new(dir.path(), budget(5, 3600), "a", Some(own)).unwrap();
        let b = BudgetLedger::new(dir.path(), budget(5, 3600), "b", None).unwrap();
        a.take(true).unwrap();
        b.take(true).unwrap();
        b.take(true).unwrap();
        let got = usage(dir.path(), budget(5, 3600), &[("a", own)]);
        assert_eq!(got, [("all".into(), 3, 5), ("a".into(), 1, 2)]);
        std::fs::write(dir.path().join("fleet-budget.json"), "not json").unwrap();
        assert_eq!(
            usage(dir.path(), budget(5, 3600), &[]),
            [("all".into(), 5, 5)]
        );
    }

    /// A runbook with a short window never drops the calls another
    /// runbook's longer window still counts.
    #[test]
    fn a_short_window_keeps_what_a_longer_one_still_counts() {
        let dir = tempfile::tempdir().unwrap();
        let week = BudgetLedger::new(dir.path(), None, "weekly", budget(1, 7 * 24 * 3600)).unwrap();
        let quick = BudgetLedger::new(dir.path(), None, "quick", budget(5, 600)).unwrap();
        let t = 1_000_000_000_000;
        let day = 24 * 3600 * 1000;
        assert!(week.take_at(t, true).is_ok());
        assert!(quick.take_at(t + 2 * day, true).is_ok());
        assert!(
            week.take_at(t + 3 * day, true).is_err(),
            "still one this week"
        );
        assert!(week.take_at(t + 8 * day, true).is_ok());
    }

    #[test]
    fn a_ledger_that_cannot_be_read_refuses_every_call() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fleet-budget.json"), "{ half").unwrap();
        let f = BudgetLedger::new(dir.path(), budget(10, 60), "a", None).unwrap();
        let e = f.take(true).unwrap_err();
        assert!(
            matches!(e, FleetRefused::Ledger { .. }) && e.to_string().contains("fixed or removed"),
            "{e}"
        );
    }

    /// Many threads (each its own open file, as separate processes have)
    /// take from one budget at once: exactly the budget is counted.
    #[test]
    fn racing_takers_never_pass_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let granted: usize = (0..16)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let f =
                        BudgetLedger::new(&path, budget(5, 3600), &format!("r{i}"), None).unwrap();
                    usize::from(f.take(true).is_ok())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(granted, 5);
    }
}

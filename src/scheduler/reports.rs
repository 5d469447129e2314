//! The full reports of recent runs, kept for the API.

use std::collections::VecDeque;

use std::sync::Mutex;
use tokio::sync::watch;

use crate::run::RunReport;

/// The full reports of recent runs this daemon ran, for `GET
/// /api/v1/runs/{id}`; what every run is and how it ended is read from the
/// audit log (see [`crate::audit::runs`]), so only the report lives here.
#[derive(Default)]
pub(crate) struct Reports {
    reports: Mutex<VecDeque<RunReport>>,
    /// Runs of this daemon whose report is not kept yet: their verdict line
    /// may already be in the log, but for the API they end with the report.
    finishing: Mutex<std::collections::HashSet<String>>,
    /// Runs that could not start, and why (as many as reports are kept).
    unstarted: Mutex<VecDeque<(String, String)>>,
    /// Bumped as each run ends here: what waits for one looks again.
    ended: watch::Sender<u64>,
}

const KEEP_REPORTS: usize = 500;

/// Why a run of this daemon ended without a report.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NoReport {
    /// It could not start: the run's own [`crate::run::StartError`], kept
    /// as it reads (kept for the API after the error itself is gone).
    #[error("{0}")]
    Unstarted(String),
    /// The daemon stopped before the run ended here.
    #[error("runwarden is stopping")]
    Stopping,
}

impl Reports {
    pub(super) fn starting(&self, run_id: &str) {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id.to_string());
    }

    /// The run is over here: its report, or why it could not start, is
    /// kept first.
    pub(super) fn done(&self, run_id: &str, report: Result<RunReport, crate::run::StartError>) {
        match report {
            Ok(report) => {
                let mut reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
                reports.push_back(report);
                while reports.len() > KEEP_REPORTS {
                    reports.pop_front();
                }
            }
            Err(why) => {
                let mut unstarted = self.unstarted.lock().unwrap_or_else(|p| p.into_inner());
                unstarted.push_back((run_id.to_string(), why.to_string()));
                while unstarted.len() > KEEP_REPORTS {
                    unstarted.pop_front();
                }
            }
        }
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        self.ended.send_modify(|n| *n += 1);
    }

    /// Why run `run_id` could not start, if it could not.
    fn unstarted(&self, run_id: &str) -> Option<String> {
        let unstarted = self.unstarted.lock().unwrap_or_else(|p| p.into_inner());
        unstarted
            .iter()
            .find(|(id, _)| id == run_id)
            .map(|(_, why)| why.clone())
    }

    /// Wait for run `run_id` of this daemon to end: its report, or why it
    /// could not start.
    pub(crate) async fn ended(&self, run_id: &str) -> Result<RunReport, NoReport> {
        let mut ended = self.ended.subscribe();
        loop {
            if let Some(report) = self.get(run_id) {
                return Ok(report);
            }
            if let Some(why) = self.unstarted(run_id) {
                return Err(NoReport::Unstarted(why));
            }
            if ended.changed().await.is_err() {
                return Err(NoReport::Stopping);
            }
        }
    }

    /// Whether this daemon is still finishing the run (its report is not kept yet).
    pub(crate) fn finishing(&self, run_id: &str) -> bool {
        self.finishing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(run_id)
    }

    /// A kept report of run `run_id`.
    pub(crate) fn get(&self, run_id: &str) -> Option<RunReport> {
        let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        reports.iter().find(|r| r.run_id == run_id).cloned()
    }
}

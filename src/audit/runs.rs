//! Run history, read from the audit log: every run of any process, across
//! restarts, as `GET /api/v1/runs` and `runwarden runs` list it.
//!
//! The log is the record, so the history is whatever it says: a run with a
//! verdict line has that verdict; one with a `start` line and no verdict is
//! `running` while the process that wrote it lives (else `interrupted`,
//! until a daemon start-up closes it); one with only its `queued` line is
//! `queued` (or `interrupted`), or `handed` when its line handed it to the
//! fleet's queue (the log of the replica that took it has the rest).
//!
//! One file: listing runs, recovery at start and the history's time bounds
//! are one reading of the log, and they must agree on what a run's lines
//! mean.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize as _, Serialize};

use super::{Entry, Phase, process_alive};
use crate::text::NotOfForm;

/// One run as the history shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct RunSummary {
    /// The run's id.
    pub(crate) run_id: String,
    /// The runbook.
    pub(crate) runbook: String,
    /// The host.
    pub(crate) host: String,
    /// `schedule`, `alert`, `cli`, or `unknown`.
    pub(crate) trigger: String,
    /// When it started (or was queued).
    pub(crate) started_at: String,
    /// `queued`, `handed`, `running`, `interrupted`, or the verdict.
    pub(crate) status: String,
    /// When its verdict was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ended_at: Option<String>,
    /// Why that verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
    /// A dry run: tier-2 calls were shown, not made.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) dry_run: bool,
    /// The alert that started it (labels, summary, description).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) alert: Option<serde_json::Value>,
    /// Who started it by hand (`runwarden run`), and who asked through sudo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<String>,
    /// A model-planned run: the claims of its final answer as its verdict
    /// line marked them (`[{text, supported, why}]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) claims: Vec<serde_json::Value>,
}

/// Which runs to list.
#[derive(Debug, Default, Clone)]
pub(crate) struct Filter {
    /// Only this runbook's runs.
    pub(crate) runbook: Option<String>,
    /// Only runs on this host.
    pub(crate) host: Option<String>,
    /// A status: a verdict, `running`, `queued` or `interrupted`.
    pub(crate) status: Option<String>,
    /// Only runs started since then.
    pub(crate) since: Option<jiff::Timestamp>,
    /// The newest this many.
    pub(crate) limit: Option<usize>,
}

impl Filter {
    fn keeps(&self, r: &RunSummary) -> bool {
        self.runbook.as_ref().is_none_or(|x| *x == r.runbook)
            && self.host.as_ref().is_none_or(|x| *x == r.host)
            && self.status.as_ref().is_none_or(|x| *x == r.status)
            && self.since.is_none_or(|t| {
                r.started_at
                    .parse::<jiff::Timestamp>()
                    .is_ok_and(|s| s >= t)
            })
    }
}

/// Every run in the log that `filter` keeps, oldest first.
///
/// What is read follows what is asked: from `since` on (a bisection finds
/// it); for the newest `limit` runs, the newest segments until they hold
/// that many; all of history only when nothing bounds it.
pub(crate) fn list(path: &Path, filter: &Filter) -> std::io::Result<Vec<RunSummary>> {
    let segments = super::segments::list(path)?;
    let mut out = match (filter.since, filter.limit) {
        (Some(since), _) => read(super::segments::since(segments, since), Some(since), filter)?,
        (None, Some(limit)) => {
            let mut newest = 1;
            loop {
                let from = segments.len().saturating_sub(newest);
                let runs = read(segments[from..].to_vec(), None, filter)?;
                if runs.len() >= limit || from == 0 {
                    break runs;
                }
                newest *= 2;
            }
        }
        (None, None) => read(segments, None, filter)?,
    };
    if let Some(n) = filter.limit
        && out.len() > n
    {
        out.drain(..out.len() - n);
    }
    Ok(out)
}

/// The runs of `segments` (from `since`) that `filter` keeps. A run whose
/// first line read is not its `queued` or `start` line began before what
/// was read: it is left out (it is older than asked, or in a segment not read).
fn read(
    segments: Vec<super::segments::Segment>,
    since: Option<jiff::Timestamp>,
    filter: &Filter,
) -> std::io::Result<Vec<RunSummary>> {
    let whole = since.is_none() && segments.first().is_some_and(|s| s.first.unwrap_or(1) <= 1);
    // Streamed: a long log is never held whole in memory.
    let mut failed = None;
    let entries = super::segments::lines(segments, since)
        .map_while(|l| l.map_err(|e| failed = Some(e)).ok())
        .filter_map(|l| serde_json::from_str::<Entry>(&l).ok());
    let runs = summarize(entries);
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(runs
        .into_iter()
        .filter(|(_, began)| whole || *began)
        .map(|(r, _)| r)
        .filter(|r| filter.keeps(r))
        .collect())
}

/// One run, read from its own lines only (what `GET /api/v1/runs/{id}` and
/// a waiting `run --via-daemon` ask for, often).
pub(crate) fn one(path: &Path, run_id: &str) -> std::io::Result<Option<RunSummary>> {
    match super::run_lines(path, run_id) {
        Ok(lines) => Ok(summarize(lines).pop().map(|(r, _)| r)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The runs that audit lines describe, in the order they first appear, each
/// with whether its `queued` or `start` line was among them.
fn summarize(entries: impl IntoIterator<Item = Entry>) -> Vec<(RunSummary, bool)> {
    let mut order: Vec<String> = Vec::new();
    let mut began: std::collections::HashSet<String> = Default::default();
    let mut runs: HashMap<String, (RunSummary, Option<Entry>)> = HashMap::new();
    for e in entries {
        if e.run_id == "-" || e.run_id.is_empty() {
            continue;
        }
        let (run, open) = runs.entry(e.run_id.clone()).or_insert_with(|| {
            order.push(e.run_id.clone());
            if matches!(e.phase, Some(Phase::Queued | Phase::Start)) {
                began.insert(e.run_id.clone());
            }
            (
                RunSummary {
                    run_id: e.run_id.clone(),
                    runbook: e.runbook.clone(),
                    host: e.host.clone(),
                    trigger: "unknown".into(),
                    started_at: e.ts.clone(),
                    status: "queued".into(),
                    ended_at: None,
                    detail: None,
                    dry_run: false,
                    alert: None,
                    user: None,
                    claims: Vec::new(),
                },
                None,
            )
        });
        match e.phase {
            Some(Phase::Queued | Phase::Start) => {
                if let Some(t) = e.detail.as_ref().and_then(|d| d["trigger"].as_str()) {
                    run.trigger = t.to_string();
                }
                if let Some(d) = e.detail.as_ref() {
                    run.dry_run |= d["dry_run"].as_bool().unwrap_or(false);
                    if !d["alert"].is_null() {
                        run.alert = Some(d["alert"].clone());
                    }
                    if let Some(u) = d["user"].as_str() {
                        run.user = Some(match d["sudo_user"].as_str() {
                            Some(by) => format!("{u} (sudo by {by})"),
                            None => u.to_string(),
                        });
                    }
                }
                if e.phase == Some(Phase::Start) {
                    run.status = "running".into();
                }
                if super::handed(&e) {
                    // Its run is the log of whichever replica took it.
                    run.status = "handed".into();
                    *open = None;
                    continue;
                }
                *open = Some(e);
            }
            Some(Phase::Verdict) => {
                run.status = e.outcome.clone().unwrap_or_default();
                run.ended_at = Some(e.ts.clone());
                run.detail = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["detail"].as_str())
                    .map(String::from);
                run.claims = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["claims"].as_array())
                    .cloned()
                    .unwrap_or_default();
                *open = None;
            }
            _ => {}
        }
    }
    order
        .into_iter()
        .filter_map(|id| runs.remove(&id))
        .map(|(mut run, open)| {
            if let Some(last) = open
                && !process_alive(&last)
            {
                run.status = "interrupted".into();
            }
            let began = began.contains(&run.run_id);
            (run, began)
        })
        .collect()
}

/// `since` as a person writes it: a duration back from now (`90m`, `7d`) or an RFC 3339 time.
pub(crate) fn parse_since(s: &str) -> Result<jiff::Timestamp, NotOfForm> {
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Ok(t);
    }
    let d = humantime::parse_duration(s).map_err(|e| {
        NotOfForm::new(
            s,
            format!("not a duration (1h, 7d) nor an RFC 3339 time: {e}"),
        )
    })?;
    let too_far = |e: jiff::Error| NotOfForm::new(s, e.to_string());
    let d = jiff::SignedDuration::try_from(d).map_err(too_far)?;
    jiff::Timestamp::now().checked_sub(d).map_err(too_far)
}

/// Why a run id given by its first characters names no single run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunIdError {
    /// The log could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The log.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// No run id starts so.
    #[error("no run id in {} starts with {prefix:?}", path.display())]
    NotFound {
        /// The log.
        path: std::path::PathBuf,
        /// What was given.
        prefix: String,
    },
    /// Several do.
    #[error("{} runs start with {prefix:?} ({}…): give more of the id", ids.len(), ids.iter().take(3).cloned().collect::<Vec<_>>().join(", "))]
    Ambiguous {
        /// What was given.
        prefix: String,
        /// The run ids that start so.
        ids: Vec<String>,
    },
}

/// The one run id in the log that starts with `prefix`. Run ids say when
/// they were made (UUIDv7), so the read starts at the earliest time the
/// prefix allows.
pub fn resolve(path: &Path, prefix: &str) -> Result<String, RunIdError> {
    let filter = Filter {
        since: super::segments::id_time(prefix).map(|(earliest, _)| earliest),
        ..Filter::default()
    };
    let all = list(path, &filter).map_err(|source| RunIdError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let hits: Vec<&RunSummary> = all
        .iter()
        .filter(|r| r.run_id.starts_with(prefix))
        .collect();
    match hits.as_slice() {
        [one] => Ok(one.run_id.clone()),
        [] => Err(RunIdError::NotFound {
            path: path.to_path_buf(),
            prefix: prefix.to_string(),
        }),
        many => Err(RunIdError::Ambiguous {
            prefix: prefix.to_string(),
            ids: many.iter().map(|r| r.run_id.clone()).collect(),
        }),
    }
}

/// (runbook, host) -> when its last run ended, and the trigger keys that started it.
pub(crate) type LastEnds = HashMap<(String, String), (jiff::Timestamp, Vec<String>)>;

/// What a daemon reads back from the log when it starts, in one pass.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// Runs with a `queued` or `start` line and no verdict, oldest first: the
    /// last of those lines of each (a `queued` line means it was accepted and
    /// never started), with the trigger keys that started it.
    pub(crate) unfinished: Vec<(Entry, Vec<String>)>,
    /// For each (runbook, host): when its last run ended and the trigger
    /// keys (alert fingerprints, group keys) that started it, for cooldown
    /// and deduplication.
    pub(crate) ends: LastEnds,
    /// For each (runbook, host): when its runs started within the last
    /// week (the longest `max_runs` window), oldest first.
    pub(crate) starts: Starts,
    /// Runs a daemon's shutdown stopped before they proposed anything, and
    /// that no later run took over (`resumes:RUN` among its keys): the
    /// line that started each, its keys, and when it was stopped. Read from
    /// the current file (a rotation in between forgets them).
    pub(crate) handed_back: Vec<(Entry, Vec<String>, jiff::Timestamp)>,
    /// Where the read stopped: the file and the end of its last whole
    /// line, from where a daemon follows the runs other processes record
    /// (see [`follow`](super::follow)).
    pub(crate) through: Option<super::follow::Through>,
    /// Runbooks whose last `autonomy` line demoted them (no `promoted`
    /// after it), and since when: the record a demotion file must agree with.
    pub(crate) demoted: Demoted,
}

/// Runbook -> when the log demoted it (see [`Recovery::demoted`]).
pub(crate) type Demoted = std::collections::BTreeMap<String, String>;

/// What `e` says of demotions: a `segment` line carries them all as they
/// were, an `autonomy` line demotes or promotes one runbook.
pub(crate) fn fold_demoted(demoted: &mut Demoted, e: &Entry) {
    match e.phase {
        Some(Phase::Segment) => {
            let carried = e.detail.as_ref().map(|d| &d["carried"]["demoted"]);
            if let Some(d) = carried.and_then(|c| Demoted::deserialize(c).ok()) {
                *demoted = d;
            }
        }
        Some(Phase::Autonomy) => match e.outcome.as_deref() {
            Some("demoted") => {
                demoted.insert(e.runbook.clone(), e.ts.clone());
            }
            Some("promoted") => {
                demoted.remove(&e.runbook);
            }
            _ => {}
        },
        _ => {}
    }
}

/// Whether a line's text is one [`fold_demoted`] reads.
pub(crate) fn says_demoted(line: &str) -> bool {
    line.split_once("\"phase\":\"")
        .is_some_and(|(_, rest)| rest.starts_with("segment\"") || rest.starts_with("autonomy\""))
}

/// The key a run that takes over a handed-back one carries.
pub(crate) fn resumes_key(run_id: &str) -> String {
    format!("resumes:{run_id}")
}

/// (runbook, host) -> when its recent runs started.
pub(crate) type Starts = HashMap<(String, String), Vec<jiff::Timestamp>>;

/// What a restarted daemon needs, read from the current file alone: its
/// first line carries the state of every closed segment (see
/// [`segments`](super::segments)), and the lines after it update that.
pub(crate) fn recovery(path: &Path) -> std::io::Result<Recovery> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Recovery::default()),
        Err(e) => return Err(e),
    };
    let mut through = super::follow::Through::of(&file)?;
    let mut reader = BufReader::new(file);
    let mut fold = Fold {
        week_ago: jiff::Timestamp::now()
            - jiff::SignedDuration::try_from(crate::config::MaxRuns::LONGEST).unwrap_or_default(),
        ..Fold::default()
    };
    let mut buf = Vec::new();
    loop {
        buf.clear();
        // Whole lines only: one another process is writing now is read by
        // whoever follows from `through`.
        match reader.read_until(b'\n', &mut buf)? {
            0 => break,
            _ if buf.last() != Some(&b'\n') => break,
            n => through.offset += n as u64,
        }
        let line = String::from_utf8_lossy(&buf);
        // Most lines are calls: skip them unparsed (a line's own `phase`
        // comes before any value a tool or an alert wrote into it).
        if line
            .split_once("\"phase\":\"")
            .is_some_and(|(_, rest)| !RECOVERY_PHASES.iter().any(|p| rest.starts_with(p)))
        {
            continue;
        }
        if let Ok(e) = serde_json::from_str::<Entry>(&line) {
            fold.line(e);
        }
    }
    Ok(fold.recovery(through))
}

/// What [`recovery`] has read so far, line by line.
#[derive(Default)]
struct Fold {
    /// Starts before it no longer count against `max_runs`.
    week_ago: jiff::Timestamp,
    keys: HashMap<String, Vec<String>>,
    open: HashMap<String, Entry>,
    ends: HashMap<(String, String), (jiff::Timestamp, Vec<String>)>,
    starts: Starts,
    /// Runs whose start is in `starts` already.
    counted: std::collections::HashSet<String>,
    handed_back: Vec<(Entry, Vec<String>, jiff::Timestamp)>,
    demoted: Demoted,
    /// Runs a later run took over (`resumes:RUN`).
    resumed: std::collections::HashSet<String>,
    /// Dry runs: they change nothing, so their end starts no cooldown.
    dry: std::collections::HashSet<String>,
}

impl Fold {
    fn line(&mut self, e: Entry) {
        fold_demoted(&mut self.demoted, &e);
        if e.phase == Some(Phase::Queued)
            && let Some(ks) = e.detail.as_ref().and_then(|d| d["keys"].as_array())
        {
            self.resumed.extend(
                ks.iter()
                    .filter_map(|k| k.as_str()?.strip_prefix("resumes:").map(String::from)),
            );
        }
        if super::handed(&e) {
            // Handed to the fleet's queue: the replica that took it keeps
            // its run, its end and its count.
            return;
        }
        if matches!(e.phase, Some(Phase::Queued | Phase::Start))
            && e.detail.as_ref().is_some_and(|d| d["dry_run"] == true)
        {
            self.dry.insert(e.run_id.clone());
        }
        match e.phase {
            Some(Phase::Segment) => self.segment(&e),
            Some(Phase::Queued | Phase::Start)
                if self.counted.insert(e.run_id.clone())
                    && let Ok(at) = e.ts.parse::<jiff::Timestamp>()
                    && at > self.week_ago =>
            {
                self.starts
                    .entry((e.runbook.clone(), e.host.clone()))
                    .or_default()
                    .push(at);
                recover_open(e, &mut self.keys, &mut self.open);
            }
            Some(Phase::Queued | Phase::Start) => recover_open(e, &mut self.keys, &mut self.open),
            Some(Phase::Verdict) => self.verdict(&e),
            _ => {}
        }
    }

    /// A `segment` line: what the closed segments carried.
    fn segment(&mut self, e: &Entry) {
        let carried = e.detail.as_ref().map(|d| &d["carried"]);
        let Some(c) = carried.and_then(|c| Carried::deserialize(c).ok()) else {
            return;
        };
        for run in c.unfinished {
            // Counted in `starts` where it began.
            self.counted.insert(run.entry.run_id.clone());
            self.keys.insert(run.entry.run_id.clone(), run.keys);
            self.open.insert(run.entry.run_id.clone(), run.entry);
        }
        for end in c.ends {
            if let Ok(ended) = end.ended.parse() {
                self.ends.insert((end.runbook, end.host), (ended, end.keys));
            }
        }
        for start in c.starts {
            let times: Vec<jiff::Timestamp> =
                start.at.iter().filter_map(|t| t.parse().ok()).collect();
            self.starts
                .entry((start.runbook, start.host))
                .or_default()
                .extend(times);
        }
    }

    /// A verdict ends its run: its end counts for cooldown and dedupe,
    /// unless it was handed back having done nothing.
    fn verdict(&mut self, e: &Entry) {
        let began = self.open.remove(&e.run_id);
        let k = super::lines::keys_after(e, self.keys.remove(&e.run_id).unwrap_or_default());
        let handed = e.detail.as_ref().is_some_and(|d| d["handed_back"] == true);
        let Ok(ts) = e.ts.parse::<jiff::Timestamp>() else {
            return;
        };
        if self.dry.remove(&e.run_id) {
            // A dry run changed nothing: no cooldown from it.
            return;
        }
        match (handed, began) {
            // It did nothing: no cooldown or deduplication from it.
            // Handed to the fleet's queue: another replica ran it.
            (true, Some(_))
                if e.detail
                    .as_ref()
                    .is_some_and(|d| d["handed_to"].is_string()) => {}
            (true, Some(began)) => self.handed_back.push((began, k, ts)),
            (true, None) => {}
            (false, _) => {
                self.ends
                    .insert((e.runbook.clone(), e.host.clone()), (ts, k));
            }
        }
    }

    /// Everything read, as a restarted daemon needs it.
    fn recovery(mut self, through: super::follow::Through) -> Recovery {
        let mut unfinished: Vec<(Entry, Vec<String>)> = self
            .open
            .into_values()
            .map(|e| {
                let k = self.keys.remove(&e.run_id).unwrap_or_default();
                (e, k)
            })
            .collect();
        unfinished.sort_by(|a, b| a.0.ts.cmp(&b.0.ts));
        let week_ago = self.week_ago;
        for times in self.starts.values_mut() {
            times.retain(|t| *t > week_ago);
            times.sort();
        }
        self.starts.retain(|_, times| !times.is_empty());
        let resumed = self.resumed;
        self.handed_back
            .retain(|(e, _, _)| !resumed.contains(&e.run_id));
        Recovery {
            unfinished,
            ends: self.ends,
            starts: self.starts,
            handed_back: self.handed_back,
            through: Some(through),
            demoted: self.demoted,
        }
    }
}

/// A `queued` or `start` line: its run is open until its verdict.
fn recover_open(
    e: Entry,
    keys: &mut HashMap<String, Vec<String>>,
    open: &mut HashMap<String, Entry>,
) {
    // A start line after the queued one keeps the queued line's keys.
    if e.phase == Some(Phase::Queued) || !keys.contains_key(&e.run_id) {
        let k = e
            .detail
            .as_ref()
            .and_then(|d| d["keys"].as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        keys.insert(e.run_id.clone(), k);
    }
    open.insert(e.run_id.clone(), e);
}

/// The phases start-up reads, as they begin in a line's text.
const RECOVERY_PHASES: [&str; 5] = [
    "segment\"",
    "queued\"",
    "start\"",
    "verdict\"",
    "autonomy\"",
];

/// [`Recovery`] as a `segment` line carries it.
#[derive(Serialize, serde::Deserialize)]
struct Carried {
    unfinished: Vec<CarriedRun>,
    ends: Vec<CarriedEnd>,
    #[serde(default)]
    starts: Vec<CarriedStarts>,
    #[serde(default)]
    demoted: Demoted,
}

#[derive(Serialize, serde::Deserialize)]
struct CarriedStarts {
    runbook: String,
    host: String,
    at: Vec<String>,
}

#[derive(Serialize, serde::Deserialize)]
struct CarriedRun {
    entry: Entry,
    keys: Vec<String>,
}

#[derive(Serialize, serde::Deserialize)]
struct CarriedEnd {
    runbook: String,
    host: String,
    ended: String,
    keys: Vec<String>,
}

impl Recovery {
    /// The state, as the next segment's first line carries it.
    pub(super) fn to_json(&self) -> serde_json::Value {
        let carried = Carried {
            unfinished: self
                .unfinished
                .iter()
                .map(|(entry, keys)| CarriedRun {
                    entry: entry.clone(),
                    keys: keys.clone(),
                })
                .collect(),
            ends: self
                .ends
                .iter()
                .map(|((runbook, host), (ended, keys))| CarriedEnd {
                    runbook: runbook.clone(),
                    host: host.clone(),
                    ended: ended.to_string(),
                    keys: keys.clone(),
                })
                .collect(),
            starts: self
                .starts
                .iter()
                .map(|((runbook, host), times)| CarriedStarts {
                    runbook: runbook.clone(),
                    host: host.clone(),
                    at: times.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            demoted: self.demoted.clone(),
        };
        serde_json::to_value(carried).unwrap_or_default()
    }
}

//! A run started by an alert is done when that alert is gone: not when
//! its calls succeeded (a restart can verify and leave the queue as deep
//! as before), and not when Alertmanager next says `resolved` (minutes
//! later, after `for:`, `keep_firing_for:` and its own group interval).
//!
//! runwarden finds the rule that fired the alert (`/api/v1/rules`: its
//! `alertname` and the static labels the alert carries; between several,
//! the one its `generatorURL` names), evaluates that rule's own expression
//! now, and looks for the alert's own series in the result ([`series`]);
//! and asks Prometheus itself, `ALERTS{alertname=...,alertstate="firing"}`,
//! whether it still reports the alert firing (it does through
//! `keep_firing_for`). It asks again every evaluation interval until both
//! were absent in `absent_evaluations` evaluations in a row (one gap of a
//! flapping series is not a clear) or `within` ends.
//!
//! Silence is not a clear: the alert must have been *seen* firing, before
//! the run's first change or at the wait's first evaluation, by either
//! question. An alert whose series this Prometheus never shows (it does not
//! evaluate the rule, the rule was renamed, the alert's labels match no
//! series) is `inconclusive`, never `ok`.
//!
//! Three answers, and never a fourth: cleared (`ok`, with the queries and
//! the times that say so), still firing (`unresolved`), or could not tell
//! (`inconclusive`: Prometheus unreachable, no such rule, an alert never
//! seen, an expression that fails, a run no alert started). A check that
//! could not run is never an `ok`.
//!
//! One file: the wait, its outcomes and the recurrence bookkeeping share
//! the evidence they record; choosing the series, which is pure, is
//! `series`.

pub(crate) mod series;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::config::AlertClears;
use crate::prometheus::promql;
use crate::prometheus::{AlertRule, PromError, Prometheus, Sample, Server};
use crate::verdict::Verdict;
use series::Wanted;

/// Evaluations in a row that may fail before the check gives up on
/// Prometheus (inconclusive) rather than wait out `within`.
const FAILURES_IN_A_ROW: u32 = 3;

/// The shortest and longest time between two evaluations.
const FASTEST: Duration = Duration::from_secs(1);
const SLOWEST: Duration = Duration::from_secs(300);

/// Prometheus's own default `evaluation_interval`.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// Evaluations kept in the evidence line (the last ones).
const KEPT: usize = 12;

/// The shortest `within` that can see a good fix: the expression's
/// look-back, plus two evaluation intervals (one for the fixed value to
/// be scraped and evaluated, one for the second absent evaluation), plus
/// the rule's `keep_firing_for` (Prometheus reports it firing that long
/// after its expression clears, and that is not a clear).
pub(crate) fn minimum_within(
    look_back: Duration,
    interval: Duration,
    keep_firing_for: Duration,
) -> Duration {
    look_back + 2 * interval + keep_firing_for
}

/// One alert of the run, and the series that is it.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    /// `alertname`.
    pub(crate) name: String,
    /// Alertmanager's fingerprint of its labels.
    pub(crate) fingerprint: String,
    /// Per rule that could have fired it: the expression, and the series.
    pub(crate) rules: Vec<(String, Wanted)>,
    /// `ALERTS{alertname=...,alertstate="firing"}`, and its series there.
    pub(crate) alerts: (String, Wanted),
    /// The rule group's evaluation interval (the longest, of several rules).
    pub(crate) interval: Duration,
    /// How far back the expression looks.
    pub(crate) look_back: Duration,
    /// The rule's `keep_firing_for`.
    pub(crate) keep_firing_for: Duration,
    /// Where the rule came from, for the report.
    pub(crate) source: String,
}

impl Watched {
    /// The series, as a person reads it.
    pub(crate) fn display(&self) -> String {
        self.rules
            .first()
            .map(|(_, w)| w.display(&self.name))
            .unwrap_or_else(|| self.name.clone())
    }

    /// The shortest `within` that can see a good fix of it.
    pub(crate) fn minimum_within(&self) -> Duration {
        minimum_within(self.look_back, self.interval, self.keep_firing_for)
    }

    /// What the report and the evidence line say was looked for.
    fn describe(&self) -> Value {
        json!({
            "alert": self.name,
            "fingerprint": self.fingerprint,
            "rule": self.source,
            "queries": self.rules.iter().map(|(q, _)| q.clone()).chain(std::iter::once(self.alerts.0.clone())).collect::<Vec<_>>(),
            "series": self.rules.first().map(|(_, w)| w.labels.clone()),
            "not_matched_on": self.rules.first().map(|(_, w)| w.dropped.clone()),
            "evaluation_interval_s": self.interval.as_secs_f64(),
            "look_back_s": self.look_back.as_secs_f64(),
        })
    }
}

/// The alert in a run request's shape (`labels`, `fingerprint`,
/// `generator_url`), read.
fn alert_parts(alert: &Value) -> (BTreeMap<String, String>, String, Option<String>) {
    let labels = alert["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let fingerprint = alert["fingerprint"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let generator = alert["generator_url"]
        .as_str()
        .and_then(series::generator_expr);
    (labels, fingerprint, generator)
}

/// What Prometheus knows of the rules and itself, for the alerts of one run.
pub(crate) struct Known {
    rules: Vec<AlertRule>,
    server: Server,
}

impl Known {
    /// Ask `prom` for the rules of `names` and its own configuration.
    pub(crate) async fn ask(prom: &Prometheus, names: &[&str]) -> Result<Known, PromError> {
        let server = prom.server().await?;
        let mut rules = Vec::new();
        let mut asked = std::collections::BTreeSet::new();
        for name in names {
            if asked.insert(*name) {
                rules.extend(prom.rules(Some(name)).await?);
            }
        }
        Ok(Known { rules, server })
    }

    /// The series that is `alert`, or why none can be named.
    pub(crate) fn watched(
        &self,
        alert: &Value,
        clears: &AlertClears,
    ) -> Result<Watched, Unknowable> {
        let (labels, fingerprint, generator) = alert_parts(alert);
        let name = labels
            .get("alertname")
            .cloned()
            .ok_or(Unknowable::NoAlertname)?;
        let rules = series::rules_of(&self.rules, &labels, generator.as_deref());
        let global = self.server.evaluation_interval.unwrap_or(DEFAULT_INTERVAL);
        let external = &self.server.external_labels;
        let ignore = &clears.ignore_labels;
        if rules.is_empty() {
            // This Prometheus does not evaluate the alert (another server,
            // a renamed rule, static labels that changed): nothing it
            // answers can say the alert cleared.
            return Err(Unknowable::NoRule(name));
        }
        let interval = rules
            .iter()
            .map(|r| r.interval)
            .filter(|i| !i.is_zero())
            .max()
            .unwrap_or(global);
        let keep_firing_for = rules
            .iter()
            .map(|r| r.keep_firing_for)
            .max()
            .unwrap_or_default();
        let source = rules
            .iter()
            .map(|r| format!("group {:?}", r.group))
            .collect::<Vec<_>>()
            .join(", ");
        let found: Vec<(String, Wanted)> = rules
            .iter()
            .map(|r| {
                (
                    r.query.clone(),
                    Wanted::of(&labels, &r.labels, external, ignore),
                )
            })
            .collect();
        let alerts = (
            format!(
                "ALERTS{{alertname={},alertstate=\"firing\"}}",
                promql::string(&name)
            ),
            Wanted::in_alerts(&labels, external, ignore),
        );
        let look_back = found
            .iter()
            .map(|(q, _)| promql::look_back(q))
            .max()
            .unwrap_or_default();
        Ok(Watched {
            name,
            fingerprint,
            rules: found,
            alerts,
            interval,
            look_back,
            keep_firing_for,
            source,
        })
    }
}

/// A runbook's `within` that is shorter than one of its alert's rules can
/// clear in after a good fix: what `check` and `alerts test` warn of.
pub(crate) fn too_short(clears: &AlertClears, watched: &Watched) -> Option<String> {
    let minimum = watched.minimum_within();
    (clears.within < minimum).then(|| {
        format!(
            "done_when.alert_clears.within {} is shorter than {} can clear after a good fix: its rule looks back {} and is evaluated every {}; set within to at least {}",
            humantime::format_duration(clears.within),
            watched.name,
            humantime::format_duration(watched.look_back),
            humantime::format_duration(watched.interval),
            humantime::format_duration(minimum)
        )
    })
}

/// What `check` says of a runbook's `done_when` against the rules of
/// `alertname` that Prometheus serves now: a warning per rule whose window
/// is longer than `within`, or that there is no such rule.
pub(crate) async fn check_windows(
    prom: &Prometheus,
    alertname: &str,
    clears: &AlertClears,
) -> Result<Vec<String>, PromError> {
    let known = Known::ask(prom, &[alertname]).await?;
    let rules: Vec<&AlertRule> = known.rules.iter().filter(|r| r.name == alertname).collect();
    if rules.is_empty() {
        return Ok(vec![format!(
            "Prometheus at {} has no alerting rule {alertname}: it does not evaluate that alert, so a run it starts cannot be checked (inconclusive)",
            prom.url()
        )]);
    }
    let global = known.server.evaluation_interval.unwrap_or(DEFAULT_INTERVAL);
    Ok(rules
        .into_iter()
        .filter_map(|r| {
            let watched = Watched {
                name: format!("{alertname} (group {:?})", r.group),
                fingerprint: String::new(),
                rules: Vec::new(),
                alerts: (
                    String::new(),
                    Wanted::in_alerts(&BTreeMap::new(), &BTreeMap::new(), &[]),
                ),
                interval: if r.interval.is_zero() {
                    global
                } else {
                    r.interval
                },
                look_back: promql::look_back(&r.query),
                keep_firing_for: r.keep_firing_for,
                source: r.group.clone(),
            };
            too_short(clears, &watched)
        })
        .collect())
}

/// What `alerts test` shows of an alert a runbook with `done_when` would
/// start: the expression, the series it looks for, the shortest `within`.
pub(crate) async fn preview(
    prom: &Prometheus,
    alert: &Value,
    clears: &AlertClears,
) -> Result<Value, Unknowable> {
    let name = alert["labels"]["alertname"].as_str().unwrap_or_default();
    let known = Known::ask(prom, &[name]).await?;
    let watched = known.watched(alert, clears)?;
    let mut out = watched.describe();
    out["series_text"] = watched.display().into();
    out["minimum_within_s"] = watched.minimum_within().as_secs_f64().into();
    if let Some(warning) = too_short(clears, &watched) {
        out["warning"] = warning.into();
    }
    Ok(out)
}

/// Why whether an alert cleared cannot be told: the run's verdict is
/// `inconclusive` with this as its reason, never `ok`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unknowable {
    /// The alert names no rule.
    #[error("the alert has no alertname label: there is no rule to ask about")]
    NoAlertname,
    /// No rule fits the alert: this Prometheus does not evaluate it.
    #[error(
        "Prometheus has no alerting rule {0} whose static labels this alert carries: it does not evaluate this alert (another server, a renamed rule, changed labels), so nothing it answers says the alert cleared"
    )]
    NoRule(String),
    /// Prometheus could not say which rules there are.
    #[error("whether the alert cleared could not be checked: {0}")]
    Asking(#[from] PromError),
}

/// How the wait for an alert to clear ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Every alert's series was gone in enough evaluations in a row.
    Cleared {
        /// What the report says.
        evidence: String,
        /// Seconds from the last change to the first of those evaluations.
        seconds: f64,
        /// The evidence line's detail.
        detail: Value,
    },
    /// At least one alert's series was still there when `within` ended.
    Firing {
        /// What the report says, with the last value.
        why: String,
        /// The evidence line's detail.
        detail: Value,
    },
    /// Nothing could be said (`inconclusive`).
    Unknown {
        /// The reason, in words.
        why: String,
        /// The evidence line's detail.
        detail: Value,
    },
    /// The kill switch or the daemon's stop ended the wait.
    Stopped(Verdict, String),
}

impl Outcome {
    /// The verdict it makes of a run whose calls all went well.
    pub(crate) fn verdict(&self) -> Verdict {
        match self {
            Outcome::Cleared { .. } => Verdict::Ok,
            Outcome::Firing { .. } => Verdict::Unresolved,
            Outcome::Unknown { .. } => Verdict::Inconclusive,
            Outcome::Stopped(v, _) => *v,
        }
    }

    /// Its words for the report and the verdict line.
    pub(crate) fn words(&self) -> &str {
        match self {
            Outcome::Cleared { evidence, .. } => evidence,
            Outcome::Firing { why, .. } | Outcome::Unknown { why, .. } => why,
            Outcome::Stopped(_, why) => why,
        }
    }

    /// The evidence line's detail (`None`: stopped, nothing to record).
    pub(crate) fn detail(&self) -> Option<&Value> {
        match self {
            Outcome::Cleared { detail, .. }
            | Outcome::Firing { detail, .. }
            | Outcome::Unknown { detail, .. } => Some(detail),
            Outcome::Stopped(..) => None,
        }
    }

    /// Could not tell.
    pub(crate) fn unknown(why: impl Into<String>) -> Outcome {
        Outcome::Unknown {
            why: why.into(),
            detail: Value::Null,
        }
    }
}

/// One evaluation of one alert's series.
#[derive(Debug, Clone)]
struct Seen {
    at: jiff::Timestamp,
    /// The series' value, when it was there (from its rule's expression,
    /// else `firing` from ALERTS).
    value: Option<String>,
}

/// What the wait knows of one alert so far.
#[derive(Debug, Default)]
struct Track {
    seen: Vec<Seen>,
    absent_in_row: u32,
    /// It was seen firing: before the first change, or by an evaluation.
    sighted: bool,
}

impl Track {
    fn record(&mut self, seen: Seen) {
        self.absent_in_row = match seen.value {
            Some(_) => {
                self.sighted = true;
                0
            }
            None => self.absent_in_row + 1,
        };
        self.seen.push(seen);
        if self.seen.len() > 4 * KEPT {
            self.seen.drain(..self.seen.len() - KEPT);
        }
    }

    fn last_value(&self) -> Option<&Seen> {
        self.seen.iter().rev().find(|s| s.value.is_some())
    }

    fn evaluations(&self) -> Value {
        let from = self.seen.len().saturating_sub(KEPT);
        self.seen[from..]
            .iter()
            .map(|s| json!({ "at": short(s.at), "value": s.value }))
            .collect()
    }
}

/// A time as a report shows it: to the second, UTC.
fn short(t: jiff::Timestamp) -> String {
    t.round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

/// One evaluation of every query of `watched`: each result by its query.
async fn evaluate<'a>(
    prom: &Prometheus,
    watched: &'a [Watched],
) -> BTreeMap<&'a str, Result<Vec<Sample>, PromError>> {
    let mut queries: Vec<&str> = Vec::new();
    for w in watched {
        for q in w
            .rules
            .iter()
            .map(|(q, _)| q.as_str())
            .chain([w.alerts.0.as_str()])
        {
            if !queries.contains(&q) {
                queries.push(q);
            }
        }
    }
    let mut results = BTreeMap::new();
    for query in queries {
        let answer = prom.query(query).await;
        results.insert(query, answer);
    }
    results
}

/// What one evaluation says of `w`: the value of its series in its rule's
/// expression, else `firing` when ALERTS still has it, else `None`.
fn value_of(
    w: &Watched,
    results: &BTreeMap<&str, Result<Vec<Sample>, PromError>>,
) -> Option<String> {
    let in_query = |q: &str, wanted: &Wanted| {
        let samples = results.get(q)?.as_ref().ok()?;
        samples
            .iter()
            .find(|s| wanted.is(s))
            .map(|s| s.value.clone())
    };
    w.rules
        .iter()
        .find_map(|(q, wanted)| in_query(q, wanted))
        .or_else(|| in_query(&w.alerts.0, &w.alerts.1).map(|_| "firing (ALERTS)".to_string()))
}

/// Wait for every one of `watched` to clear: evaluate their rules'
/// expressions and ALERTS every evaluation interval, from the run's last
/// change (`since`) until each was seen firing (`sighted`: before the
/// first change, else by an evaluation) and then absent in
/// `clears.absent_evaluations` evaluations in a row, or `deadline`
/// passes. One absent that long and never seen is `inconclusive`. `stop` is asked before each evaluation and while waiting (the
/// kill switch, the daemon's stop).
pub(crate) async fn watch(
    prom: &Prometheus,
    watched: &[Watched],
    sighted: &[bool],
    clears: &AlertClears,
    since: Instant,
    deadline: Instant,
    stop: &(dyn Fn() -> Option<(Verdict, String)> + Send + Sync),
) -> Outcome {
    let period = watched
        .iter()
        .map(|w| w.interval)
        .max()
        .unwrap_or(DEFAULT_INTERVAL)
        .clamp(FASTEST, SLOWEST);
    let mut tracks: Vec<Track> = watched
        .iter()
        .enumerate()
        .map(|(i, _)| Track {
            sighted: sighted.get(i).copied().unwrap_or(false),
            ..Track::default()
        })
        .collect();
    let mut failures = 0u32;
    loop {
        if let Some((v, why)) = stop() {
            return Outcome::Stopped(v, why);
        }
        let at = jiff::Timestamp::now();
        let results = evaluate(prom, watched).await;
        let last_error = results.values().find_map(|r| r.as_ref().err());
        match &last_error {
            Some(_) => failures += 1,
            None => {
                failures = 0;
                for (w, track) in watched.iter().zip(&mut tracks) {
                    track.record(Seen {
                        at,
                        value: value_of(w, &results),
                    });
                }
            }
        }
        let needed = clears.absent_evaluations;
        if last_error.is_none() && tracks.iter().all(|t| t.absent_in_row >= needed) {
            // Absent long enough to be called cleared: only what was seen
            // firing first can be.
            return match tracks.iter().all(|t| t.sighted) {
                true => cleared(watched, &tracks, needed, since, at),
                false => never_seen(prom, watched, &tracks),
            };
        }
        if let Some(e) = &last_error
            && failures >= FAILURES_IN_A_ROW
        {
            return unknown(watched, &tracks, e, failures);
        }
        if Instant::now() + period > deadline {
            return match &last_error {
                Some(e) => unknown(watched, &tracks, e, failures),
                None => firing(watched, &tracks, clears, since),
            };
        }
        let next = Instant::now() + period;
        while Instant::now() < next {
            if let Some((v, why)) = stop() {
                return Outcome::Stopped(v, why);
            }
            tokio::time::sleep((next - Instant::now()).min(Duration::from_millis(200))).await;
        }
    }
}

/// An alert not seen firing, before the first change nor at the wait's
/// first evaluation: nothing says the run's changes cleared it.
fn never_seen(prom: &Prometheus, watched: &[Watched], tracks: &[Track]) -> Outcome {
    let missing: Vec<String> = watched
        .iter()
        .zip(tracks)
        .filter(|(_, t)| !t.sighted)
        .map(|(w, _)| w.display())
        .collect();
    Outcome::Unknown {
        why: format!(
            "{} was never seen firing on Prometheus at {}: neither its rule's expression nor {} had its series, before the first change nor since; it may have cleared before runwarden looked, or this Prometheus does not see it (its labels match no series); not called ok",
            missing.join(", "),
            prom.url(),
            watched
                .first()
                .map(|w| w.alerts.0.as_str())
                .unwrap_or("ALERTS")
        ),
        detail: detail_of(watched, tracks, "unknown"),
    }
}

/// Whether each of `watched` is firing now, by one evaluation of its
/// rules' expressions and ALERTS (`Err`: Prometheus could not say).
pub(crate) async fn sight(prom: &Prometheus, watched: &[Watched]) -> Result<Vec<bool>, PromError> {
    let results = evaluate(prom, watched).await;
    let firing = watched
        .iter()
        .map(|w| value_of(w, &results).is_some())
        .collect();
    match results.into_values().find_map(Result::err) {
        Some(e) => Err(e),
        None => Ok(firing),
    }
}

fn detail_of(watched: &[Watched], tracks: &[Track], outcome: &str) -> Value {
    let alerts: Vec<Value> = watched
        .iter()
        .zip(tracks)
        .map(|(w, t)| {
            let mut d = w.describe();
            d["evaluations"] = t.evaluations();
            d
        })
        .collect();
    json!({ "outcome": outcome, "alerts": alerts })
}

fn cleared(
    watched: &[Watched],
    tracks: &[Track],
    needed: u32,
    since: Instant,
    at: jiff::Timestamp,
) -> Outcome {
    let mut words = Vec::new();
    let mut seconds = 0f64;
    for (w, t) in watched.iter().zip(tracks) {
        let absent = &t.seen[t.seen.len() - needed as usize..];
        let first = absent.first().map(|s| s.at).unwrap_or(at);
        let after = (first - jiff::Timestamp::now())
            .total(jiff::Unit::Second)
            .unwrap_or_default()
            + since.elapsed().as_secs_f64();
        seconds = seconds.max(after.max(0.0));
        let times: Vec<String> = absent.iter().map(|s| short(s.at)).collect();
        let last = match t.last_value() {
            Some(s) => format!(
                "last value {} at {}",
                s.value.as_deref().unwrap_or_default(),
                short(s.at)
            ),
            None => "seen firing before the first change".into(),
        };
        let mut line = format!(
            "{} cleared {:.0} s after the last change: no series at {} ({last})",
            w.display(),
            after.max(0.0),
            times.join(" and ")
        );
        if !w.keep_firing_for.is_zero() {
            let resolves = first
                .checked_add(jiff::SignedDuration::try_from(w.keep_firing_for).unwrap_or_default())
                .unwrap_or(first);
            line.push_str(&format!(
                "; its rule keeps it firing for {} after that, so Alertmanager sees it resolved at about {}",
                humantime::format_duration(w.keep_firing_for),
                short(resolves)
            ));
        }
        words.push(line);
    }
    Outcome::Cleared {
        evidence: words.join("; "),
        seconds,
        detail: detail_of(watched, tracks, "cleared"),
    }
}

fn firing(watched: &[Watched], tracks: &[Track], clears: &AlertClears, since: Instant) -> Outcome {
    let mut words = Vec::new();
    for (w, t) in watched.iter().zip(tracks) {
        if t.absent_in_row >= clears.absent_evaluations {
            continue;
        }
        let last = match t.last_value() {
            Some(s) => format!(
                "value {} at {}",
                s.value.as_deref().unwrap_or_default(),
                short(s.at)
            ),
            None => "no value".into(),
        };
        let mut line = format!(
            "{} still firing {:.0} s after the last change ({last}; absent in {} evaluation(s) in a row of the {} needed)",
            w.display(),
            since.elapsed().as_secs_f64(),
            t.absent_in_row,
            clears.absent_evaluations,
        );
        if let Some(short) = too_short(clears, w) {
            line.push_str(&format!("; {short}"));
        }
        words.push(line);
    }
    Outcome::Firing {
        why: words.join("; "),
        detail: detail_of(watched, tracks, "firing"),
    }
}

fn unknown(watched: &[Watched], tracks: &[Track], error: &PromError, failures: u32) -> Outcome {
    let names: Vec<String> = watched.iter().map(Watched::display).collect();
    let mut detail = detail_of(watched, tracks, "unknown");
    detail["error"] = error.to_string().into();
    Outcome::Unknown {
        why: format!(
            "whether {} cleared could not be checked ({failures} evaluation(s) in a row failed; last: {error}); not called ok",
            names.join(", ")
        ),
        detail,
    }
}

/// Whether any of `watched` is firing now by its rules' expressions (an
/// L2 call approved after its alert went away is not made: ALERTS is not
/// asked, for it reports an alert firing an evaluation late and through
/// `keep_firing_for`, after the condition itself has gone).
pub(crate) async fn firing_now(prom: &Prometheus, watched: &[Watched]) -> Result<bool, PromError> {
    for w in watched {
        for (query, wanted) in &w.rules {
            if prom.query(query).await?.iter().any(|s| wanted.is(s)) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The runs whose alert cleared, by (runbook, host, fingerprint), kept
/// for their runbook's `recurrence`: the same alert back within it is a
/// fix that did not hold.
#[derive(Debug, Default)]
pub(crate) struct Clears {
    cleared: Mutex<BTreeMap<ClearedKey, ClearedBy>>,
}

/// (runbook, host, fingerprint).
type ClearedKey = (String, String, String);

/// The run that saw it clear, when, and its runbook's `recurrence`.
type ClearedBy = (String, std::time::Instant, Duration);

/// A run that cleared an alert that is back.
#[derive(Debug, Clone)]
pub(crate) struct Recurred {
    /// The earlier run.
    pub(crate) run_id: String,
    /// The alert's fingerprint.
    pub(crate) fingerprint: String,
    /// How long after it cleared.
    pub(crate) after: Duration,
}

impl Clears {
    /// `run_id` cleared `fingerprint` of `runbook` on `host`.
    pub(crate) fn cleared(
        &self,
        (runbook, host): (&str, &str),
        fingerprints: &[String],
        run_id: &str,
        recurrence: Duration,
    ) {
        let mut map = self.cleared.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (_, at, keep)| at.elapsed() < *keep);
        for fp in fingerprints.iter().filter(|f| !f.is_empty()) {
            map.insert(
                (runbook.into(), host.into(), fp.clone()),
                (run_id.into(), std::time::Instant::now(), recurrence),
            );
        }
    }

    /// The run that cleared one of `fingerprints` on (`runbook`, `host`)
    /// within its recurrence window, taken out (it recurs once).
    pub(crate) fn recurred(
        &self,
        (runbook, host): (&str, &str),
        fingerprints: &[String],
    ) -> Option<Recurred> {
        let mut map = self.cleared.lock().unwrap_or_else(|p| p.into_inner());
        for fp in fingerprints {
            let key = (runbook.to_string(), host.to_string(), fp.clone());
            if let Some((run_id, at, keep)) = map.get(&key).cloned() {
                map.remove(&key);
                if at.elapsed() < keep {
                    return Some(Recurred {
                        run_id,
                        fingerprint: fp.clone(),
                        after: at.elapsed(),
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clear_recurs_once_and_only_within_its_window() {
        let clears = Clears::default();
        let fp = vec!["abc".to_string()];
        clears.cleared(("rb", "h"), &fp, "run-1", Duration::from_secs(3600));
        assert!(clears.recurred(("rb", "other"), &fp).is_none());
        assert!(clears.recurred(("rb", "h"), &["zzz".into()]).is_none());
        let back = clears.recurred(("rb", "h"), &fp).expect("recurred");
        assert_eq!(back.run_id, "run-1");
        assert!(clears.recurred(("rb", "h"), &fp).is_none(), "once");
        clears.cleared(("rb", "h"), &fp, "run-2", Duration::ZERO);
        assert!(
            clears.recurred(("rb", "h"), &fp).is_none(),
            "past its window"
        );
    }

    #[test]
    fn the_minimum_within_is_the_look_back_and_two_evaluations() {
        assert_eq!(
            minimum_within(
                Duration::from_secs(120),
                Duration::from_secs(15),
                Duration::ZERO
            ),
            Duration::from_secs(150)
        );
        assert_eq!(
            minimum_within(
                Duration::from_secs(120),
                Duration::from_secs(15),
                Duration::from_secs(60)
            ),
            Duration::from_secs(210),
            "Prometheus reports it firing through keep_firing_for"
        );
    }
}

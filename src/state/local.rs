//! This machine's own state: admission's slot per (runbook, host), in
//! memory, restored from the audit log when the daemon starts; failures
//! toward demotion in the state directory's ledger; approval requests and
//! the kill switch only this daemon's (nothing to share).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Admitted, ApprovalState, Approvals, Ask, Decided, Decision, DecisionError, DemoteAfter,
    Demotion, Demotions, Failure, KillSwitch, Pending, PromoteRefused, Request, Settings,
    SharedState,
};
use crate::audit::follow::{Others, Seen};
use crate::config::MaxRuns;
use crate::rules::TriggerResult;
use crate::rules::admission::{self as rules, DUPLICATE_WINDOW};
use crate::store::StoreError;
use crate::trigger::RunRequest;

/// The state of one (runbook, host) pair.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    in_flight: bool,
    ended: Option<Instant>,
    /// Fingerprints and group keys of the current or last run's triggers.
    keys: BTreeSet<String>,
    /// When its runs started, within the longest `max_runs` window.
    starts: Vec<Instant>,
}

impl Slot {
    /// The slot as the audit log leaves it: the last run ended at `ended`,
    /// started by `keys` (start-up, and `runwarden alerts test`).
    pub(crate) fn from_log(ended: jiff::Timestamp, keys: Vec<String>) -> Slot {
        let ago = Duration::try_from(jiff::Timestamp::now().duration_since(ended))
            .unwrap_or(Duration::ZERO);
        Slot {
            in_flight: false,
            ended: Some(Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)),
            keys: keys.into_iter().collect(),
            starts: Vec::new(),
        }
    }

    /// The slot of (runbook, host) as the audit log's `record` leaves it.
    pub(crate) fn from_record(
        record: &crate::audit::runs::Recovery,
        key: &(String, String),
    ) -> Slot {
        let slot = match record.ends.get(key) {
            Some((ended, keys)) => Slot::from_log(*ended, keys.clone()),
            None => Slot::default(),
        };
        slot.with_starts(record.starts.get(key).map_or(&[], Vec::as_slice))
    }

    /// Runs that started at `times` (from the audit log), for `max_runs`.
    pub(crate) fn with_starts(mut self, times: &[jiff::Timestamp]) -> Slot {
        let now = jiff::Timestamp::now();
        self.starts = times
            .iter()
            .filter_map(|t| Duration::try_from(now.duration_since(*t)).ok())
            .filter_map(|ago| Instant::now().checked_sub(ago))
            .collect();
        self
    }

    /// A slot whose run holding `keys` is in flight.
    pub(crate) fn in_flight(keys: &[String]) -> Slot {
        Slot {
            in_flight: true,
            ended: None,
            keys: keys.iter().cloned().collect(),
            starts: Vec::new(),
        }
    }

    /// A slot whose last run, started by `keys`, ended `ago`.
    #[cfg(test)]
    pub(crate) fn ended_ago(ago: Duration, keys: &[String]) -> Slot {
        Slot {
            in_flight: false,
            ended: Some(Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)),
            keys: keys.iter().cloned().collect(),
            starts: Vec::new(),
        }
    }

    /// What a trigger with `keys` comes to against this slot, under the
    /// runbook's `cooldown`, its `max_runs` and the duplicate `window`: a
    /// run in flight, or a repeat of the last run's triggers within the
    /// window or the cooldown, is deduplicated; another within the cooldown
    /// waits it out; one past `max_runs` is capped; `None`: it starts. How
    /// long ago the last run ended comes with it.
    pub(crate) fn refuses(
        &self,
        keys: &[String],
        cooldown: Option<Duration>,
        cap: Option<MaxRuns>,
        window: Duration,
    ) -> Option<(TriggerResult, Option<Duration>)> {
        let ended_ago = match self.in_flight {
            true => None,
            false => self.ended.map(|e| e.elapsed()),
        };
        let started_ago: Vec<Duration> = self.starts.iter().map(|t| t.elapsed()).collect();
        let facts = rules::Facts {
            stopped: false,
            held: self.in_flight.then_some(rules::Holder::Confirmed),
            ended_ago,
            last_started_by: &|k| self.keys.contains(k),
            started_ago: &started_ago,
        };
        let terms = rules::Terms {
            keys,
            cooldown,
            cap,
            window,
        };
        rules::decide(&facts, &terms).map(|result| (result, ended_ago))
    }

    /// Decide one trigger, and hold the slot when it starts. A duplicate of
    /// a run in flight adds its keys to that run's.
    fn admit(
        &mut self,
        keys: &[String],
        cooldown: Option<Duration>,
        cap: Option<MaxRuns>,
        window: Duration,
    ) -> Admitted {
        if let Some((result, _)) = self.refuses(keys, cooldown, cap, window) {
            if self.in_flight {
                self.keys.extend(keys.iter().cloned());
            }
            return Admitted::Refused(result);
        }
        let mut starts = std::mem::take(&mut self.starts);
        starts.retain(|t| t.elapsed() < MaxRuns::LONGEST);
        starts.push(Instant::now());
        *self = Slot {
            starts,
            ..Slot::in_flight(keys)
        };
        Admitted::Started(None)
    }
}

/// When `at` was, on this process's monotonic clock (`None`: in the future
/// or before the clock began).
fn instant_of(at: jiff::Timestamp) -> Option<Instant> {
    let ago = Duration::try_from(jiff::Timestamp::now().duration_since(at)).ok()?;
    Instant::now().checked_sub(ago)
}

/// The state of a daemon (or a person's run) that shares none.
#[derive(Debug)]
pub(crate) struct Local {
    slots: Mutex<HashMap<(String, String), Slot>>,
    window: Duration,
    /// The runs other processes on this machine (a person's `runwarden
    /// run`) record in the log after start-up read it: they count as this
    /// daemon's own, as the log says they ran.
    others: Mutex<Option<Others>>,
}

impl Default for Local {
    fn default() -> Local {
        Local {
            slots: Mutex::default(),
            window: DUPLICATE_WINDOW,
            others: Mutex::default(),
        }
    }
}

impl Local {
    /// Take in what other processes recorded since the last look.
    fn catch_up(&self, slots: &mut HashMap<(String, String), Slot>) {
        let mut others = self.others.lock().unwrap_or_else(|p| p.into_inner());
        let Some(follower) = others.as_mut() else {
            return;
        };
        let seen = match follower.read() {
            Ok(seen) => seen,
            Err(e) => {
                tracing::warn!(
                    "the audit log cannot be read for runs started by hand since the daemon started ({e}): they are not counted for cooldown and max_runs until it can"
                );
                return;
            }
        };
        for s in seen {
            match s {
                Seen::Started { runbook, host, at } => {
                    let slot = slots.entry((runbook, host)).or_default();
                    slot.starts.extend(instant_of(at));
                }
                Seen::Ended {
                    runbook,
                    host,
                    at,
                    keys,
                } => {
                    let slot = slots.entry((runbook, host)).or_default();
                    let Some(ended) = instant_of(at) else {
                        continue;
                    };
                    if slot.ended.is_none_or(|e| e < ended) {
                        slot.ended = Some(ended);
                        if !slot.in_flight {
                            slot.keys = keys.into_iter().collect();
                        }
                    }
                }
            }
        }
    }

    /// Put `slot` in place for (`runbook`, `host`) (the parity table).
    #[cfg(test)]
    pub(crate) fn set(&self, runbook: &str, host: &str, slot: Slot) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((runbook.to_string(), host.to_string()), slot);
    }

    /// Decide `asks` in order (the sync half of [`SharedState::admit`]).
    pub(crate) fn decide(&self, asks: &[&Ask<'_>]) -> Vec<Admitted> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        self.catch_up(&mut slots);
        asks.iter()
            .map(|a| {
                slots
                    .entry((a.req.runbook.clone(), a.req.host.clone()))
                    .or_default()
                    .admit(&a.req.keys, a.cooldown, a.cap, self.window)
            })
            .collect()
    }
}

impl SharedState for Local {
    fn admit<'a>(
        &'a self,
        asks: &'a [&'a Ask<'a>],
        _: &'a [Decided<'a>],
        _direct: usize,
    ) -> Pending<'a, Vec<Admitted>> {
        // The audit log holds this machine's record of every trigger.
        let admitted = self.decide(asks);
        Box::pin(async move { Ok(admitted) })
    }

    fn abandon<'a>(&'a self, started: &'a [(&'a RunRequest, String)]) -> Pending<'a, ()> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for (req, _) in started {
            if let Some(slot) = slots.get_mut(&(req.runbook.clone(), req.host.clone())) {
                slot.in_flight = false;
                slot.keys.clear();
                // It never started: it does not count against `max_runs`.
                slot.starts.pop();
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn ended(&self, req: &RunRequest, cleared: bool) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots
            .entry((req.runbook.clone(), req.host.clone()))
            .or_default();
        slot.in_flight = false;
        // A dry run changed nothing: its end starts no cooldown.
        if !req.dry_run {
            slot.ended = Some(Instant::now());
        }
        if cleared {
            slot.keys.clear();
        }
    }

    /// The audit log holds this machine's record of every trigger as it
    /// is written: there is nothing to confirm.
    fn confirm<'a>(&'a self, _: &'a [String], _: &'a [String]) -> Pending<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn queues(&self) -> bool {
        false
    }

    fn claim<'a>(&'a self, _: &'a RunRequest, _: &'a str) -> Pending<'a, Admitted> {
        Box::pin(async { Ok(Admitted::Started(None)) })
    }

    /// On the run's own thread, as its audit lines are written.
    fn record_failure<'a>(
        &'a self,
        settings: &'a Settings,
        failure: Failure,
        rule: DemoteAfter,
    ) -> Pending<'a, Option<Demotion>> {
        let reached = crate::gate::demotion::record_local(
            &settings.state_dir,
            rule,
            failure,
            &settings.replica,
        )
        .map_err(|e| StoreError::Local(format!("the failure ledger: {e}")));
        Box::pin(async move { reached })
    }

    fn promote<'a>(
        &'a self,
        settings: &'a Settings,
        runbook: &'a str,
        force: bool,
    ) -> Pending<'a, Result<Demotion, PromoteRefused>> {
        Box::pin(promote_here(settings, runbook, force))
    }

    /// Only this daemon lists its requests.
    fn share_approval<'a>(&'a self, _: &'a Request) -> Pending<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn close_approval<'a>(&'a self, _: &'a Request) -> Pending<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn withdraw_approvals<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a str,
        _: &'a ApprovalState,
    ) -> Pending<'a, Vec<Request>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The slots as the audit log left them: (runbook, host) -> when its last
    /// run ended and the keys that started it, and when its recent runs started.
    /// Then it follows the log at `path` for the runs of other processes.
    fn restore(&self, record: &crate::audit::runs::Recovery, path: &std::path::Path) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for key in record.ends.keys().chain(record.starts.keys()) {
            slots.insert(key.clone(), Slot::from_record(record, key));
        }
        let open = record
            .unfinished
            .iter()
            .map(|(e, keys)| (e.run_id.clone(), keys.clone()));
        *self.others.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Others::from(path, record.through, open));
    }

    fn approvals<'a>(
        &'a self,
        here: Option<&'a Approvals>,
        id: Option<&'a str>,
    ) -> Pending<'a, Vec<Request>> {
        let found = match (here, id) {
            (None, _) => Vec::new(),
            (Some(here), None) => here.list(),
            (Some(here), Some(id)) => here.get(id).into_iter().collect(),
        };
        Box::pin(async move { Ok(found) })
    }

    fn decide_approval<'a>(
        &'a self,
        here: &'a Approvals,
        id: &'a str,
        d: &'a Decision<'a>,
    ) -> Pending<'a, Result<Request, DecisionError>> {
        let decided = here.decide(id, d);
        Box::pin(async move { Ok(decided) })
    }

    fn fleet_runs<'a>(
        &'a self,
        _: Option<&'a str>,
        _: Option<&'a str>,
        _: i64,
    ) -> Pending<'a, Option<serde_json::Value>> {
        Box::pin(async { Ok(None) })
    }

    fn unhealthy(&self) -> Option<String> {
        None
    }

    fn sweep_switches(&self) -> Pending<'_, Vec<crate::gate::killswitch::Expired>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// No other replica asks.
    fn publish_switches<'a>(&'a self, _: &'a [(String, String)]) -> Pending<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn kill_switch(&self, dir: &std::path::Path) -> KillSwitch {
        KillSwitch::new(dir.to_path_buf())
    }

    fn engage_switch<'a>(
        &'a self,
        ks: &'a KillSwitch,
        runbook: Option<&'a str>,
        by: &'a str,
        reason: &'a str,
        for_: Option<Duration>,
    ) -> Pending<'a, crate::gate::killswitch::Switched> {
        Box::pin(super::engage_file(ks, runbook, by, reason, for_, None))
    }

    fn release_switch<'a>(
        &'a self,
        ks: &'a KillSwitch,
        runbook: Option<&'a str>,
    ) -> Pending<'a, bool> {
        Box::pin(async move { super::release_file(ks, runbook) })
    }

    fn switches<'a>(&'a self, ks: &'a KillSwitch) -> Pending<'a, Vec<(String, String)>> {
        Box::pin(async move { super::in_force(ks, None).await.map_err(StoreError::Local) })
    }

    fn demotions(&self, settings: &Settings) -> Demotions {
        crate::audit::demotions(settings)
    }
}

/// Promote `runbook` in this machine's own record (files under a lock:
/// off the async threads).
pub(super) async fn promote_here(
    settings: &Settings,
    runbook: &str,
    force: bool,
) -> Result<Result<Demotion, PromoteRefused>, StoreError> {
    let (demotions, runbook) = (crate::audit::demotions(settings), runbook.to_string());
    tokio::task::spawn_blocking(move || {
        crate::gate::demotion::promote_local(&demotions, &runbook, force)
    })
    .await
    .map_err(|e| StoreError::Local(format!("promoting on this machine: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(keys: &[&str]) -> RunRequest {
        let mut req = RunRequest::cli("rb".into(), "web".into(), false);
        req.trigger = crate::origin::Trigger::Alert;
        req.keys = keys.iter().map(|k| k.to_string()).collect();
        req
    }

    fn decide(local: &Local, req: &RunRequest, cooldown: Option<Duration>) -> TriggerResult {
        decide_capped(local, req, cooldown, None)
    }

    fn decide_capped(
        local: &Local,
        req: &RunRequest,
        cooldown: Option<Duration>,
        cap: Option<MaxRuns>,
    ) -> TriggerResult {
        let ask = Ask {
            req,
            cooldown,
            cap,
            run_id: "r".into(),
        };
        match local.decide(&[&ask]).pop() {
            Some(Admitted::Started(_)) => TriggerResult::Started,
            Some(Admitted::Refused(r)) => r,
            Some(Admitted::Queued) => panic!("one machine queues nothing for a fleet"),
            None => panic!("one outcome per ask"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn cooldown_holds_for_its_hour_and_a_repeat_of_the_same_alert_is_a_duplicate() {
        let local = Local::default();
        let hour = Some(Duration::from_secs(3600));
        let d = |keys: &[&str]| decide(&local, &alert(keys), hour);
        assert_eq!(d(&["fp1"]), TriggerResult::Started);
        assert_eq!(d(&["fp2"]), TriggerResult::Deduplicated, "in flight");
        local.ended(&alert(&[]), false);
        assert_eq!(d(&["fp3"]), TriggerResult::Cooldown);
        assert_eq!(
            d(&["fp1"]),
            TriggerResult::Deduplicated,
            "the alert the last run took"
        );
        assert_eq!(
            d(&["fp2"]),
            TriggerResult::Deduplicated,
            "a duplicate of the run in flight counts as its trigger"
        );
        tokio::time::advance(Duration::from_secs(3599)).await;
        assert_eq!(d(&["fp3"]), TriggerResult::Cooldown, "a second early");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(d(&["fp3"]), TriggerResult::Started);
    }

    /// A run that saw its alert clear leaves no trigger keys behind: the
    /// same alert firing right after is the alert back (a run, which the
    /// runbook's `recurrence` names), not a duplicate; the cooldown holds
    /// as for any run.
    #[tokio::test(start_paused = true)]
    async fn the_alert_a_run_saw_clear_starts_a_run_when_it_fires_again() {
        let local = Local::default();
        let d = |keys: &[&str], cooldown| decide(&local, &alert(keys), cooldown);
        assert_eq!(d(&["fp1"], None), TriggerResult::Started);
        local.ended(&alert(&[]), true);
        assert_eq!(
            d(&["fp1"], None),
            TriggerResult::Started,
            "back, not repeated"
        );
        local.ended(&alert(&[]), false);
        assert_eq!(d(&["fp1"], None), TriggerResult::Deduplicated, "a repeat");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(d(&["fp1"], None), TriggerResult::Started);
        local.ended(&alert(&[]), true);
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(
            d(&["fp1"], hour),
            TriggerResult::Cooldown,
            "the cooldown holds"
        );
    }

    /// `max_runs`: the third run within the window is refused, whatever
    /// triggers it, until the oldest of the two leaves the window.
    #[tokio::test(start_paused = true)]
    async fn max_runs_caps_the_runs_on_a_host_within_its_window() {
        let local = Local::default();
        let cap = Some(MaxRuns {
            count: 2,
            per: Duration::from_secs(6 * 3600),
        });
        let d = |keys: &[&str]| decide_capped(&local, &alert(keys), None, cap);
        for fp in ["fp1", "fp2"] {
            assert_eq!(d(&[fp]), TriggerResult::Started);
            local.ended(&alert(&[]), false);
            tokio::time::advance(Duration::from_secs(3600)).await;
        }
        assert_eq!(d(&["fp3"]), TriggerResult::Capped);
        // A run abandoned before it started does not count.
        tokio::time::advance(Duration::from_secs(4 * 3600)).await;
        assert_eq!(
            d(&["fp4"]),
            TriggerResult::Started,
            "the first left the window"
        );
        let req = alert(&["fp4"]);
        local.abandon(&[(&req, "r".to_string())]).await.unwrap();
        assert_eq!(
            d(&["fp5"]),
            TriggerResult::Started,
            "the abandoned one is not counted"
        );
    }

    /// One table of cases, run here against this machine's own admission,
    /// and in the root tier against the fleet's (`state::fleet::tests`)
    /// and the SQL of earlier releases (`it::ha::the_admission_table_on_postgres`).
    #[tokio::test(start_paused = true)]
    async fn the_admission_table_on_this_machines_own_state() {
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(include_str!("../../tests/fixtures/admission-cases.json"))
                .unwrap();
        assert!(cases.len() >= 10);
        for case in cases {
            let keys = |v: &serde_json::Value| -> Vec<String> {
                serde_json::from_value(v.clone()).unwrap()
            };
            let local = Local::default();
            let before = &case["before"];
            let starts: Vec<jiff::Timestamp> = before["starts_s_ago"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| {
                            jiff::Timestamp::now()
                                - jiff::SignedDuration::from_secs(s.as_i64().unwrap())
                        })
                        .collect()
                })
                .unwrap_or_default();
            if before["in_flight"] == true {
                let slot = Slot::in_flight(&keys(&before["keys"])).with_starts(&starts);
                local.set("rb", "web", slot);
            } else if let Some(ago) = before["ended_s_ago"].as_u64() {
                let slot = Slot::ended_ago(Duration::from_secs(ago), &keys(&before["keys"]))
                    .with_starts(&starts);
                local.set("rb", "web", slot);
            }
            let mut req = alert(&[]);
            req.keys = keys(&case["keys"]);
            let cooldown = case["cooldown_s"].as_u64().map(Duration::from_secs);
            let cap = case["cap"].as_object().map(|c| MaxRuns {
                count: c["count"].as_u64().unwrap() as u32,
                per: Duration::from_secs(c["per_s"].as_u64().unwrap()),
            });
            let got = decide_capped(&local, &req, cooldown, cap);
            assert_eq!(got.as_str(), case["expect"], "{}", case["case"]);
        }
    }
}

//! Admission on this machine alone: one slot per (runbook, host), in
//! memory, restored from the audit log when the daemon starts.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Admitted, Ask, DUPLICATE_WINDOW, Decided, Pending, TriggerResult};
use crate::trigger::RunRequest;

/// The state of one (runbook, host) pair.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    in_flight: bool,
    ended: Option<Instant>,
    /// Fingerprints and group keys of the current or last run's triggers.
    keys: BTreeSet<String>,
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
        }
    }

    /// A slot whose run holding `keys` is in flight.
    pub(crate) fn in_flight(keys: &[String]) -> Slot {
        Slot {
            in_flight: true,
            ended: None,
            keys: keys.iter().cloned().collect(),
        }
    }

    /// A slot whose last run, started by `keys`, ended `ago`.
    #[cfg(test)]
    pub(crate) fn ended_ago(ago: Duration, keys: &[String]) -> Slot {
        Slot {
            in_flight: false,
            ended: Some(Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)),
            keys: keys.iter().cloned().collect(),
        }
    }

    /// What a trigger with `keys` comes to against this slot, under the
    /// runbook's `cooldown` and the duplicate `window`: a run in flight, or
    /// a repeat of the last run's triggers within the window or the
    /// cooldown, is deduplicated; another within the cooldown waits it out;
    /// `None`: it starts. How long ago the last run ended comes with it.
    pub(crate) fn refuses(
        &self,
        keys: &[String],
        cooldown: Option<Duration>,
        window: Duration,
    ) -> Option<(TriggerResult, Option<Duration>)> {
        if self.in_flight {
            return Some((TriggerResult::Deduplicated, None));
        }
        let ago = self.ended?.elapsed();
        let repeat = keys.iter().any(|k| self.keys.contains(k));
        if repeat && ago < window {
            return Some((TriggerResult::Deduplicated, Some(ago)));
        }
        if ago >= cooldown? {
            return None;
        }
        Some(match repeat {
            true => (TriggerResult::Deduplicated, Some(ago)),
            false => (TriggerResult::Cooldown, Some(ago)),
        })
    }

    /// Decide one trigger, and hold the slot when it starts. A duplicate of
    /// a run in flight adds its keys to that run's.
    fn admit(&mut self, keys: &[String], cooldown: Option<Duration>, window: Duration) -> Admitted {
        if let Some((result, _)) = self.refuses(keys, cooldown, window) {
            if self.in_flight {
                self.keys.extend(keys.iter().cloned());
            }
            return Admitted::Refused(result);
        }
        *self = Slot::in_flight(keys);
        Admitted::Started(None)
    }
}

/// Every (runbook, host) this daemon decides alone.
#[derive(Debug)]
pub(crate) struct Local {
    slots: Mutex<HashMap<(String, String), Slot>>,
    window: Duration,
}

impl Default for Local {
    fn default() -> Local {
        Local {
            slots: Mutex::default(),
            window: DUPLICATE_WINDOW,
        }
    }
}

impl Local {
    /// The slots as the audit log left them: (runbook, host) -> when its last
    /// run ended and the keys that started it.
    pub(crate) fn restore(&self, ends: crate::audit::runs::LastEnds) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for ((runbook, host), (ended, keys)) in ends {
            slots.insert((runbook, host), Slot::from_log(ended, keys));
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

    /// Decide `asks` in order (the sync half of [`Admission::admit`]).
    pub(crate) fn decide(&self, asks: &[Ask<'_>]) -> Vec<Admitted> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        asks.iter()
            .map(|a| {
                slots
                    .entry((a.req.runbook.clone(), a.req.host.clone()))
                    .or_default()
                    .admit(&a.req.keys, a.cooldown, self.window)
            })
            .collect()
    }
}

impl Admission for Local {
    fn admit<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        _: &'a [Decided<'a>],
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
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn ended(&self, req: &RunRequest) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots
            .entry((req.runbook.clone(), req.host.clone()))
            .or_default();
        slot.in_flight = false;
        slot.ended = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(keys: &[&str]) -> RunRequest {
        let mut req = RunRequest::cli("rb".into(), "web".into(), false);
        req.trigger = crate::trigger::Trigger::Alert;
        req.keys = keys.iter().map(|k| k.to_string()).collect();
        req
    }

    fn decide(local: &Local, req: &RunRequest, cooldown: Option<Duration>) -> TriggerResult {
        let ask = Ask {
            req,
            cooldown,
            run_id: "r".into(),
        };
        match local.decide(std::slice::from_ref(&ask)).pop() {
            Some(Admitted::Started(_)) => TriggerResult::Started,
            Some(Admitted::Refused(r)) => r,
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
        local.ended(&alert(&[]));
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

    /// One table of cases, run here against this machine's own admission
    /// and in the root tier against PostgreSQL's (`it::ha::admission_*`).
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
            if before["in_flight"] == true {
                local.set("rb", "web", Slot::in_flight(&keys(&before["keys"])));
            } else if let Some(ago) = before["ended_s_ago"].as_u64() {
                let slot = Slot::ended_ago(Duration::from_secs(ago), &keys(&before["keys"]));
                local.set("rb", "web", slot);
            }
            let mut req = alert(&[]);
            req.keys = keys(&case["keys"]);
            let cooldown = case["cooldown_s"].as_u64().map(Duration::from_secs);
            let got = decide(&local, &req, cooldown);
            assert_eq!(got.as_str(), case["expect"], "{}", case["case"]);
        }
    }
}

//! Autonomy L2: a person approves each tier-2 call.
//!
//! When the gate holds a call, the run opens an approval request that shows
//! the concrete resolved call (tool, host, every argument, the reason, the
//! findings so far) and a digest of exactly that call. A decision must carry
//! the digest it was shown, so an approval can never apply to a call whose
//! arguments changed after it was shown; the first decision wins and every
//! later one is refused. Requests live in the daemon's memory only: after a
//! restart nothing is approvable, and the run that waited is reported
//! interrupted.
//!
//! A quarter of it is its unit tests (paused time).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// A person's decision: who, and what they wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct Decided {
    /// The approver's name (from the approvers file, never the token).
    pub(crate) by: String,
    /// What they wrote.
    pub(crate) comment: String,
    /// The door it came through: `API`, `CLI` or `Slack`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) via: String,
}

/// A person's decision as it is asked for: who (authorized by
/// [`crate::access`]), through which door, on which digest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decision<'a> {
    pub(crate) by: &'a str,
    /// `API`, `CLI` or `Slack`.
    pub(crate) via: &'a str,
    /// The digest the person was shown.
    pub(crate) digest: &'a str,
    pub(crate) approve: bool,
    pub(crate) comment: &'a str,
}

/// Where a request stands. Everything but `Pending` is final. As the API
/// shows it: `state`, and a decision's `by` and `comment` beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum State {
    /// Waiting for a person.
    Pending,
    /// A person approved the call.
    Approved(Decided),
    /// A person denied the call.
    Denied(Decided),
    /// Nobody decided in time: counts as denied.
    Expired,
    /// The run stopped waiting (kill switch, time budget, shutdown).
    Cancelled {
        /// What stopped it.
        why: String,
    },
    /// The alert that started the run resolved: nobody needs to decide.
    Withdrawn {
        /// Which alert, and where it was heard.
        why: String,
    },
}

/// Why a run stopped waiting for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// The kill switch was engaged (its own message).
    KillSwitch(String),
    /// The daemon is shutting down.
    Shutdown,
    /// The run's `max_duration` is spent.
    MaxDuration,
    /// The agent that asked for the call went away (its MCP session ended).
    AgentGone,
}

impl std::fmt::Display for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cancel::KillSwitch(why) => f.write_str(why),
            Cancel::Shutdown => f.write_str("runwarden is shutting down"),
            Cancel::MaxDuration => f.write_str("the run's max_duration is spent"),
            Cancel::AgentGone => {
                f.write_str("the agent that asked for the call went away (its MCP session ended)")
            }
        }
    }
}

/// How a wait for a person ended (see [`Approvals::wait`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// A person approved the call.
    Approved(Decided),
    /// A person denied the call.
    Denied(Decided),
    /// Nobody decided in time.
    Expired,
    /// The run stopped waiting.
    Cancelled(Cancel),
    /// The alert that started the run resolved (why, as the request says).
    Withdrawn(String),
}

impl Resolution {
    /// The `decision` label of `runwarden_approvals_total`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Resolution::Approved(_) => "approved",
            Resolution::Denied(_) => "denied",
            Resolution::Expired => "expired",
            Resolution::Cancelled(_) => "cancelled",
            Resolution::Withdrawn(_) => "withdrawn",
        }
    }
}

/// One request, as the API shows it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct Request {
    /// The request's id (what `approve` and `deny` name).
    pub(crate) id: String,
    /// The run that waits.
    pub(crate) run_id: String,
    /// The step of that run.
    pub(crate) step: u32,
    /// The runbook.
    pub(crate) runbook: String,
    /// The host the call would change.
    pub(crate) host: String,
    /// The tier-2 tool.
    pub(crate) tool: String,
    /// Its arguments, exactly as they would run.
    pub(crate) args: Value,
    /// Why the run wants to make the call.
    pub(crate) reason: String,
    /// What the run has seen so far (`steps.*`).
    pub(crate) findings: Value,
    /// sha256 of the call; a decision must quote it.
    pub(crate) digest: String,
    /// When it was opened (RFC 3339).
    pub(crate) created_at: String,
    /// When it expires unless decided (RFC 3339).
    pub(crate) expires_at: String,
    /// The trigger keys of the run (an alert's `fp:FINGERPRINT`): a
    /// resolved alert withdraws the requests of the runs it started.
    #[serde(default)]
    pub(crate) keys: Vec<String>,
    /// The agent that asks for the call, by its own word (`name version`),
    /// when an agent plans the run over MCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) agent: Option<String>,
    /// The principal who started the run, when one did (the runs API,
    /// `/mcp`): under `four_eyes` it may not decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) requested_by: Option<String>,
    /// The alert that started the run (its labels and annotations, where
    /// a value usually is): untrusted text, shown to a person as such.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) alert: Option<Value>,
    /// What the run may still spend when it asks: steps, tier-2 calls,
    /// seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) budget_left: Option<Value>,
    /// Where it stands.
    #[serde(flatten)]
    pub(crate) state: State,
}

/// Why a decision was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum DecisionError {
    /// Four-eyes: the approver is who started the run.
    #[error(
        "runbook {0} takes four eyes: whoever started a run cannot decide its calls; ask another approver"
    )]
    OwnRun(String),
    /// No such request.
    #[error("no approval request {0}")]
    NotFound(String),
    #[error(
        "the digest does not match the call awaiting approval (it changed, or it is another call): nothing was approved"
    )]
    /// The digest quoted is not the call's.
    StaleDigest,
    /// The request was decided before.
    #[error("approval request {0} was already decided")]
    AlreadyDecided(String),
    /// The request expired first.
    #[error("approval request {0} expired before this decision arrived: nothing was approved")]
    Expired(String),
    /// The alert that started the run resolved first.
    #[error(
        "approval request {0} was withdrawn (the alert that started its run resolved): nothing was approved"
    )]
    Withdrawn(String),
}

struct Entry {
    request: Request,
    expires: Instant,
    opened: Instant,
    tx: watch::Sender<State>,
}

/// The L2 approval store: requests and their waiting runs. Who may
/// decide is [`crate::access`]'s to say; a decision here is already
/// authorized and carries its approver.
pub(crate) struct Approvals {
    timeout: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

/// A decision's comment as it is kept: no control characters, at most 500.
pub(crate) fn clean_comment(comment: &str) -> String {
    comment
        .chars()
        .filter(|c| !c.is_control())
        .take(500)
        .collect()
}

/// The digest of one resolved call in one run.
pub(crate) fn digest(
    run_id: &str,
    step: u32,
    runbook: &str,
    host: &str,
    tool: &str,
    args: &Value,
    reason: &str,
) -> String {
    let canonical = json!({
        "run_id": run_id, "step": step, "runbook": runbook, "host": host,
        "tool": tool, "args": args, "reason": reason,
    });
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Approvals {
    /// A store whose requests expire after `timeout`.
    pub(crate) fn new(timeout: Duration) -> Approvals {
        Approvals {
            timeout,
            entries: Mutex::default(),
        }
    }

    /// Open a request; the receiver sees its state change.
    pub(crate) fn open(&self, mut request: Request) -> watch::Receiver<State> {
        let now = Instant::now();
        request.created_at = jiff::Timestamp::now().to_string();
        request.expires_at = (jiff::Timestamp::now() + self.timeout).to_string();
        request.state = State::Pending;
        let (tx, rx) = watch::channel(State::Pending);
        let entry = Entry {
            request: request.clone(),
            expires: now + self.timeout,
            opened: now,
            tx,
        };
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request.id.clone(), entry);
        rx
    }

    /// Approve or deny, as `by` (an authorized approver). Exactly one
    /// decision counts.
    pub(crate) fn decide(&self, id: &str, d: &Decision) -> Result<Request, DecisionError> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let e = entries
            .get_mut(id)
            .ok_or_else(|| DecisionError::NotFound(id.to_string()))?;
        if e.request.state != State::Pending {
            // Expired and cancelled requests say so: a late approver must know
            // that nothing they decide now can run.
            return Err(match &e.request.state {
                State::Expired => DecisionError::Expired(id.to_string()),
                State::Withdrawn { .. } => DecisionError::Withdrawn(id.to_string()),
                _ => DecisionError::AlreadyDecided(id.to_string()),
            });
        }
        // Expiry is exact: a decision that arrives late changes nothing,
        // however soon the waiting run would have noticed.
        if Instant::now() >= e.expires {
            e.request.state = State::Expired;
            let _ = e.tx.send(State::Expired);
            return Err(DecisionError::Expired(id.to_string()));
        }
        if !crate::same_secret(e.request.digest.as_bytes(), d.digest.as_bytes()) {
            return Err(DecisionError::StaleDigest);
        }
        let decided = Decided {
            by: d.by.to_string(),
            comment: clean_comment(d.comment),
            via: d.via.to_string(),
        };
        e.request.state = if d.approve {
            State::Approved(decided)
        } else {
            State::Denied(decided)
        };
        let _ = e.tx.send(e.request.state.clone());
        Ok(e.request.clone())
    }

    /// Wait for the decision on request `id` (as [`Approvals::open`] gave
    /// `rx`). `cancelled` is asked at least every 100 ms and after every
    /// change; the request expires at its deadline. Whichever comes first
    /// ends it, and a decision that arrives at the same moment wins over a
    /// cancellation or the expiry.
    pub(crate) async fn wait(
        &self,
        id: &str,
        mut rx: watch::Receiver<State>,
        cancelled: impl Fn() -> Option<Cancel>,
    ) -> Resolution {
        let expires = self.expires(id).unwrap_or_else(Instant::now);
        loop {
            let now = rx.borrow_and_update().clone();
            match now {
                State::Pending => {}
                State::Approved(d) => return Resolution::Approved(d),
                State::Denied(d) => return Resolution::Denied(d),
                State::Expired => return Resolution::Expired,
                // Only a wait cancels its request, and it returns its own
                // cause; a cancellation read back is the kill switch's.
                State::Cancelled { why } => return Resolution::Cancelled(Cancel::KillSwitch(why)),
                State::Withdrawn { why } => return Resolution::Withdrawn(why),
            }
            let end = match cancelled() {
                Some(cancel) => Some((
                    State::Cancelled {
                        why: cancel.to_string(),
                    },
                    Resolution::Cancelled(cancel),
                )),
                None if Instant::now() >= expires => Some((State::Expired, Resolution::Expired)),
                None => None,
            };
            if let Some((state, resolution)) = end {
                if self.close(id, state) {
                    return resolution;
                }
                continue; // a decision got there first
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// End a pending request without a decision (expiry or the run stopped waiting).
    /// Returns false when a decision got there first.
    pub(crate) fn close(&self, id: &str, state: State) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = entries.get_mut(id) else {
            return false;
        };
        if e.request.state != State::Pending {
            return false;
        }
        e.request.state = state;
        let _ = e.tx.send(e.request.state.clone());
        true
    }

    /// Withdraw the pending requests of runs of `runbook` on `host` that
    /// `key` started (their alert resolved): each waiting run hears it at
    /// once. The requests withdrawn, as they now stand.
    pub(crate) fn withdraw(&self, runbook: &str, host: &str, key: &str, why: &str) -> Vec<Request> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for e in entries.values_mut() {
            let r = &e.request;
            if r.state == State::Pending
                && r.runbook == runbook
                && r.host == host
                && r.keys.iter().any(|k| k == key)
            {
                e.request.state = State::Withdrawn {
                    why: why.to_string(),
                };
                let _ = e.tx.send(e.request.state.clone());
                out.push(e.request.clone());
            }
        }
        out
    }

    /// When request `id` expires, if it is held here.
    pub(crate) fn expires(&self, id: &str) -> Option<Instant> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|e| e.expires)
    }

    /// How long request `id` has waited so far.
    pub(crate) fn waited(&self, id: &str) -> Duration {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map_or(Duration::ZERO, |e| e.opened.elapsed())
    }

    /// Request `id` as the API shows it.
    pub(crate) fn get(&self, id: &str) -> Option<Request> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|e| e.request.clone())
    }

    /// The ids of the requests still waiting for a person.
    pub(crate) fn pending(&self) -> Vec<String> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .filter(|(_, e)| e.request.state == State::Pending)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Recent requests, pending first.
    pub(crate) fn list(&self) -> Vec<Request> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<Request> = entries.values().map(|e| e.request.clone()).collect();
        all.sort_by(|a, b| {
            (a.state != State::Pending, &a.created_at)
                .cmp(&(b.state != State::Pending, &b.created_at))
        });
        all
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn decision<'a>(by: &'a str, digest: &'a str, approve: bool, comment: &'a str) -> Decision<'a> {
        Decision {
            by,
            via: "API",
            digest,
            approve,
            comment,
        }
    }

    fn approvals() -> ((), Approvals) {
        ((), Approvals::new(Duration::from_secs(300)))
    }

    /// A pending request of runbook `rb` on host `web`.
    pub(crate) fn request(id: &str) -> Request {
        let args = json!({"unit": "nginx.service"});
        Request {
            id: id.into(),
            run_id: "r".into(),
            step: 2,
            runbook: "rb".into(),
            host: "web".into(),
            tool: "restart_service".into(),
            digest: digest("r", 2, "rb", "web", "restart_service", &args, "stuck"),
            args,
            reason: "stuck".into(),
            findings: json!({}),
            created_at: String::new(),
            expires_at: String::new(),
            keys: vec!["fp:abc".into()],
            agent: None,
            requested_by: None,
            alert: None,
            budget_left: None,
            state: State::Pending,
        }
    }

    #[test]
    fn one_decision_with_the_right_digest() {
        let (_d, a) = approvals();
        let mut rx = a.open(request("x"));
        let d = a.get("x").unwrap().digest;
        let other = digest(
            "r",
            2,
            "rb",
            "web",
            "restart_service",
            &json!({"unit": "sshd.service"}),
            "stuck",
        );
        assert_eq!(
            a.decide("x", &decision("alice", &other, true, ""))
                .unwrap_err(),
            DecisionError::StaleDigest
        );
        let r = a
            .decide("x", &decision("alice", &d, true, "ok by me"))
            .unwrap();
        assert_eq!(
            r.state,
            State::Approved(Decided {
                by: "alice".into(),
                comment: "ok by me".into(),
                via: "API".into()
            })
        );
        // As the API shows it: the decision beside `state`.
        let shown = serde_json::to_value(&r).unwrap();
        assert_eq!(
            (&shown["state"], &shown["by"], &shown["comment"]),
            (&json!("approved"), &json!("alice"), &json!("ok by me"))
        );
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), r.state);
        assert_eq!(
            a.decide("x", &decision("bob", &d, false, "")).unwrap_err(),
            DecisionError::AlreadyDecided("x".into())
        );
        assert!(!a.close("x", State::Expired), "a decision is final");
    }

    // Paused time: the clock moves only when the test (or an idle runtime)
    // moves it, so the five-minute expiry takes no time at all.
    #[tokio::test(start_paused = true)]
    async fn a_request_nobody_decides_expires_at_its_deadline_and_not_before() {
        let (_d, a) = approvals();
        let rx = a.open(request("x"));
        let opened = Instant::now();
        let resolution = a.wait("x", rx, || None).await;
        assert_eq!(resolution, Resolution::Expired);
        let waited = opened.elapsed();
        assert!(
            waited >= Duration::from_secs(300) && waited < Duration::from_secs(301),
            "{waited:?}"
        );
        assert_eq!(a.get("x").unwrap().state, State::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn a_decision_before_the_deadline_is_what_the_wait_returns() {
        let (_d, a) = approvals();
        let a = std::sync::Arc::new(a);
        let rx = a.open(request("x"));
        let digest = a.get("x").unwrap().digest;
        let decider = a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(120)).await;
            decider
                .decide("x", &decision("bob", &digest, false, "not now"))
                .unwrap();
        });
        let resolution = a.wait("x", rx, || None).await;
        assert_eq!(
            resolution,
            Resolution::Denied(Decided {
                by: "bob".into(),
                comment: "not now".into(),
                via: "API".into()
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_says_why_and_closes_the_request() {
        for cause in [
            Cancel::Shutdown,
            Cancel::MaxDuration,
            Cancel::KillSwitch("ENGAGED: maintenance".into()),
        ] {
            let (_d, a) = approvals();
            let rx = a.open(request("x"));
            let at = Instant::now() + Duration::from_secs(30);
            let c = cause.clone();
            let resolution = a
                .wait("x", rx, move || (Instant::now() >= at).then(|| c.clone()))
                .await;
            assert_eq!(resolution, Resolution::Cancelled(cause.clone()));
            assert_eq!(
                a.get("x").unwrap().state,
                State::Cancelled {
                    why: cause.to_string()
                }
            );
            // Decided after the end: refused.
            let digest = a.get("x").unwrap().digest;
            assert!(
                a.decide("x", &decision("alice", &digest, true, ""))
                    .is_err()
            );
        }
    }
}

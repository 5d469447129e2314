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
    pub(crate) fn decide(
        &self,
        id: &str,
        by: &str,
        digest: &str,
        approve: bool,
        comment: &str,
    ) -> Result<Request, DecisionError> {
        let who = by.to_string();
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
        if !crate::same_secret(e.request.digest.as_bytes(), digest.as_bytes()) {
            return Err(DecisionError::StaleDigest);
        }
        let decided = Decided {
            by: who,
            comment: clean_comment(comment),
        };
        e.request.state = if approve {
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
mod tests {
    use super::*;

    fn approvals() -> ((), Approvals) {
        ((), Approvals::new(Duration::from_secs(300)))
    }

    fn request(id: &str) -> Request {
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

    /// A chat bridge that answers a `pending` message slowly still hears
    /// the same request's `withdrawn` after it, never before; another
    /// request's message does not wait for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_requests_messages_reach_the_webhook_in_the_order_sent() {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/chat", listener.local_addr().unwrap());
        let heard: std::sync::Arc<Mutex<Vec<String>>> = Default::default();
        let log = heard.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(3) {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut stream = stream.unwrap();
                    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                    let mut len = 0;
                    loop {
                        let mut line = String::new();
                        reader.read_line(&mut line).unwrap();
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).unwrap();
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    if v["state"] == "pending" && v["id"] == "slow" {
                        std::thread::sleep(Duration::from_millis(400));
                    }
                    log.lock().unwrap().push(format!(
                        "{} {}",
                        v["id"].as_str().unwrap(),
                        v["state"].as_str().unwrap()
                    ));
                    stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .unwrap();
                });
            }
        });
        let (_d, a) = approvals();
        a.notify(url.clone(), request("slow"));
        let mut withdrawn = request("slow");
        withdrawn.state = State::Withdrawn {
            why: "resolved".into(),
        };
        a.notify(url.clone(), withdrawn);
        a.notify(url, request("other"));
        let started = std::time::Instant::now();
        while heard.lock().unwrap().len() < 3 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                heard.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let heard = heard.lock().unwrap().clone();
        assert_eq!(heard, ["other pending", "slow pending", "slow withdrawn"]);
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
            a.decide("x", "alice", &other, true, "").unwrap_err(),
            DecisionError::StaleDigest
        );
        let r = a.decide("x", "alice", &d, true, "ok by me").unwrap();
        assert_eq!(
            r.state,
            State::Approved(Decided {
                by: "alice".into(),
                comment: "ok by me".into()
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
            a.decide("x", "bob", &d, false, "").unwrap_err(),
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
                .decide("x", "bob", &digest, false, "not now")
                .unwrap();
        });
        let resolution = a.wait("x", rx, || None).await;
        assert_eq!(
            resolution,
            Resolution::Denied(Decided {
                by: "bob".into(),
                comment: "not now".into()
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
            assert!(a.decide("x", "alice", &digest, true, "").is_err());
        }
    }
}

//! Why a run starts: a person on the command line, a cron schedule, or an
//! Alertmanager notification. A trigger is pure data ([`RunRequest`]); the
//! scheduler decides what becomes of it.

pub mod alerts;
pub(crate) mod cron;

use serde::Serialize;
use serde_json::Value;

/// Where a worker that fires triggers sends them (the scheduler, in the
/// daemon): the worker needs only this handle, not what decides.
pub(crate) trait Submit: Send + Sync + 'static {
    /// Why a trigger could not be recorded.
    type Error: std::fmt::Display;

    /// Record `reqs` and have them decided, as one batch (with shared
    /// state, one round trip); an error means none was recorded.
    fn submit(&self, reqs: Vec<RunRequest>)
    -> impl Future<Output = Result<(), Self::Error>> + Send;
}

pub use crate::origin::Trigger;

/// A request to run one runbook on one host.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The runbook, by name.
    pub(crate) runbook: String,
    /// The host, by name.
    pub(crate) host: String,
    /// Show tier-2 calls instead of running them.
    pub(crate) dry_run: bool,
    /// What started it.
    pub(crate) trigger: Trigger,
    /// For alert triggers: the alert's labels and annotations, as `alert.*` in templates.
    /// Untrusted text: whatever a template makes of it still passes the gate.
    pub(crate) alert: Option<Value>,
    /// What identifies a repeat of this trigger (alert fingerprint, group key).
    pub(crate) keys: Vec<String>,
    /// Who picks the calls.
    pub(crate) planner: crate::planner::PlannerChoice,
    /// For alert triggers: the notification's alerts for this runbook and
    /// host (at most [`TOGETHER`], in the notification's order), one list
    /// shared by each of their requests. A notification of thousands of
    /// alerts for one pair is one list, not a copy of it per alert.
    pub(crate) together: Option<std::sync::Arc<Together>>,
    /// An MCP session's run: the agent that plans its calls, taken by the
    /// run when it starts.
    pub(crate) agent: Option<std::sync::Arc<AgentSlot>>,
    /// The principal who asked for it (the runs API, an MCP session);
    /// `None` for a schedule, an alert or the command line. Under four
    /// eyes it may not approve the run's calls.
    pub(crate) by: Option<String>,
}

/// Where an MCP session's agent waits for the run that it plans.
#[derive(Debug)]
pub(crate) struct AgentSlot {
    /// Who the agent is (`name version`, from the client's own word).
    pub(crate) client: String,
    /// Taken by the run when it starts.
    pub(crate) planner: std::sync::Mutex<Option<crate::planner::AgentPlanner>>,
    /// Set when the session ends: a call still waiting for a person is
    /// withdrawn rather than made for an agent that is gone.
    pub(crate) gone: std::sync::atomic::AtomicBool,
}

impl AgentSlot {
    /// An agent `client`'s slot, its planner fed by the session.
    pub(crate) fn new(client: String, planner: crate::planner::AgentPlanner) -> AgentSlot {
        AgentSlot {
            client,
            planner: std::sync::Mutex::new(Some(planner)),
            gone: Default::default(),
        }
    }

    /// Whether the agent's session has ended.
    pub(crate) fn gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// How many of a notification's alerts for one (runbook, host) its run
/// sees as `alerts` (Alertmanager may send thousands in one group).
pub(crate) const TOGETHER: usize = 100;

/// The alerts of one notification for one (runbook, host).
#[derive(Debug, Default)]
pub(crate) struct Together {
    /// The first [`TOGETHER`] of them.
    pub(crate) alerts: Vec<Value>,
    /// How many there were.
    pub(crate) total: usize,
}

/// A run request as the fleet's queue keeps it (its runbook and host are
/// columns of their own).
#[derive(Serialize, serde::Deserialize)]
struct InQueue {
    trigger: Trigger,
    keys: Vec<String>,
    alert: Option<Value>,
    dry_run: bool,
    planner: crate::planner::PlannerChoice,
}

impl RunRequest {
    /// What the fleet's queue keeps of this request, for the replica that
    /// takes it: everything but its runbook and host.
    pub(crate) fn to_queue(&self) -> String {
        // The alerts seen together ride inside the alert, as `alerts`: the
        // shape every release's replica reads from the queue.
        let alert = self.alert.clone().map(|mut a| {
            if self.together.is_some() && a.is_object() {
                a["alerts"] = Value::Array(self.alerts_seen());
            }
            a
        });
        serde_json::to_string(&InQueue {
            trigger: self.trigger,
            keys: self.keys.clone(),
            alert,
            dry_run: self.dry_run,
            planner: self.planner,
        })
        .unwrap_or_default()
    }

    /// The request [`to_queue`](Self::to_queue) kept.
    pub(crate) fn from_queue(
        runbook: String,
        host: String,
        text: &str,
    ) -> Result<RunRequest, serde_json::Error> {
        let mut q: InQueue = serde_json::from_str(text)?;
        let together = q
            .alert
            .as_mut()
            .and_then(Value::as_object_mut)
            .and_then(|o| o.remove("alerts"))
            .and_then(|all| match all {
                Value::Array(mut alerts) => {
                    let total = alerts.len();
                    alerts.truncate(TOGETHER);
                    Some(std::sync::Arc::new(Together { alerts, total }))
                }
                _ => None,
            });
        Ok(RunRequest {
            runbook,
            host,
            dry_run: q.dry_run,
            trigger: q.trigger,
            alert: q.alert,
            keys: q.keys,
            planner: q.planner,
            together,
            agent: None,
            by: None,
        })
    }

    /// What a run's templates see: `run` (id, runbook, host, trigger) and,
    /// for an alert, `alert` (the alert that started it) and `alerts`
    /// (every alert of its notification for this runbook and host, itself
    /// first).
    pub(crate) fn template_context(&self, run_id: &str) -> Value {
        let mut context = serde_json::json!({ "run": { "id": run_id, "runbook": self.runbook, "host": self.host, "trigger": self.trigger } });
        if let Some(alert) = &self.alert {
            context["alert"] = alert.clone();
            context["alerts"] = Value::Array(self.alerts_seen());
        }
        context
    }

    /// What the audit log records of who or what asked.
    pub(crate) fn origin(&self) -> crate::audit::Origin<'_> {
        crate::audit::Origin {
            alert: self.alert.as_ref().map(|a| (a, self.alerts_seen())),
            client: self.agent.as_ref().map(|slot| slot.client.as_str()),
        }
    }

    /// The alerts this request's run sees together: its own first, then
    /// the others of its notification for this runbook and host (at most
    /// [`TOGETHER`] in all).
    pub(crate) fn alerts_seen(&self) -> Vec<Value> {
        let Some(alert) = &self.alert else {
            return Vec::new();
        };
        let mut own = alert.clone();
        // `run --alert` with a whole notification: the list is in the alert.
        let embedded = own.as_object_mut().and_then(|o| o.remove("alerts"));
        let others: Vec<Value> = match (&self.together, embedded) {
            (Some(t), _) => t.alerts.clone(),
            (None, Some(Value::Array(all))) => all,
            (None, _) => Vec::new(),
        };
        let fingerprint = own.get("fingerprint").cloned();
        let mut out = Vec::with_capacity(others.len().min(TOGETHER) + 1);
        out.push(own);
        out.extend(
            others
                .into_iter()
                .filter(|a| fingerprint.is_none() || a.get("fingerprint") != fingerprint.as_ref())
                .take(TOGETHER - 1),
        );
        out
    }

    /// A run from the command line.
    pub fn cli(runbook: String, host: String, dry_run: bool) -> RunRequest {
        RunRequest {
            runbook,
            host,
            dry_run,
            trigger: Trigger::Cli,
            alert: None,
            keys: Vec::new(),
            planner: Default::default(),
            together: None,
            agent: None,
            by: None,
        }
    }
}

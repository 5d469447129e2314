//! Autonomy L2 inside a run: the held call is written as `pending`, put to a
//! person through the approval store, and waited on while the kill switch,
//! the time budget and shutdown still apply. The store's typed
//! [`Resolution`] becomes a permit (the approval re-enters the gate with the
//! call it held) or a denial with its own reason.

use super::run_loop::{RunLoop, RunState};
use crate::chat::Event;
use crate::gate::approvals::{self, Cancel, Decided, Request, Resolution, State};
use crate::gate::{Denial, DenyReason, Hold, Permit};
use crate::report::StepReport;

impl RunLoop<'_> {
    /// L2: put a held call to a person and wait, while the kill switch, the
    /// time budget and shutdown still apply. An approval re-enters the gate
    /// with the call it held.
    pub(super) async fn ask(
        &self,
        s: &mut RunState,
        hold: Hold,
        r: &mut StepReport,
    ) -> Result<Permit, Denial> {
        let Some(approvals) = self.runner.approvals.clone() else {
            let why = match hold.demoted() {
                Some(demoted) => format!("{demoted}; no person can approve here"),
                None => "autonomy L2: no person can approve here".into(),
            };
            return Err(denial(
                &hold,
                DenyReason::NoApprover,
                format!("{why}; run it under `runwarden serve` with `approvers_file` set"),
            ));
        };
        let (id, rx) = self.put_to_a_person(s, &approvals, &hold).await?;
        r.detail = Some(format!("waiting for approval {id}"));
        let deadline = s.gate.budget().deadline();
        let resolution = approvals.wait(&id, rx, || self.cancelled(deadline)).await;
        self.settled(&approvals, &id, &hold, &resolution).await;
        self.answered(s, hold, r, &id, resolution)
    }

    /// The request, its `pending` line written first, opened here, shared
    /// with the fleet and sent to the approval webhook: its id, and where
    /// its decision arrives. A request nobody can be asked is a denial.
    async fn put_to_a_person(
        &self,
        s: &RunState,
        approvals: &approvals::Approvals,
        hold: &Hold,
    ) -> Result<(String, tokio::sync::watch::Receiver<State>), Denial> {
        let tool = hold.action().tool();
        let args = hold.action().args_json();
        let reason = hold.action().reason().unwrap_or_default().to_string();
        let digest = approvals::digest(
            &self.info.run_id,
            hold.step(),
            &self.runbook.name,
            &self.host.name,
            tool.name(),
            &args,
            &reason,
        );
        let id = uuid::Uuid::now_v7().to_string();
        if let Err(err) = self.runner.audit.pending(&self.info, hold, &id, &digest) {
            return Err(denial(
                hold,
                DenyReason::NoApprover,
                format!("the pending line could not be written, nobody was asked: {err}"),
            ));
        }
        let rx = approvals.open(Request {
            id: id.clone(),
            run_id: self.info.run_id.clone(),
            step: hold.step(),
            runbook: self.runbook.name.clone(),
            host: self.host.name.clone(),
            tool: tool.name().into(),
            args,
            reason,
            findings: serde_json::Value::Object(s.transcript.steps.clone()),
            digest,
            created_at: String::new(),
            expires_at: String::new(),
            keys: self.req.keys.clone(),
            agent: self.req.agent.as_ref().map(|a| a.client.clone()),
            requested_by: self.req.by.clone(),
            alert: self.req.alert.clone(),
            budget_left: Some(s.gate.budget().left()),
            state: State::Pending,
        });
        // With shared state, any replica lists it and takes the decision.
        if let Some(req) = approvals.get(&id)
            && let Err(e) = self.runner.state.share_approval(&req).await
        {
            let why = format!(
                "the approval request could not be shared with the fleet, nobody was asked: {e}"
            );
            approvals.close(&id, State::Cancelled { why: why.clone() });
            return Err(denial(hold, DenyReason::NoApprover, why));
        }
        tracing::info!(approval_id = %id, run_id = %self.info.run_id, runbook = %self.runbook.name, host = %self.host.name, tool = tool.name(), "approval requested");
        if let Some(m) = &self.runner.metrics {
            m.approvals_pending.inc();
        }
        if let (Some(chat), Some(req)) = (&self.runner.chat, approvals.get(&id)) {
            chat.tell(&self.runner.config.settings, Event::Opened, req);
        }
        Ok((id, rx))
    }

    /// Why a wait for a person ends before anyone decided, if it does now.
    fn cancelled(&self, deadline: tokio::time::Instant) -> Option<Cancel> {
        if let Err(engaged) = self.runner.killswitch.check(&self.runbook.name) {
            Some(Cancel::KillSwitch(engaged.to_string()))
        } else if self.shutting_down() {
            Some(Cancel::Shutdown)
        } else if tokio::time::Instant::now() >= deadline {
            Some(Cancel::MaxDuration)
        } else if self.req.agent.as_ref().is_some_and(|a| a.gone()) {
            // Nothing changes for an agent no longer there to hear it.
            Some(Cancel::AgentGone)
        } else {
            None
        }
    }

    /// The request is settled: logged, closed in the fleet's table when it
    /// ended without a decision, counted.
    async fn settled(
        &self,
        approvals: &approvals::Approvals,
        id: &str,
        hold: &Hold,
        resolution: &Resolution,
    ) {
        tracing::info!(approval_id = %id, run_id = %self.info.run_id, decision = ?resolution, "approval decided");
        // However it was settled, whoever was asked hears how it ended.
        if let (Some(chat), Some(req)) = (&self.runner.chat, approvals.get(id)) {
            chat.tell(&self.runner.config.settings, Event::Settled, req);
        }
        if let Some(req) = approvals.get(id)
            && matches!(
                resolution,
                Resolution::Expired | Resolution::Cancelled(_) | Resolution::Withdrawn(_)
            )
            && let Err(e) = self.runner.state.close_approval(&req).await
        {
            tracing::warn!(approval_id = %id, "the fleet still shows the request pending ({e}); a decision on it now is refused once it expires");
        }
        if let Some(m) = &self.runner.metrics {
            m.approvals_pending.dec();
            m.approval_wait.observe(approvals.waited(id).as_secs_f64());
            m.approvals
                .with_label_values(&[
                    &self.runbook.name,
                    hold.action().tool().name(),
                    resolution.label(),
                ])
                .inc();
        }
    }

    /// What a settled request makes of its held call: a permit through the
    /// gate again, or a denial with its own reason.
    fn answered(
        &self,
        s: &mut RunState,
        hold: Hold,
        r: &mut StepReport,
        id: &str,
        resolution: Resolution,
    ) -> Result<Permit, Denial> {
        let deny = |reason, detail: String| Err(denial(&hold, reason, detail));
        match resolution {
            Resolution::Approved(Decided { by, comment, via }) => {
                let via = match via.is_empty() {
                    true => String::new(),
                    false => format!(" via {via}"),
                };
                r.detail = Some(match comment.is_empty() {
                    true => format!("approved by {by}{via}"),
                    false => format!("approved by {by}{via}: {comment}"),
                });
                s.gate.approved(hold, by)
            }
            Resolution::Denied(Decided { by, comment, .. }) => deny(
                DenyReason::ApprovalDenied,
                format!("{by} denied approval {id}: {comment}"),
            ),
            Resolution::Expired => deny(
                DenyReason::ApprovalExpired,
                format!("nobody decided on approval {id} in time"),
            ),
            Resolution::Cancelled(Cancel::MaxDuration) => {
                deny(DenyReason::TimeBudget, Cancel::MaxDuration.to_string())
            }
            Resolution::Cancelled(cause @ Cancel::Shutdown) => deny(
                DenyReason::Shutdown,
                format!("approval {id} cancelled: {cause}"),
            ),
            Resolution::Cancelled(cause @ Cancel::KillSwitch(_)) => deny(
                DenyReason::KillSwitch,
                format!("approval {id} cancelled: {cause}"),
            ),
            Resolution::Cancelled(cause @ Cancel::AgentGone) => deny(
                DenyReason::AgentGone,
                format!("approval {id} withdrawn: {cause}"),
            ),
            Resolution::Withdrawn(why) => deny(
                DenyReason::AlertResolved,
                format!("approval {id} withdrawn: {why}"),
            ),
        }
    }
}

/// A denial of the held call.
fn denial(hold: &Hold, reason: DenyReason, detail: String) -> Denial {
    Denial::new(hold.step(), reason, detail).of(hold.action().tool().clone())
}

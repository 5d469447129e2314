//! `/api/v1/chat/slack`: what Slack sends back, a button's click or
//! `/runwarden stop REASON`. Outside the token guard: Slack cannot send a
//! bearer token, it signs. The signature is checked on the raw body before
//! anything in it is read (401 and `runwarden_chat_requests_refused_total`
//! otherwise); then the Slack user is only a claim of who clicked, and
//! what it may do is what the principal whose `chat:` names that user
//! holds, through the same [`super::allow_unless`] as the API, audited
//! `via: slack` before anything is done. A user no principal names may do
//! nothing, and its try is audited under its Slack identity.
//!
//! Slack wants an answer within 3 s: a decision is one compare-and-swap
//! (a retry or a second click finds it decided and changes nothing), an
//! engage one write; what the clicker is told goes back through the
//! click's `response_url`, in the background.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, allow_unless, problem};
use crate::access::{Caller, Scope};
use crate::chat::slack::{self, Action, Inbound};
use crate::gate::approvals::{Decision, DecisionError};

/// What `/runwarden` answers to anything but `stop`.
const HELP: &str = "`/runwarden stop REASON` engages the kill switch: every run stops before its next call and pending approvals are denied. Release it with `runwarden kill-switch release` or the API.";

/// `POST /api/v1/chat/slack`.
pub(super) async fn slack(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let config = s.config.borrow().clone();
    let Some(settings) = config.settings.slack.as_ref() else {
        return problem(
            StatusCode::NOT_FOUND,
            "no Slack here: set chat.slack in runwarden.yaml",
        );
    };
    let secrets = match slack::signing_secrets(settings) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("Slack request refused: {e}");
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the signing secret cannot be read (the daemon's log says why)",
            );
        }
    };
    let secrets: Vec<&[u8]> = secrets.iter().map(|s| s.as_bytes()).collect();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Err(refused) = crate::hmac::verify(
        &secrets,
        "v0",
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
        &body,
        jiff::Timestamp::now().as_second(),
    ) {
        s.metrics
            .chat_refused
            .with_label_values(&[refused.reason()])
            .inc();
        return problem(StatusCode::UNAUTHORIZED, refused);
    }
    let inbound = match slack::parse(&body) {
        Ok(i) => i,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e),
    };
    match inbound {
        Inbound::Click {
            user,
            action,
            response_url,
        } => {
            let caller = who(&s, &user);
            let said = match action {
                Action::Decide {
                    approve,
                    request,
                    digest,
                } => decide(&s, &caller, &request, &digest, approve).await,
                Action::Stop => stop(&s, &caller, "the Stop button in Slack").await,
            };
            slack::reply(response_url, said);
            // The click is taken: what came of it went to the clicker.
            StatusCode::OK.into_response()
        }
        Inbound::Command { user, text } => {
            let text = text.trim();
            let said = match text.split_once(char::is_whitespace).unwrap_or((text, "")) {
                ("stop", reason) => {
                    let reason = match reason.trim() {
                        "" => "/runwarden stop in Slack",
                        r => r,
                    };
                    stop(&s, &who(&s, &user), reason).await
                }
                _ => HELP.to_string(),
            };
            axum::Json(json!({ "response_type": "ephemeral", "text": said })).into_response()
        }
    }
}

/// The principal whose `chat:` names `user`, or a stranger who may do
/// nothing.
fn who(s: &AppState, user: &str) -> Caller {
    s.access
        .as_ref()
        .filter(|a| !a.refused())
        .and_then(|a| a.principals().chat(user))
        .unwrap_or_else(|| Caller::stranger(user))
}

/// A click on Approve or Deny: what the clicker is told.
async fn decide(s: &AppState, caller: &Caller, id: &str, digest: &str, approve: bool) -> String {
    let here = match super::approvals::store(s, caller) {
        Ok(a) => a,
        Err(_) => return "approvals are not taken here now (no principals file in force)".into(),
    };
    let verb = if approve { "approve" } else { "deny" };
    let request = match s.scheduler.state().approvals(Some(here), Some(id)).await {
        Ok(mut list) => match list.pop() {
            Some(r) => r,
            None => return format!("no approval request {id}"),
        },
        Err(e) => return format!("nothing was decided: {e}; retry, or use the CLI"),
    };
    let veto = super::approvals::own_run(s, caller, &request);
    let what = format!("{verb} {id}");
    let allowed = allow_unless(
        s,
        caller,
        Scope::Approve,
        Some(&request.runbook),
        Some(2),
        &what,
        veto.clone(),
        "slack",
    );
    if allowed.is_err() {
        return match veto {
            Some(why) if caller.may(Scope::Approve, &request.runbook) => {
                format!("{why} (refused and audited)")
            }
            _ => refusal(caller, Scope::Approve, &request.runbook),
        };
    }
    let d = Decision {
        by: caller.name(),
        via: "Slack",
        digest,
        approve,
        comment: "",
    };
    match s.scheduler.state().decide_approval(here, id, &d).await {
        Ok(Ok(_)) => format!("{} {id}", if approve { "approved" } else { "denied" }),
        Ok(Err(e @ DecisionError::StaleDigest)) => {
            format!("{e}: the request changed since this message was posted; nothing was decided")
        }
        Ok(Err(e)) => format!("{e}: nothing was decided"),
        Err(e) => format!("nothing was decided: {e}; retry, or use the CLI"),
    }
}

/// The Stop button or `/runwarden stop`: the global kill switch, for a
/// principal that may engage it for every runbook.
async fn stop(s: &AppState, caller: &Caller, reason: &str) -> String {
    let what = format!(
        "engage {}: {}",
        crate::rules::kill_switch::GLOBAL,
        crate::text::one_line(reason)
    );
    let allowed = allow_unless(
        s,
        caller,
        Scope::KillEngage,
        None,
        None,
        &what,
        None,
        "slack",
    );
    if allowed.is_err() {
        return refusal(caller, Scope::KillEngage, "every runbook");
    }
    match super::killswitch::engage_now(s, caller, None, reason, None).await {
        Ok(done) => match done.warning {
            Some(w) => format!("kill switch engaged ({}): {w}", done.scope),
            None => format!(
                "kill switch engaged ({}): every run stops before its next call; release it with the CLI or the API",
                done.scope
            ),
        },
        Err(e) => format!("the kill switch was NOT engaged: {e}"),
    }
}

/// Why a Slack user may not: a stranger learns that it is not mapped, a
/// principal which scope it lacks (it was audited either way).
fn refusal(caller: &Caller, scope: Scope, on: &str) -> String {
    match caller.stranger_in_chat() {
        true => format!(
            "{} is no principal's chat identity here, so it may do nothing: add it to a principal's chat: in the principals file",
            caller.name()
        ),
        false => format!(
            "{} may not {} for {on} (refused and audited)",
            caller.name(),
            scope.name()
        ),
    }
}

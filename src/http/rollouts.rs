//! `/api/v1/rollouts`: the rollouts this daemon drives (with shared state,
//! the fleet's, each with its driver), and a person's decisions on them
//! (resume, abort), each audited with who and why.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, allow, problem};
use crate::access::{Caller, Scope};
use crate::rollout::{Decision as Done, Refused};

/// `GET /api/v1/rollouts`: newest first.
pub(super) async fn list(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    if !caller.holds(Scope::RunRead) {
        return super::refused_any(&caller, Scope::RunRead);
    }
    match s.rollouts.listed().await {
        Ok(mut all) => {
            all.retain(|r| {
                r["runbook"]
                    .as_str()
                    .is_some_and(|rb| caller.may(Scope::RunRead, rb))
            });
            axum::Json(json!({ "rollouts": all })).into_response()
        }
        Err(e) => unavailable(e),
    }
}

/// `GET /api/v1/rollouts/{id}` (an id or an unambiguous prefix of one).
pub(super) async fn show(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    match s.rollouts.shown(&id).await {
        // Not seen is not found: nothing of another runbook's rollout.
        Ok(Some(status))
            if !status["runbook"]
                .as_str()
                .is_some_and(|rb| caller.may(Scope::RunRead, rb)) =>
        {
            problem(StatusCode::NOT_FOUND, Refused::NotFound(short(&id)))
        }
        Ok(Some(status)) => axum::Json(status).into_response(),
        Ok(None) => problem(StatusCode::NOT_FOUND, Refused::NotFound(short(&id))),
        Err(e) => unavailable(e),
    }
}

/// The shared state did not answer: the rollouts cannot be read now.
fn unavailable(e: crate::store::StoreError) -> Response {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the fleet's rollouts cannot be read: {e}; retry"),
    )
}

/// What a person sends to resume or abort.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    /// Who decides, with the webhook token (the audit log keeps it); a
    /// principal's token says who, and a `by` beside it is refused.
    #[serde(default)]
    by: Option<String>,
    /// Why.
    reason: String,
}

/// `POST /api/v1/rollouts/{id}/{resume|abort}` with `{"by", "reason"}`.
pub(super) async fn decide(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((id, decision)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let d: Decision = match serde_json::from_slice(&body) {
        Ok(d) => d,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"by\": \"NAME\", \"reason\": \"why\"}}: {e}"),
            );
        }
    };
    let by = match (caller.builtin(), d.by) {
        (false, Some(_)) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "who decides is whoever the token belongs to, never a name the request carries: leave out by",
            );
        }
        (false, None) => caller.name().to_string(),
        (true, Some(by))
            if !by.trim().is_empty() && by.len() <= 128 && !by.chars().any(char::is_control) =>
        {
            by
        }
        (true, _) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "`by` names the person: 1-128 printable characters (or send a principal's token, which says who)",
            );
        }
    };
    let resume = match decision.as_str() {
        "resume" => true,
        "abort" => false,
        other => {
            return problem(
                StatusCode::NOT_FOUND,
                format!(
                    "no decision {:?}: POST .../resume or .../abort",
                    short(other)
                ),
            );
        }
    };
    let runbook = match s.rollouts.shown(&id).await {
        Ok(Some(status)) => status["runbook"].as_str().unwrap_or_default().to_string(),
        Ok(None) => return problem(StatusCode::NOT_FOUND, Refused::NotFound(short(&id))),
        Err(e) => return unavailable(e),
    };
    let what = format!("{decision} rollout {}", short(&id));
    if let Err(refused) = allow(
        &s,
        &caller,
        Scope::RolloutControl,
        Some(&runbook),
        None,
        &what,
    ) {
        return *refused;
    }
    let reason: String = d.reason.chars().take(1000).collect();
    let done = s.rollouts.decide(&id, resume, &by, &reason).await;
    match done {
        Ok(Done::Applied(status)) => axum::Json(status).into_response(),
        // Another replica drives it: it applies the decision within a
        // third of the lease.
        Ok(Done::Sent { mut status, driver }) => {
            if let Some(o) = status.as_object_mut() {
                o.insert(
                    "decision".into(),
                    json!({ "verb": decision, "by": by, "sent_to": driver }),
                );
            }
            (StatusCode::ACCEPTED, axum::Json(status)).into_response()
        }
        Err(e @ Refused::NotFound(_)) => problem(StatusCode::NOT_FOUND, e),
        Err(e @ Refused::NoReason) => problem(StatusCode::BAD_REQUEST, e),
        Err(e @ (Refused::NotHalted { .. } | Refused::Over(_) | Refused::Pending(_))) => {
            problem(StatusCode::CONFLICT, e)
        }
        Err(e @ (Refused::Audit(_) | Refused::Store(_))) => {
            problem(StatusCode::SERVICE_UNAVAILABLE, e)
        }
    }
}

/// At most 64 characters of what a client sent, for a message.
fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

//! `/api/v1/rollouts`: the rollouts this daemon drives (with shared state,
//! the fleet's, each with its driver), and a person's decisions on them
//! (resume, abort), each audited with who and why.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, problem};
use crate::rollout::{Decision as Done, Refused};

/// `GET /api/v1/rollouts`: newest first.
pub(super) async fn list(State(s): State<AppState>) -> Response {
    match s.rollouts.listed().await {
        Ok(all) => axum::Json(json!({ "rollouts": all })).into_response(),
        Err(e) => unavailable(e),
    }
}

/// `GET /api/v1/rollouts/{id}` (an id or an unambiguous prefix of one).
pub(super) async fn show(State(s): State<AppState>, Path(id): Path<String>) -> Response {
    match s.rollouts.shown(&id).await {
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
    /// Who decides (the audit log keeps it).
    by: String,
    /// Why.
    reason: String,
}

/// `POST /api/v1/rollouts/{id}/{resume|abort}` with `{"by", "reason"}`.
pub(super) async fn decide(
    State(s): State<AppState>,
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
    if d.by.trim().is_empty() || d.by.len() > 128 || d.by.chars().any(char::is_control) {
        return problem(
            StatusCode::BAD_REQUEST,
            "`by` names the person: 1-128 printable characters",
        );
    }
    let reason: String = d.reason.chars().take(1000).collect();
    let done = match decision.as_str() {
        "resume" => s.rollouts.decide(&id, true, &d.by, &reason).await,
        "abort" => s.rollouts.decide(&id, false, &d.by, &reason).await,
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
    match done {
        Ok(Done::Applied(status)) => axum::Json(status).into_response(),
        // Another replica drives it: it applies the decision within a
        // third of the lease.
        Ok(Done::Sent { mut status, driver }) => {
            if let Some(o) = status.as_object_mut() {
                o.insert(
                    "decision".into(),
                    json!({ "verb": decision, "by": d.by, "sent_to": driver }),
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

//! `/api/v1/rollouts`: the rollouts this daemon drives, and a person's
//! decisions on them (resume, abort), each audited with who and why.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, problem};
use crate::rollout::Refused;

/// `GET /api/v1/rollouts`: newest first.
pub(super) async fn list(State(s): State<AppState>) -> Response {
    axum::Json(json!({ "rollouts": s.rollouts.list() })).into_response()
}

/// `GET /api/v1/rollouts/{id}` (an id or an unambiguous prefix of one).
pub(super) async fn show(State(s): State<AppState>, Path(id): Path<String>) -> Response {
    match s.rollouts.get(&id) {
        Some(one) => axum::Json(one.status()).into_response(),
        None => problem(StatusCode::NOT_FOUND, Refused::NotFound(short(&id))),
    }
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
        "resume" => s.rollouts.resume(&id, &d.by, &reason),
        "abort" => s.rollouts.abort(&id, &d.by, &reason),
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
        Ok(status) => axum::Json(status).into_response(),
        Err(e @ Refused::NotFound(_)) => problem(StatusCode::NOT_FOUND, e),
        Err(e @ Refused::NoReason) => problem(StatusCode::BAD_REQUEST, e),
        Err(e @ (Refused::NotHalted { .. } | Refused::Over(_))) => problem(StatusCode::CONFLICT, e),
        Err(e @ Refused::Audit(_)) => problem(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// At most 64 characters of what a client sent, for a message.
fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

//! `/api/v1/approvals`: the L2 requests a principal may see, and its
//! decisions on them. The approver is the token's principal, stamped
//! here; a body that names one is refused. Every decision, allowed or
//! refused, is audited with the principal and the token's id before it
//! is taken.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, allow_unless, no, problem};
use crate::access::{Caller, Scope};
use crate::gate::approvals::{Approvals, Decision, DecisionError, Request};

/// The approvals store, or why there is none, for a caller that is a
/// principal (the webhook token and loopback never decide).
pub(super) fn store<'a>(s: &'a AppState, caller: &Caller) -> Result<&'a Approvals, Box<Response>> {
    let Some(approvals) = s.scheduler.approvals.as_deref() else {
        return Err(no(
            StatusCode::SERVICE_UNAVAILABLE,
            "approvals are not configured: set principals_file in runwarden.yaml",
        ));
    };
    if s.access.as_ref().is_some_and(|a| a.refused()) {
        return Err(no(
            StatusCode::SERVICE_UNAVAILABLE,
            "the principals file was refused at the last reload: nobody can approve until it is fixed and runwarden reloads",
        ));
    }
    if caller.builtin() {
        return Err(no(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer` header with an approver's token (a principal holding approve)",
        ));
    }
    Ok(approvals)
}

/// Whether `caller` may see `r`: it may decide it, or read its runbook.
fn visible(caller: &Caller, r: &Request) -> bool {
    caller.may(Scope::Approve, &r.runbook) || caller.may(Scope::RunRead, &r.runbook)
}

/// `GET /api/v1/approvals`: the requests of the runbooks the caller may
/// approve or read, pending first.
pub(super) async fn list(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    let here = match store(&s, &caller) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if !caller.holds(Scope::Approve) && !caller.holds(Scope::RunRead) {
        return super::refused_any(&caller, Scope::Approve);
    }
    match s.scheduler.state().approvals(Some(here), None).await {
        Ok(mut list) => {
            list.retain(|r| visible(&caller, r));
            axum::Json(json!({ "approvals": list })).into_response()
        }
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// One request, if the caller may see it.
async fn one(s: &AppState, here: &Approvals, id: &str) -> Result<Request, Box<Response>> {
    match s.scheduler.state().approvals(Some(here), Some(id)).await {
        Ok(mut list) => list
            .pop()
            .ok_or_else(|| no(StatusCode::NOT_FOUND, format!("no approval request {id}"))),
        Err(e) => Err(no(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

/// `GET /api/v1/approvals/{id}`.
pub(super) async fn show(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let here = match store(&s, &caller) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    match one(&s, here, &id).await {
        // Not seen is not found: a caller learns nothing of another
        // runbook's requests.
        Ok(r) if !visible(&caller, &r) => {
            problem(StatusCode::NOT_FOUND, format!("no approval request {id}"))
        }
        Ok(r) => axum::Json(r).into_response(),
        Err(refused) => *refused,
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    digest: String,
    #[serde(default)]
    comment: String,
}

/// `POST /api/v1/approvals/{id}/{approve|deny}` with `{"digest", "comment"}`.
pub(super) async fn decide(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((id, decision)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let here = match store(&s, &caller) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let approve = match decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return problem(
                StatusCode::NOT_FOUND,
                format!("no action {other:?}: use approve or deny"),
            );
        }
    };
    let body: DecisionBody = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v)
            if ["by", "approver", "approved_by"]
                .iter()
                .any(|k| v.get(k).is_some()) =>
        {
            return problem(
                StatusCode::BAD_REQUEST,
                "the approver is whoever the token belongs to, never a name the request carries: leave out by/approver",
            );
        }
        Ok(v) => match serde_json::from_value(v) {
            Ok(b) => b,
            Err(e) => return bad_body(e),
        },
        Err(e) => return bad_body(e),
    };
    let request = match one(&s, here, &id).await {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let what = format!("{decision} {id}");
    let veto = own_run(&s, &caller, &request);
    let allowed = allow_unless(
        &s,
        &caller,
        Scope::Approve,
        Some(&request.runbook),
        Some(2),
        &what,
        veto,
        "api",
    );
    if let Err(refused) = allowed {
        return *refused;
    }
    let cli = headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua == super::CLI_USER_AGENT);
    let d = Decision {
        by: caller.name(),
        via: if cli { "CLI" } else { "API" },
        digest: &body.digest,
        approve,
        comment: &body.comment,
    };
    let decided = match s.scheduler.state().decide_approval(here, &id, &d).await {
        Ok(decided) => decided,
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    answer(decided)
}

/// A decision's answer: the request as it now stands, or why not.
pub(super) fn answer(decided: Result<Request, DecisionError>) -> Response {
    match decided {
        Ok(r) => axum::Json(r).into_response(),
        Err(e @ DecisionError::OwnRun(_)) => problem(StatusCode::FORBIDDEN, e.to_string()),
        Err(e @ DecisionError::NotFound(_)) => problem(StatusCode::NOT_FOUND, e.to_string()),
        Err(
            e @ (DecisionError::StaleDigest
            | DecisionError::AlreadyDecided(_)
            | DecisionError::Expired(_)
            | DecisionError::Withdrawn(_)),
        ) => problem(StatusCode::CONFLICT, e.to_string()),
    }
}

fn bad_body(e: serde_json::Error) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        format!("expected {{\"digest\": \"...\", \"comment\": \"...\"}}: {e}"),
    )
}

/// A runbook with `four_eyes: true`: whoever started the run does not
/// decide its calls.
pub(super) fn own_run(s: &AppState, caller: &Caller, r: &Request) -> Option<String> {
    let config = s.config.borrow().clone();
    let four_eyes = config
        .runbooks
        .get(&r.runbook)
        .is_some_and(|rb| rb.four_eyes);
    (four_eyes && r.requested_by.as_deref() == Some(caller.name()))
        .then(|| DecisionError::OwnRun(r.runbook.clone()).to_string())
}

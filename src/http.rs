//! The daemon's HTTP interface: `/metrics`, `/healthz`, the runs API and the
//! Alertmanager webhook receiver.
//!
//! The webhook only records and enqueues: it answers 2xx once every alert in
//! the notification has its outcome, 4xx (with a JSON reason) for a body it
//! will never accept, and 5xx only when it could not record the triggers, so
//! that Alertmanager retries.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::audit::AuditLog;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::scheduler::{Scheduler, TriggerResult};
use crate::trigger::alerts::{Candidate, Notification, candidates};

/// Largest webhook body accepted.
pub const MAX_BODY: usize = 1 << 20;

#[derive(Clone)]
pub struct AppState {
    pub config: watch::Receiver<Arc<Config>>,
    pub scheduler: Arc<Scheduler>,
    pub metrics: Arc<Metrics>,
    pub audit: Arc<AuditLog>,
    /// The bearer token the webhook requires, if one is configured.
    pub token: Option<Arc<Vec<u8>>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/runs", get(runs))
        .route("/api/v1/runs/{id}", get(run))
        .route("/api/v1/alerts", post(alerts))
        .route("/api/v1/approvals", get(approvals_list))
        .route("/api/v1/approvals/{id}", get(approval_show))
        .route("/api/v1/approvals/{id}/{decision}", post(approval_decide))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

fn problem(status: StatusCode, reason: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": reason.into() }))).into_response()
}

async fn metrics(State(s): State<AppState>) -> Response {
    let seen = s.metrics.audit_write_failures.get();
    let now = s.audit.failures();
    if now > seen {
        s.metrics.audit_write_failures.inc_by(now - seen);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn healthz(State(s): State<AppState>) -> Response {
    if s.audit.failing() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "unhealthy: the last audit write failed; no call runs until it succeeds\n",
        )
            .into_response();
    }
    let dir = s.config.borrow().settings.state_dir.clone();
    if let Err(e) = std::fs::metadata(s.audit.path()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "unhealthy: audit log {}: {e} (state dir {})\n",
                s.audit.path().display(),
                dir.display()
            ),
        )
            .into_response();
    }
    (StatusCode::OK, "ok\n").into_response()
}

async fn runs(State(s): State<AppState>) -> Response {
    axum::Json(json!({ "runs": s.scheduler.runs.list() })).into_response()
}

async fn run(State(s): State<AppState>, Path(id): Path<String>) -> Response {
    match s.scheduler.runs.get(&id) {
        Some(r) => axum::Json(r).into_response(),
        None => problem(StatusCode::NOT_FOUND, format!("no recent run {id}")),
    }
}

async fn alerts(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(token) = &s.token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match given {
            Some(g) if crate::same_secret(g.as_bytes(), token) => {}
            Some(_) => return problem(StatusCode::UNAUTHORIZED, "wrong bearer token"),
            None => {
                return problem(
                    StatusCode::UNAUTHORIZED,
                    "missing `Authorization: Bearer` header",
                );
            }
        }
    }
    let notification = match Notification::parse(&body) {
        Ok(n) => n,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e),
    };
    for a in &notification.alerts {
        let status = if a.status == "firing" {
            "firing"
        } else {
            "resolved"
        };
        s.metrics.alerts_received.with_label_values(&[status]).inc();
    }
    let config = s.config.borrow().clone();
    let candidates = candidates(&notification, &config);
    // Runs first, in one batch (the kill switch is looked at once per runbook).
    let runs: Vec<_> = candidates
        .iter()
        .filter_map(|c| match c {
            Candidate::Run(req) => Some(req.clone()),
            _ => None,
        })
        .collect();
    let mut started = s.scheduler.submit_all(runs).into_iter();
    let mut outcomes = Vec::with_capacity(candidates.len());
    for c in candidates {
        let (runbook, fingerprint, result) = match c {
            Candidate::Run(req) => {
                let fp = req
                    .keys
                    .first()
                    .map(|k| k.trim_start_matches("fp:").to_string())
                    .unwrap_or_default();
                (
                    req.runbook,
                    fp,
                    started.next().expect("one result per run request"),
                )
            }
            Candidate::OutOfScope {
                runbook,
                fingerprint,
            } => {
                s.metrics
                    .alert_triggers
                    .with_label_values(&[&runbook, TriggerResult::OutOfScope.as_str()])
                    .inc();
                (runbook, fingerprint, TriggerResult::OutOfScope)
            }
            Candidate::NoMatch { fingerprint } => {
                s.metrics
                    .alert_triggers
                    .with_label_values(&["none", TriggerResult::NoMatch.as_str()])
                    .inc();
                ("none".to_string(), fingerprint, TriggerResult::NoMatch)
            }
        };
        outcomes.push(
            json!({ "runbook": runbook, "fingerprint": fingerprint, "result": result.as_str() }),
        );
    }
    let body: Value = json!({
        "alerts": notification.alerts.len(),
        "truncated_alerts": notification.truncated_alerts,
        "outcomes": outcomes,
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// The approver token of a request, or why it is refused.
fn approver_token(
    s: &AppState,
    headers: &HeaderMap,
) -> Result<Vec<u8>, (StatusCode, &'static str)> {
    let Some(approvals) = &s.scheduler.approvals else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "approvals are not configured: set approvers_file in runwarden.yaml",
        ));
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().as_bytes().to_vec())
        .ok_or((
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer` header with an approver token",
        ))?;
    if approvals.approver(&token).is_none() {
        return Err((StatusCode::UNAUTHORIZED, "unknown approver token"));
    }
    Ok(token)
}

async fn approvals_list(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Err((status, why)) = approver_token(&s, &headers) {
        return problem(status, why);
    }
    let list = s
        .scheduler
        .approvals
        .as_ref()
        .map(|a| a.list())
        .unwrap_or_default();
    axum::Json(json!({ "approvals": list })).into_response()
}

async fn approval_show(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err((status, why)) = approver_token(&s, &headers) {
        return problem(status, why);
    }
    match s.scheduler.approvals.as_ref().and_then(|a| a.get(&id)) {
        Some(r) => axum::Json(r).into_response(),
        None => problem(StatusCode::NOT_FOUND, format!("no approval request {id}")),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    digest: String,
    #[serde(default)]
    comment: String,
}

async fn approval_decide(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path((id, decision)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let token = match approver_token(&s, &headers) {
        Ok(t) => t,
        Err((status, why)) => return problem(status, why),
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
    let body: DecisionBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"digest\": \"...\", \"comment\": \"...\"}}: {e}"),
            );
        }
    };
    let approvals = s
        .scheduler
        .approvals
        .as_ref()
        .expect("checked by approver_token");
    use crate::gate::approvals::DecisionError;
    match approvals.decide(&id, &token, &body.digest, approve, &body.comment) {
        Ok(r) => axum::Json(r).into_response(),
        Err(e @ DecisionError::Unauthorized) => problem(StatusCode::UNAUTHORIZED, e.to_string()),
        Err(e @ DecisionError::NotFound(_)) => problem(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ (DecisionError::StaleDigest | DecisionError::AlreadyDecided(_))) => {
            problem(StatusCode::CONFLICT, e.to_string())
        }
    }
}

//! `/api/v1/kill-switch`: the stop from anywhere a principal's token
//! reaches. `POST` engages (`kill:engage` for the runbook named, or for
//! every runbook: `runbooks: ["*"]`), `DELETE` releases (`kill:release`),
//! `GET` says what stops runs (`run:read`). Engaging is not releasing: a
//! phone that may stop everything cannot start it all again. With shared
//! state the switch is the fleet's, as the CLI's is; who engaged it is the
//! token's principal, stamped here. Every engage and release, allowed or
//! refused, is audited before it is done.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{AppState, allow, problem};
use crate::access::{Caller, Scope};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EngageBody {
    reason: String,
    #[serde(default)]
    runbook: Option<String>,
    /// How long it holds (`2h`, `30m`); without it, until released.
    #[serde(default, rename = "for")]
    for_: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Which {
    #[serde(default)]
    runbook: Option<String>,
}

/// What a person engages, or why not: a reason, a time between a second
/// and a century.
fn engage_of(body: &[u8]) -> Result<(EngageBody, Option<std::time::Duration>), Box<Response>> {
    let bad = |why: String| {
        super::no(
            StatusCode::BAD_REQUEST,
            format!(
                "{why}: expected {{\"reason\": \"...\", \"runbook\": \"NAME\" (omit: every runbook), \"for\": \"2h\" (omit: until released)}}"
            ),
        )
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    if ["by", "engaged_by"].iter().any(|k| v.get(k).is_some()) {
        return Err(super::no(
            StatusCode::BAD_REQUEST,
            "who engages is whoever the token belongs to, never a name the request carries: leave out by",
        ));
    }
    let b: EngageBody = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
    if b.reason.trim().is_empty() {
        return Err(bad(
            "the reason is empty: say why (an incident, a ticket)".into()
        ));
    }
    let for_ = match &b.for_ {
        None => None,
        Some(text) => {
            let d = humantime::parse_duration(text)
                .map_err(|e| bad(format!("for {text:?} is no duration ({e})")))?;
            crate::gate::killswitch::end_for(d, "`for`").map_err(bad)?;
            Some(d)
        }
    };
    Ok((b, for_))
}

/// A runbook this daemon runs (a switch for another would stop nothing).
fn known(s: &AppState, runbook: Option<&str>) -> Result<(), Box<Response>> {
    let Some(rb) = runbook else { return Ok(()) };
    let config = s.config.borrow().clone();
    if config.runbooks.contains_key(rb) {
        return Ok(());
    }
    Err(super::no(
        StatusCode::BAD_REQUEST,
        format!(
            "{rb:?} is not a runbook this daemon runs, so a switch for it would stop nothing{} (omit runbook to stop every runbook)",
            crate::text::did_you_mean(rb, config.runbooks.keys().map(String::as_str))
        ),
    ))
}

/// `POST /api/v1/kill-switch` with `{"reason", "runbook", "for"}`.
pub(super) async fn engage(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    body: Bytes,
) -> Response {
    let (b, for_) = match engage_of(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let runbook = b.runbook.as_deref();
    let what = format!(
        "engage {}: {}",
        runbook.unwrap_or(crate::rules::kill_switch::GLOBAL),
        crate::text::one_line(&b.reason)
    );
    if let Err(refused) = allow(&s, &caller, Scope::KillEngage, runbook, None, &what) {
        return *refused;
    }
    // Which runbooks exist is told only to a caller that may stop them.
    if let Err(refused) = known(&s, runbook) {
        return *refused;
    }
    let by = engaged_by(&caller);
    match engage_now(&s, &caller, runbook, &b.reason, for_).await {
        Ok(done) => axum::Json(json!({
            "engaged": true,
            "scope": done.scope,
            "until": done.until.map(|t| t.to_string()),
            "reach": done.reach,
            "engaged_by": by,
            "warning": done.warning,
        }))
        .into_response(),
        // Nothing was engaged: say so loudly.
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the kill switch was NOT engaged: {e}"),
        ),
    }
}

/// Engage the switch of `runbook` (`None`: every runbook) as `caller`,
/// once [`allow`] said it may: what was engaged, or why nothing was and
/// how else to stop runs.
pub(super) async fn engage_now(
    s: &AppState,
    caller: &Caller,
    runbook: Option<&str>,
    reason: &str,
    for_: Option<std::time::Duration>,
) -> Result<crate::gate::killswitch::Switched, String> {
    let by = engaged_by(caller);
    let config = s.config.borrow().clone();
    let ks = s.scheduler.killswitch(&config);
    s.scheduler
        .state()
        .engage_switch(&ks, runbook, &by, reason, for_)
        .await
        .map_err(|e| {
            format!(
                "{e}; stop runs another way (`runwarden kill-switch engage` on the host, or `touch {}/ENGAGED`)",
                ks.dir().display()
            )
        })
}

/// `DELETE /api/v1/kill-switch[?runbook=NAME]`: releases that switch
/// (this machine's file and, with shared state, the fleet's) and says
/// what still stops runs.
pub(super) async fn release(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    which: Result<Query<Which>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let runbook = match which {
        Ok(Query(w)) => w.runbook,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let what = format!(
        "release {}",
        runbook
            .as_deref()
            .unwrap_or(crate::rules::kill_switch::GLOBAL)
    );
    if let Err(refused) = allow(
        &s,
        &caller,
        Scope::KillRelease,
        runbook.as_deref(),
        None,
        &what,
    ) {
        return *refused;
    }
    if let Err(refused) = known(&s, runbook.as_deref()) {
        return *refused;
    }
    let config = s.config.borrow().clone();
    let ks = s.scheduler.killswitch(&config);
    let state = s.scheduler.state();
    let was = match state.release_switch(&ks, runbook.as_deref()).await {
        Ok(was) => was,
        Err(e) => {
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the kill switch was not released everywhere: {e}; runs stay stopped, retry"
                ),
            );
        }
    };
    match state.switches(&ks).await {
        Ok(left) => axum::Json(json!({
            "was_engaged": was,
            "still_engaged": listed(&left),
        }))
        .into_response(),
        Err(e) => axum::Json(json!({
            "was_engaged": was,
            "warning": format!("what else stops runs could not be read: {e}"),
        }))
        .into_response(),
    }
}

/// `GET /api/v1/kill-switch`: what stops runs now, for a caller that
/// may read runs.
pub(super) async fn status(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    if !caller.holds(Scope::RunRead) {
        return super::refused_any(&caller, Scope::RunRead);
    }
    let config = s.config.borrow().clone();
    let ks = s.scheduler.killswitch(&config);
    match s.scheduler.state().switches(&ks).await {
        Ok(now) => axum::Json(json!({ "engaged": listed(&now) })).into_response(),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Who engaged a switch, as its file and row say: the principal, and
/// which of its tokens (or its chat identity).
fn engaged_by(caller: &Caller) -> String {
    match caller.in_chat() {
        true => format!("{} ({})", caller.name(), caller.token_id),
        false => format!("{} (token {})", caller.name(), caller.token_id),
    }
}

/// Switches as the API lists them: the global one first.
fn listed(switches: &[(String, String)]) -> Vec<Value> {
    let mut out: Vec<&(String, String)> = switches.iter().collect();
    let global = |scope: &str| scope.rsplit(':').next() == Some(crate::rules::kill_switch::GLOBAL);
    out.sort_by_key(|(scope, _)| !global(scope));
    out.iter()
        .map(|(scope, detail)| json!({ "scope": scope, "detail": detail }))
        .collect()
}

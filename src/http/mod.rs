//! The daemon's HTTP interface: `/metrics`, `/healthz`, the runs API and the
//! Alertmanager webhook receiver.
//!
//! Who may call what: `/metrics` and `/healthz` are open (Prometheus and a
//! load balancer read them). Every `/api/v1` route is refused to a browser
//! (a request with `Origin`, or `Sec-Fetch-Site` other than `none`), takes
//! only `application/json` bodies, and, with a webhook token configured,
//! needs `Authorization: Bearer TOKEN` (approvals take an approver's token
//! instead). Without a token the daemon listens on loopback only and answers
//! only requests whose `Host` is a loopback name, so a web page cannot reach
//! it through DNS rebinding. Connections are capped and must send their
//! headers within a few seconds.
//!
//! The webhook only records and enqueues: it answers 2xx once every alert in
//! the notification has its outcome, 4xx (with a JSON reason) for a body it
//! will never accept, and 5xx only when it could not record the triggers, so
//! that Alertmanager retries.
//!
//! One file: the accept loop's limits, the request
//! guard and the handlers are the whole HTTP surface, and reading them
//! together is how the surface is reviewed.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::watch;

mod approvals;
mod chat;
mod killswitch;
mod rollouts;

use crate::access::{Caller, Scope};
use crate::audit::AuditLog;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::trigger::RunRequest;
use crate::trigger::alerts::{Notification, candidates};

/// Largest request body accepted, but for notifications.
pub(crate) const MAX_BODY: usize = 1 << 20;

/// Largest Alertmanager notification accepted: a group of 10,000 alerts
/// with a dozen labels each fits (refused, Alertmanager would retry it
/// for ever and nothing would start). Its cost is linear in what it holds.
pub(crate) const MAX_NOTIFICATION: usize = 8 << 20;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The configuration in force (replaced on reload).
    pub(crate) config: watch::Receiver<Arc<Config>>,
    /// Where triggers go.
    pub(crate) scheduler: Arc<Scheduler>,
    /// Fan-outs in waves (`rollout:`).
    pub(crate) rollouts: Arc<crate::rollout::Rollouts>,
    /// The metrics `/metrics` serves.
    pub(crate) metrics: Arc<Metrics>,
    /// The audit log the runs API reads.
    pub(crate) audit: Arc<AuditLog>,
    /// The bearer token the API requires (re-read on SIGHUP).
    pub(crate) token: Arc<std::sync::RwLock<WebhookToken>>,
    /// Who may do what (`principals_file`, re-read on SIGHUP).
    pub(crate) access: Option<Arc<crate::access::Access>>,
    /// `/mcp`: MCP sessions of agents (see [`crate::mcp::http`]).
    pub(crate) mcp: crate::mcp::http::Endpoint,
    /// The address the daemon listens on: a name `/mcp` answers to.
    pub(crate) listen: std::net::SocketAddr,
}

/// Connections served at once; more wait in the kernel's backlog.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// How long a client may take to send a request's headers.
pub(crate) const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long one request may take, its body included.
pub(crate) const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long one `/mcp` request may take (a call waiting for a person).
pub(crate) const MCP_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Serve `router` on `listener` until `stop` turns true, then let the
/// connections in flight finish their current request.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stopped(&mut stop) => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let router = router.clone();
        let mut stop = stop.clone();
        conns.spawn(async move {
            let _permit = permit;
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let router = router.clone();
                    async move {
                        // An MCP call may wait minutes (a person's
                        // approval): the session's own idle timeout and the
                        // run's budget bound it, not the request timeout.
                        let limit = match req.uri().path().starts_with("/mcp") {
                            true => MCP_REQUEST_TIMEOUT,
                            false => REQUEST_TIMEOUT,
                        };
                        let call = tower_service::Service::call(&mut router.into_service(), req);
                        Ok::<_, std::convert::Infallible>(
                            match tokio::time::timeout(limit, call).await {
                                Ok(Ok(resp)) => resp,
                                Ok(Err(never)) => match never {},
                                Err(_) => problem(
                                    StatusCode::REQUEST_TIMEOUT,
                                    "the request took too long",
                                ),
                            },
                        )
                    }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Every route: the webhook, the runs and approvals API, `/metrics` and `/healthz`.
pub(crate) fn router(state: AppState) -> Router {
    let guarded = state.clone();
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/runs", get(runs).post(start_runs))
        .route("/api/v1/runs/{id}", get(run))
        .route(
            "/api/v1/alerts",
            post(alerts).layer(DefaultBodyLimit::max(MAX_NOTIFICATION)),
        )
        .route("/api/v1/fleet/runs", get(fleet_runs))
        .route("/api/v1/rollouts", get(rollouts::list))
        .route("/api/v1/rollouts/{id}", get(rollouts::show))
        .route("/api/v1/rollouts/{id}/{decision}", post(rollouts::decide))
        .route("/api/v1/approvals", get(approvals::list))
        .route("/api/v1/approvals/{id}", get(approvals::show))
        .route("/api/v1/approvals/{id}/{decision}", post(approvals::decide))
        .route(
            "/api/v1/kill-switch",
            get(killswitch::status)
                .post(killswitch::engage)
                .delete(killswitch::release),
        )
        .route("/api/v1/chat/slack", post(chat::slack))
        .route("/mcp", axum::routing::any(mcp))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(guarded, guard))
        .with_state(state)
}

/// `/mcp`: only with `mcp_token_file` set (404 without), only with its
/// token, never from a web page; then MCP's streamable HTTP transport.
async fn mcp(State(s): State<AppState>, req: axum::extract::Request) -> Response {
    let config = s.config.borrow().clone();
    let file = config.settings.mcp_token_file.clone();
    if file.is_none() && s.access.is_none() {
        return problem(
            StatusCode::NOT_FOUND,
            "no MCP endpoint: set mcp_token_file (or principals_file) in runwarden.yaml",
        );
    }
    let headers = req.headers();
    if from_a_web_page(headers) {
        return problem(
            StatusCode::FORBIDDEN,
            "requests from a web page are refused: connect an MCP client",
        );
    }
    if let Some(refused) = ambiguous_authority(&req) {
        s.metrics.mcp_refused.with_label_values(&["host"]).inc();
        return refused;
    }
    // DNS rebinding: a page of another site whose name now points here
    // sends that name; only the daemon's own are served.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(host_name);
    if !host.is_some_and(|h| config.settings.mcp_limits.allows_host(h, s.listen)) {
        s.metrics.mcp_refused.with_label_values(&["host"]).inc();
        return problem(
            StatusCode::FORBIDDEN,
            "the Host header does not name this daemon: add the name clients use to mcp_allowed_hosts in runwarden.yaml",
        );
    }
    let given = bearer(headers).unwrap_or("").to_string();
    let caller = match mcp_caller(&s, &given, file).await {
        Ok(c) => c,
        Err(refused) => return *refused,
    };
    // An agent never approves: its principal may not hold the scope, so
    // a call it asks for and a decision on it are never one token's.
    if caller.holds(Scope::Approve) {
        s.metrics.mcp_refused.with_label_values(&["scope"]).inc();
        return problem(
            StatusCode::FORBIDDEN,
            format!(
                "{} holds approve: an agent's principal never may (it would approve its own calls); give the agent a principal without approve",
                caller.name()
            ),
        );
    }
    let runbook = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "runbook")
            .map(|(_, v)| v.into_owned())
    });
    let may = match &runbook {
        Some(rb) => crate::access::authorize(&caller, Scope::RunTrigger, Some(rb), None),
        None if caller.holds(Scope::RunTrigger) => Ok(()),
        None => crate::access::authorize(&caller, Scope::RunTrigger, None, None),
    };
    if let Err(r) = may {
        s.metrics.mcp_refused.with_label_values(&["scope"]).inc();
        return problem(StatusCode::FORBIDDEN, r);
    }
    s.mcp.handle(req).await
}

/// Who an MCP client is: a principal's token, or `mcp_token_file`'s (read
/// at every request, so a token changed or revoked counts at once).
async fn mcp_caller(
    s: &AppState,
    given: &str,
    file: Option<std::path::PathBuf>,
) -> Result<Caller, Box<Response>> {
    if let Some(c) = principal(s, Some(given))? {
        return Ok(c);
    }
    let unknown = || {
        problem(
            StatusCode::UNAUTHORIZED,
            "an MCP client needs `Authorization: Bearer` with the token of mcp_token_file or a principal's",
        )
    };
    let Some(file) = file else {
        return Err(Box::new(unknown()));
    };
    let token = match tokio::task::spawn_blocking(move || {
        crate::secret::read_token(&file, "mcp_token_file")
    })
    .await
    {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(Box::new(mcp_unavailable(e.to_string()))),
        Err(e) => {
            return Err(Box::new(mcp_unavailable(format!(
                "the reading thread failed: {e}"
            ))));
        }
    };
    match crate::same_secret(given.as_bytes(), token.as_bytes()) {
        true => Ok(Caller::mcp_token()),
        false => Err(Box::new(unknown())),
    }
}

/// 400 for a request whose authority is not one name (RFC 9112 §3.2): two
/// `Host` headers, or an absolute-form target (`POST http://evil.example/mcp`)
/// naming another authority than `Host`. A proxy and runwarden could read
/// two different names from either, so neither is trusted.
fn ambiguous_authority(req: &axum::extract::Request) -> Option<Response> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Some(problem(
            StatusCode::BAD_REQUEST,
            "more than one Host header: send exactly one",
        ));
    }
    if let Some(h) = host
        && !h.to_str().is_ok_and(one_authority)
    {
        return Some(problem(
            StatusCode::BAD_REQUEST,
            "the Host header is not one name and port (a list, a space or a user part): send exactly one",
        ));
    }
    let target = req.uri().authority()?;
    let same = host
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h.eq_ignore_ascii_case(target.as_str()));
    (!same).then(|| {
        problem(
            StatusCode::BAD_REQUEST,
            format!(
                "the request target names {:?}, another authority than its Host header: send the path alone (origin form)",
                target.as_str()
            ),
        )
    })
}

/// Whether `host` is one `name[:port]` or `[v6][:port]`: no list (how a
/// proxy merges two Host headers), no space, no user part.
fn one_authority(host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, rest)) => {
                let ok = !addr.is_empty()
                    && addr
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
                (if ok { "v6" } else { "" }, rest)
            }
            None => ("", ""),
        },
        None => host.split_at(host.find(':').unwrap_or(host.len())),
    };
    let port_ok = match port.strip_prefix(':') {
        Some(p) => !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()),
        None => port.is_empty(),
    };
    port_ok
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// A `Host` header's name: its port and an IPv6 address's brackets off.
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

/// Whether a browser sent the request (a page's script, a form): the API
/// and `/mcp` answer programs, never a web page a person happens to open.
fn from_a_web_page(headers: &axum::http::HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() != b"none")
}

/// `/mcp` while its token cannot be read: 503, and why in the log only.
fn mcp_unavailable(why: String) -> Response {
    tracing::warn!("/mcp answers 503: {why}");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the MCP token file cannot be read (the daemon's log says why); retry once it is fixed",
    )
}

/// The webhook token in force.
#[derive(Debug, Clone)]
pub(crate) enum WebhookToken {
    /// None configured: loopback only.
    None,
    /// Requests must carry it as `Authorization: Bearer`.
    Bearer(Vec<u8>),
    /// The token file was refused at the last reload: no token is taken,
    /// old or new, until it is fixed. Every `/api/` request but an
    /// approval is answered 503, which Alertmanager retries, so no
    /// notification is lost meanwhile.
    Refused,
}

/// What every `/api/` request must satisfy before its handler sees it.
async fn guard(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Slack signs what it sends instead: checked by the route itself.
    if !req.uri().path().starts_with("/api/") || req.uri().path() == "/api/v1/chat/slack" {
        return next.run(req).await;
    }
    if let Some(refused) = ambiguous_authority(&req) {
        return refused;
    }
    let headers = req.headers();
    if from_a_web_page(headers) {
        return problem(
            StatusCode::FORBIDDEN,
            "requests from a web page are refused: call the API from Alertmanager, curl or the runwarden CLI",
        );
    }
    let caller = match caller_of(&s, headers) {
        Ok(c) => c,
        Err(refused) => return *refused,
    };
    // Without a token, a browser's "simple" cross-site POST (a form) is the
    // threat: it cannot send JSON. With one, it cannot send the token.
    if caller.token_id == LOOPBACK && req.method() != axum::http::Method::GET {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be sent as Content-Type: application/json",
            );
        }
    }
    let mut req = req;
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The runwarden CLI's `User-Agent`: a decision it sends is shown "via CLI".
pub(crate) const CLI_USER_AGENT: &str = concat!("runwarden-cli/", env!("CARGO_PKG_VERSION"));

/// How a request without a token is known: to loopback, on a daemon
/// with no webhook token.
const LOOPBACK: &str = "loopback";

/// The principal whose token `given` is (`None`: no principal's), or 401
/// for a principal's token that expired.
fn principal(s: &AppState, given: Option<&str>) -> Result<Option<Caller>, Box<Response>> {
    let (Some(given), Some(access)) = (given, &s.access) else {
        return Ok(None);
    };
    match access
        .principals()
        .authenticate(given.as_bytes(), jiff::Timestamp::now())
    {
        Ok(c) => Ok(Some(c)),
        Err(e @ crate::access::Unknown::Expired { .. }) => Err(no(StatusCode::UNAUTHORIZED, e)),
        Err(crate::access::Unknown::Token) => Ok(None),
    }
}

/// Who sends the request ([`crate::access`]): a principal's token, the
/// webhook token, or (with no webhook token) a request to loopback; or
/// the answer that refuses it.
fn caller_of(s: &AppState, headers: &HeaderMap) -> Result<Caller, Box<Response>> {
    let given = bearer(headers);
    if let Some(c) = principal(s, given)? {
        return Ok(c);
    }
    // A principal's token while the principals file is refused: nobody
    // is known (fail closed), and saying so beats "unknown token".
    let refused = s.access.as_ref().is_some_and(|a| a.refused());
    let unknown = |wrong: &'static str| match refused {
        true => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the principals file was refused at the last reload (the daemon's log says why): no principal's token is taken and nobody can approve until it is fixed and runwarden reloads",
        ),
        false => problem(StatusCode::UNAUTHORIZED, wrong),
    };
    match s.token.read().unwrap_or_else(|p| p.into_inner()).clone() {
        WebhookToken::Bearer(t) => match given {
            Some(g) if crate::same_secret(g.as_bytes(), &t) => {
                Ok(Caller::webhook("webhook_token_file"))
            }
            Some(_) => Err(Box::new(unknown("wrong bearer token"))),
            None => Err(no(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer` header (the webhook token, or a principal's)",
            )),
        },
        // Why is in the daemon's log, not told to whoever asks.
        WebhookToken::Refused => Err(no(
            StatusCode::SERVICE_UNAVAILABLE,
            "the webhook token file was refused at the last reload (the daemon's log says why); no token is taken until it is fixed and runwarden reloads",
        )),
        WebhookToken::None => {
            if given.is_some() {
                return Err(Box::new(unknown("unknown token")));
            }
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            if !loopback_host(host) {
                return Err(no(
                    StatusCode::MISDIRECTED_REQUEST,
                    format!(
                        "Host {host:?} is not a loopback name; without a webhook token only requests to 127.0.0.1, [::1] or localhost are answered without a principal's token (set webhook_token_file, or send a principal's token)"
                    ),
                ));
            }
            Ok(Caller::webhook(LOOPBACK))
        }
    }
}

/// The refusal of a caller that holds `scope` for no runbook at all.
fn refused_any(caller: &Caller, scope: Scope) -> Response {
    match crate::access::authorize(caller, scope, None, None) {
        Err(r) => refuse(caller, r),
        Ok(()) => problem(
            StatusCode::FORBIDDEN,
            format!("{} holds no {scope}", caller.name()),
        ),
    }
}

/// 403 for what `caller` may not do, or 401 for a caller no principal
/// is (the webhook token, loopback): it was never asked who it is.
fn refuse(caller: &Caller, refused: crate::access::Refused) -> Response {
    if caller.builtin() {
        return problem(
            StatusCode::UNAUTHORIZED,
            format!(
                "this takes a principal's token (`Authorization: Bearer`) holding the scope; {refused}"
            ),
        );
    }
    problem(StatusCode::FORBIDDEN, refused)
}

/// The credentials of `Authorization: Bearer X`; the scheme is case-insensitive (RFC 7235).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn loopback_host(host: &str) -> bool {
    let name = host_name(host);
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The one answer to "may this caller do this here": [`crate::access::authorize`],
/// and for a scope that changes who may act, its audit line, allowed or
/// refused, written before the answer. An audit line that cannot be
/// written refuses (fail closed).
pub(crate) fn allow(
    s: &AppState,
    caller: &Caller,
    scope: Scope,
    runbook: Option<&str>,
    tier: Option<u8>,
    what: &str,
) -> Result<(), Box<Response>> {
    allow_unless(s, caller, scope, runbook, tier, what, None, "api")
}

/// [`allow`], refused for `veto` too (a rule of the runbook's, such as
/// four eyes) when the scope alone allows it: one decision, one line,
/// which names the door it came through (`via`: `api`, `slack`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn allow_unless(
    s: &AppState,
    caller: &Caller,
    scope: Scope,
    runbook: Option<&str>,
    tier: Option<u8>,
    what: &str,
    veto: Option<String>,
    via: &'static str,
) -> Result<(), Box<Response>> {
    let decided =
        crate::access::authorize(caller, scope, runbook, tier).and_then(|()| match veto {
            None => Ok(()),
            Some(why) => Err(crate::access::Refused {
                principal: caller.name().to_string(),
                token_id: caller.token_id.clone(),
                why,
            }),
        });
    if scope.audited() {
        let line = crate::audit::AccessDecision {
            caller,
            scope,
            runbook,
            what,
            via,
            refused: decided.as_ref().err().map(|r| r.why.clone()),
        };
        if let Err(e) = s.audit.access(&line) {
            return Err(no(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the decision could not be audited, so nothing was done: {e}; retry"),
            ));
        }
    }
    decided.map_err(|r| Box::new(refuse(caller, r)))
}

/// [`problem`], boxed: what a check that refuses returns.
pub(super) fn no(status: StatusCode, reason: impl std::fmt::Display) -> Box<Response> {
    Box::new(problem(status, reason))
}

fn problem(status: StatusCode, reason: impl std::fmt::Display) -> Response {
    (status, axum::Json(json!({ "error": reason.to_string() }))).into_response()
}

async fn metrics(State(s): State<AppState>) -> Response {
    let seen = s.metrics.audit_write_failures.get();
    let now = s.audit.failures();
    if now > seen {
        s.metrics.audit_write_failures.inc_by(now - seen);
    }
    let (seen, now) = (s.metrics.audit_syncs.get(), s.audit.syncs());
    if now > seen {
        s.metrics.audit_syncs.inc_by(now - seen);
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
    if let Some(why) = s.scheduler.state().unhealthy() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: the shared state (PostgreSQL) cannot be reached: {why}; no trigger is accepted and no call runs here until it can\n"),
        )
            .into_response();
    }
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

/// `GET /api/v1/runs?runbook=&host=&status=&since=&limit=`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RunsQuery {
    runbook: Option<String>,
    host: Option<String>,
    /// A verdict, `running`, `queued` or `interrupted` (`verdict` is the same).
    status: Option<String>,
    verdict: Option<String>,
    /// A duration back from now (`1h`, `7d`) or an RFC 3339 time.
    since: Option<String>,
    limit: Option<usize>,
}

/// The run history, from the audit log: every run of any process, across restarts.
async fn runs(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    query: Result<axum::extract::Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if !caller.holds(Scope::RunRead) {
        return refused_any(&caller, Scope::RunRead);
    }
    let q = match query {
        Ok(q) => q.0,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let since = match q.since.as_deref().map(crate::audit::runs::parse_since) {
        Some(Err(e)) => return problem(StatusCode::BAD_REQUEST, format!("since {e}")),
        Some(Ok(t)) => Some(t),
        None => None,
    };
    let filter = crate::audit::runs::Filter {
        runbook: q.runbook,
        host: q.host,
        status: q.status.or(q.verdict),
        since,
        limit: Some(q.limit.unwrap_or(500).min(10_000)),
    };
    let path = s.audit.path().to_path_buf();
    match tokio::task::spawn_blocking(move || crate::audit::runs::list(&path, &filter)).await {
        Ok(Ok(mut list)) => {
            list.retain(|r| caller.may(Scope::RunRead, &r.runbook));
            // As `GET /api/v1/runs/{id}` says it: a run whose verdict line
            // is written and whose report is a moment away is still running.
            for run in &mut list {
                if s.scheduler.reports.finishing(&run.run_id) {
                    run.status = "running".into();
                }
            }
            axum::Json(json!({ "runs": list })).into_response()
        }
        Ok(Err(e)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the audit log: {e}"),
        ),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `POST /api/v1/runs`: run a runbook now, through the daemon.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    runbook: String,
    /// The hosts to run it on; empty with `all_hosts`: every host it names.
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    all_hosts: bool,
    #[serde(default)]
    dry_run: bool,
}

/// Start runs as the scheduler decides every trigger: the kill switch,
/// one run per (runbook, host), cooldown and `max_concurrent_runs` hold.
/// Answers 202 with each host's outcome and the id of each run it started.
async fn start_runs(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    body: Bytes,
) -> Response {
    let body: StartBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!(
                    "expected {{\"runbook\": \"...\", \"hosts\": [\"...\"]}} or {{\"runbook\": \"...\", \"all_hosts\": true}}: {e}"
                ),
            );
        }
    };
    let config = s.config.borrow().clone();
    let Some(runbook) = config.runbooks.get(&body.runbook) else {
        return problem(
            StatusCode::NOT_FOUND,
            format!(
                "no runbook named {:?}",
                body.runbook.chars().take(64).collect::<String>()
            ),
        );
    };
    if let Err(refused) = allow(
        &s,
        &caller,
        Scope::RunTrigger,
        Some(&runbook.name),
        None,
        "run",
    ) {
        return *refused;
    }
    let hosts: Vec<String> = match (body.all_hosts, body.hosts.is_empty()) {
        (true, true) => runbook.hosts.iter().map(|h| h.to_string()).collect(),
        (false, false) => body.hosts,
        _ => {
            return problem(
                StatusCode::BAD_REQUEST,
                "give `hosts` or `all_hosts: true`, one of the two",
            );
        }
    };
    if let Some(h) = hosts.iter().find(|h| !runbook.allows_host(h)) {
        return problem(
            StatusCode::BAD_REQUEST,
            format!(
                "runbook {:?} does not name host {:?}",
                runbook.name,
                h.chars().take(64).collect::<String>()
            ),
        );
    }
    // A runbook's every host, for real: a rollout, wave by wave. A dry
    // run changes nothing, so it goes to every host at once and says the
    // waves a real one would take.
    let waves = runbook
        .rollout
        .as_ref()
        .filter(|_| body.all_hosts)
        .map(|_| crate::rollout::plan(&config, runbook));
    if waves.is_some() && !body.dry_run {
        return match s
            .rollouts
            .start(runbook, crate::origin::Trigger::Api, Vec::new())
            .await
        {
            Ok(status) => answer(
                StatusCode::ACCEPTED,
                json!({ "runbook": runbook.name, "rollout": status, "outcomes": [] }),
                None,
            ),
            Err(e @ crate::rollout::NotStarted::Unfinished(..)) => problem(StatusCode::CONFLICT, e),
            Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, format!("{e}; retry")),
        };
    }
    let reqs: Vec<RunRequest> = hosts
        .iter()
        .map(|h| RunRequest {
            runbook: runbook.name.clone(),
            host: h.clone(),
            dry_run: body.dry_run,
            trigger: crate::origin::Trigger::Api,
            alert: None,
            keys: Vec::new(),
            planner: Default::default(),
            together: None,
            agent: None,
            by: (!caller.builtin()).then(|| caller.name().to_string()),
        })
        .collect();
    match s.scheduler.submit_all(reqs).await {
        Ok(results) => {
            let pending = pending(&results).then(|| retry_why(&s));
            let outcomes: Vec<Value> = hosts
                .iter()
                .zip(results)
                .map(|(host, o)| {
                    json!({ "host": host, "result": o.result.as_str(), "run_id": o.run_id })
                })
                .collect();
            let mut body = json!({ "runbook": runbook.name, "outcomes": outcomes });
            if let Some(waves) = &waves {
                body["waves"] = json!(waves);
            }
            answer(StatusCode::ACCEPTED, body, pending)
        }
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the runs could not be recorded, so none started; retry: {e}"),
        ),
    }
}

/// `GET /api/v1/fleet/runs?runbook=&host=&limit=`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetRunsQuery {
    runbook: Option<String>,
    host: Option<String>,
    limit: Option<i64>,
}

/// Every replica's runs, from the shared state, newest first (each
/// replica's own audit log holds the detail).
async fn fleet_runs(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    query: Result<axum::extract::Query<FleetRunsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if !caller.holds(Scope::RunRead) {
        return refused_any(&caller, Scope::RunRead);
    }
    let q = match query {
        Ok(q) => q.0,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let limit = q.limit.unwrap_or(500).clamp(1, 10_000);
    match s
        .scheduler
        .state()
        .fleet_runs(q.runbook.as_deref(), q.host.as_deref(), limit)
        .await
    {
        Ok(Some(mut runs)) => {
            if let Some(list) = runs.as_array_mut() {
                list.retain(|r| {
                    r["runbook"]
                        .as_str()
                        .is_some_and(|rb| caller.may(Scope::RunRead, rb))
                });
            }
            axum::Json(json!({ "runs": runs })).into_response()
        }
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            "no shared state: runwarden.yaml sets no state.postgres, so this daemon's runs are all there is (GET /api/v1/runs)",
        ),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// One run as the history shows it, with its full report while this daemon
/// remembers it (`report`).
async fn run(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let path = s.audit.path().to_path_buf();
    let found = tokio::task::spawn_blocking(move || crate::audit::runs::one(&path, &id)).await;
    match found {
        Ok(Ok(Some(summary))) => {
            let may =
                crate::access::authorize(&caller, Scope::RunRead, Some(&summary.runbook), None);
            if let Err(r) = may {
                return refuse(&caller, r);
            }
            let mut v = serde_json::to_value(&summary).unwrap_or_default();
            if let Some(report) = s.scheduler.reports.get(&summary.run_id) {
                v["report"] = serde_json::to_value(report).unwrap_or_default();
            } else if s.scheduler.reports.finishing(&summary.run_id) {
                // Its verdict line is written and its report is a moment
                // away: it ends, for whoever polls, with its report.
                v["status"] = "running".into();
            }
            axum::Json(v).into_response()
        }
        Ok(Ok(None)) => problem(
            StatusCode::NOT_FOUND,
            "no run with that id in the audit log",
        ),
        Ok(Err(e)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the audit log: {e}"),
        ),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The token, if one is configured, was checked by [`guard`].
#[allow(
    clippy::expect_used,
    reason = "submit_all returns one result per request, in order"
)]
async fn alerts(
    State(s): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    query: axum::extract::RawQuery,
    body: Bytes,
) -> Response {
    if !caller.holds(Scope::RunTrigger) && !caller.holds(Scope::RunRead) {
        return refused_any(&caller, Scope::RunTrigger);
    }
    let plan = match plan_asked(query.0.as_deref()) {
        Ok(plan) => plan,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    let notification = match Notification::parse(&body) {
        Ok(n) => n,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e),
    };
    if plan {
        return plan_notification(&s, notification).await;
    }
    if !caller.holds(Scope::RunTrigger) {
        return refused_any(&caller, Scope::RunTrigger);
    }
    for a in &notification.alerts {
        let status = if a.status == "firing" {
            "firing"
        } else {
            "resolved"
        };
        s.metrics.alerts_received.with_label_values(&[status]).inc();
    }
    let config = s.config.borrow().clone();
    // A runbook the caller may not start is out of its scope: recorded
    // and answered as such, and nothing starts.
    let candidates: Vec<_> = candidates(&notification, &config)
        .into_iter()
        .map(|c| {
            use crate::trigger::alerts::Candidate;
            let refused = match &c {
                Candidate::Run(r) => {
                    crate::access::authorize(&caller, Scope::RunTrigger, Some(&r.runbook), None)
                        .err()
                }
                _ => None,
            };
            match (c, refused) {
                (c @ Candidate::Run(_), Some(refused)) => Candidate::OutOfScope {
                    fingerprint: c.fingerprint().to_string(),
                    runbook: c.names().0.to_string(),
                    host: c.names().1.to_string(),
                    keys: c.names().2.to_vec(),
                    why: refused.to_string(),
                },
                (c, _) => c,
            }
        })
        .collect();
    // Every candidate goes to the scheduler, which counts and records each
    // once; the answer says what became of each, and why when it is known.
    let outcomes = match s.scheduler.submit_candidates(&candidates).await {
        Ok(outcomes) => outcomes,
        // Nothing was recorded and nothing starts: Alertmanager retries a 5xx.
        Err(e) => {
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the triggers could not be recorded, so no run started; retry: {e}"),
            );
        }
    };
    let pending = pending(&outcomes).then(|| retry_why(&s));
    let outcomes: Vec<Value> = candidates
        .iter()
        .zip(outcomes)
        .map(|(c, o)| {
            let (runbook, ..) = c.names();
            let mut outcome = json!({
                "runbook": runbook,
                "fingerprint": c.fingerprint(),
                "result": o.result.as_str(),
            });
            if let Some(id) = o.run_id {
                outcome["run_id"] = id.into();
            }
            if let Some(why) = c.why() {
                outcome["why"] = why.into();
            }
            outcome
        })
        .collect();
    // Resolved alerts end what their runs wait for (`on_resolved`).
    let withdrawn: Vec<Value> = s
        .scheduler
        .withdraw(&crate::trigger::alerts::resolved(&notification, &config))
        .await
        .into_iter()
        .map(|r| {
            json!({ "approval_id": r.id, "run_id": r.run_id, "runbook": r.runbook, "host": r.host })
        })
        .collect();
    let body: Value = json!({
        "alerts": notification.alerts.len(),
        "truncated_alerts": notification.truncated_alerts,
        "outcomes": outcomes,
        "withdrawn": withdrawn,
    });
    answer(StatusCode::OK, body, pending)
}

/// Whether a trigger of the batch met a run another replica has not yet
/// recorded ([`TriggerResult::Pending`](crate::rules::TriggerResult::Pending)).
fn pending(outcomes: &[crate::scheduler::Outcome]) -> bool {
    outcomes
        .iter()
        .any(|o| o.result == crate::rules::TriggerResult::Pending)
}

/// A batch's answer: `status` with its outcomes, or 503 with the same
/// outcomes when one of them is pending, so the sender sends the batch
/// again (Alertmanager does, with backoff). The others are duplicates of
/// themselves by then: nothing starts twice.
fn answer(status: StatusCode, mut body: Value, pending: Option<&'static str>) -> Response {
    let Some(why) = pending else {
        return (status, axum::Json(body)).into_response();
    };
    body["error"] = why.into();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        axum::Json(body),
    )
        .into_response()
}

/// Why a pending batch is to be sent again.
fn retry_why(s: &AppState) -> &'static str {
    if s.scheduler.stopping() {
        "this runwarden is shutting down and starts no new run; nothing of this request is lost if it is sent again (to another replica, or here once it is back): retry"
    } else {
        "a host is held by a run another replica admitted and has not yet recorded (it may have stopped); nothing of this request is lost if it is sent again: retry"
    }
}

/// Whether `POST /api/v1/alerts` is asked to plan only: `plan=1|true`
/// plans, `plan=0|false` (or no query) runs. Anything else is refused
/// rather than taken as a live notification: a `plan` of another value or
/// spelling (`plan=yes`, a bare `plan`, `PLAN=1`, `plan=1%00`), a repeated
/// `plan`, or a parameter the webhook does not take.
fn plan_asked(query: Option<&str>) -> Result<bool, BadQuery> {
    let mut plan = None;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if key != "plan" {
            return Err(BadQuery::Unknown(crate::text::one_line(&key)));
        }
        let asked = match value.as_ref() {
            "1" | "true" => true,
            "0" | "false" => false,
            other => return Err(BadQuery::NotABool(crate::text::one_line(other))),
        };
        if plan.replace(asked).is_some() {
            return Err(BadQuery::Twice);
        }
    }
    Ok(plan.unwrap_or(false))
}

/// Why the webhook's query is refused (400, and nothing is started).
#[derive(Debug, thiserror::Error)]
enum BadQuery {
    /// A parameter other than `plan` (shown on one line).
    #[error(
        "unknown query parameter {0:?}: the webhook takes only plan=true or plan=false; nothing was started"
    )]
    Unknown(String),
    /// `plan` of another value or spelling.
    #[error(
        "plan={0:?} is neither true nor false (plan=true plans, plan=false or no plan runs); nothing was started"
    )]
    NotABool(String),
    /// `plan` twice.
    #[error("plan is given twice; nothing was started")]
    Twice,
}

/// What a notification would do here, each run it would start planned
/// through the real gate, as `runwarden alerts test --plan` says it:
/// nothing is recorded, counted or started, so a pipeline can test
/// Alertmanager's routing against the daemon before deploying it.
async fn plan_notification(s: &AppState, n: Notification) -> Response {
    let config = s.config.borrow().clone();
    let killswitch = s
        .scheduler
        .state()
        .kill_switch(&config.settings.kill_switch_dir);
    let demotions = s.scheduler.state().demotions(&config.settings);
    let answer = tokio::task::spawn_blocking(move || {
        let record = crate::audit::runs::recovery(&config.settings.audit_log)?;
        Ok::<_, std::io::Error>(crate::plan::notification(
            &n,
            &config,
            &killswitch,
            &demotions,
            &record,
            true,
        ))
    })
    .await;
    match answer {
        Ok(Ok(v)) => (StatusCode::OK, axum::Json(v)).into_response(),
        Ok(Err(e)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the audit log for cooldowns: {e}"),
        ),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod authority_tests {
    use super::one_authority;

    #[test]
    fn a_host_header_is_one_name_and_port() {
        for ok in [
            "127.0.0.1:9184",
            "localhost",
            "web-01.example:80",
            "[::1]:9184",
            "[::1]",
        ] {
            assert!(one_authority(ok), "{ok}");
        }
        for bad in [
            "",
            "a:9184, evil.example",
            "a:9184,evil.example",
            "a:9184 evil.example",
            "user@a:9184",
            "a:",
            "a:x",
            "a:1:2",
            "[::1",
            "[]:1",
            "[::1]x",
        ] {
            assert!(!one_authority(bad), "{bad:?}");
        }
    }
}

//! The daemon's `/mcp`: MCP's streamable HTTP transport, behind a bearer
//! token of its own (`mcp_token_file`; without one the endpoint is not
//! there, 404).
//!
//! The runbook and host are chosen by the URL the client is given,
//! `/mcp?runbook=R&host=H`, read on the session's first request. A
//! session is one run, started through the scheduler as any trigger is
//! (the kill switch, cooldown, `max_runs`, the run lock, the concurrency
//! limit); it ends when the client deletes the session, when it has been
//! idle for `mcp_idle_timeout` (no request open, none for that long; see
//! [`Endpoint`]), at the run's `max_duration`, or with the
//! daemon (the run then ends as any run does at a stop).
//!
//! No client can grow the daemon without bound: at most `mcp_max_sessions`
//! sessions are open (a handshake past them is answered 429 with
//! `Retry-After`), a session that has made no tool call ends
//! `mcp_handshake_timeout` after its handshake (a client that opens a
//! session per call and never closes it), and `Host` must name the daemon
//! (`mcp_allowed_hosts`; checked by the daemon's router), which DNS
//! rebinding cannot. Sessions need the
//! handshake: this endpoint speaks the revisions up to 2025-11-25, whose
//! sessions carry `Mcp-Session-Id`; the 2026-07-28 revision has no session
//! over HTTP to hold a run (on stdio it is served as well).

use std::borrow::Cow;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, InitializeRequestParams, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use tokio::sync::watch;

use super::{NoRun, Server, Session, Started, Starter};
use crate::config::Config;
use crate::rules::TriggerResult;
use crate::scheduler::Scheduler;

/// The tower service behind `/mcp`.
type Service = StreamableHttpService<HttpSession, LocalSessionManager>;

/// What every session of the daemon's `/mcp` shares.
pub(crate) struct Daemon {
    /// The configuration in force (a session takes it as it stands at its start).
    pub(crate) config: watch::Receiver<Arc<Config>>,
    /// Where its run is started.
    pub(crate) scheduler: Arc<Scheduler>,
    /// `runwarden_mcp_sessions_open`.
    pub(crate) open: prometheus::IntGauge,
    /// `runwarden_mcp_sessions_refused_total`.
    pub(crate) refused: prometheus::IntCounterVec,
}

/// `/mcp`: MCP's streamable HTTP transport, and when each session was
/// last heard from.
///
/// A session ends `idle` after its client's last request ended with no
/// other request of its still open. The transport's own keep-alive is not
/// used: it counts what the server sends too, so a call waiting for a
/// person (its progress every 2 s) would keep a session whose client is
/// gone alive until someone decided, and a change would be made for
/// nobody. A disconnect alone does not end a session (the protocol lets a
/// client come back to its stream).
#[derive(Clone)]
pub(crate) struct Endpoint {
    service: Service,
    sessions: Arc<LocalSessionManager>,
    seen: Traffic,
    idle: Duration,
    limits: crate::config::McpLimits,
    daemon: Arc<Daemon>,
    /// Handshakes being answered now: counted with the open sessions
    /// against `max_sessions`, so a burst cannot overshoot it.
    handshaking: Arc<std::sync::atomic::AtomicUsize>,
}

/// Each session's traffic, by session id.
type Traffic = Arc<Mutex<HashMap<String, Seen>>>;

/// A session's traffic: its requests still open, when the last ended,
/// when it began and whether it has made a tool call.
struct Seen {
    open: usize,
    last: Instant,
    born: Instant,
    called: bool,
}

/// Build `/mcp` within `limits`; its idle sessions, and those that make
/// no call after their handshake, are ended from now on.
pub(crate) fn endpoint(
    daemon: Arc<Daemon>,
    idle: Duration,
    limits: crate::config::McpLimits,
) -> Endpoint {
    let seen: Traffic = Default::default();
    let mut config = SessionConfig::default();
    config.keep_alive = None;
    let mut sessions = LocalSessionManager::default();
    sessions.session_config = config;
    let sessions = Arc::new(sessions);
    let http = StreamableHttpServerConfig::default()
        // The daemon's own guard answers for who may call (the bearer
        // token); its listener may be any address the operator chose.
        .disable_allowed_hosts()
        .with_legacy_session_mode(true);
    let (factory, traffic) = (daemon.clone(), seen.clone());
    let service = StreamableHttpService::new(
        move || {
            factory.open.inc();
            Ok(HttpSession {
                daemon: factory.clone(),
                bound: OnceLock::new(),
                seen: traffic.clone(),
            })
        },
        sessions.clone(),
        http,
    );
    let endpoint = Endpoint {
        service,
        sessions,
        seen,
        idle,
        limits,
        daemon,
        handshaking: Default::default(),
    };
    tokio::spawn(endpoint.clone().reap());
    endpoint
}

impl Endpoint {
    /// Serve one request of `/mcp` (its caller has checked the token).
    pub(crate) async fn handle(&self, req: axum::extract::Request) -> axum::response::Response {
        let delete = req.method() == axum::http::Method::DELETE;
        let asked = session_of(req.headers());
        if let Some(id) = &asked {
            self.opened(id);
        }
        // A request naming no session is a handshake: a new session.
        let handshake = match asked.is_none() && req.method() == axum::http::Method::POST {
            true => match Handshake::begin(self) {
                Some(counted) => Some(counted),
                None => return self.full(),
            },
            false => None,
        };
        let mut service = self.service.clone();
        let resp = match tower_service::Service::call(&mut service, req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
        drop(handshake);
        let id = match asked {
            Some(id) => Some(id),
            // The handshake's answer names the new session.
            None => session_of(resp.headers()).inspect(|id| self.opened(id)),
        };
        let (mut parts, body) = resp.into_parts();
        // A session ended by its client is done, not queued: 204, which
        // clients take for a clean end (they log 202 as a failure).
        if delete && parts.status == axum::http::StatusCode::ACCEPTED {
            parts.status = axum::http::StatusCode::NO_CONTENT;
        }
        let body = match id {
            Some(id) => axum::body::Body::new(Watched {
                inner: axum::body::Body::new(body),
                _open: Open {
                    seen: self.seen.clone(),
                    id,
                },
            }),
            None => axum::body::Body::new(body),
        };
        axum::response::Response::from_parts(parts, body)
    }

    fn opened(&self, id: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let s = seen.entry(id.to_string()).or_insert(Seen {
            open: 0,
            last: Instant::now(),
            born: Instant::now(),
            called: false,
        });
        s.open += 1;
    }

    /// 429 with `Retry-After`: `mcp_max_sessions` are open.
    fn full(&self) -> axum::response::Response {
        self.daemon.refused.with_label_values(&["sessions"]).inc();
        let body = serde_json::json!({
            "error": format!(
                "{} MCP sessions are open, as many as mcp_max_sessions allows: end one (DELETE its session) or retry later",
                self.limits.max_sessions
            ),
        });
        let mut resp = axum::response::IntoResponse::into_response((
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            axum::Json(body),
        ));
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("5"),
        );
        resp
    }

    /// End every session (the daemon is stopping): their streams end, so
    /// the listener's connections can finish.
    pub(crate) async fn close_all(&self) {
        let ids: Vec<String> = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.drain().map(|(id, _)| id).collect()
        };
        for id in ids {
            let sid: rmcp::transport::streamable_http_server::session::SessionId =
                id.as_str().into();
            let _ = self.sessions.close_session(&sid).await;
        }
    }

    /// End the sessions idle for longer than `idle`, and those with no
    /// tool call `handshake_timeout` after their handshake; forget those gone.
    async fn reap(self) {
        let shortest = self.idle.min(self.limits.handshake_timeout);
        let every = (shortest / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
        loop {
            tokio::time::sleep(every).await;
            let ending: Vec<(String, bool)> = {
                let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                seen.iter()
                    .filter_map(|(id, s)| {
                        let idle = s.open == 0 && s.last.elapsed() >= self.idle;
                        let silent = s.open == 0
                            && !s.called
                            && s.born.elapsed() >= self.limits.handshake_timeout;
                        (idle || silent).then(|| (id.clone(), !idle))
                    })
                    .collect()
            };
            for (id, silent) in ending {
                let sid: rmcp::transport::streamable_http_server::session::SessionId =
                    id.as_str().into();
                if self.sessions.has_session(&sid).await.unwrap_or(false) {
                    if silent {
                        tracing::info!(session = %id, "MCP session made no tool call within {:?} of its handshake: ended", self.limits.handshake_timeout);
                        self.daemon
                            .refused
                            .with_label_values(&["handshake_timeout"])
                            .inc();
                    } else {
                        tracing::info!(session = %id, "MCP session idle for {:?}: ended", self.idle);
                    }
                    let _ = self.sessions.close_session(&sid).await;
                }
                self.seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
            }
        }
    }
}

/// A handshake being answered: counted against `max_sessions` until its
/// answer is out (by then its session is open, or it failed).
struct Handshake(Arc<std::sync::atomic::AtomicUsize>);

impl Handshake {
    /// Count a new handshake in; `None` when `max_sessions` are open.
    fn begin(endpoint: &Endpoint) -> Option<Handshake> {
        use std::sync::atomic::Ordering;
        let now = endpoint.handshaking.fetch_add(1, Ordering::AcqRel);
        let open = usize::try_from(endpoint.daemon.open.get()).unwrap_or(0);
        let ticket = Handshake(endpoint.handshaking.clone());
        (open + now < endpoint.limits.max_sessions).then_some(ticket)
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The session a request or an answer names (`Mcp-Session-Id`).
fn session_of(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

/// One request of a session still open: counted until its answer's body
/// is done with (sent whole, or dropped as its client went away).
struct Open {
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    id: String,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = seen.get_mut(&self.id) {
            s.open = s.open.saturating_sub(1);
            s.last = Instant::now();
        }
    }
}

/// An answer's body, with its request counted open while it is read.
struct Watched {
    inner: axum::body::Body,
    _open: Open,
}

impl hyper::body::Body for Watched {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// One session of `/mcp`: bound to a runbook and host by its first request.
pub(crate) struct HttpSession {
    daemon: Arc<Daemon>,
    bound: OnceLock<Result<Server, NoRun>>,
    /// The endpoint's traffic, where a tool call marks its session as one
    /// that has made a call (`mcp_handshake_timeout` no longer applies).
    seen: Traffic,
}

impl Drop for HttpSession {
    fn drop(&mut self) {
        self.daemon.open.dec();
        // The session is gone: its run ends once it has taken what was asked.
        if let Some(Ok(server)) = self.bound.get() {
            let session = server.0.clone();
            tokio::spawn(async move {
                session.close().await;
            });
        }
    }
}

impl HttpSession {
    /// The session's server, bound on its first request to what its URL
    /// names (`?runbook=R&host=H`), or why it cannot be.
    fn server(&self, context: &RequestContext<RoleServer>) -> Result<Server, McpError> {
        let bound = self.bound.get_or_init(|| {
            let parts = context.extensions.get::<axum::http::request::Parts>();
            let query = parts.and_then(|p| p.uri.query()).unwrap_or("");
            bind(&self.daemon, query)
        });
        bound
            .clone()
            .map_err(|why| McpError::invalid_params(why.to_string(), None))
    }
}

/// A session's server for what `query` names.
fn bind(daemon: &Arc<Daemon>, query: &str) -> Result<Server, NoRun> {
    let mut runbook = None;
    let mut host = None;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "runbook" => runbook = Some(v.into_owned()),
            "host" => host = Some(v.into_owned()),
            _ => {}
        }
    }
    let (Some(runbook), Some(host)) = (runbook, host) else {
        return Err(NoRun::Unnamed);
    };
    let shown = crate::tools::args::shown;
    let config = daemon.config.borrow().clone();
    let Some(rb) = config.runbooks.get(&runbook).cloned() else {
        return Err(NoRun::NoRunbook(shown(&runbook)));
    };
    if !rb.allows_host(&host) {
        return Err(NoRun::NotItsHost {
            runbook: rb.name.clone(),
            host: shown(&host),
        });
    }
    let Some(host) = config.hosts.get(&host).cloned() else {
        return Err(NoRun::NoHost(shown(&host)));
    };
    let scheduler = daemon.scheduler.clone();
    let starter: Starter = Arc::new(move |req| {
        let scheduler = scheduler.clone();
        Box::pin(async move { start(scheduler, req).await })
    });
    Ok(Server(Arc::new(Session::new(rb, host, starter))))
}

/// Start a session's run as any trigger starts one: the scheduler decides
/// (kill switch, cooldown, `max_runs`, concurrency), and its report is
/// waited for once the session's calls end.
async fn start(
    scheduler: Arc<Scheduler>,
    req: crate::trigger::RunRequest,
) -> Result<Started, NoRun> {
    let outcomes = scheduler
        .submit_all(vec![req])
        .await
        .map_err(|e| NoRun::NotRecorded(e.to_string()))?;
    let Some(outcome) = outcomes.into_iter().next() else {
        return Err(NoRun::NotAdmitted("the scheduler decided nothing"));
    };
    let why = match outcome.result {
        TriggerResult::Started => {
            if let Some(run_id) = outcome.run_id {
                let id = run_id.clone();
                let ended = Box::pin(async move {
                    scheduler
                        .reports
                        .ended(&id)
                        .await
                        .map_err(|e| NoRun::NoReport(e.to_string()))
                });
                return Ok(Started { run_id, ended });
            }
            "the scheduler gave it no run id"
        }
        TriggerResult::KillSwitch => "the kill switch is engaged",
        TriggerResult::Deduplicated => {
            "a run of this runbook on this host is going (another session's, or a trigger's): one at a time; try again when it has ended"
        }
        TriggerResult::Cooldown => "the runbook ran on this host within its cooldown",
        TriggerResult::Capped => {
            "the runbook ran on this host as often as its max_runs allows: a person should look first"
        }
        TriggerResult::Pending => {
            "every run slot of this replica is busy (max_concurrent_runs), or runwarden is stopping; try again"
        }
        TriggerResult::OutOfScope | TriggerResult::NoMatch | TriggerResult::Invalid => {
            "the runbook or host is no longer in the configuration"
        }
    };
    Err(NoRun::NotAdmitted(why))
}

impl ServerHandler for HttpSession {
    fn get_info(&self) -> ServerConfig {
        match self.bound.get() {
            Some(Ok(server)) => server.get_info(),
            _ => Server::info_unbound(),
        }
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(HANDSHAKE_VERSIONS)
    }

    /// The session is bound at its handshake, so a URL that names no
    /// runbook, or one not there, is refused at once with why.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        self.server(&context)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let server = self.server(&context)?;
        server.list_tools(request, context).await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let server = self.server(&context)?;
        let id = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| session_of(&p.headers));
        if let Some(id) = id
            && let Some(s) = self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(&id)
        {
            s.called = true;
        }
        server.call_tool(request, context).await
    }

    async fn on_initialized(&self, _context: NotificationContext<RoleServer>) {}
}

/// The revisions with an `initialize` handshake, whose sessions hold a run.
const HANDSHAKE_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2024_11_05,
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
];

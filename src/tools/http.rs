//! `http_check`: GET a loopback health-check URL named by the host file.

use std::time::{Duration, Instant};

use serde_json::json;

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::registry::{Allowed, Tier, Tool};
use super::{Ctx, ToolResult};
use crate::host::Host;
use crate::process::Argv;

/// Hard timeout of one check (the call's deadline may cut it shorter).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of the body kept as an excerpt.
const EXCERPT: usize = 512;

pub(crate) async fn check(ctx: &Ctx<'_>, name: &str) -> ToolResult {
    let url = &ctx.host.health_checks[name];
    let until = (tokio::time::Instant::now() + CHECK_TIMEOUT).min(ctx.deadline);
    let mut data = probe(url, until).await;
    data["name"] = json!(name);
    ToolResult::observed(data)
}

/// One GET; the result says `healthy` (2xx) or why not. Never follows redirects:
/// a redirect could lead off the loopback interface.
pub(crate) async fn probe(url: &str, until: tokio::time::Instant) -> serde_json::Value {
    let started = Instant::now();
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
    {
        Ok(c) => c,
        Err(e) => return json!({ "url": url, "healthy": false, "error": e.to_string() }),
    };
    let attempt = async {
        let mut resp = client.get(url).send().await?;
        let status = resp.status();
        let mut body = Vec::new();
        let mut cut = false;
        while let Some(chunk) = resp.chunk().await? {
            let room = EXCERPT.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if chunk.len() > room {
                cut = true;
                break;
            }
        }
        Ok::<_, reqwest::Error>((status, body, cut))
    };
    match tokio::time::timeout_at(until, attempt).await {
        Ok(Ok((status, body, cut))) => json!({
            "url": url,
            "healthy": status.is_success(),
            "status": status.as_u16(),
            "latency_ms": started.elapsed().as_millis() as u64,
            "body_excerpt": String::from_utf8_lossy(&body),
            "body_truncated": cut,
        }),
        Ok(Err(e)) => json!({
            "url": url,
            "healthy": false,
            "error": crate::error_chain(&e),
            "latency_ms": started.elapsed().as_millis() as u64,
        }),
        Err(_) => json!({
            "url": url,
            "healthy": false,
            "error": format!("no answer within {} ms", started.elapsed().as_millis()),
            "latency_ms": started.elapsed().as_millis() as u64,
        }),
    }
}

/// What an `http_check` result said, in a person's words.
pub(super) fn said(data: &serde_json::Value) -> String {
    format!(
        "{} {} in {} ms{}",
        if data["healthy"] == true {
            "healthy"
        } else {
            "UNHEALTHY"
        },
        data["status"],
        data["latency_ms"],
        data["error"]
            .as_str()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    )
}

/// `http_check`: one GET of an allowed loopback health check.
pub(crate) struct HttpCheck;

impl Tool for HttpCheck {
    const NAME: &'static str = "http_check";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str = "GET an allowed loopback health-check URL with a hard timeout: healthy, status, latency, body excerpt.";
    type Args = NameArgs;
    type Resolved = String;

    fn allowed(host: &Host) -> Vec<(&'static str, Allowed)> {
        vec![(
            "name",
            Allowed::OneOf(host.health_checks.keys().cloned().collect()),
        )]
    }

    fn resolve(a: NameArgs, host: &Host, _: PathMode) -> Result<String, ArgError> {
        allowed_key(&a.name, &host.health_checks, "health_checks")
    }

    fn args_json(name: &String) -> serde_json::Value {
        json!({ "name": name })
    }

    fn argv(_: &String, _: &Host) -> Vec<Argv> {
        Vec::new()
    }

    async fn run(ctx: &Ctx<'_>, name: &String) -> ToolResult {
        check(ctx, name).await
    }

    fn said(data: &serde_json::Value) -> Option<String> {
        Some(said(data))
    }
}

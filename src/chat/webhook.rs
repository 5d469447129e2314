//! The approval webhook: each request, as the API shows it, POSTed to
//! `approval_webhook` with what a bridge needs to act on it and to trust
//! it came from runwarden.
//!
//! The body is the request's JSON, plus `event` (`opened` or `settled`)
//! and `links` (`approve`, `deny`, `show`: the API's own URLs under
//! `external_url`, which take a principal's token holding `approve`, so a
//! link that leaks approves nothing). With `approval_webhook_secret_file`
//! each POST is signed as [`crate::hmac`] says: `X-Runwarden-Timestamp`
//! (Unix seconds) and `X-Runwarden-Signature: v1=HEX`, the HMAC-SHA256 of
//! `v1:TIMESTAMP:BODY`. The secret is read at each POST (a rotation needs
//! no reload); when it cannot be read, nothing is sent unsigned.

use std::path::PathBuf;

use super::Event;
use crate::config::Settings;
use crate::gate::approvals::Request;

/// The header of the signature.
pub(crate) const SIGNATURE: &str = "x-runwarden-signature";
/// The header of the timestamp it signs.
pub(crate) const TIMESTAMP: &str = "x-runwarden-timestamp";

/// Where, and how signed.
#[derive(Debug, Clone)]
pub(crate) struct Hook {
    url: String,
    secret_file: Option<PathBuf>,
    /// The daemon's URL as people reach it (the links' base).
    base: String,
}

impl Hook {
    /// The webhook `settings` name, at `url`.
    pub(crate) fn of(settings: &Settings, url: String) -> Hook {
        Hook::new(
            url,
            settings.approval_webhook_secret_file.clone(),
            external_url(settings),
        )
    }

    /// The webhook at `url`, signed with `secret_file`, its links under `base`.
    pub(crate) fn new(url: String, secret_file: Option<PathBuf>, base: String) -> Hook {
        Hook {
            url,
            secret_file,
            base,
        }
    }

    /// The body a bridge receives.
    pub(crate) fn body(&self, event: Event, request: &Request) -> serde_json::Value {
        let mut body = serde_json::to_value(request).unwrap_or_default();
        let at = format!("{}/api/v1/approvals/{}", self.base, request.id);
        body["event"] = event.name().into();
        body["links"] = serde_json::json!({
            "approve": format!("{at}/approve"),
            "deny": format!("{at}/deny"),
            "show": at,
        });
        body
    }

    /// One POST; its answer changes nothing.
    pub(crate) async fn post(&self, event: Event, request: &Request) {
        let body = serde_json::to_vec(&self.body(event, request)).unwrap_or_default();
        let mut post = client()
            .post(&self.url)
            .header("content-type", "application/json");
        if let Some(file) = &self.secret_file {
            let secret = match crate::secret::read_token(file, "approval_webhook_secret_file") {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(approval_id = %request.id, "approval webhook not sent: {e}");
                    return;
                }
            };
            let now = jiff::Timestamp::now().as_second();
            post = post.header(TIMESTAMP, now.to_string()).header(
                SIGNATURE,
                crate::hmac::sign(secret.as_bytes(), "v1", now, &body),
            );
        }
        if let Err(e) = post
            .body(body)
            .send()
            .await
            .and_then(|r| r.error_for_status())
        {
            // The URL may carry a token: name only its host.
            let host = reqwest::Url::parse(&self.url)
                .ok()
                .and_then(|u| u.host_str().map(String::from))
                .unwrap_or_default();
            tracing::warn!(
                approval_id = %request.id,
                "approval webhook at {host}: {}",
                crate::error_chain(&e.without_url())
            );
        }
    }
}

/// How people reach the daemon: `external_url`, else `http://LISTEN`.
pub(crate) fn external_url(settings: &Settings) -> String {
    settings
        .external_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", settings.listen))
}

/// A client for outgoing messages: short timeouts, so a chat that hangs
/// holds one background task, never a run.
pub(crate) fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(5))
                .connect_timeout(std::time::Duration::from_secs(3))
                .build()
                .unwrap_or_default()
        })
        .clone()
}

//! The settings that name another system runwarden talks to: Prometheus
//! (`done_when`), PostgreSQL (shared state) and Slack (`chat.slack`). Each
//! is an address and a secret file beside the configuration, checked the
//! same way: an http(s) URL, a file resolved against the config directory.

use std::path::Path;
use std::time::Duration;

use super::diag::Diagnostics;
use super::{PostgresSettings, duration, raw};

/// `prometheus:`: an http(s) URL, a token file beside the config, a timeout.
pub(super) fn prometheus(
    raw: &raw::Prometheus,
    dir: &Path,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<crate::prometheus::Endpoint> {
    let url = match reqwest::Url::parse(&raw.url.value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => url,
        _ => {
            diags.at(
                file,
                raw.url.referenced,
                format!(
                    "prometheus.url \"{}\" is not an http(s) URL; write e.g. http://127.0.0.1:9090",
                    raw.url.value
                ),
            );
            return None;
        }
    };
    let timeout = match &raw.timeout {
        Some(t) => duration(t, "prometheus.timeout", file, diags)?,
        None => Duration::from_secs(10),
    };
    Some(crate::prometheus::Endpoint {
        url,
        bearer_token_file: raw.bearer_token_file.as_ref().map(|f| dir.join(&f.value)),
        timeout,
    })
}

/// `state.postgres:`, the shared state, if the settings name one.
pub(super) fn postgres(
    settings: &raw::Settings,
    dir: &Path,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<PostgresSettings> {
    settings
        .state
        .as_ref()
        .and_then(|s| s.postgres.as_ref())
        .map(|pg| PostgresSettings {
            url_file: dir.join(&pg.url_file.value),
            ca_file: pg.ca_file.as_ref().map(|f| dir.join(&f.value)),
            lease: pg
                .lease
                .as_ref()
                .and_then(|l| duration(l, "state.postgres.lease", file, diags))
                .filter(|l| {
                    let ok = (Duration::from_secs(3)..=Duration::from_secs(600)).contains(l);
                    if !ok && let Some(at) = &pg.lease {
                        diags.at(file, at.referenced, "state.postgres.lease must be between 3s and 10m: a shorter one expires between two renewals, a longer one keeps a dead replica's runs for that long");
                    }
                    ok
                })
                .unwrap_or(Duration::from_secs(15)),
        })
}

/// `chat.slack:`: its files resolved, its URL an http(s) one.
pub(super) fn slack(
    settings: &raw::Settings,
    dir: &Path,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<super::SlackSettings> {
    let s = settings.chat.as_ref()?.slack.as_ref()?;
    let at = s.referenced;
    let s = &s.value;
    let api_url = match &s.api_url {
        None => "https://slack.com/api".to_string(),
        Some(u) => {
            if !reqwest::Url::parse(&u.value).is_ok_and(|url| url.scheme().starts_with("http")) {
                diags.at(
                    file,
                    u.referenced,
                    format!("chat.slack.api_url \"{}\" is not an http(s) URL", u.value),
                );
            }
            u.value.trim_end_matches('/').to_string()
        }
    };
    if s.channel.value.trim().is_empty() {
        diags.at(
            file,
            at,
            "chat.slack.channel is empty: name the channel's id (C0123ABCD)",
        );
    }
    Some(super::SlackSettings {
        signing_secret_file: dir.join(&s.signing_secret_file.value),
        bot_token_file: dir.join(&s.bot_token_file.value),
        channel: s.channel.value.clone(),
        api_url,
    })
}

//! `model:` in runwarden.yaml: where the model planner sends its requests.
//!
//! The API key is never part of the configuration value: only where to read
//! it from (an environment variable or a file), and it is read when a request
//! is made. Nothing that prints a [`ModelEndpoint`] can print the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::diag::Diagnostics;
use super::{duration, raw};
use crate::secret::SecretError;

/// The model planner's endpoint, from `model:` in runwarden.yaml.
#[derive(Debug, Clone)]
pub(crate) struct ModelEndpoint {
    /// Base URL of an OpenAI-compatible API, e.g. `http://127.0.0.1:11434/v1`.
    pub(crate) endpoint: reqwest::Url,
    /// The model name sent with each request (a runbook's `agent.model` overrides it).
    pub(crate) name: String,
    /// Where the API key is read from, when the endpoint needs one (never the key itself).
    pub(crate) api_key: Option<ApiKey>,
    /// How long the model may take to start answering a request (reading
    /// its prompt: a CPU reads a long one slowly).
    pub(crate) timeout: Duration,
    /// How long it may then go silent between two chunks of its answer: a
    /// model still writing is never cut off, one that went quiet is.
    pub(crate) idle_timeout: Duration,
    /// Sampling temperature sent with each request.
    pub(crate) temperature: f32,
    /// Retries on 429, 5xx, timeouts and refused connections, with backoff.
    pub(crate) retries: u32,
    /// Most tokens one answer may have, sent as the request's `max_tokens`:
    /// a model that keeps writing is stopped by its endpoint, where no
    /// timeout can tell it from one that is slow.
    pub(crate) max_tokens: u32,
}

/// `model.max_tokens` when runwarden.yaml does not set it: room for a
/// call's arguments or a final answer of a page, not for an essay.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 1024;

/// Where the API key lives.
#[derive(Debug, Clone)]
pub(crate) enum ApiKey {
    /// An environment variable's name.
    Env(String),
    /// A file holding the key.
    File(PathBuf),
}

impl ApiKey {
    /// Read the key now. The error names the source, never the value.
    pub(crate) fn read(&self) -> Result<String, SecretError> {
        let key = match self {
            ApiKey::Env(var) => std::env::var(var).map_err(|_| SecretError::Unset {
                setting: "model.api_key_env",
                var: var.clone(),
            })?,
            ApiKey::File(path) => crate::secret::read_file(path, "model.api_key_file")?,
        };
        let key = key.trim().to_string();
        crate::secret::hold(&key);
        if key.is_empty() || key.chars().any(char::is_control) {
            return Err(SecretError::NotOneLine(match self {
                ApiKey::Env(var) => format!("model.api_key_env {var}"),
                ApiKey::File(p) => format!("model.api_key_file {}", p.display()),
            }));
        }
        Ok(key)
    }
}

pub(super) fn validate(
    raw: &raw::Model,
    file: &Path,
    dir: &Path,
    diags: &mut Diagnostics,
) -> Option<ModelEndpoint> {
    let before = diags.len();
    let endpoint = match reqwest::Url::parse(raw.endpoint.value.trim_end_matches('/')) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Some(u),
        _ => {
            diags.at(
                file,
                raw.endpoint.referenced,
                format!(
                    "model.endpoint \"{}\" is not an http(s) URL; write the API's base URL, e.g. http://127.0.0.1:11434/v1",
                    raw.endpoint.value
                ),
            );
            None
        }
    };
    if let Some(u) = &endpoint
        && (!u.username().is_empty() || u.password().is_some())
    {
        diags.at(
            file,
            raw.endpoint.referenced,
            "model.endpoint carries credentials; put the key in api_key_file or api_key_env",
        );
    }
    if raw.name.value.trim().is_empty() {
        diags.at(file, raw.name.referenced, "model.name is empty");
    }
    let api_key = match (&raw.api_key_env, &raw.api_key_file) {
        (Some(_), Some(f)) => {
            diags.at(
                file,
                f.referenced,
                "set one of model.api_key_env and model.api_key_file, not both",
            );
            None
        }
        (Some(v), None) => Some(ApiKey::Env(v.value.clone())),
        (None, Some(f)) => Some(ApiKey::File(dir.join(&f.value))),
        (None, None) => None,
    };
    let timeout = raw
        .timeout
        .as_ref()
        .and_then(|t| duration(t, "model.timeout", file, diags))
        .unwrap_or(Duration::from_secs(60));
    let idle_timeout = raw
        .idle_timeout
        .as_ref()
        .and_then(|t| duration(t, "model.idle_timeout", file, diags))
        .unwrap_or(Duration::from_secs(30));
    let temperature = raw.temperature.as_ref().map_or(0.1, |t| {
        if !(0.0..=2.0).contains(&t.value) {
            diags.at(
                file,
                t.referenced,
                "model.temperature must be between 0 and 2",
            );
        }
        t.value
    });
    let retries = raw.retries.as_ref().map_or(3, |r| {
        if r.value > 10 {
            diags.at(file, r.referenced, "model.retries must be at most 10");
        }
        r.value
    });
    let max_tokens = raw.max_tokens.as_ref().map_or(DEFAULT_MAX_TOKENS, |m| {
        if !(16..=32768).contains(&m.value) {
            diags.at(
                file,
                m.referenced,
                "model.max_tokens must be between 16 and 32768 (tokens of one answer)",
            );
        }
        m.value
    });
    if diags.len() != before {
        return None;
    }
    Some(ModelEndpoint {
        endpoint: endpoint?,
        name: raw.name.value.clone(),
        api_key,
        timeout,
        idle_timeout,
        temperature,
        retries,
        max_tokens,
    })
}

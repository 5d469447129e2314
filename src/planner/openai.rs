//! The model endpoint's wire format: OpenAI-compatible
//! `POST {endpoint}/chat/completions` with `tools` and `tool_calls`, which
//! Ollama's `/v1`, llama.cpp's server, vLLM, LM Studio and hosted APIs speak.
//!
//! Everything here treats the endpoint as unreliable: replies are size-capped
//! before they are parsed, 429/5xx/timeouts are retried with backoff inside
//! the run's time budget, and every failure is an error string that names the
//! endpoint and the HTTP status, never the API key.
//!
//! One file: the request, the streamed reply and its retries are one
//! conversation with one endpoint, bounded by one budget; its wire types
//! are private to it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::ModelEndpoint;
use crate::metrics::Metrics;

/// Replies larger than this are refused unparsed (a model that streams out
/// megabytes of content is broken, not informative).
pub(crate) const MAX_REPLY_BYTES: usize = 1 << 20;
/// Longest backoff between retries, and the most a `Retry-After` is honoured.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One tool call as the model wrote it (arguments still a string).
#[derive(Debug, Clone)]
pub struct WireCall {
    /// The call's id, which the answer must quote.
    pub(crate) id: String,
    /// The tool's name.
    pub(crate) name: String,
    /// The arguments: JSON, not yet parsed.
    pub arguments: String,
}

/// Tokens the endpoint counted.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// In the request.
    pub(crate) prompt: u64,
    /// In the answer.
    pub(crate) completion: u64,
}

/// A model's answer to one request.
#[derive(Debug)]
pub struct Reply {
    /// What the model wrote besides its calls.
    pub(crate) content: String,
    /// The calls it asked for.
    pub tool_calls: Vec<WireCall>,
    /// Tokens, when the endpoint says.
    pub(crate) usage: Option<Usage>,
    /// How long it took, retries included.
    pub(crate) duration: Duration,
    /// How many tries it took.
    pub(crate) attempts: u32,
    /// The endpoint stopped it at `max_tokens` (`finish_reason: length`):
    /// whatever it wrote is unfinished.
    pub(crate) cut_off: bool,
}

/// Why the model could not be asked, or gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The runbook has no `agent` section.
    #[error("runbook \"{0}\" has no agent goal")]
    NoGoal(String),
    /// The endpoint's URL cannot take a path.
    #[error("model.endpoint {0} cannot be a base URL")]
    NotABase(String),
    /// The HTTP client could not be built.
    #[error("model client: {0}")]
    Client(#[source] reqwest::Error),
    /// The API key could not be read.
    #[error(transparent)]
    Key(#[from] crate::secret::SecretError),
    /// The endpoint failed (unreachable, no answer in time, an HTTP error,
    /// a reply that is not a chat completion), after `attempts` tries.
    #[error("model endpoint {url}: {why}{}", after(*.attempts))]
    Endpoint {
        /// Where requests went (never with credentials).
        url: String,
        /// What went wrong, last.
        why: String,
        /// How many requests were made.
        attempts: u32,
    },
}

fn after(attempts: u32) -> String {
    match attempts {
        1 => String::new(),
        n => format!(" (after {n} attempts)"),
    }
}

/// A reply that is not a usable chat completion.
#[derive(Debug, thiserror::Error)]
pub enum BadReply {
    /// Not the JSON of a chat completion.
    #[error("the reply is not a chat completion: {0}")]
    NotACompletion(#[source] serde_json::Error),
    /// A completion without a choice.
    #[error("the reply has no choices")]
    NoChoices,
}

/// An OpenAI-compatible chat completions client, with retries and backoff.
pub(crate) struct Client {
    http: reqwest::Client,
    endpoint: ModelEndpoint,
    url: reqwest::Url,
    /// The model name requests carry (the runbook may override the endpoint's).
    pub(crate) model: String,
    metrics: Option<Arc<Metrics>>,
    /// Told the tokens written so far while a turn streams (a terminal's
    /// progress line).
    pub(crate) progress: Option<ProgressFn>,
}

/// What a terminal is told while the model writes: tokens so far, time taken.
pub(crate) type ProgressFn = Arc<dyn Fn(u64, Duration) + Send + Sync>;

impl Client {
    /// A client for `endpoint`, asking `model`.
    pub(crate) fn new(
        endpoint: &ModelEndpoint,
        model: String,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Client, ModelError> {
        // No whole-request timeout: a model still writing is not cut off.
        // `attempt` bounds the wait for its first chunk (model.timeout) and
        // each silence after it (model.idle_timeout); the run's budget
        // bounds the rest.
        let http = reqwest::Client::builder()
            .connect_timeout(endpoint.timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(ModelError::Client)?;
        let mut url = endpoint.endpoint.clone();
        url.path_segments_mut()
            .map_err(|_| ModelError::NotABase(endpoint.endpoint.to_string()))?
            .pop_if_empty()
            .extend(["chat", "completions"]);
        Ok(Client {
            http,
            endpoint: endpoint.clone(),
            url,
            model,
            metrics,
            progress: None,
        })
    }

    /// Where requests go, for error messages (the endpoint never carries credentials).
    /// Most tokens one answer may have (`model.max_tokens`).
    pub(crate) fn max_tokens(&self) -> u32 {
        self.endpoint.max_tokens
    }

    pub(crate) fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// Ask once, retrying transient failures until `deadline`.
    pub(crate) async fn complete(
        &self,
        messages: &[Value],
        tools: &[Value],
        deadline: Instant,
    ) -> Result<Reply, ModelError> {
        let body = json!({
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
            "temperature": self.endpoint.temperature,
            "max_tokens": self.endpoint.max_tokens,
            // Streamed, so a slow model is seen writing (and a silent one
            // is told from it); an endpoint that answers in one piece is
            // read the same way.
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        // A `Value` always serialises (its map keys are strings).
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let key = match &self.endpoint.api_key {
            Some(k) => Some(k.read()?),
            None => None,
        };
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let t = Instant::now();
            let attempted = self.attempt(&body, key.as_deref()).await;
            let outcome = attempted
                .as_ref()
                .map_or_else(|(label, _)| *label, |_| "ok");
            self.observe(outcome, t.elapsed());
            let retry_after = match attempted.map_err(|(_, failure)| failure) {
                Ok(mut reply) => {
                    reply.duration = started.elapsed();
                    reply.attempts = attempt;
                    if let (Some(m), Some(u)) = (&self.metrics, reply.usage) {
                        m.model_tokens
                            .with_label_values(&[&self.model, "prompt"])
                            .inc_by(u.prompt);
                        m.model_tokens
                            .with_label_values(&[&self.model, "completion"])
                            .inc_by(u.completion);
                    }
                    return Ok(reply);
                }
                Err(Failure::Final(e)) => return Err(self.failed(e, attempt)),
                Err(Failure::Transient(e, after)) => {
                    if attempt > self.endpoint.retries {
                        return Err(self.failed(e, attempt));
                    }
                    (e, after)
                }
            };
            let (e, after) = retry_after;
            let backoff = after
                .unwrap_or(Duration::from_millis(250) * 2u32.pow(attempt.min(6) - 1))
                .min(MAX_BACKOFF);
            if Instant::now() + backoff >= deadline {
                return Err(self.failed(
                    format!("{e}; no time left in the run's budget to retry"),
                    attempt,
                ));
            }
            tracing::warn!(model = %self.model, "model endpoint {}: {e}; retrying in {backoff:?}", self.url);
            tokio::time::sleep(backoff).await;
        }
    }

    fn failed(&self, why: String, attempts: u32) -> ModelError {
        ModelError::Endpoint {
            url: self.url.to_string(),
            why,
            attempts,
        }
    }

    fn observe(&self, outcome: &str, took: Duration) {
        if let Some(m) = &self.metrics {
            m.model_requests
                .with_label_values(&[&self.model, outcome])
                .inc();
            m.model_request_duration.observe(took.as_secs_f64());
        }
    }

    /// One request to the endpoint: its metrics label (`ok`, `timeout`,
    /// `unreachable`, `rate_limited`, ...) and the reply or why none.
    async fn attempt(&self, body: &[u8], key: Option<&str>) -> Attempt {
        let started = Instant::now();
        let resp = self.send(body, key).await?;
        let streamed = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut bytes = self.read(resp, streamed, started).await?;
        // An endpoint may echo the request's `Authorization` header back:
        // nothing of what it says carries the key any further.
        if let Some(k) = key {
            bytes = crate::secret::redact(&bytes, k);
        }
        answered(status, retry_after, &bytes, streamed)
    }

    /// No answer started within `model.timeout`.
    fn no_start(&self) -> Failed {
        (
            "timeout",
            Failure::Transient(
                format!(
                    "no answer within {} (model.timeout: how long the model may take to start answering)",
                    humantime::format_duration(self.endpoint.timeout)
                ),
                None,
            ),
        )
    }

    /// The request sent, its answer's headers received.
    async fn send(&self, body: &[u8], key: Option<&str>) -> Result<reqwest::Response, Failed> {
        let mut req = self
            .http
            .post(self.url.clone())
            .header("content-type", "application/json")
            .body(body.to_vec());
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        match tokio::time::timeout(self.endpoint.timeout, req.send()).await {
            Ok(Ok(r)) => Ok(r),
            Err(_) => Err(self.no_start()),
            Ok(Err(e)) if e.is_timeout() => Err(self.no_start()),
            Ok(Err(e)) => {
                let e = crate::error_chain(&e.without_url());
                Err(("unreachable", Failure::Transient(e, None)))
            }
        }
    }

    /// The answer's body, chunk by chunk as the model writes it: until it
    /// starts, within `model.timeout` (from the request); after that,
    /// within `model.idle_timeout` between two chunks; at most
    /// [`MAX_REPLY_BYTES`].
    async fn read(
        &self,
        mut resp: reqwest::Response,
        streamed: bool,
        started: Instant,
    ) -> Result<Vec<u8>, Failed> {
        let status = resp.status();
        let mut bytes = Vec::new();
        let mut progress = Progress::new(self, started);
        loop {
            let wait = match progress.tokens {
                0 => self
                    .endpoint
                    .timeout
                    .saturating_sub(started.elapsed())
                    .max(Duration::from_millis(1)),
                _ => self.endpoint.idle_timeout,
            };
            let chunk = match tokio::time::timeout(wait, resp.chunk()).await {
                Ok(c) => c,
                Err(_) if progress.tokens == 0 => {
                    progress.done();
                    return Err(self.no_start());
                }
                Err(_) => {
                    progress.done();
                    return Err((
                        "timeout",
                        Failure::Transient(
                            format!(
                                "HTTP {status}: the model went silent for {} after writing {} token(s) (model.idle_timeout)",
                                humantime::format_duration(self.endpoint.idle_timeout),
                                progress.tokens
                            ),
                            None,
                        ),
                    ));
                }
            };
            match chunk {
                Ok(Some(c)) => {
                    progress.saw(&c, streamed);
                    if bytes.len() + c.len() > MAX_REPLY_BYTES {
                        return Err((
                            "invalid_reply",
                            Failure::Final(format!(
                                "HTTP {status}: the reply is larger than {} KiB; refused unread",
                                MAX_REPLY_BYTES >> 10
                            )),
                        ));
                    }
                    bytes.extend_from_slice(&c);
                }
                Ok(None) => break,
                Err(e) => {
                    progress.done();
                    let e = crate::error_chain(&e.without_url());
                    return Err((
                        "unreachable",
                        Failure::Transient(format!("HTTP {status}: reading the reply: {e}"), None),
                    ));
                }
            }
        }
        progress.done();
        Ok(bytes)
    }
}

/// A request that got no usable reply: its metrics label, and why.
type Failed = (&'static str, Failure);

/// What one request came to: the model's reply, or its metrics label and why not.
type Attempt = Result<Reply, Failed>;

/// What the endpoint's answer (`status`, its whole body) says: a reply,
/// or a failure worth a retry (rate limited, a server error) or not.
fn answered(
    status: reqwest::StatusCode,
    retry_after: Option<Duration>,
    bytes: &[u8],
    streamed: bool,
) -> Attempt {
    if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        return Err((
            "rate_limited",
            Failure::Transient(format!("HTTP {status}"), retry_after),
        ));
    }
    if status.is_server_error() {
        return Err((
            "server_error",
            Failure::Transient(format!("HTTP {status}: {}", snippet(bytes)), retry_after),
        ));
    }
    if !status.is_success() {
        let hint = match status.as_u16() {
            401 | 403 => " (check model.api_key_env / model.api_key_file)",
            404 => {
                " (check model.endpoint: it is the base URL, e.g. http://127.0.0.1:11434/v1, and model.name)"
            }
            _ => "",
        };
        return Err((
            "client_error",
            Failure::Final(format!("HTTP {status}{hint}: {}", snippet(bytes))),
        ));
    }
    let parsed = match streamed {
        true => parse_stream(bytes),
        false => parse_reply(bytes),
    };
    parsed.map_err(|e| {
        (
            "invalid_reply",
            Failure::Final(format!("HTTP {status} but {e}")),
        )
    })
}

/// A turn the model is writing: tokens so far (one per streamed chunk
/// that carries text or a call), said on a terminal, in `/metrics` and,
/// every ten seconds, in the log.
struct Progress<'a> {
    client: &'a Client,
    started: Instant,
    tokens: u64,
    said_at: Instant,
    /// The end of the last chunk (an event's `data:` split between two).
    tail: Vec<u8>,
}

impl<'a> Progress<'a> {
    fn new(client: &'a Client, started: Instant) -> Progress<'a> {
        Progress {
            client,
            started,
            tokens: 0,
            said_at: started,
            tail: Vec::new(),
        }
    }

    /// A chunk arrived: a streamed one counts its events, however the
    /// network cut them (a whole answer in one piece counts as one).
    fn saw(&mut self, chunk: &[u8], streamed: bool) {
        if !streamed {
            self.tokens = 1;
        } else {
            let mut seen = std::mem::take(&mut self.tail);
            seen.extend_from_slice(chunk);
            self.tokens += seen.windows(5).filter(|w| w == b"data:").count() as u64;
            self.tail = seen[seen.len().saturating_sub(4)..].to_vec();
        }
        if let Some(m) = &self.client.metrics {
            m.model_turn_tokens
                .with_label_values(&[&self.client.model])
                .set(self.tokens as f64);
        }
        if let Some(show) = &self.client.progress {
            show(self.tokens, self.started.elapsed());
        }
        if self.said_at.elapsed() >= Duration::from_secs(10) {
            self.said_at = Instant::now();
            tracing::info!(
                model = %self.client.model,
                tokens = self.tokens,
                "the model is writing: {} token(s) in {:.0} s",
                self.tokens,
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    /// The turn ended (answered, failed or cut off).
    fn done(&self) {
        if let Some(m) = &self.client.metrics {
            m.model_turn_tokens
                .with_label_values(&[&self.client.model])
                .set(0.0);
        }
    }
}

/// Parse a streamed chat completion (server-sent events, `data: {chunk}`
/// lines until `data: [DONE]`): the content and each call put together
/// from their deltas, the usage from the chunk that carries it. Only the
/// first choice counts.
pub fn parse_stream(bytes: &[u8]) -> Result<Reply, BadReply> {
    let text = String::from_utf8_lossy(bytes);
    let mut content = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut usage = None;
    let mut cut_off = false;
    let mut chunks = 0;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).map_err(BadReply::NotACompletion)?;
        chunks += 1;
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            usage = Some(Usage {
                prompt: u["prompt_tokens"].as_u64().unwrap_or(0),
                completion: u["completion_tokens"].as_u64().unwrap_or(0),
            });
        }
        cut_off |= chunk["choices"][0]["finish_reason"].as_str() == Some("length");
        let delta = &chunk["choices"][0]["delta"];
        if let Some(c) = delta["content"].as_str() {
            content.push_str(c);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap_or(calls.len() as u64) as usize;
            if i > 256 {
                continue;
            }
            if calls.len() <= i {
                calls.resize(i + 1, Default::default());
            }
            let (id, name, args) = &mut calls[i];
            if let Some(v) = call["id"].as_str() {
                id.push_str(v);
            }
            if let Some(v) = call["function"]["name"].as_str() {
                name.push_str(v);
            }
            match &call["function"]["arguments"] {
                Value::String(v) => args.push_str(v),
                Value::Null => {}
                other => args.push_str(&other.to_string()),
            }
        }
    }
    if chunks == 0 {
        return Err(BadReply::NoChoices);
    }
    Ok(Reply {
        content,
        tool_calls: calls
            .into_iter()
            .filter(|(_, name, _)| !name.is_empty())
            .map(|(id, name, arguments)| WireCall {
                id,
                name,
                arguments: if arguments.is_empty() {
                    "{}".into()
                } else {
                    arguments
                },
            })
            .collect(),
        usage,
        duration: Duration::ZERO,
        attempts: 1,
        cut_off,
    })
}

enum Failure {
    /// Worth another try (with the server's `Retry-After`, if it sent one).
    Transient(String, Option<Duration>),
    Final(String),
}

/// The start of an error body, on one line, for a person to read.
fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]);
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.trim().is_empty() {
        "(empty body)".into()
    } else {
        one_line.trim().to_string()
    }
}

#[derive(Deserialize)]
struct WireReply {
    #[serde(default)]
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    /// A JSON string per the spec; some servers send the object itself.
    #[serde(default)]
    arguments: Value,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// Parse a chat-completions reply. Only the first choice counts.
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, BadReply> {
    let wire: WireReply = serde_json::from_slice(bytes).map_err(BadReply::NotACompletion)?;
    let Some(choice) = wire.choices.into_iter().next() else {
        return Err(BadReply::NoChoices);
    };
    let choice_cut_off = choice.finish_reason.as_deref() == Some("length");
    let tool_calls = choice
        .message
        .tool_calls
        .into_iter()
        .map(|c| WireCall {
            id: c.id.unwrap_or_default(),
            name: c.function.name,
            arguments: match c.function.arguments {
                Value::String(s) => s,
                Value::Null => "{}".into(),
                other => other.to_string(),
            },
        })
        .collect();
    Ok(Reply {
        content: choice.message.content.unwrap_or_default(),
        tool_calls,
        usage: wire.usage.map(|u| Usage {
            prompt: u.prompt_tokens,
            completion: u.completion_tokens,
        }),
        duration: Duration::ZERO,
        attempts: 1,
        cut_off: choice_cut_off,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_and_ollama_shapes() {
        let openai = br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"disk_usage","arguments":"{\"path\":\"/\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":120,"completion_tokens":9,"total_tokens":129}}"#;
        let r = parse_reply(openai).unwrap();
        assert_eq!(r.tool_calls[0].name, "disk_usage");
        assert_eq!(r.tool_calls[0].arguments, r#"{"path":"/"}"#);
        assert_eq!(r.usage.unwrap().prompt, 120);
        // Arguments as an object, no id, no usage.
        let ollama = br#"{"choices":[{"message":{"content":"","tool_calls":[{"function":{"name":"x","arguments":{"a":1}}}]}}]}"#;
        let r = parse_reply(ollama).unwrap();
        assert_eq!(r.tool_calls[0].arguments, r#"{"a":1}"#);
        assert!(r.usage.is_none());
    }

    /// A streamed answer as llama.cpp's server sends it: content deltas, a
    /// call whose arguments arrive in pieces, usage in the last chunk.
    #[test]
    fn a_streamed_answer_is_put_together_from_its_deltas() {
        let sse = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Looking \"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"at it.\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":\"disk_usage\",\"arguments\":\"{\\\"pa\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":\\\"/\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":1310,\"completion_tokens\":22}}\n\n",
            "data: [DONE]\n\n",
        );
        let r = parse_stream(sse.as_bytes()).unwrap();
        assert_eq!(r.content, "Looking at it.");
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].id, "call_7");
        assert_eq!(r.tool_calls[0].name, "disk_usage");
        assert_eq!(r.tool_calls[0].arguments, r#"{"path":"/"}"#);
        assert_eq!(r.usage.unwrap().prompt, 1310);
        assert!(parse_stream(b"data: {not json}\n\n").is_err());
        assert!(parse_stream(b"").is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &b"{\"choices\":[]}"[..],
            b"",
            b"null",
            b"[1,2]",
            b"{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{}}]}}]}",
            b"\xff\xfe",
        ] {
            assert!(
                parse_reply(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

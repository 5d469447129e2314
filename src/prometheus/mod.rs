//! The Prometheus that evaluates the alerting rules: what runwarden asks
//! it to decide whether a fix cleared the alert that started its run
//! (`done_when.alert_clears`).
//!
//! Three reads of its HTTP API, each bounded in time (`timeout`) and in
//! size ([`MAX_BODY`]), each failing with a reason a person can act on:
//! the alerting rules (`/api/v1/rules`), the server's `external_labels`
//! and evaluation interval (`/api/v1/status/config`), and an instant query
//! (`/api/v1/query`). The bearer token is read from its file at each
//! request and goes nowhere but the `Authorization` header.

pub(crate) mod promql;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// The most bytes one answer of Prometheus may have: a rule's expression
/// over a whole fleet can return thousands of series, and a rules listing
/// carries every active alert.
pub(crate) const MAX_BODY: usize = 8 << 20;

/// `prometheus:` in runwarden.yaml.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// Its base URL, e.g. `http://127.0.0.1:9090`.
    pub(crate) url: reqwest::Url,
    /// An owner-only file holding a bearer token, if it needs one.
    pub(crate) bearer_token_file: Option<PathBuf>,
    /// How long one request may take.
    pub(crate) timeout: Duration,
}

/// Why Prometheus could not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PromError {
    /// It could not be reached, or did not answer in time.
    #[error("Prometheus at {url} could not be reached: {reason}")]
    Unreachable {
        /// Where it was asked.
        url: String,
        /// Why, in words.
        reason: String,
    },
    /// It answered with an error (a bad expression, a refused token).
    #[error("Prometheus answered {status} to {what}: {reason}")]
    Refused {
        /// What was asked.
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// Its `error` field, or the body's start.
        reason: String,
    },
    /// Its answer was larger than [`MAX_BODY`].
    #[error(
        "Prometheus's answer to {what} is larger than {} MiB: narrow the rule's expression",
        MAX_BODY >> 20
    )]
    TooLarge {
        /// What was asked.
        what: &'static str,
    },
    /// Its answer was not the API's shape.
    #[error("Prometheus's answer to {what} is not its API's ({reason})")]
    Shape {
        /// What was asked.
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The bearer token file could not be read.
    #[error(transparent)]
    Token(#[from] crate::secret::SecretError),
}

/// An alerting rule as Prometheus serves it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AlertRule {
    /// `alert:`, the alert's `alertname`.
    pub(crate) name: String,
    /// Its expression.
    pub(crate) query: String,
    /// Its static `labels:` (values may be templates).
    pub(crate) labels: BTreeMap<String, String>,
    /// Its group's evaluation interval.
    pub(crate) interval: Duration,
    /// `keep_firing_for:`: how long the alert stays after its series goes.
    pub(crate) keep_firing_for: Duration,
    /// Its group, for messages.
    pub(crate) group: String,
}

/// What the server's own configuration says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Server {
    /// `global.external_labels`: added to every alert it sends, never to a
    /// query's result.
    pub(crate) external_labels: BTreeMap<String, String>,
    /// `global.evaluation_interval` (a group's own `interval` wins).
    pub(crate) evaluation_interval: Option<Duration>,
}

/// One series of an instant query's result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// Its labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// Its value, as Prometheus wrote it.
    pub(crate) value: String,
}

/// A client of one Prometheus.
#[derive(Debug, Clone)]
pub(crate) struct Prometheus {
    endpoint: Endpoint,
    http: reqwest::Client,
}

impl Prometheus {
    /// A client of `endpoint`.
    pub(crate) fn new(endpoint: &Endpoint) -> Prometheus {
        let http = reqwest::Client::builder()
            .timeout(endpoint.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Prometheus {
            endpoint: endpoint.clone(),
            http,
        }
    }

    /// Its base URL, for messages.
    pub(crate) fn url(&self) -> &str {
        self.endpoint.url.as_str()
    }

    /// The alerting rules named `name` (every one, if `None`).
    pub(crate) async fn rules(&self, name: Option<&str>) -> Result<Vec<AlertRule>, PromError> {
        let mut query = vec![("type", "alert")];
        // Prometheus 2.48 and later filter by name; an older one ignores it.
        if let Some(name) = name {
            query.push(("rule_name[]", name));
        }
        let data = self.get("/api/v1/rules", &query, "the rules").await?;
        let groups: Vec<RawGroup> =
            serde_json::from_value(data["groups"].clone()).map_err(|e| PromError::Shape {
                what: "the rules",
                reason: e.to_string(),
            })?;
        Ok(groups
            .into_iter()
            .flat_map(|g| {
                let interval = Duration::from_secs_f64(g.interval.max(0.0));
                let group = g.name;
                g.rules.into_iter().filter_map(move |r| {
                    (r.kind == "alerting" && name.is_none_or(|n| n == r.name)).then(|| AlertRule {
                        name: r.name,
                        query: r.query,
                        labels: r.labels,
                        interval,
                        keep_firing_for: Duration::from_secs_f64(r.keep_firing_for.max(0.0)),
                        group: group.clone(),
                    })
                })
            })
            .collect())
    }

    /// Its external labels and global evaluation interval.
    pub(crate) async fn server(&self) -> Result<Server, PromError> {
        let data = self
            .get("/api/v1/status/config", &[], "its configuration")
            .await?;
        let yaml = data["yaml"].as_str().unwrap_or_default();
        #[derive(Deserialize, Default)]
        struct Config {
            #[serde(default)]
            global: Global,
        }
        #[derive(Deserialize, Default)]
        struct Global {
            #[serde(default)]
            external_labels: BTreeMap<String, String>,
            evaluation_interval: Option<String>,
        }
        let config: Config = serde_saphyr::from_str(yaml).map_err(|e| PromError::Shape {
            what: "its configuration",
            reason: e.to_string(),
        })?;
        Ok(Server {
            external_labels: config.global.external_labels,
            evaluation_interval: config
                .global
                .evaluation_interval
                .and_then(|d| humantime::parse_duration(&d).ok()),
        })
    }

    /// `expr` evaluated now: its series (a scalar is one series with no
    /// labels).
    pub(crate) async fn query(&self, expr: &str) -> Result<Vec<Sample>, PromError> {
        let data = self
            .get("/api/v1/query", &[("query", expr)], "the query")
            .await?;
        let shape = |reason: String| PromError::Shape {
            what: "the query",
            reason,
        };
        match data["resultType"].as_str() {
            Some("vector") => {
                #[derive(Deserialize)]
                struct Series {
                    #[serde(default)]
                    metric: BTreeMap<String, String>,
                    value: (Value, String),
                }
                let series: Vec<Series> = serde_json::from_value(data["result"].clone())
                    .map_err(|e| shape(e.to_string()))?;
                Ok(series
                    .into_iter()
                    .map(|s| Sample {
                        labels: s.metric,
                        value: s.value.1,
                    })
                    .collect())
            }
            Some("scalar") => Ok(vec![Sample {
                labels: BTreeMap::new(),
                value: data["result"][1].as_str().unwrap_or_default().to_string(),
            }]),
            other => Err(shape(format!(
                "result type {}, where an alerting rule's is a vector",
                other.unwrap_or("none")
            ))),
        }
    }

    /// GET `path` with `query`: the answer's `data`, read to at most [`MAX_BODY`].
    async fn get(
        &self,
        path: &str,
        query: &[(&str, &str)],
        what: &'static str,
    ) -> Result<Value, PromError> {
        let mut url = self.endpoint.url.clone();
        let base = url.path().trim_end_matches('/').to_string();
        url.set_path(&format!("{base}{path}"));
        url.query_pairs_mut().extend_pairs(query);
        let mut request = self.http.get(url);
        if let Some(file) = &self.endpoint.bearer_token_file {
            let token = crate::secret::read_token(file, "prometheus.bearer_token_file")?;
            request = request.bearer_auth(token);
        }
        let unreachable = |e: reqwest::Error| PromError::Unreachable {
            url: self.url().to_string(),
            reason: if e.is_timeout() {
                format!("no answer within {:?}", self.endpoint.timeout)
            } else {
                causes(&e)
            },
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(PromError::TooLarge { what });
            }
            body.extend_from_slice(&chunk);
        }
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !status.is_success() || answer["status"] != "success" {
            let reason = match answer["error"].as_str() {
                Some(e) => e.to_string(),
                None => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            };
            return Err(PromError::Refused {
                what,
                status: status.as_u16(),
                reason,
            });
        }
        Ok(answer["data"].clone())
    }
}

/// An error and its causes on one line (reqwest's own says only "error
/// sending request").
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[derive(Deserialize)]
struct RawGroup {
    name: String,
    #[serde(default)]
    interval: f64,
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
struct RawRule {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    #[serde(default)]
    query: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default, rename = "keepFiringFor")]
    keep_firing_for: f64,
}

//! `runwarden rollout`: a daemon's rollouts, and a person's decisions on
//! them, through its API; and how a rollout's command exits.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::args::RolloutCommand;
use super::{EXIT_BUSY, Exit, Failed};
use crate::verdict::Verdict;

/// The daemon's API, with its token if there is one.
pub(super) struct Api {
    base: String,
    token: Option<String>,
    /// Whether the token (or none) is not a principal's: the daemon then
    /// takes who decides from the request, else from the token.
    says_who: bool,
    client: reqwest::Client,
}

impl Api {
    /// The daemon at `daemon`, else at `listen` of the config in `dir`.
    pub(super) fn new(
        daemon: Option<String>,
        token_file: Option<&Path>,
        dir: &Path,
    ) -> Result<Api, Failed> {
        let settings = crate::config::Settings::load(dir).ok();
        let base = match daemon {
            Some(d) => d,
            None => match &settings {
                Some(s) => format!("http://{}", s.listen),
                None => format!("http://{}", crate::config::DEFAULT_LISTEN),
            },
        };
        let token = match token_file {
            Some(f) => Some(
                crate::secret::read_file(f, "webhook token file")
                    .map_err(Failed::usage)?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        // The webhook token (or none) says nobody; a principal's says who.
        let webhook = settings
            .and_then(|s| s.webhook_token_file)
            .and_then(|f| crate::secret::read_token(&f, "webhook_token_file").ok());
        let says_who = match &token {
            None => true,
            Some(t) => webhook.is_some_and(|w| crate::same_secret(w.as_bytes(), t.as_bytes())),
        };
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            token,
            says_who,
            client: reqwest::Client::new(),
        })
    }

    /// `method path` with `body`: the answer, or the status and its reason.
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.map_err(|e| {
            format!(
                "cannot reach the daemon at {}: {}",
                self.base,
                crate::error_chain(&e)
            )
        })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        match status.is_success() {
            true => Ok(v),
            false => Err(format!(
                "the daemon answered {status}: {}",
                v["error"].as_str().unwrap_or(&v.to_string())
            )),
        }
    }
}

pub(super) async fn rollout(
    command: RolloutCommand,
    daemon: Option<String>,
    token_file: Option<PathBuf>,
    dir: &Path,
) -> Exit {
    let api = Api::new(daemon, token_file.as_deref(), dir)?;
    let get = reqwest::Method::GET;
    let fail = |e: String| Failed::code(1, e);
    match command {
        RolloutCommand::List { json } => {
            let v = api
                .call(get, "/api/v1/rollouts", None)
                .await
                .map_err(fail)?;
            if json {
                println!("{v}");
                return Ok(0);
            }
            for r in v["rollouts"].as_array().into_iter().flatten() {
                let hosts: usize = r["waves"].as_array().map_or(0, |w| {
                    w.iter().map(|w| w.as_array().map_or(0, Vec::len)).sum()
                });
                println!(
                    "{}  {:<9} {} ({}, {hosts} hosts, {} failure(s)) started {}{}",
                    r["id"].as_str().unwrap_or(""),
                    r["state"].as_str().unwrap_or(""),
                    r["runbook"].as_str().unwrap_or(""),
                    r["trigger"].as_str().unwrap_or(""),
                    r["failures"],
                    r["started_at"].as_str().unwrap_or(""),
                    r["reason"]
                        .as_str()
                        .map(|why| format!(": {why}"))
                        .unwrap_or_default()
                );
            }
            Ok(0)
        }
        RolloutCommand::Status { id, json } => {
            let v = api
                .call(get, &format!("/api/v1/rollouts/{id}"), None)
                .await
                .map_err(fail)?;
            match json {
                true => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
                false => print!("{}", status_text(&v)),
            }
            Ok(exit_code(&v))
        }
        RolloutCommand::Resume { id, reason } => decide(&api, &id, "resume", &reason).await,
        RolloutCommand::Abort { id, reason } => decide(&api, &id, "abort", &reason).await,
    }
}

async fn decide(api: &Api, id: &str, verb: &str, reason: &str) -> Exit {
    let body = match api.says_who {
        true => json!({ "by": crate::gate::killswitch::who(), "reason": reason }),
        false => json!({ "reason": reason }),
    };
    let v = api
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/rollouts/{id}/{verb}"),
            Some(body),
        )
        .await
        .map_err(|e| Failed::code(1, e))?;
    print!("{}", status_text(&v));
    Ok(0)
}

/// A rollout's status for a person: its state, then each wave's hosts.
pub(super) fn status_text(v: &Value) -> String {
    use std::fmt::Write;
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let mut out = format!(
        "rollout {} of {} ({}): {}{}\n",
        s("id"),
        s("runbook"),
        s("trigger"),
        s("state"),
        v["reason"]
            .as_str()
            .map(|why| format!(": {}", crate::text::printable(why)))
            .unwrap_or_default()
    );
    if let Some(d) = v["decision"]["sent_to"].as_str() {
        let _ = writeln!(
            out,
            "  {} sent to replica {d}, which drives it: applied within a third of the lease (`runwarden rollout status {}`)",
            v["decision"]["verb"].as_str().unwrap_or("the decision"),
            s("id")
        );
    } else if let Some(d) = v["driver"].as_str() {
        let _ = writeln!(out, "  driven by replica {d}");
    }
    let _ = writeln!(
        out,
        "  failures {} (max_failures {} counted from {}); waits on {}{}",
        v["failures"],
        v["max_failures"],
        v["accepted"],
        s("waiting_on"),
        v["next_wave_at"]
            .as_str()
            .map(|t| format!(" (next wave at {t})"))
            .unwrap_or_default()
    );
    for (i, wave) in v["waves"].as_array().into_iter().flatten().enumerate() {
        let _ = writeln!(out, "  wave {}:", i + 1);
        for h in wave.as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "    {:<24} {:<12} {}{}",
                h["host"].as_str().unwrap_or(""),
                h["outcome"].as_str().unwrap_or(""),
                h["run_id"].as_str().unwrap_or(""),
                h["detail"]
                    .as_str()
                    .filter(|d| !d.is_empty())
                    .map(|d| format!("  {}", crate::text::printable(&crate::text::one_line(d))))
                    .unwrap_or_default()
            );
        }
    }
    out
}

/// How a rollout's command exits: its worst verdict's code; a halted or
/// aborted rollout never 0 and never 75 (it is no "try again"): 7 then,
/// as for the kill switch, unless a worse verdict has a code of its own.
pub(super) fn exit_code(v: &Value) -> i32 {
    let worst = v["worst"]
        .as_str()
        .and_then(|w| w.parse::<Verdict>().ok())
        .map_or(0, Verdict::exit_code);
    match v["state"].as_str() {
        Some("finished") => worst,
        Some("halted" | "aborted") if worst == 0 || worst == EXIT_BUSY => {
            Verdict::Halted.exit_code()
        }
        Some("halted" | "aborted") => worst,
        // Still going (the command did not wait): nothing is known yet.
        _ => worst,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_exits_with_its_worst_verdict_and_a_halt_is_never_0_or_75() {
        let rows = [
            ("finished", Some("ok"), 0),
            ("finished", Some("failed"), 1),
            ("finished", None, 0),
            ("halted", Some("ok"), 7),
            ("halted", None, 7),
            ("halted", Some("failed"), 1),
            ("halted", Some("unresolved"), 9),
            ("aborted", Some("ok"), 7),
            ("halted", Some("halted"), 7),
        ];
        for (state, worst, want) in rows {
            let v = json!({ "state": state, "worst": worst });
            assert_eq!(exit_code(&v), want, "{state} {worst:?}");
        }
    }
}

//! `runwarden approvals`: list, show, approve and deny L2 requests through the daemon's API.

use std::path::Path;
use std::path::PathBuf;

use serde_json::Value;

use super::{ApprovalsCommand, Exit, Failed};
use crate::config::Config;

pub(super) async fn approvals(
    command: ApprovalsCommand,
    daemon: Option<String>,
    token_file: Option<PathBuf>,
    dir: &Path,
) -> Exit {
    let base = match daemon {
        Some(d) => d,
        None => match Config::load(dir) {
            Ok(c) => format!("http://{}", c.settings.listen),
            Err(_) => format!("http://{}", crate::config::DEFAULT_LISTEN),
        },
    };
    let Some(file) =
        token_file.or_else(|| std::env::var_os("RUNWARDEN_APPROVER_TOKEN_FILE").map(PathBuf::from))
    else {
        return Err(Failed::usage(
            "give your approver token with --token-file FILE or RUNWARDEN_APPROVER_TOKEN_FILE (never on the command line)",
        ));
    };
    let token = crate::secret::read_file(&file, "approver token file")
        .map_err(Failed::usage)?
        .trim()
        .to_string();
    // The daemon says a decision came "via CLI" (a label for people: the
    // token says who).
    let client = reqwest::Client::builder()
        .user_agent(crate::http::CLI_USER_AGENT)
        .build()
        .map_err(|e| Failed::usage(crate::error_chain(&e)))?;
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut req = client
            .request(method, format!("{base}{path}"))
            .bearer_auth(&token);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let base = base.clone();
        async move {
            let resp = req.send().await.map_err(|e| {
                format!(
                    "cannot reach the daemon at {base}: {}",
                    crate::error_chain(&e)
                )
            })?;
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if status.is_success() {
                Ok(v)
            } else {
                Err(format!(
                    "{status}: {}",
                    v["error"].as_str().unwrap_or(&v.to_string())
                ))
            }
        }
    };
    let outcome = match command {
        ApprovalsCommand::List { json: true } => {
            call(reqwest::Method::GET, "/api/v1/approvals".into(), None)
                .await
                .map(|v| println!("{v}"))
        }
        ApprovalsCommand::List { json: false } => {
            call(reqwest::Method::GET, "/api/v1/approvals".into(), None)
                .await
                .map(|v| {
                    for r in v["approvals"].as_array().into_iter().flatten() {
                        println!(
                            "{}  {:<9} {} on {}: {} {}  reason: {}",
                            r["id"].as_str().unwrap_or(""),
                            r["state"].as_str().unwrap_or(""),
                            r["runbook"].as_str().unwrap_or(""),
                            r["host"].as_str().unwrap_or(""),
                            r["tool"].as_str().unwrap_or(""),
                            r["args"],
                            r["reason"].as_str().unwrap_or("")
                        );
                    }
                })
        }
        ApprovalsCommand::Show { id } => call(
            reqwest::Method::GET,
            format!("/api/v1/approvals/{id}"),
            None,
        )
        .await
        .map(|v| println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())),
        ApprovalsCommand::Approve { id, comment } => decide(&call, &id, &comment, true).await,
        ApprovalsCommand::Deny { id, comment } => decide(&call, &id, &comment, false).await,
    };
    outcome.map(|()| 0).map_err(|e| Failed::code(1, e))
}

/// Show the call, then decide on exactly that call (its digest goes along).
pub(super) async fn decide<F, Fut>(
    call: &F,
    id: &str,
    comment: &str,
    approve: bool,
) -> Result<(), String>
where
    F: Fn(reqwest::Method, String, Option<Value>) -> Fut,
    Fut: std::future::Future<Output = Result<Value, String>>,
{
    let shown = call(
        reqwest::Method::GET,
        format!("/api/v1/approvals/{id}"),
        None,
    )
    .await?;
    let field = |k: &str| shown[k].as_str().unwrap_or("").to_string();
    // A request already decided (or expired) says so first, and nothing is sent.
    let state = field("state");
    if state != "pending" {
        let by = match (shown["by"].as_str(), shown["why"].as_str()) {
            (Some(person), _) => format!(" by {person}"),
            (None, Some(why)) => format!(" ({why})"),
            _ => String::new(),
        };
        return Err(format!(
            "request {id} is already {state}{by}: nothing was sent ({} on {}: {} {})",
            field("runbook"),
            field("host"),
            field("tool"),
            crate::report::args_text(&shown["args"])
        ));
    }
    let verb = if approve { "approving" } else { "denying" };
    println!(
        "{verb} {} on {}: {} {}",
        field("runbook"),
        field("host"),
        field("tool"),
        shown["args"]
    );
    match shown["agent"].as_str() {
        // An agent's reason is its own word, as is its name.
        Some(agent) => println!(
            "reason (from agent {}): {}",
            crate::text::one_line(agent),
            field("reason")
        ),
        None => println!("reason: {}", field("reason")),
    }
    let body = serde_json::json!({ "digest": shown["digest"], "comment": comment });
    let action = if approve { "approve" } else { "deny" };
    let decided = call(
        reqwest::Method::POST,
        format!("/api/v1/approvals/{id}/{action}"),
        Some(body),
    )
    .await?;
    println!("{}", decided["state"].as_str().unwrap_or(""));
    Ok(())
}

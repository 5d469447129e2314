//! Slack: a message for each approval request, with Approve, Deny and
//! "Stop runwarden" buttons, rewritten when the request is settled; and
//! what Slack sends back (a click, `/runwarden stop REASON`), read only
//! after its signature is verified.
//!
//! Outgoing, through Slack's Web API (`chat.postMessage` when a request
//! opens, `chat.update` when it is settled however it was): the runbook,
//! host, tool, arguments and reason; the alert that started the run,
//! shown as the untrusted text it is; the budget left; the digest; when it
//! expires. The bot token is read at each call and never logged.
//!
//! Incoming (`POST /api/v1/chat/slack`, served in `src/http/chat.rs`): Slack's `v0`
//! signature of `v0:TIMESTAMP:BODY` under the app's signing secret (the
//! file's first line, and a second during a rotation), checked before
//! anything is parsed. A click or command is then only a claim by a
//! Slack user: who may do what is the principal whose `chat:` names that
//! user, within its grants.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use super::Event;
use crate::config::SlackSettings;
use crate::gate::approvals::Request;

/// The button that approves, denies, or stops everything.
pub(crate) const APPROVE: &str = "runwarden_approve";
pub(crate) const DENY: &str = "runwarden_deny";
pub(crate) const STOP: &str = "runwarden_stop";

/// Each open request's message: (channel, ts) by request id.
#[derive(Default)]
pub(crate) struct Messages {
    posted: Mutex<HashMap<String, (String, String)>>,
}

/// Post or rewrite `request`'s message. Slack down or refusing: logged,
/// and nothing else changes.
pub(crate) async fn tell(s: &SlackSettings, messages: &Messages, event: Event, request: &Request) {
    let token = match crate::secret::read_token(&s.bot_token_file, "chat.slack.bot_token_file") {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(approval_id = %request.id, "Slack not told: {e}");
            return;
        }
    };
    let (text, blocks) = message(request);
    let answer = match event {
        Event::Opened => {
            let body = json!({ "channel": s.channel, "text": text, "blocks": blocks });
            let answer = call(s, &token, "chat.postMessage", &body).await;
            if let Ok(a) = &answer
                && let (Some(channel), Some(ts)) = (a["channel"].as_str(), a["ts"].as_str())
            {
                let mut posted = messages.posted.lock().unwrap_or_else(|p| p.into_inner());
                posted.insert(request.id.clone(), (channel.to_string(), ts.to_string()));
            }
            answer
        }
        Event::Settled => {
            let at = {
                let mut posted = messages.posted.lock().unwrap_or_else(|p| p.into_inner());
                posted.remove(&request.id)
            };
            // Posted by another replica, or before a restart: nothing to rewrite.
            let Some((channel, ts)) = at else { return };
            let body = json!({ "channel": channel, "ts": ts, "text": text, "blocks": blocks });
            call(s, &token, "chat.update", &body).await
        }
    };
    if let Err(e) = answer {
        tracing::warn!(approval_id = %request.id, "Slack: {e}");
    }
}

/// One Web API call: Slack's answer when it says `ok`.
async fn call(s: &SlackSettings, token: &str, method: &str, body: &Value) -> Result<Value, String> {
    let url = format!("{}/{method}", s.api_url);
    let answer = super::webhook::client()
        .post(&url)
        .bearer_auth(token)
        .header("content-type", "application/json; charset=utf-8")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| format!("{method}: {}", crate::error_chain(&e.without_url())))?;
    let status = answer.status();
    let bytes = answer.bytes().await.map_err(|e| {
        format!(
            "{method}: HTTP {status}: {}",
            crate::error_chain(&e.without_url())
        )
    })?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{method}: HTTP {status}, not Slack's JSON: {e}"))?;
    match v["ok"].as_bool() {
        Some(true) => Ok(v),
        _ => Err(format!(
            "{method}: HTTP {status}, Slack said {}",
            v["error"].as_str().unwrap_or("no ok")
        )),
    }
}

/// Slack's mrkdwn escapes: `&`, `<` and `>` (no text becomes a mention or
/// a link).
fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The request's message: its fallback text and its blocks. An open
/// request has buttons; a settled one says how it ended, and has none.
pub(crate) fn message(r: &Request) -> (String, Value) {
    let args = serde_json::to_string_pretty(&r.args).unwrap_or_default();
    let mut lines = vec![
        format!(
            "*{}* on *{}* asks to run `{}`",
            esc(&r.runbook),
            esc(&r.host),
            esc(&r.tool)
        ),
        format!("*Reason:* {}", esc(&r.reason)),
        format!("*Arguments:*\n```{}```", esc(&args)),
    ];
    if let Some(alert) = &r.alert {
        lines.push(format!(
            "*Alert* (text from the alert, not from runwarden):\n```{}```",
            esc(&alert_text(alert))
        ));
    }
    if let Some(b) = &r.budget_left {
        lines.push(format!(
            "*Budget left:* {} steps, {} tier-2 calls, {}s",
            b["steps"], b["mutations"], b["seconds"]
        ));
    }
    lines.push(format!(
        "*Digest:* `{}`   *Expires:* {}   *Request:* `{}`",
        esc(&r.digest),
        esc(&r.expires_at),
        esc(&r.id)
    ));
    let state = serde_json::to_value(&r.state).unwrap_or_default();
    let pending = state["state"] == "pending";
    let ended = ended(&state);
    let text = match pending {
        true => format!(
            "runwarden asks to run {} on {} ({})",
            r.tool, r.host, r.runbook
        ),
        false => format!("{} on {}: {ended}", r.tool, r.host),
    };
    let mut blocks = vec![json!({
        "type": "section",
        "text": { "type": "mrkdwn", "text": lines.join("\n") }
    })];
    if pending {
        let value = format!("{} {}", r.id, r.digest);
        blocks.push(json!({
            "type": "actions",
            "block_id": "runwarden",
            "elements": [
                { "type": "button", "action_id": APPROVE, "style": "primary", "value": value,
                  "text": { "type": "plain_text", "text": "Approve" } },
                { "type": "button", "action_id": DENY, "style": "danger", "value": value,
                  "text": { "type": "plain_text", "text": "Deny" } },
                { "type": "button", "action_id": STOP, "value": "stop",
                  "text": { "type": "plain_text", "text": "Stop runwarden" },
                  "confirm": {
                      "title": { "type": "plain_text", "text": "Stop every run?" },
                      "text": { "type": "plain_text", "text": "This engages the kill switch: every run stops before its next call, and pending approvals are denied. Release it with the CLI or the API." },
                      "confirm": { "type": "plain_text", "text": "Stop" },
                      "deny": { "type": "plain_text", "text": "Cancel" } } }
            ]
        }));
    } else {
        blocks.push(json!({
            "type": "context",
            "elements": [{ "type": "mrkdwn", "text": esc(&ended) }]
        }));
    }
    (text, Value::Array(blocks))
}

/// How a settled request ended, in a person's words.
fn ended(state: &Value) -> String {
    let by = match state["via"].as_str() {
        Some(via) if !via.is_empty() => {
            format!("{} via {via}", state["by"].as_str().unwrap_or("someone"))
        }
        _ => state["by"].as_str().unwrap_or("someone").to_string(),
    };
    let comment = match state["comment"].as_str() {
        Some(c) if !c.is_empty() => format!(": {c}"),
        _ => String::new(),
    };
    match state["state"].as_str().unwrap_or_default() {
        "approved" => format!("approved by {by}{comment}"),
        "denied" => format!("denied by {by}{comment}"),
        "expired" => "expired: nobody decided in time (counts as denied)".into(),
        "cancelled" => format!("cancelled: {}", state["why"].as_str().unwrap_or_default()),
        "withdrawn" => format!("withdrawn: {}", state["why"].as_str().unwrap_or_default()),
        other => other.to_string(),
    }
}

/// An alert's name, labels and annotations, one per line.
fn alert_text(alert: &Value) -> String {
    let mut out = Vec::new();
    for part in ["labels", "annotations"] {
        if let Some(map) = alert[part].as_object() {
            for (k, v) in map {
                out.push(format!("{k}: {}", v.as_str().unwrap_or(&v.to_string())));
            }
        }
    }
    out.join("\n").chars().take(1500).collect()
}

/// What Slack sent, once its signature holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// A button: approve or deny `request` quoting `digest`, or stop.
    Click {
        user: String,
        action: Action,
        response_url: Option<String>,
    },
    /// A slash command (`/runwarden stop REASON`): its text after the command.
    Command { user: String, text: String },
}

/// What a button does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Decide {
        approve: bool,
        request: String,
        digest: String,
    },
    Stop,
}

/// Slack's form body: a click's `payload`, or a slash command's fields.
/// The user is `slack:TEAM/USER`, the identity a principal's `chat:` names.
pub(crate) fn parse(body: &[u8]) -> Result<Inbound, String> {
    let fields: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    if let Some(payload) = fields.get("payload") {
        let v: Value =
            serde_json::from_str(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
        if v["type"] != "block_actions" {
            return Err(format!("payload of type {} is not handled", v["type"]));
        }
        let team = v["user"]["team_id"]
            .as_str()
            .or(v["team"]["id"].as_str())
            .ok_or("payload names no team")?;
        let user = v["user"]["id"].as_str().ok_or("payload names no user")?;
        let a = &v["actions"][0];
        let action = match a["action_id"].as_str().unwrap_or_default() {
            STOP => Action::Stop,
            id @ (APPROVE | DENY) => {
                let (request, digest) = a["value"]
                    .as_str()
                    .and_then(|v| v.split_once(' '))
                    .ok_or("the button's value is not REQUEST DIGEST")?;
                Action::Decide {
                    approve: id == APPROVE,
                    request: request.to_string(),
                    digest: digest.to_string(),
                }
            }
            other => return Err(format!("action {other:?} is not runwarden's")),
        };
        return Ok(Inbound::Click {
            user: format!("slack:{team}/{user}"),
            action,
            response_url: v["response_url"].as_str().map(String::from),
        });
    }
    match (
        fields.get("command"),
        fields.get("team_id"),
        fields.get("user_id"),
    ) {
        (Some(_), Some(team), Some(user)) => Ok(Inbound::Command {
            user: format!("slack:{team}/{user}"),
            text: fields.get("text").cloned().unwrap_or_default(),
        }),
        _ => {
            Err("neither a click (payload) nor a slash command (command, team_id, user_id)".into())
        }
    }
}

/// Tell the clicker alone why a click did nothing (`response_url`, an
/// ephemeral message); in the background, its failure only logged.
pub(crate) fn reply(response_url: Option<String>, text: String) {
    let Some(url) = response_url else { return };
    tokio::spawn(async move {
        let body = json!({ "response_type": "ephemeral", "replace_original": false, "text": text });
        let post = super::webhook::client()
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Err(e) = post.send().await {
            tracing::warn!(
                "Slack response_url: {}",
                crate::error_chain(&e.without_url())
            );
        }
    });
}

/// Which version of a file: its inode, size, and when its content and its
/// mode or owner last changed (a chmod is seen too).
type Version = (u64, u64, Option<std::time::SystemTime>, i64, i64);

/// The signing secrets read last: from which file, which version of it.
type Cached = (std::path::PathBuf, Version, Vec<String>);

/// The signing secrets: the file's first line, and a second (the one
/// before) during a rotation. The file is read again whenever it changed
/// (a rotation needs no reload); a burst of clicks costs one `stat` each.
pub(crate) fn signing_secrets(s: &SlackSettings) -> Result<Vec<String>, String> {
    use std::os::unix::fs::MetadataExt;
    static LAST: Mutex<Option<Cached>> = Mutex::new(None);
    let version = std::fs::metadata(&s.signing_secret_file)
        .map(|m| {
            (
                m.ino(),
                m.size(),
                m.modified().ok(),
                m.ctime(),
                m.ctime_nsec(),
            )
        })
        .ok();
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let (Some((file, seen, secrets)), Some(now)) = (last.as_ref(), version)
        && *file == s.signing_secret_file
        && *seen == now
    {
        return Ok(secrets.clone());
    }
    // Read with every check a secret file gets (owner-only, a regular file).
    let secrets = read_signing_secrets(s)?;
    if let Some(now) = version {
        *last = Some((s.signing_secret_file.clone(), now, secrets.clone()));
    }
    Ok(secrets)
}

fn read_signing_secrets(s: &SlackSettings) -> Result<Vec<String>, String> {
    let text = crate::secret::read_file(&s.signing_secret_file, "chat.slack.signing_secret_file")
        .map_err(|e| e.to_string())?;
    let secrets: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    match secrets.len() {
        1 | 2 => Ok(secrets),
        n => Err(format!(
            "{} holds {n} secrets: one line (two during a rotation)",
            s.signing_secret_file.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A click as Slack's documentation shows a `block_actions` payload
    /// (api.slack.com/reference/interaction-payloads/block-actions), its
    /// action being one of runwarden's buttons.
    fn click(action_id: &str, value: &str) -> Vec<u8> {
        let payload = json!({
            "type": "block_actions",
            "team": { "id": "T9TK3CUKW", "domain": "example" },
            "user": { "id": "UA8RXUSPL", "username": "jtorrance", "team_id": "T9TK3CUKW" },
            "api_app_id": "AABA1ABCD",
            "token": "9s8d9as89d8as9d8as989",
            "container": { "type": "message_attachment", "message_ts": "1548261231.000200",
                           "attachment_id": 1, "channel_id": "CBR2V3XEX", "is_ephemeral": false },
            "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
            "channel": { "id": "CBR2V3XEX", "name": "review-updates" },
            "response_url": "https://hooks.slack.com/actions/AABA1ABCD/1232321423432/D09sSasdasdAS9091209",
            "actions": [{ "action_id": action_id, "block_id": "runwarden",
                          "text": { "type": "plain_text", "text": "Approve", "emoji": true },
                          "value": value, "type": "button", "action_ts": "1548426417.840180" }]
        });
        form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish()
            .into_bytes()
    }

    #[test]
    fn a_click_and_a_command_are_read_as_slack_sends_them() {
        assert_eq!(
            parse(&click(APPROVE, "0193-id abc123")).unwrap(),
            Inbound::Click {
                user: "slack:T9TK3CUKW/UA8RXUSPL".into(),
                action: Action::Decide {
                    approve: true,
                    request: "0193-id".into(),
                    digest: "abc123".into()
                },
                response_url: Some(
                    "https://hooks.slack.com/actions/AABA1ABCD/1232321423432/D09sSasdasdAS9091209"
                        .into()
                ),
            }
        );
        assert!(matches!(
            parse(&click(STOP, "stop")).unwrap(),
            Inbound::Click {
                action: Action::Stop,
                ..
            }
        ));
        assert!(parse(&click("someone_elses", "x")).is_err());
        assert!(parse(&click(DENY, "no-digest")).is_err());
        // Slack's documented slash command body, its command ours.
        let command = b"token=gIkuvaNzQIHg97ATvDxqgjtO&team_id=T0001&team_domain=example&enterprise_id=E0001&enterprise_name=Globular%20Construct%20Inc&channel_id=C2147483705&channel_name=test&user_id=U2147483697&user_name=Steve&command=%2Frunwarden&text=stop%20INC-9%20disk%20alarms&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1234%2F5678&trigger_id=13345224609.738474920.8088930838d88f008e0&api_app_id=A123456";
        assert_eq!(
            parse(command).unwrap(),
            Inbound::Command {
                user: "slack:T0001/U2147483697".into(),
                text: "stop INC-9 disk alarms".into()
            }
        );
        assert!(parse(b"hello=1").is_err());
    }
}

//! Quiet maintenance: while a run changes its host, an Alertmanager
//! silence (API v2) holds the host's matching alerts, so a planned restart
//! does not page on-call.
//!
//! Why it is shaped this way:
//! - It is asked for just before the run's first tier-2 call, once the gate
//!   has allowed it, and expired when the run ends, however it ends. It is
//!   never longer than `silence.for`, so a silence nobody expired still ends.
//! - A run whose alert `done_when` waits on never silences that alert: the
//!   silence carries `alertname!="..."` for it, so a fix that did not work
//!   still pages.
//! - Alertmanager unreachable is not a reason to leave the host broken: the
//!   run goes on unsilenced, and its audit line says so.
//! - Each silence is an audit line (`phase: silence`) with its id, before
//!   the change it covers; a restart expires every silence the log shows
//!   created and never expired (the process that held it died).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};

use crate::audit::{AuditLog, Phase};
use crate::config::Silence;

/// How long Alertmanager has to answer: a change waits on it.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// How far back a restart looks for silences left behind: none lives longer.
const LOOK_BACK: jiff::SignedDuration = jiff::SignedDuration::from_hours(25);

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(ASK_TIMEOUT)
            .build()
            .unwrap_or_default()
    })
}

/// A silence a run holds.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) id: String,
    pub(crate) alertmanager: reqwest::Url,
}

/// The matchers of `s`'s silence for `host`: the runbook's, the host's
/// label (`HOST` or `HOST:PORT`), and, when `done_when` waits on alert
/// `except`, that alert left out.
pub(crate) fn matchers(s: &Silence, host: &str, except: Option<&str>) -> Vec<Value> {
    let mut out: Vec<Value> = s.matchers.iter().map(|m| m.to_api()).collect();
    out.push(json!({
        "name": s.host_label,
        "value": format!("{}(:[0-9]+)?", regex::escape(host)),
        "isRegex": true,
        "isEqual": true,
    }));
    if let Some(name) = except {
        out.push(json!({ "name": "alertname", "value": name, "isRegex": false, "isEqual": false }));
    }
    out
}

/// Ask Alertmanager for a silence with `matchers`, ending after `s.longest`
/// at the latest; `comment` says whose it is.
/// Why there is no silence, and whether Alertmanager may have made one
/// all the same (the request was sent, its answer lost).
#[derive(Debug)]
pub(crate) struct NotHeld {
    pub(crate) why: String,
    pub(crate) lost_answer: bool,
}

pub(crate) async fn hold(s: &Silence, matchers: &[Value], comment: &str) -> Result<Held, NotHeld> {
    let now = jiff::Timestamp::now();
    let ends = now + jiff::SignedDuration::try_from(s.longest).unwrap_or_default();
    let url = api(&s.alertmanager, "api/v2/silences");
    let body = json!({
        "matchers": matchers,
        "startsAt": now.to_string(),
        "endsAt": ends.to_string(),
        "createdBy": "runwarden",
        "comment": comment,
    });
    let lost = |e: reqwest::Error| NotHeld {
        lost_answer: !e.is_connect(),
        why: match e.is_timeout() {
            true => format!("{url} did not answer within {ASK_TIMEOUT:?}"),
            false => format!("{url} cannot be reached: {}", crate::error_chain(&e)),
        },
    };
    let answer = client()
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(lost)?;
    let status = answer.status();
    let text = answer.text().await.map_err(lost)?;
    let refused = |why: String| NotHeld {
        lost_answer: false,
        why,
    };
    if !status.is_success() {
        let said: String = crate::text::one_line(&text).chars().take(300).collect();
        return Err(refused(format!("{url} answered {status}: {said}")));
    }
    let id = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["silenceID"].as_str().map(String::from))
        .filter(|id| !id.is_empty() && id.len() <= 64 && !id.contains('/'))
        .ok_or_else(|| {
            let said: String = text.chars().take(200).collect();
            refused(format!("{url} answered without a silence id: {said}"))
        })?;
    Ok(Held {
        id,
        alertmanager: s.alertmanager.clone(),
    })
}

/// Expire every silence Alertmanager at `alertmanager` holds for run
/// `run_id` (its comment names the run): what a create whose answer was
/// lost (a timeout, a dropped connection) may have left. Their ids.
pub(crate) async fn expire_tagged(
    alertmanager: &reqwest::Url,
    run_id: &str,
) -> Result<Vec<String>, String> {
    let url = api(alertmanager, "api/v2/silences");
    let answer = client()
        .get(url.clone())
        .send()
        .await
        .map_err(|e| format!("{url} cannot be reached: {}", crate::error_chain(&e)))?;
    let text = answer
        .text()
        .await
        .map_err(|e| format!("{url}: {}", crate::error_chain(&e)))?;
    let all: Vec<Value> = serde_json::from_str(&text)
        .map_err(|e| format!("{url} answered no list of silences: {e}"))?;
    let tag = format!("run {run_id} ");
    let mut expired = Vec::new();
    for s in all {
        let ours = s["createdBy"] == "runwarden"
            && s["comment"].as_str().is_some_and(|c| c.contains(&tag))
            && s["status"]["state"] != "expired";
        if let (true, Some(id)) = (ours, s["id"].as_str()) {
            let held = Held {
                id: id.to_string(),
                alertmanager: alertmanager.clone(),
            };
            expire(&held).await?;
            expired.push(held.id);
        }
    }
    Ok(expired)
}

/// Expire silence `h` now.
pub(crate) async fn expire(h: &Held) -> Result<(), String> {
    let url = api(&h.alertmanager, &format!("api/v2/silence/{}", h.id));
    let answer = client().delete(url.clone()).send().await.map_err(|e| {
        format!(
            "{url} cannot be reached: {}",
            crate::text::one_line(&e.to_string())
        )
    })?;
    let status = answer.status();
    // Gone already (expired by a person, or by an earlier try): expired.
    if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
        return Ok(());
    }
    let text = answer.text().await.unwrap_or_default();
    // Alertmanager 0.25 answers 500 "silence ... already expired".
    if text.contains("already expired") {
        return Ok(());
    }
    Err(format!(
        "{url} answered {status}: {}",
        crate::text::one_line(&text)
            .chars()
            .take(300)
            .collect::<String>()
    ))
}

fn api(base: &reqwest::Url, path: &str) -> reqwest::Url {
    let mut u = base.clone();
    let joined = format!("{}/{path}", u.path().trim_end_matches('/'));
    u.set_path(&joined);
    u
}

/// Expire every silence the log shows created and never expired whose run
/// is over (its verdict written, by itself or by the start that closed it
/// `interrupted`): the process that held it stopped before the run ended.
/// A run with no verdict yet may still be running elsewhere (a person's
/// `run` beside the daemon): its silence is left to it. Each expiry is
/// written as its run's line. Run once at start, after the runs the last
/// process left are closed, in the background.
pub(crate) async fn expire_left(audit: Arc<AuditLog>) {
    let since = jiff::Timestamp::now() - LOOK_BACK;
    let path = audit.path().to_path_buf();
    let read = tokio::task::spawn_blocking(move || {
        crate::audit::entries(&path, Some(since), |l| {
            l.contains("\"phase\":\"silence\"") || l.contains("\"phase\":\"verdict\"")
        })
    })
    .await;
    let lines = match read {
        Ok(Ok(lines)) => lines,
        Ok(Err(e)) => {
            tracing::warn!("the audit log cannot be read for silences left behind: {e}");
            return;
        }
        Err(_) => return,
    };
    let mut open: Vec<(crate::audit::Entry, Held)> = Vec::new();
    let mut unanswered: Vec<(crate::audit::Entry, reqwest::Url)> = Vec::new();
    let mut over = std::collections::HashSet::new();
    for e in lines {
        if e.phase == Some(Phase::Verdict) {
            over.insert(e.run_id);
            continue;
        }
        if e.phase != Some(Phase::Silence) {
            continue;
        }
        let d = e.detail.clone().unwrap_or_default();
        if e.outcome.as_deref() == Some("unsilenced")
            && d["lost_answer"] == true
            && let Some(am) = d["alertmanager"]
                .as_str()
                .and_then(|u| reqwest::Url::parse(u).ok())
        {
            unanswered.push((e, am));
            continue;
        }
        let Some(id) = d["id"].as_str().map(String::from) else {
            continue;
        };
        match e.outcome.as_deref() {
            Some("created") => {
                if let Some(url) = d["alertmanager"]
                    .as_str()
                    .and_then(|u| reqwest::Url::parse(u).ok())
                {
                    open.push((
                        e,
                        Held {
                            id,
                            alertmanager: url,
                        },
                    ));
                }
            }
            Some("expired") => open.retain(|(_, h)| h.id != id),
            _ => {}
        }
    }
    // A create whose answer was lost may have made one all the same.
    for (line, am) in unanswered {
        if !over.contains(&line.run_id) {
            continue;
        }
        match expire_tagged(&am, &line.run_id).await {
            Ok(ids) if ids.is_empty() => {}
            Ok(ids) => {
                let info = crate::audit::RunInfo::of(&line);
                let detail = json!({ "ids": ids, "by": "the next start: a create whose answer was lost had made them" });
                if let Err(e) = audit.silence(&info, "expired", detail) {
                    tracing::error!(
                        "the expiry of {} silence(s) could not be written: {e}",
                        ids.len()
                    );
                }
            }
            Err(e) => {
                tracing::warn!(run_id = %line.run_id, "silences a lost create may have left cannot be looked for: {e}")
            }
        }
    }
    open.retain(|(line, _)| over.contains(&line.run_id));
    for (line, held) in open {
        let outcome = expire(&held).await;
        let info = crate::audit::RunInfo::of(&line);
        match &outcome {
            Ok(()) => {
                tracing::info!(run_id = %line.run_id, "silence {} the run left (the process stopped before it ended) expired", held.id)
            }
            Err(e) => {
                tracing::warn!(run_id = %line.run_id, "silence {} the run left cannot be expired: {e}; it ends by itself at its end time", held.id)
            }
        }
        let written = match outcome {
            Ok(()) => audit.silence(
                &info,
                "expired",
                json!({ "id": held.id, "by": "the next start: the process that held it stopped before the run ended" }),
            ),
            Err(why) => audit.silence(
                &info,
                "not_expired",
                json!({ "id": held.id, "why": why, "ends_by_itself": true }),
            ),
        };
        if let Err(e) = written {
            tracing::error!(
                "the expiry of silence {} could not be written: {e}",
                held.id
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silence(matchers: &[&str]) -> Silence {
        Silence {
            alertmanager: reqwest::Url::parse("http://127.0.0.1:9093").unwrap(),
            matchers: matchers
                .iter()
                .map(|m| crate::config::matchers::Matcher::parse(m).unwrap())
                .collect(),
            host_label: "instance".into(),
            longest: Duration::from_secs(1800),
        }
    }

    #[test]
    fn a_silence_covers_the_hosts_alerts_it_names_and_never_the_one_done_when_waits_on() {
        let s = silence(&["severity=~\"warning|page\"", "job!=\"blackbox\""]);
        let m = matchers(&s, "web-1.example", Some("DiskAlmostFull"));
        assert_eq!(m[0]["isRegex"], true);
        assert_eq!(m[0]["isEqual"], true);
        assert_eq!(m[1]["isEqual"], false);
        assert_eq!(m[2]["name"], "instance");
        // The dot is escaped: web-1Xexample is another host.
        assert_eq!(m[2]["value"], "web\\-1\\.example(:[0-9]+)?");
        assert_eq!(
            m[3],
            json!({ "name": "alertname", "value": "DiskAlmostFull", "isRegex": false, "isEqual": false })
        );
        assert_eq!(matchers(&s, "h", None).len(), 3);
    }

    #[test]
    fn the_api_path_follows_a_base_url_with_a_path_prefix() {
        let base = reqwest::Url::parse("https://am.example/alertmanager/").unwrap();
        assert_eq!(
            api(&base, "api/v2/silences").as_str(),
            "https://am.example/alertmanager/api/v2/silences"
        );
        let bare = reqwest::Url::parse("http://127.0.0.1:9093").unwrap();
        assert_eq!(
            api(&bare, "api/v2/silence/abc").as_str(),
            "http://127.0.0.1:9093/api/v2/silence/abc"
        );
    }
}

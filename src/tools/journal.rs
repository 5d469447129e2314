//! `read_journal`: recent entries of one unit via `journalctl -o json`.

use serde_json::{Value, json};

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::args::{Priority, Since};
use super::registry::{Allowed, Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process};
use crate::host::Host;
use crate::process::Argv;

/// Lines handed back at most; one more is asked for to know whether any were cut.
pub(crate) const MAX_LINES: usize = 80;
/// Characters kept of one message.
const MAX_MESSAGE: usize = 512;

pub(crate) fn argv(host: &Host, unit: &str, since: Since, priority: Priority) -> Argv {
    Argv::new(&host.binaries.journalctl)
        .args([
            "--no-pager",
            "--quiet",
            "--output=json",
            "--output-fields=MESSAGE,PRIORITY",
        ])
        .arg(format!("--lines={}", MAX_LINES + 1))
        .arg(format!("--since={}", since.journalctl()))
        .arg(format!("--priority={}", priority.name()))
        .arg(format!("--unit={unit}"))
}

pub(crate) async fn read(
    ctx: &Ctx<'_>,
    unit: &str,
    since: Since,
    priority: Priority,
) -> ToolResult {
    let out = match ctx.run(&argv(ctx.host, unit, since, priority)).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let mut result = from_process(&out, Value::Null);
    if result.outcome != Outcome::Ok {
        return result;
    }
    let (lines, cut) = parse(&out.stdout_text());
    result.truncated |= cut;
    result.data = json!({ "unit": unit, "since": since, "priority": priority, "lines": lines, "truncated": result.truncated });
    result
}

/// One JSON object per line; the oldest are dropped past [`MAX_LINES`].
pub(crate) fn parse(text: &str) -> (Vec<Value>, bool) {
    let mut cut = false;
    let mut lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| {
            let (message, long) = message(&e["MESSAGE"]);
            cut |= long;
            let priority = e["PRIORITY"].as_str().and_then(|p| p.parse::<usize>().ok());
            let ts = e["__REALTIME_TIMESTAMP"]
                .as_str()
                .and_then(|t| t.parse::<i64>().ok())
                .and_then(|us| jiff::Timestamp::from_microsecond(us).ok())
                .map(|t| t.to_string())
                .unwrap_or_default();
            json!({
                "ts": ts,
                "priority": priority.and_then(|p| Priority::NAMES.get(p)).copied().unwrap_or("unknown"),
                "message": message,
            })
        })
        .collect();
    if lines.len() > MAX_LINES {
        lines.drain(..lines.len() - MAX_LINES);
        cut = true;
    }
    (lines, cut)
}

/// journald gives MESSAGE as a string, or as an array of bytes when it is not UTF-8.
fn message(v: &Value) -> (String, bool) {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Array(bytes) => {
            let raw: Vec<u8> = bytes
                .iter()
                .filter_map(|b| b.as_u64().map(|b| b as u8))
                .collect();
            String::from_utf8_lossy(&raw).into_owned()
        }
        _ => String::new(),
    };
    if text.chars().count() > MAX_MESSAGE {
        (text.chars().take(MAX_MESSAGE).collect(), true)
    } else {
        (text, false)
    }
}

/// What a `read_journal` result said, in a person's words.
pub(super) fn said(data: &Value) -> String {
    let lines = data["lines"].as_array();
    let newest = lines
        .and_then(|l| l.last())
        .and_then(|l| l["message"].as_str())
        .unwrap_or("");
    format!("{} line(s); newest: {newest}", lines.map_or(0, Vec::len))
}

/// `read_journal`: what a unit logged lately.
pub(crate) struct ReadJournal;

/// A `read_journal` call, resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JournalCall {
    unit: String,
    since: Since,
    priority: Priority,
}

impl Tool for ReadJournal {
    const NAME: &'static str = "read_journal";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str = "Recent journal entries of an allowed unit at or above a priority. At most 80 lines, newest last; truncated says when cut.";
    type Args = JournalArgs;
    type Resolved = JournalCall;

    fn allowed(host: &Host) -> Vec<(&'static str, Allowed)> {
        let units = host.journals.iter().chain(&host.units).cloned();
        let units: std::collections::BTreeSet<String> = units.collect();
        vec![("unit", Allowed::OneOf(units.into_iter().collect()))]
    }

    fn resolve(a: JournalArgs, host: &Host, _: PathMode) -> Result<JournalCall, ArgError> {
        Ok(JournalCall {
            unit: allowed_unit(&a.unit, host, true)?,
            since: a.since,
            priority: a.priority,
        })
    }

    fn args_json(c: &JournalCall) -> Value {
        json!({ "unit": c.unit, "since": c.since, "priority": c.priority })
    }

    fn argv(c: &JournalCall, host: &Host) -> Vec<Argv> {
        vec![argv(host, &c.unit, c.since, c.priority)]
    }

    async fn run(ctx: &Ctx<'_>, c: &JournalCall) -> ToolResult {
        read(ctx, &c.unit, c.since, c.priority).await
    }

    fn said(data: &Value) -> Option<String> {
        Some(said(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_journal_json_and_caps_lines() {
        let line = r#"{"__REALTIME_TIMESTAMP":"1700000000000000","PRIORITY":"3","MESSAGE":"config error: /etc/broken.conf line 3"}"#;
        let (lines, cut) = parse(line);
        assert_eq!(lines[0]["priority"], "err");
        assert_eq!(lines[0]["ts"], "2023-11-14T22:13:20Z");
        assert!(!cut);
        let many = std::iter::repeat_n(line, 81).collect::<Vec<_>>().join("\n");
        let (lines, cut) = parse(&many);
        assert_eq!(lines.len(), 80);
        assert!(cut);
        let bin = r#"{"PRIORITY":"6","MESSAGE":[104,105,255]}"#;
        assert_eq!(parse(bin).0[0]["message"], "hi\u{fffd}");
    }
}

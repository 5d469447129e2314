//! `failed_units`: the host's failed systemd units, as `systemctl` lists them.
//!
//! Allowlisted like every tool: the units the host file names (under `units`
//! or `journals`) are listed by name; failed units it does not name are only
//! counted, so a runbook learns that something else is wrong without a name
//! the host never allowed reaching a planner or a model.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::ArgError;
use super::registry::{Tier, Tool};
use super::{Ctx, Outcome, PathMode, ToolResult, from_process};
use crate::host::Host;
use crate::process::Argv;

/// At most this many failed units are listed by name.
const MAX_LISTED: usize = 50;
/// A unit's description is cut to this many characters.
const MAX_DESCRIPTION: usize = 200;

/// `failed_units` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailedUnitsArgs {}

/// `failed_units`: which of the host's units systemd holds as failed.
pub(crate) struct FailedUnits;

impl Tool for FailedUnits {
    const NAME: &'static str = "failed_units";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str = "Failed systemd units: each allowed one with its states and description; others only counted.";
    type Args = FailedUnitsArgs;
    type Resolved = ();

    fn resolve(_: FailedUnitsArgs, _: &Host, _: PathMode) -> Result<(), ArgError> {
        Ok(())
    }

    fn args_json(_: &()) -> Value {
        json!({})
    }

    fn argv(_: &(), host: &Host) -> Vec<Argv> {
        vec![argv(host)]
    }

    async fn run(ctx: &Ctx<'_>, _: &()) -> ToolResult {
        let out = match ctx.run(&argv(ctx.host)).await {
            Ok(out) => out,
            Err(e) => return ToolResult::failed(e),
        };
        let result = from_process(&out, Value::Null);
        if result.outcome != Outcome::Ok {
            return result;
        }
        let allowed = |u: &str| ctx.host.units.contains(u) || ctx.host.journals.contains(u);
        ToolResult::observed(read(&out.stdout_text(), allowed))
    }

    fn said(data: &Value) -> Option<String> {
        let listed: Vec<String> = data["failed"]
            .as_array()?
            .iter()
            .map(|u| {
                let s = |k: &str| u[k].as_str().unwrap_or("?").to_string();
                format!("{} ({}/{})", s("unit"), s("active_state"), s("sub_state"))
            })
            .collect();
        let elsewhere = data["not_allowed"].as_u64().unwrap_or(0);
        let mut text = match listed.len() {
            0 => "no allowed unit failed".to_string(),
            n => format!("{n} failed: {}", listed.join(", ")),
        };
        if elsewhere > 0 {
            text.push_str(&format!(
                "; {elsewhere} more failed outside this host's allowlist"
            ));
        }
        Some(text)
    }
}

fn argv(host: &Host) -> Argv {
    Argv::new(&host.binaries.systemctl).args([
        "list-units",
        "--state=failed",
        "--all",
        "--plain",
        "--no-legend",
        "--no-pager",
        "--full",
    ])
}

/// The failed units of `systemctl list-units --plain --no-legend` output
/// (`UNIT LOAD ACTIVE SUB DESCRIPTION...` per line): the allowed ones by
/// name, the others counted.
fn read(text: &str, allowed: impl Fn(&str) -> bool) -> Value {
    let mut failed = Vec::new();
    let mut not_allowed = 0;
    let mut truncated = false;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(unit), Some(load), Some(active), Some(sub)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !allowed(unit) {
            not_allowed += 1;
            continue;
        }
        if failed.len() == MAX_LISTED {
            truncated = true;
            continue;
        }
        let description: String = fields
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(MAX_DESCRIPTION)
            .collect();
        failed.push(json!({
            "unit": unit,
            "load_state": load,
            "active_state": active,
            "sub_state": sub,
            "description": description,
        }));
    }
    json!({ "failed": failed, "not_allowed": not_allowed, "truncated": truncated })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two failed units of the root tier's systemd host (Debian 12,
    /// systemd 252) as `systemctl list-units --state=failed --plain
    /// --no-legend` lists them; the same host is read for real by
    /// `it::systemd::failed_units_names_the_allowed_failures_and_only_counts_the_others`.
    const RECORDED: &str = "\
broken.service         loaded failed failed runwarden estate unit that fails on start
not-named-here.service loaded failed failed not-named-here.service
";

    #[test]
    fn allowed_units_are_named_and_the_others_only_counted() {
        let data = read(RECORDED, |u| u == "broken.service");
        assert_eq!(data["failed"][0]["unit"], "broken.service");
        assert_eq!(
            data["failed"][0]["description"],
            "runwarden estate unit that fails on start"
        );
        assert_eq!(data["failed"].as_array().unwrap().len(), 1);
        assert_eq!(data["not_allowed"], 1);
        let text = FailedUnits::said(&data).unwrap();
        assert!(!text.contains("not-named-here"), "{text}");
        assert!(text.contains("1 more failed outside"), "{text}");
    }
}

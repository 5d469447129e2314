//! `rotate_logs`: force logrotate on one allowed configuration and check what it did.
//!
//! logrotate's exit status is not enough: some of its errors (an unknown
//! directive) exit 0, so stderr is read too and any `error:` line fails the
//! verification.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::json;

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::registry::{Change, Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process, privileged};
use crate::host::Host;
use crate::process::Argv;

const DEFAULT_STATE: &str = "/var/lib/logrotate/status";

fn state_file(host: &Host) -> PathBuf {
    host.logrotate_state
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE))
}

pub(crate) fn argv(host: &Host, config: &Path) -> Argv {
    let mut a = Argv::new(&host.binaries.logrotate).args(["--verbose", "--force"]);
    if let Some(state) = &host.logrotate_state {
        a = a.arg("--state").arg(state.to_string_lossy());
    }
    privileged(host, a.arg(config.to_string_lossy()))
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

pub(crate) async fn rotate(ctx: &Ctx<'_>, config: &Path) -> ToolResult {
    let state = state_file(ctx.host);
    let before = mtime(&state);
    let out = match ctx.run(&argv(ctx.host, config)).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let stderr = out.stderr_text();
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .take(10)
        .collect();
    // One `rotating log PATH, log->rotateCount is N` line per log it
    // rotates; its `renaming` lines are every older copy it shifts (a
    // thousand a log with `rotate 1000`, most of them absent), no count.
    let rotated: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("rotating log "))
        .map(|l| {
            l.split_once(", log->rotateCount")
                .map_or(l, |(path, _)| path)
        })
        .take(50)
        .collect();
    let after = mtime(&state);
    let state_updated = after.is_some() && after != before;
    let mut result = from_process(
        &out,
        json!({
            "config": config,
            "errors": errors,
            "rotated": rotated,
            "state_file": state,
            "state_updated": state_updated,
        }),
    );
    let verified = result.outcome == Outcome::Ok && errors.is_empty() && state_updated;
    result.data["evidence"] = json!(if verified {
        format!(
            "exit 0, no error lines, {} file(s) rotated, state file updated",
            rotated.len()
        )
    } else if let Some(e) = errors.first() {
        format!("not verified: {e}")
    } else if !state_updated {
        "not verified: the state file was not updated".to_string()
    } else {
        format!("not verified: {}", out.failure_text())
    });
    if let Some(e) = errors.first() {
        // Its own `error:` line says what went wrong; the last line of its
        // output is often only where it stopped.
        match result.outcome {
            Outcome::Ok => {
                result.outcome = Outcome::Error;
                result.error = Some(format!("logrotate exited 0 but reported: {e}"));
            }
            Outcome::Error => result.error = Some(format!("logrotate failed: {e}")),
            Outcome::Timeout => {}
        }
    }
    result.verified = Some(verified);
    result
}

/// `rotate_logs`: one forced logrotate run of an allowed configuration.
pub(crate) struct RotateLogs;

impl Tool for RotateLogs {
    const NAME: &'static str = "rotate_logs";
    const TIER: Tier = Tier::Change;
    const DESCRIPTION: &'static str = "Force logrotate on an allowed configuration, then verify: exit status, no error lines, state file updated.";
    type Args = RotateArgs;
    type Resolved = Change<PathBuf>;

    fn resolve(a: RotateArgs, host: &Host, mode: PathMode) -> Result<Change<PathBuf>, ArgError> {
        let config = allowed_file(
            a.config.as_str(),
            &host.logrotate_configs,
            mode,
            "logrotate_configs",
        )?;
        Ok(Change::new(config, &a.reason))
    }

    fn args_json(c: &Change<PathBuf>) -> serde_json::Value {
        json!({ "config": c.target })
    }

    fn reason(c: &Change<PathBuf>) -> Option<&str> {
        Some(&c.reason)
    }

    fn argv(c: &Change<PathBuf>, host: &Host) -> Vec<Argv> {
        vec![argv(host, &c.target)]
    }

    async fn run(ctx: &Ctx<'_>, c: &Change<PathBuf>) -> ToolResult {
        rotate(ctx, &c.target).await
    }

    fn targets(host: &Host) -> Option<(&'static str, Vec<String>)> {
        let configs = host.logrotate_configs.iter();
        Some(("config", configs.map(|p| p.display().to_string()).collect()))
    }
}

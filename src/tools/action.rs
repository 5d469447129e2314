//! From untrusted arguments to an [`Action`]: [`resolve`] checks every value
//! against the host's allowlists, and only it makes an action.

use serde_json::{Value, json};

use super::args::ArgError;
use super::registry::Resolved;
use super::*;
use crate::host::Host;
use crate::process::Argv;

/// How paths are checked: on the machine that will run the call, or by their text only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMode {
    /// Resolve symlinks and `..` on this machine, then check what they point to.
    Resolve,
    /// Check the text only (the call runs elsewhere; that side resolves again).
    Lexical,
}

/// A call whose every argument was checked against the host: the only input
/// `tools::execute` accepts. Opaque: only [`resolve`] makes one, so no code
/// outside this module can hand-build a call the allowlists never saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Action(pub(in crate::tools) Resolved);

impl Action {
    /// The tool it runs.
    pub(crate) fn tool(&self) -> ToolId {
        self.0.tool()
    }

    /// The tool's tier.
    pub(crate) fn tier(&self) -> Tier {
        self.tool().tier()
    }

    /// A tier-2 call's reason.
    pub(crate) fn reason(&self) -> Option<&str> {
        self.0.reason()
    }

    /// The resolved arguments, as recorded in the audit log (the reason has its own field).
    pub fn args_json(&self) -> Value {
        self.0.args_json()
    }

    /// The commands it runs, exactly as it would spawn them (for `--dry-run`).
    pub(crate) fn planned_argv(&self, host: &Host) -> Vec<Argv> {
        self.0.argv(host)
    }

    /// The sha256 of a declared tool's file: which version of it this is.
    pub(crate) fn declaration(&self) -> Option<String> {
        self.tool().declaration().map(str::to_string)
    }

    /// A declared tier-2 call's undo, as a person would run it.
    pub(crate) fn undo_argv(&self, host: &Host) -> Option<Argv> {
        match &self.0 {
            Resolved::Declared(c) => c.undo_argv(host),
            _ => None,
        }
    }
}

/// The commands a tier-2 call of `tool` on `target` runs as root on
/// `host` (after `sudo -n --`), built by the tool's own resolve and argv
/// builders: what a sudoers file must allow, and nothing else. A command
/// whose arguments are only known at run time (a signal to a master's pid)
/// cannot be listed and is left out.
pub fn privileged_commands(tool: &ToolId, host: &Host, target: &str) -> Vec<Argv> {
    let Some((field, _)) = tool.targets(host) else {
        return Vec::new();
    };
    let args = json!({ field: target, "reason": "install print" });
    let Ok(action) = resolve(tool, &args, host, PathMode::Lexical) else {
        return Vec::new();
    };
    action
        .planned_argv(host)
        .into_iter()
        .filter(|a| !a.to_vec().iter().any(|s| s == pool::MASTER_PID))
        .map(|a| super::context::unprivileged(host, a))
        .collect()
}

/// Check untrusted arguments for `tool` against `host`'s allowlists.
///
/// The error is a sentence a planner (or a model) can act on; it quotes
/// untrusted values only escaped and cut short.
pub fn resolve(
    tool: &ToolId,
    args: &Value,
    host: &Host,
    mode: PathMode,
) -> Result<Action, ArgError> {
    tool.resolve(args, host, mode).map(Action)
}

//! The host's side of the gate: what `runwarden agent` checks before it
//! writes a call's intent line on a managed host.
//!
//! The agent does not trust the runner, so it mints its own [`Permit`] here,
//! the only place besides [`super::Gate::check`] that can: the host's own
//! policy resolves the call against its allowlists, and a tier-2 call must
//! carry the runner's signed permit for exactly this call, used once. The
//! agent then goes the same typed way as a run: intent line (the permit
//! spent), dispatch (the ticket spent), result line.

use serde_json::Value;

use super::signed::{CallId, SignedPermit};
use super::{ApprovedBy, Permit};
use crate::config::Host;
use crate::tools::{self, PathMode, Tier, ToolId};

/// One call as it reached the host.
pub struct HostCall<'a> {
    pub run_id: &'a str,
    pub step: u32,
    pub tool: &'a str,
    /// The arguments as sent (a tier-2 call's `reason` among them).
    pub args: &'a Value,
    pub signed: Option<&'a SignedPermit>,
}

/// Check `call` against the host's policy. `used_before` says whether this
/// host's audit log already has an intent for the call's run and step (one
/// permit, one call); it is asked only for a tier-2 call whose signature holds.
pub fn check(
    policy: &Host,
    call: &HostCall<'_>,
    used_before: impl FnOnce() -> Result<bool, String>,
) -> Result<Permit, String> {
    let Some(tool) = ToolId::from_name(call.tool) else {
        return Err(format!(
            "there is no tool {}",
            tools::args::shown(call.tool)
        ));
    };
    let action = tools::resolve(tool, call.args, policy, PathMode::Resolve)
        .map_err(|e| format!("host policy refuses it: {e}"))?;
    let approved_by = match tool.tier() {
        Tier::Observe => ApprovedBy::Auto,
        Tier::Change => signed_approval(policy, call, used_before)?,
    };
    Ok(Permit {
        step: call.step,
        action,
        approved_by,
    })
}

/// A tier-2 call runs only with the runner's signed permit for exactly this
/// call, once: holding the SSH key is not enough to change this host.
fn signed_approval(
    policy: &Host,
    call: &HostCall<'_>,
    used_before: impl FnOnce() -> Result<bool, String>,
) -> Result<ApprovedBy, String> {
    let Some(public) = &policy.permit_public_key else {
        return Err(
            "this host's policy names no permit_public_key, so it takes no tier-2 call: add the line `runwarden install print` gives".into(),
        );
    };
    let Some(permit) = call.signed else {
        return Err("a tier-2 call without the runner's signed permit".into());
    };
    permit.check(
        public,
        &CallId {
            run_id: call.run_id,
            step: call.step,
            host: &policy.name,
            tool: call.tool,
            args: call.args,
        },
    )?;
    let by = match permit.approved_by.parse::<ApprovedBy>() {
        Ok(by @ (ApprovedBy::Standing(_) | ApprovedBy::Person(_))) => by,
        _ => {
            return Err(format!(
                "the permit names no standing approval or person ({:?})",
                permit.approved_by
            ));
        }
    };
    if used_before()? {
        return Err(format!(
            "the permit for run {} step {} was already used",
            call.run_id, call.step
        ));
    }
    Ok(by)
}

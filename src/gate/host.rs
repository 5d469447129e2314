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
use crate::audit::HostRefusal;
use crate::config::Host;
use crate::tools::{self, PathMode, Tier, ToolId};

/// One call as it reached the host.
pub struct HostCall<'a> {
    /// The run, as the runner named it.
    pub run_id: &'a str,
    /// Its step.
    pub step: u32,
    /// The tool's name, as sent.
    pub tool: &'a str,
    /// The arguments as sent (a tier-2 call's `reason` among them).
    pub args: &'a Value,
    /// The runner's signed permit (tier 2).
    pub signed: Option<&'a SignedPermit>,
}

/// Why the host refused a call: the message for the runner, and the kind
/// its audit line records ([`Refusal::reason`]).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// No such tool, or arguments the host's allowlists do not allow.
    #[error("{0}")]
    Policy(String),
    /// A tier-2 call without a permit this host accepts.
    #[error("{0}")]
    Permit(String),
    /// The permit was spent on an earlier call.
    #[error("the permit for run {run_id} step {step} was already used")]
    Reused {
        /// The run the permit was signed for.
        run_id: String,
        /// Its step.
        step: u32,
    },
    /// The host's audit log could not be read to tell whether the permit
    /// was spent.
    #[error("{0}")]
    AuditUnreadable(String),
}

impl Refusal {
    /// The kind of refusal, as the host's audit line names it.
    pub fn reason(&self) -> HostRefusal {
        match self {
            Refusal::Policy(_) => HostRefusal::HostPolicy,
            Refusal::Permit(_) => HostRefusal::PermitInvalid,
            Refusal::Reused { .. } => HostRefusal::PermitReused,
            Refusal::AuditUnreadable(_) => HostRefusal::AuditUnreadable,
        }
    }
}

/// Check `call` against the host's policy. `used_before` says whether this
/// host's audit log already has an intent for the call's run and step (one
/// permit, one call); it is asked only for a tier-2 call whose signature
/// holds, and its error says why the log could not be read.
pub fn check(
    policy: &Host,
    call: &HostCall<'_>,
    used_before: impl FnOnce() -> Result<bool, String>,
) -> Result<Permit, Refusal> {
    let Some(tool) = ToolId::from_name(call.tool) else {
        return Err(Refusal::Policy(format!(
            "there is no tool {}",
            tools::args::shown(call.tool)
        )));
    };
    let action = tools::resolve(tool, call.args, policy, PathMode::Resolve)
        .map_err(|e| Refusal::Policy(format!("host policy refuses it: {e}")))?;
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
) -> Result<ApprovedBy, Refusal> {
    let Some(public) = &policy.permit_public_key else {
        return Err(Refusal::Permit(
            "this host's policy names no permit_public_key, so it takes no tier-2 call: add the line `runwarden install print` gives".into(),
        ));
    };
    let Some(permit) = call.signed else {
        return Err(Refusal::Permit(
            "a tier-2 call without the runner's signed permit".into(),
        ));
    };
    permit
        .check(
            public,
            &CallId {
                run_id: call.run_id,
                step: call.step,
                host: &policy.name,
                tool: call.tool,
                args: call.args,
            },
        )
        .map_err(Refusal::Permit)?;
    let by = match permit.approved_by.parse::<ApprovedBy>() {
        Ok(by @ (ApprovedBy::Standing(_) | ApprovedBy::Person(_))) => by,
        _ => {
            return Err(Refusal::Permit(format!(
                "the permit names no standing approval or person ({:?})",
                permit.approved_by
            )));
        }
    };
    if used_before().map_err(Refusal::AuditUnreadable)? {
        return Err(Refusal::Reused {
            run_id: call.run_id.to_string(),
            step: call.step,
        });
    }
    Ok(by)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::signed::PermitKey;
    use serde_json::json;

    /// Each way a call can fail the host's check is recorded as its own kind.
    #[test]
    fn each_refusal_names_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let key = PermitKey::load_or_create(&dir.path().join("permit.key")).unwrap();
        let file = dir.path().join("web.yaml");
        std::fs::write(
            &file,
            format!(
                "name: web\nconnection: local\nunits: [nginx.service]\npermit_public_key: {}\n",
                key.public_hex()
            ),
        )
        .unwrap();
        let policy = crate::executor::agent::load_policy(&file).unwrap();
        let args = json!({ "unit": "nginx.service", "reason": "stuck" });
        let id = CallId {
            run_id: "r1",
            step: 2,
            host: "web",
            tool: "restart_service",
            args: &args,
        };
        let signed = key.sign(&id, "standing:rb");
        let call = |tool, args, signed| HostCall {
            run_id: "r1",
            step: 2,
            tool,
            args,
            signed,
        };
        let never = || Ok(false);
        let kind = |r: Result<Permit, Refusal>| r.map(|_| ()).map_err(|e| e.reason());

        assert_eq!(
            kind(check(
                &policy,
                &call("restart_service", &args, Some(&signed)),
                never
            )),
            Ok(())
        );
        assert_eq!(
            kind(check(&policy, &call("rm_rf", &args, Some(&signed)), never)),
            Err(HostRefusal::HostPolicy)
        );
        let other = json!({ "unit": "sshd.service", "reason": "stuck" });
        assert_eq!(
            kind(check(
                &policy,
                &call("restart_service", &other, Some(&signed)),
                never
            )),
            Err(HostRefusal::HostPolicy)
        );
        assert_eq!(
            kind(check(&policy, &call("restart_service", &args, None), never)),
            Err(HostRefusal::PermitInvalid)
        );
        let stranger = PermitKey::load_or_create(&dir.path().join("other.key")).unwrap();
        let theirs = stranger.sign(&id, "standing:rb");
        assert_eq!(
            kind(check(
                &policy,
                &call("restart_service", &args, Some(&theirs)),
                never
            )),
            Err(HostRefusal::PermitInvalid)
        );
        let used = check(
            &policy,
            &call("restart_service", &args, Some(&signed)),
            || Ok(true),
        );
        let err = used.map(|_| ()).unwrap_err();
        assert_eq!(err.reason(), HostRefusal::PermitReused);
        assert_eq!(
            err.to_string(),
            "the permit for run r1 step 2 was already used"
        );
        let unreadable = check(
            &policy,
            &call("restart_service", &args, Some(&signed)),
            || Err("permission denied".into()),
        );
        assert_eq!(kind(unreadable), Err(HostRefusal::AuditUnreadable));
    }
}

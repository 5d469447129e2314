//! The host's side of the gate: what the agent checks before it writes a
//! call's intent line on a managed host.
//!
//! The agent does not trust the runner, so it makes its own permit here:
//! a [`HostPermit`], a type of its own that only this module makes and only
//! the agent's own dispatch takes. The runner's [`crate::gate::Permit`]
//! comes only from the runner's gate, with a runbook's scope, budget and
//! kill switch behind it; nothing here can make one. The host's policy
//! resolves the call against its allowlists, and a tier-2 call must carry
//! the runner's signed permit for exactly this call, spent once
//! ([`super::replay`]).

use serde_json::Value;

use super::replay::Spent;
use crate::config::Host;
use crate::gate::ApprovedBy;
use crate::signing::{CallId, SignedPermit};
use crate::tools::{self, Action, PathMode, Tier, Tools};

/// The host's own policy: its host file (the allowlists), and the tools
/// declared in `tools/` beside it, the only declarations it runs.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The host file.
    pub(crate) host: Host,
    /// Its declared tools.
    pub(crate) tools: Tools,
}

impl std::ops::Deref for Policy {
    type Target = Host;
    fn deref(&self) -> &Host {
        &self.host
    }
}

/// One call as it reached the host.
pub(crate) struct HostCall<'a> {
    /// The run, as the runner named it.
    pub(crate) run_id: &'a str,
    /// Its step.
    pub(crate) step: u32,
    /// The tool's name, as sent.
    pub(crate) tool: &'a str,
    /// The arguments as sent (a tier-2 call's `reason` among them).
    pub(crate) args: &'a Value,
    /// The runner's signed permit (tier 2).
    pub(crate) signed: Option<&'a SignedPermit>,
    /// The sha256 of the declaration the runner checked a declared tool's call against.
    pub(crate) declaration: Option<&'a str>,
}

/// Permission to run one call on this host, from the host's own policy.
/// Only [`check`] makes one; the audit log spends it on the intent line.
#[derive(Debug)]
pub(crate) struct HostPermit {
    step: u32,
    action: Action,
    approved_by: ApprovedBy,
}

impl crate::audit::Permitted for HostPermit {
    fn step(&self) -> u32 {
        self.step
    }
    fn action(&self) -> &Action {
        &self.action
    }
    fn approved_by(&self) -> &ApprovedBy {
        &self.approved_by
    }
}
impl crate::audit::permitted::Sealed for HostPermit {}

/// Why the host refused a request: the message for the runner, and the
/// kind its audit line records ([`Refusal::kind`]). A permit that fails or
/// comes back a second time is worth a look of its own: the runner never
/// sends either.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// No such tool, or arguments the host's allowlists do not allow.
    #[error("{0}")]
    Policy(String),
    /// A tier-2 call without a permit this host accepts: none, signed by
    /// another key, for another call, expired, or the policy takes none.
    #[error("{0}")]
    Permit(String),
    /// The permit was spent on an earlier call (or on this very call, sent
    /// again on another connection).
    #[error("the permit for run {run_id} step {step} was already used")]
    Replayed {
        /// The run the permit was signed for.
        run_id: String,
        /// Its step.
        step: u32,
    },
    /// The host's record of spent permits could not be written or read, so
    /// the permit is not taken.
    #[error("{0}")]
    Unrecorded(String),
    /// The line was not a request at all.
    #[error("{0}")]
    Malformed(String),
}

impl Refusal {
    /// The kind of refusal, as the host's audit line names it (`detail.reason`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Refusal::Policy(_) => "host_policy",
            Refusal::Permit(_) => "permit_invalid",
            Refusal::Replayed { .. } => "permit_replayed",
            Refusal::Unrecorded(_) => "audit_unreadable",
            Refusal::Malformed(_) => "malformed_request",
        }
    }
}

/// Check `call` against the host's policy. A tier-2 call whose signed permit
/// holds is marked spent in `spent` before this returns: of any number of
/// connections carrying the same permit at the same moment, one gets the
/// [`HostPermit`] and every other is refused [`Refusal::Replayed`].
pub(crate) fn check(
    policy: &Policy,
    call: &HostCall<'_>,
    spent: &Spent,
) -> Result<HostPermit, Refusal> {
    let Some(tool) = policy.tools.get(call.tool) else {
        return Err(Refusal::Policy(format!(
            "there is no tool {} on this host (a declared tool runs only where its file is in the policy's tools/)",
            tools::args::shown(call.tool)
        )));
    };
    // A declared tool runs only as this host's own copy declares it, and
    // only when that is the declaration the runner checked the call against.
    if let Some(ours) = tool.declaration()
        && call.declaration != Some(ours)
    {
        return Err(Refusal::Policy(format!(
            "the runner checked this call of {} against declaration sha256:{}, and this host's copy is sha256:{ours}: install the same tools/{}.yaml on both (runwarden install print --host {})",
            tool.name(),
            call.declaration.unwrap_or("(none)"),
            tool.name(),
            policy.name
        )));
    }
    let action = tools::resolve(&tool, call.args, policy, PathMode::Resolve)
        .map_err(|e| Refusal::Policy(format!("host policy refuses it: {e}")))?;
    let approved_by = match tool.tier() {
        Tier::Observe => ApprovedBy::Auto,
        Tier::Change => signed_approval(policy, call, &tool.signed_name(), spent)?,
    };
    Ok(HostPermit {
        step: call.step,
        action,
        approved_by,
    })
}

/// A tier-2 call runs only with the runner's signed permit for exactly this
/// call, once: holding the SSH key is not enough to change this host.
/// `signed_name`: the tool as permits name it (a declared tool with the
/// sha256 of this host's declaration, so a permit signed for another
/// version of it does not verify here).
fn signed_approval(
    policy: &Host,
    call: &HostCall<'_>,
    signed_name: &str,
    spent: &Spent,
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
                tool: signed_name,
                args: call.args,
            },
        )
        .map_err(|e| Refusal::Permit(e.to_string()))?;
    let by = match permit.approved_by.parse::<ApprovedBy>() {
        Ok(by @ (ApprovedBy::Standing(_) | ApprovedBy::Person(_))) => by,
        _ => {
            return Err(Refusal::Permit(format!(
                "the permit names no standing approval or person ({:?})",
                permit.approved_by
            )));
        }
    };
    match spent.spend(permit) {
        Ok(true) => Ok(by),
        Ok(false) => Err(Refusal::Replayed {
            run_id: call.run_id.to_string(),
            step: call.step,
        }),
        Err(e) => Err(Refusal::Unrecorded(format!(
            "cannot record the permit as spent in {}, so it is not taken: {e}",
            spent.dir().display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::PermitKey;
    use serde_json::json;

    /// A host file allowing `nginx.service`, its policy, a permit key the
    /// policy trusts, and a record of spent permits, all under `dir`.
    struct Host {
        dir: tempfile::TempDir,
        key: PermitKey,
        policy: Policy,
        spent: Spent,
        args: serde_json::Value,
    }

    impl Host {
        fn new() -> Host {
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
            let policy = super::super::load_policy(&file).unwrap();
            let spent = Spent::at(&dir.path().join("permits"));
            let args = json!({ "unit": "nginx.service", "reason": "stuck" });
            Host {
                dir,
                key,
                policy,
                spent,
                args,
            }
        }

        /// A permit for step 2 of `run_id`, restarting nginx, signed by `key`.
        fn signed_by(&self, key: &PermitKey, run_id: &str) -> SignedPermit {
            key.sign(
                &CallId {
                    run_id,
                    step: 2,
                    host: "web",
                    tool: "restart_service",
                    args: &self.args,
                },
                "standing:rb",
            )
        }

        /// The kind of the host's answer to step 2 of `run_id`.
        fn kind(
            &self,
            run_id: &str,
            tool: &str,
            args: &serde_json::Value,
            signed: Option<&SignedPermit>,
            spent: &Spent,
        ) -> Result<(), &'static str> {
            let call = HostCall {
                run_id,
                step: 2,
                tool,
                args,
                signed,
                declaration: None,
            };
            check(&self.policy, &call, spent)
                .map(|_| ())
                .map_err(|e| e.kind())
        }
    }

    /// Each way a call can fail the host's check is recorded as its own
    /// kind; refusals before the signature holds spend nothing.
    #[test]
    fn each_refusal_names_its_kind() {
        let h = Host::new();
        let signed = h.signed_by(&h.key, "r1");
        let restart = |args, signed| h.kind("r1", "restart_service", args, signed, &h.spent);
        assert_eq!(
            h.kind("r1", "rm_rf", &h.args, Some(&signed), &h.spent),
            Err("host_policy")
        );
        let other = json!({ "unit": "sshd.service", "reason": "stuck" });
        assert_eq!(restart(&other, Some(&signed)), Err("host_policy"));
        assert_eq!(restart(&h.args, None), Err("permit_invalid"));
        let stranger = PermitKey::load_or_create(&h.dir.path().join("other.key")).unwrap();
        let theirs = h.signed_by(&stranger, "r1");
        assert_eq!(restart(&h.args, Some(&theirs)), Err("permit_invalid"));
        // The real permit runs, once.
        assert_eq!(restart(&h.args, Some(&signed)), Ok(()));
        let call = HostCall {
            run_id: "r1",
            step: 2,
            tool: "restart_service",
            args: &h.args,
            signed: Some(&signed),
            declaration: None,
        };
        let again = check(&h.policy, &call, &h.spent).map(|_| ()).unwrap_err();
        assert_eq!(again.kind(), "permit_replayed");
        assert_eq!(
            again.to_string(),
            "the permit for run r1 step 2 was already used"
        );
    }

    /// Run ids that differ only past their 64th character, or that hold
    /// quotes, are two permits, each spent once.
    #[test]
    fn a_permit_is_spent_once_whatever_its_run_id_looks_like() {
        let h = Host::new();
        let long = format!("{}a", "x".repeat(80));
        let long_too = format!("{}b", "x".repeat(80));
        for run_id in [long.as_str(), long_too.as_str(), "r\"2"] {
            let p = h.signed_by(&h.key, run_id);
            let restart = || h.kind(run_id, "restart_service", &h.args, Some(&p), &h.spent);
            assert_eq!(restart(), Ok(()), "{run_id}");
            assert_eq!(restart(), Err("permit_replayed"), "{run_id}");
        }
    }

    /// A record of spent permits that cannot be written refuses the permit
    /// (fail closed).
    #[test]
    fn a_permit_that_cannot_be_recorded_as_spent_is_refused() {
        let h = Host::new();
        let blocked = h.dir.path().join("blocked");
        std::fs::write(&blocked, "").unwrap();
        let unwritable = Spent::at(&blocked.join("permits"));
        let fresh = h.signed_by(&h.key, "r3");
        assert_eq!(
            h.kind("r3", "restart_service", &h.args, Some(&fresh), &unwritable),
            Err("audit_unreadable")
        );
    }
}

//! Signed tier-2 permits: what a managed host needs to believe that the
//! gate, and not merely a holder of the SSH key, allowed a change.
//!
//! The agent on a managed host checks every call against its own policy, but
//! a policy cannot know whether a change was approved: anyone who copied the
//! runner's SSH key could ask for one. So the runner signs each tier-2 call's
//! permit (run, step, host, tool, the digest of the exact arguments, who
//! approved it, when it expires) with a key of its own, kept outside the SSH
//! key; the host's policy names the public key (`permit_public_key`), and the
//! agent refuses a tier-2 call whose permit is missing, forged, for another
//! call or stale. A copied SSH key then reaches tier-1 calls only.
//!
//! Ed25519, with the key stored as a 32-byte seed in hex in a file only its
//! owner can read (`permit_key_file`, default `state/permit.key`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// How long a signed permit is good for after it is made: the call's own
/// timeout bounds the work, this bounds how late a permit may arrive.
pub(crate) const PERMIT_TTL_SECS: i64 = 120;

/// The runner's signing key.
pub struct PermitKey(SigningKey);

impl std::fmt::Debug for PermitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PermitKey(public {})", self.public_hex())
    }
}

/// Why the runner's permit key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read, or others can read it.
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretError),
    /// The file holds something else than a 32-byte seed in hex.
    #[error("permit_key_file {} does not hold a 32-byte key in hex", .0.display())]
    NotAKey(std::path::PathBuf),
    /// A new key could not be made or written.
    #[error("{what}: {source}")]
    Create {
        /// What was being done.
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Why a signed permit does not allow a call.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PermitRefused {
    /// The host's policy names no usable public key.
    #[error("the policy's permit_public_key is not an Ed25519 public key in hex")]
    BadPublicKey,
    /// The signature is not one at all.
    #[error("the permit's signature is not 64 bytes in hex")]
    Malformed,
    /// The signature is not the runner's (forged, or another runner's).
    #[error("the permit's signature does not verify against this host's permit_public_key")]
    Forged,
    /// Signed for another call: its run, step, host, tool or arguments differ.
    #[error("the permit is for another call (its {0} differs)")]
    OtherCall(&'static str),
    /// Too late.
    #[error("the permit expired {0} s ago")]
    Expired(i64),
}

impl PermitKey {
    /// Read the key file (refused when others can read it).
    pub fn load(path: &Path) -> Result<PermitKey, KeyError> {
        let text = crate::secret::read_file(path, "permit_key_file")?;
        let seed = decode_hex::<32>(text.trim()).ok_or_else(|| KeyError::NotAKey(path.into()))?;
        Ok(PermitKey(SigningKey::from_bytes(&seed)))
    }

    /// Read the key file, or make a new key there (mode 0600) if there is none.
    pub fn load_or_create(path: &Path) -> Result<PermitKey, KeyError> {
        if path.exists() {
            return PermitKey::load(path);
        }
        let mut seed = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
            .map_err(|source| KeyError::Create {
                what: "cannot read /dev/urandom for a new permit key".into(),
                source,
            })?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| KeyError::Create {
                what: format!("cannot create {}", dir.display()),
                source,
            })?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| KeyError::Create {
                what: format!("cannot create permit_key_file {}", path.display()),
                source,
            })?;
        writeln!(f, "{}", hex(&seed))
            .and_then(|()| f.sync_all())
            .map_err(|source| KeyError::Create {
                what: format!("cannot write permit_key_file {}", path.display()),
                source,
            })?;
        Ok(PermitKey(SigningKey::from_bytes(&seed)))
    }

    /// The public key, as a host's policy names it.
    pub fn public_hex(&self) -> String {
        hex(self.0.verifying_key().as_bytes())
    }

    /// Sign the permit of one tier-2 call, good for [`PERMIT_TTL_SECS`].
    pub fn sign(&self, call: &CallId<'_>, approved_by: &str) -> SignedPermit {
        let expires_at = jiff::Timestamp::now().as_second() + PERMIT_TTL_SECS;
        self.sign_until(call, approved_by, expires_at)
    }

    /// Sign a permit that expires at `expires_at` (Unix seconds).
    pub fn sign_until(
        &self,
        call: &CallId<'_>,
        approved_by: &str,
        expires_at: i64,
    ) -> SignedPermit {
        let mut permit = SignedPermit {
            run_id: call.run_id.to_string(),
            step: call.step,
            host: call.host.to_string(),
            tool: call.tool.to_string(),
            args_sha256: args_digest(call.args),
            approved_by: approved_by.to_string(),
            expires_at,
            sig: String::new(),
        };
        permit.sig = hex(&self.0.sign(&permit.message()).to_bytes());
        permit
    }
}

/// What a permit is for: one call of one run on one host.
pub struct CallId<'a> {
    /// The run.
    pub run_id: &'a str,
    /// Its step.
    pub step: u32,
    /// The host the call is for.
    pub host: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The arguments, exactly (a digest of them is signed).
    pub args: &'a Value,
}

/// A tier-2 permit as it travels to the host with the call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SignedPermit {
    /// The run it is for.
    pub(crate) run_id: String,
    /// Its step.
    pub(crate) step: u32,
    /// The host it is for.
    pub(crate) host: String,
    /// The tool it allows.
    pub(crate) tool: String,
    /// sha256 of the call's arguments.
    pub(crate) args_sha256: String,
    /// Who allowed the call (`standing:RUNBOOK` or `person:NAME`).
    pub(crate) approved_by: String,
    /// Unix seconds.
    pub(crate) expires_at: i64,
    /// Ed25519 signature over all of the above, in hex.
    pub(crate) sig: String,
}

impl SignedPermit {
    /// The signed bytes: every field but the signature, as canonical JSON.
    fn message(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "run_id": self.run_id, "step": self.step, "host": self.host, "tool": self.tool,
            "args_sha256": self.args_sha256, "approved_by": self.approved_by,
            "expires_at": self.expires_at, "purpose": "runwarden tier-2 permit v1",
        }))
        .unwrap_or_default()
    }

    /// sha256 of everything the signature covers, in hex: the permit's whole
    /// identity (a test's way to tell two signings of one call apart; the
    /// host spends a call, not a signature).
    #[cfg(test)]
    pub(crate) fn identity_digest(&self) -> String {
        hex(&Sha256::digest(self.message()))
    }

    /// Whether this permit, signed by `public_hex`, allows exactly `call` now.
    pub(crate) fn check(&self, public_hex: &str, call: &CallId<'_>) -> Result<(), PermitRefused> {
        let key = decode_hex::<32>(public_hex)
            .and_then(|k| VerifyingKey::from_bytes(&k).ok())
            .ok_or(PermitRefused::BadPublicKey)?;
        let sig = decode_hex::<64>(&self.sig)
            .map(|s| Signature::from_bytes(&s))
            .ok_or(PermitRefused::Malformed)?;
        key.verify(&self.message(), &sig)
            .map_err(|_| PermitRefused::Forged)?;
        let mismatch = [
            ("run", self.run_id == call.run_id),
            ("step", self.step == call.step),
            ("host", self.host == call.host),
            ("tool", self.tool == call.tool),
            ("arguments", self.args_sha256 == args_digest(call.args)),
        ];
        if let Some((what, _)) = mismatch.iter().find(|(_, same)| !same) {
            return Err(PermitRefused::OtherCall(what));
        }
        let now = jiff::Timestamp::now().as_second();
        if now > self.expires_at {
            return Err(PermitRefused::Expired(now - self.expires_at));
        }
        Ok(())
    }
}

/// sha256 of the arguments as canonical JSON (object keys sorted).
pub(crate) fn args_digest(args: &Value) -> String {
    hex(&Sha256::digest(
        serde_json::to_vec(args).unwrap_or_default(),
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Whether `s` is an Ed25519 public key in hex (for the config loader).
pub(crate) fn is_public_key(s: &str) -> bool {
    decode_hex::<32>(s).is_some_and(|k| VerifyingKey::from_bytes(&k).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(args: &'a Value) -> CallId<'a> {
        CallId {
            run_id: "r1",
            step: 3,
            host: "web",
            tool: "restart_service",
            args,
        }
    }

    #[test]
    fn a_permit_allows_exactly_its_call_and_only_under_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = PermitKey::load_or_create(&dir.path().join("k")).unwrap();
        let again = PermitKey::load(&dir.path().join("k")).unwrap();
        assert_eq!(key.public_hex(), again.public_hex());
        let args = json!({"unit": "nginx.service", "reason": "stuck"});
        let p = key.sign(&call(&args), "standing:rb");
        assert!(p.check(&key.public_hex(), &call(&args)).is_ok());
        let other = json!({"unit": "postgresql.service", "reason": "stuck"});
        assert!(matches!(
            p.check(&key.public_hex(), &call(&other)),
            Err(PermitRefused::OtherCall("arguments"))
        ));
        let mut forged = p.clone();
        forged.approved_by = "person:mallory".into();
        assert!(matches!(
            forged.check(&key.public_hex(), &call(&args)),
            Err(PermitRefused::Forged)
        ));
        let stranger = PermitKey::load_or_create(&dir.path().join("k2")).unwrap();
        let theirs = stranger.sign(&call(&args), "standing:rb");
        assert!(matches!(
            theirs.check(&key.public_hex(), &call(&args)),
            Err(PermitRefused::Forged)
        ));
        let stale = key.sign_until(
            &call(&args),
            "standing:rb",
            jiff::Timestamp::now().as_second() - 10,
        );
        assert!(matches!(
            stale.check(&key.public_hex(), &call(&args)),
            Err(PermitRefused::Expired(s)) if s >= 10
        ));
        assert!(is_public_key(&key.public_hex()) && !is_public_key("00"));
    }
}

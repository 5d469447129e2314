//! One permit, one call: the host's record of the tier-2 permits it spent.
//!
//! Why not the audit log: "not used before" and "intent recorded" must be
//! one atomic step across every agent process on the host (systemd starts
//! one per socket connection, sshd one per SSH session), and a scan of the
//! log followed by an append is two. Here a permit is spent by creating a
//! file named after the digest of the call it allows (host, run, step: not
//! its signature, so a permit signed again for a call that ran is spent
//! too) with `O_CREAT|O_EXCL`: the kernel lets exactly one of any number of racing
//! processes create it. The file is made (and its directory synced) before
//! the intent line, and never removed while the permit could still be
//! accepted, so a crash between the two burns the permit rather than
//! freeing it.
//!
//! The files live in one directory per day of the permits' expiry, in the
//! host policy's `spent_permits` directory (`DIR/YYYY-MM-DD/`): one record
//! for every agent on the host (the socket's, SSH's forced command), since
//! they all read the one policy file, whatever audit log each keeps. A permit is good for
//! two minutes ([`crate::signing::PERMIT_TTL_SECS`]), so a day's
//! directory is removed once its day ended two days ago: its permits are
//! refused as expired long before that (unless the host's clock is set back
//! by days).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::signing::SignedPermit;

/// Days a spent permit's record is kept past its expiry day.
const KEEP_DAYS: i64 = 2;

/// The host's record of spent permits.
pub(crate) struct Spent {
    dir: PathBuf,
}

impl Spent {
    /// The record in `dir` (the policy's `spent_permits`).
    pub(crate) fn at(dir: &Path) -> Spent {
        Spent {
            dir: dir.to_path_buf(),
        }
    }

    /// Where the record lives.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Mark `permit` spent: `true` when this call marked it, `false` when it
    /// was spent before (by this process or any other).
    ///
    /// One execution per (host, run, step), whatever the signature: the
    /// record is named after those alone, so a permit signed again for a
    /// call that already ran (a new expiry, a new signature) finds it spent.
    /// A permit whose expiry falls on another day than the first one's is
    /// looked for in the days either side as well.
    pub(crate) fn spend(&self, permit: &SignedPermit) -> std::io::Result<bool> {
        let name = call_digest(permit);
        for other in [-1, 1] {
            let day = day_of(permit.expires_at + other * 86_400);
            if std::fs::symlink_metadata(self.dir.join(day).join(&name)).is_ok() {
                return Ok(false);
            }
        }
        let day = day_of(permit.expires_at);
        let dir = self.dir.join(&day);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let marker = dir.join(name);
        let mut file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&marker)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e),
        };
        // What the file is for, for a person reading the directory.
        let _ = writeln!(
            file,
            "{}",
            serde_json::json!({ "run_id": permit.run_id, "step": permit.step, "tool": permit.tool, "expires_at": permit.expires_at })
        );
        std::fs::File::open(&dir)?.sync_all()?;
        self.forget_old();
        Ok(true)
    }

    /// Remove the days whose permits can no longer be accepted.
    fn forget_old(&self) {
        let now = jiff::Timestamp::now().as_second();
        let oldest_kept = day_of(now - KEEP_DAYS * 86_400);
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(day) = name.to_str() else { continue };
            // Only what this module names: YYYY-MM-DD (which sorts as dates do).
            if day.len() == 10 && day.as_bytes()[4] == b'-' && *day < *oldest_kept.as_str() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// The name of a call's record: the digest of the host, the run and the
/// step it may run, and of nothing a new signature changes.
fn call_digest(permit: &SignedPermit) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for part in [
        "runwarden spent call v1",
        &permit.host,
        &permit.run_id,
        &permit.step.to_string(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The UTC day of a Unix time, as `YYYY-MM-DD`.
fn day_of(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%d").to_string())
        .unwrap_or_else(|_| "invalid-time".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::{CallId, PermitKey};

    /// Of many threads spending one permit at once, exactly one wins; a
    /// record whose day is long past is forgotten, today's is kept.
    #[test]
    fn one_of_many_racing_spenders_wins_and_old_days_go() {
        let dir = tempfile::tempdir().unwrap();
        let key = PermitKey::load_or_create(&dir.path().join("k")).unwrap();
        let args = serde_json::json!({ "unit": "a.service" });
        let permit = key.sign(
            &CallId {
                run_id: "r",
                step: 1,
                host: "h",
                tool: "restart_service",
                args: &args,
            },
            "standing:x",
        );
        let spent = Spent::at(&dir.path().join("permits"));
        let won: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| s.spawn(|| spent.spend(&permit).unwrap()))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap() as usize)
                .sum()
        });
        assert_eq!(won, 1);
        let stale = spent.dir().join("2001-01-01");
        std::fs::create_dir_all(&stale).unwrap();
        let other = key.sign(
            &CallId {
                run_id: "r",
                step: 2,
                host: "h",
                tool: "restart_service",
                args: &args,
            },
            "standing:x",
        );
        assert!(spent.spend(&other).unwrap());
        assert!(!stale.exists());
        assert!(spent.dir().join(day_of(permit.expires_at)).exists());
    }

    /// A permit signed again for a (run, step) that already ran (a new
    /// expiry, so a new signature; on the same day or the next) is spent:
    /// one execution per call on the host, whatever the signature. Another
    /// step of the run is its own.
    #[test]
    fn a_permit_signed_again_for_a_call_that_ran_is_spent() {
        let dir = tempfile::tempdir().unwrap();
        let key = PermitKey::load_or_create(&dir.path().join("k")).unwrap();
        let args = serde_json::json!({ "unit": "a.service" });
        let call = |step| CallId {
            run_id: "r",
            step,
            host: "h",
            tool: "restart_service",
            args: &args,
        };
        let spent = Spent::at(&dir.path().join("permits"));
        let now = jiff::Timestamp::now().as_second();
        assert!(
            spent
                .spend(&key.sign_until(&call(1), "standing:x", now + 60))
                .unwrap()
        );
        let again = key.sign_until(&call(1), "standing:x", now + 90);
        assert_ne!(
            again.identity_digest(),
            key.sign_until(&call(1), "standing:x", now + 60)
                .identity_digest()
        );
        assert!(!spent.spend(&again).unwrap(), "signed again the same day");
        let tomorrow = key.sign_until(&call(1), "standing:x", now + 86_400);
        assert!(
            !spent.spend(&tomorrow).unwrap(),
            "signed again for the next day"
        );
        assert!(
            spent
                .spend(&key.sign_until(&call(2), "standing:x", now + 60))
                .unwrap()
        );
    }
}

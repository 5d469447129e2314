//! Request signatures: HMAC-SHA256 of `VERSION:TIMESTAMP:BODY` with a
//! shared secret, sent as `VERSION=HEX` beside the timestamp in Unix
//! seconds. Slack signs the requests it sends runwarden this way (`v0`),
//! and runwarden signs its approval webhook the same way (`v1`), so a
//! bridge verifies the sender with a dozen lines in any language.
//!
//! A check is made on the raw bytes, before anything is parsed: a
//! timestamp outside the window is refused before the signature is
//! computed (a captured request cannot be replayed later), and the
//! comparison is constant-time (`ring`'s). During a rotation two secrets
//! are accepted.

use ring::hmac;

/// How far a request's timestamp may be from this machine's clock.
pub(crate) const WINDOW_SECS: i64 = 300;

/// `VERSION=HEX`: the signature of `body` sent at `timestamp`.
pub(crate) fn sign(secret: &[u8], version: &str, timestamp: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let tag = hmac::sign(&key, &message(version, &timestamp.to_string(), body));
    format!("{version}={}", hex(tag.as_ref()))
}

/// Why a request's signature was refused (what the metric's `reason` says).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// No timestamp or no signature header.
    #[error("the request is not signed (no timestamp or signature header)")]
    Missing,
    /// A header that is not `VERSION=HEX` or a timestamp that is no number.
    #[error("the request's signature or timestamp is malformed")]
    Malformed,
    /// The timestamp is more than [`WINDOW_SECS`] from now.
    #[error("the request's timestamp is {0}s from this machine's clock (at most 300s is taken)")]
    Stale(i64),
    /// No secret signed it.
    #[error("the request's signature matches no signing secret")]
    Mismatch,
}

impl Refused {
    /// The metric's `reason` label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refused::Missing => "unsigned",
            Refused::Malformed => "malformed",
            Refused::Stale(_) => "stale",
            Refused::Mismatch => "mismatch",
        }
    }
}

/// Whether `signature` (`VERSION=HEX`) over `body` at `timestamp` was made
/// with one of `secrets`, at most [`WINDOW_SECS`] from `now`.
pub(crate) fn verify(
    secrets: &[&[u8]],
    version: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), Refused> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(Refused::Missing);
    };
    let at: i64 = timestamp.trim().parse().map_err(|_| Refused::Malformed)?;
    let skew = now.saturating_sub(at);
    if skew.abs() > WINDOW_SECS {
        return Err(Refused::Stale(skew));
    }
    let tag = signature
        .trim()
        .strip_prefix(version)
        .and_then(|s| s.strip_prefix('='))
        .and_then(unhex)
        .ok_or(Refused::Malformed)?;
    // Signed as sent: the timestamp's own text, not the number read from it.
    let message = message(version, timestamp, body);
    let signed = secrets.iter().any(|secret| {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        hmac::verify(&key, &message, &tag).is_ok()
    });
    signed.then_some(()).ok_or(Refused::Mismatch)
}

fn message(version: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut m = format!("{version}:{timestamp}:").into_bytes();
    m.extend_from_slice(body);
    m
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slack's own worked example (api.slack.com, "Verifying requests from
    /// Slack"): its secret, timestamp, body and the signature it shows.
    const SLACK_SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
    const SLACK_TS: &str = "1531420618";
    const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SLACK_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn slacks_worked_example_verifies() {
        let at: i64 = SLACK_TS.parse().unwrap();
        assert_eq!(sign(SLACK_SECRET, "v0", at, SLACK_BODY), SLACK_SIG);
        let check = |secrets: &[&[u8]], ts: &str, sig: &str, body: &[u8], now: i64| {
            verify(secrets, "v0", Some(ts), Some(sig), body, now)
        };
        assert_eq!(
            check(&[SLACK_SECRET], SLACK_TS, SLACK_SIG, SLACK_BODY, at + 10),
            Ok(())
        );
        // The old secret beside the new one, during a rotation.
        assert_eq!(
            check(&[b"new", SLACK_SECRET], SLACK_TS, SLACK_SIG, SLACK_BODY, at),
            Ok(())
        );
        // A byte of the body changed; a wrong secret; stale both ways.
        let mut changed = SLACK_BODY.to_vec();
        changed[6] ^= 1;
        assert_eq!(
            check(&[SLACK_SECRET], SLACK_TS, SLACK_SIG, &changed, at),
            Err(Refused::Mismatch)
        );
        assert_eq!(
            check(&[b"other"], SLACK_TS, SLACK_SIG, SLACK_BODY, at),
            Err(Refused::Mismatch)
        );
        assert_eq!(
            check(&[SLACK_SECRET], SLACK_TS, SLACK_SIG, SLACK_BODY, at + 301),
            Err(Refused::Stale(301))
        );
        assert_eq!(
            check(&[SLACK_SECRET], SLACK_TS, SLACK_SIG, SLACK_BODY, at - 301),
            Err(Refused::Stale(-301))
        );
        // Another version, odd hex, no number, nothing at all.
        let v1 = SLACK_SIG.replacen("v0=", "v1=", 1);
        for (ts, sig) in [
            (SLACK_TS, v1.as_str()),
            (SLACK_TS, "v0=abc"),
            ("soon", SLACK_SIG),
        ] {
            assert_eq!(
                check(&[SLACK_SECRET], ts, sig, SLACK_BODY, at),
                Err(Refused::Malformed)
            );
        }
        assert_eq!(
            verify(&[SLACK_SECRET], "v0", None, Some(SLACK_SIG), SLACK_BODY, at),
            Err(Refused::Missing)
        );
    }
}

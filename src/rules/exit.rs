//! How a command that reached several hosts exits (`run --all-hosts`, a
//! host list through the daemon): one code for all of them, which a
//! wrapper script branches on.
//!
//! A verdict outranks "did not start": a host whose fix failed is the news,
//! and 75 ("try again later") beside it would hide it from a script that
//! retries. Among verdicts the worst wins, by the verdicts' own order (not
//! by their codes' numbers). Only when every run that started ended `ok`
//! does a host that did not start decide: 7 when the kill switch kept it
//! (a retrying script must not loop on a switch), else 75.

use crate::verdict::Verdict;

/// The code of "busy, try again later" (`EX_TEMPFAIL`).
pub(crate) const TRY_AGAIN: i32 = 75;

/// How one host of a fan-out ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostEnd {
    /// Its run ended with this verdict.
    Ran(Verdict),
    /// No run started: the kill switch kept it (`true`) or it was refused
    /// for now (cooldown, busy, capped).
    NotStarted { kill_switch: bool },
}

/// The fan-out's exit code.
pub(crate) fn fan_out(ends: impl IntoIterator<Item = HostEnd>) -> i32 {
    let (mut worst, mut stopped, mut refused) = (None::<Verdict>, false, false);
    for end in ends {
        match end {
            HostEnd::Ran(v) => worst = Some(worst.map_or(v, |w| w.max(v))),
            HostEnd::NotStarted { kill_switch: true } => stopped = true,
            HostEnd::NotStarted { kill_switch: false } => refused = true,
        }
    }
    match worst {
        Some(v) if v != Verdict::Ok => v.exit_code(),
        _ if stopped => Verdict::Halted.exit_code(),
        _ if refused => TRY_AGAIN,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::HostEnd::*;
    use super::*;

    const BUSY: HostEnd = NotStarted { kill_switch: false };
    const SWITCH: HostEnd = NotStarted { kill_switch: true };

    #[test]
    fn a_verdict_outranks_did_not_start_and_the_worst_verdict_wins_by_its_order() {
        let table: &[(&[HostEnd], i32)] = &[
            (&[], 0),
            (&[Ran(Verdict::Ok), Ran(Verdict::Ok)], 0),
            // The finding: one host in cooldown, one failed: 1, not 75.
            (&[BUSY, Ran(Verdict::Failed)], 1),
            (&[Ran(Verdict::Failed), SWITCH], 1),
            (&[Ran(Verdict::Ok), BUSY], TRY_AGAIN),
            (&[BUSY, SWITCH, Ran(Verdict::Ok)], 7),
            (&[BUSY], TRY_AGAIN),
            // By the verdicts' order: broken (6) is worse than unresolved
            // (9), interrupted worse than failed.
            (&[Ran(Verdict::Unresolved), Ran(Verdict::Broken)], 6),
            (&[Ran(Verdict::Interrupted), Ran(Verdict::Failed)], 6),
            (&[Ran(Verdict::Unresolved), Ran(Verdict::Ok), BUSY], 9),
        ];
        for (ends, code) in table {
            assert_eq!(fan_out(ends.iter().copied()), *code, "{ends:?}");
        }
    }
}

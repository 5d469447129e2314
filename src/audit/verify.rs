//! `runwarden audit verify`: walk the chain and name every line where it
//! breaks, and check it against heads recorded outside the file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::log::hex;
use super::{GENESIS, head};

/// What `audit verify` found.
#[derive(Debug)]
pub struct Verification {
    /// Lines checked.
    pub lines: usize,
    /// The hash of the last line (what `--head` pins).
    pub(crate) head: String,
    /// Every problem, in order: (line number, what is wrong). After a bad
    /// line the chain is picked up again from that line's own hash, so one
    /// edit shows once and every later tampering still shows.
    pub problems: Vec<(usize, String)>,
}

#[cfg(test)]
impl Verification {
    /// The first problem, if any.
    pub(crate) fn broken(&self) -> Option<&(usize, String)> {
        self.problems.first()
    }
}

/// Walk the whole chain, reporting every line where it breaks.
pub fn verify(path: &Path) -> std::io::Result<Verification> {
    verify_against(path, &[])
}

/// [`verify`], and check the file against heads recorded elsewhere (the
/// journal, or one pinned by hand): line `lines` must hash to `hash`.
pub fn verify_against(path: &Path, heads: &[head::Head]) -> std::io::Result<Verification> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut prev = GENESIS.to_string();
    let mut n = 0;
    let mut line = Vec::new();
    let mut problems = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        n += 1;
        if line.last() != Some(&b'\n') {
            problems.push((n, "incomplete line (a write was cut short)".into()));
            break;
        }
        let body = &line[..line.len() - 1];
        let claimed = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["prev"].as_str().map(String::from));
        match claimed {
            None => problems.push((n, "not a JSON audit line".into())),
            Some(p) if p != prev => {
                let what = if n == 1 {
                    "the first line does not start the chain (lines before it were deleted)"
                        .to_string()
                } else {
                    format!(
                        "`prev` does not match line {}: a line was edited, deleted or reordered here",
                        n - 1
                    )
                };
                problems.push((n, what));
            }
            Some(_) => {}
        }
        prev = hex(&Sha256::digest(body));
        for h in heads.iter().filter(|h| h.lines == n as u64) {
            if h.hash != prev {
                problems.push((
                    n,
                    format!(
                        "does not match the head recorded for line {n} ({}…): the log was rewritten at or before this line",
                        &h.hash[..12]
                    ),
                ));
            }
        }
    }
    if let Some(h) = heads
        .iter()
        .filter(|h| h.lines > n as u64)
        .max_by_key(|h| h.lines)
    {
        problems.push((
            n + 1,
            format!(
                "the log ends at line {n}, but a head was recorded at line {}: lines were cut off the end",
                h.lines
            ),
        ));
    }
    Ok(Verification {
        lines: n,
        head: prev,
        problems,
    })
}

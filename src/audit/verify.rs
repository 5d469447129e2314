//! `runwarden audit verify`: walk the chain and name every line where it
//! breaks, and check it against heads recorded outside the file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::log::hex;
use super::{GENESIS, head, segments};

/// What `audit verify` found.
#[derive(Debug)]
pub struct Verification {
    /// Lines checked.
    pub lines: usize,
    /// The number of the last line in the whole chain (what `--head` pins).
    pub last: u64,
    /// Files read: closed segments and the current file.
    pub segments: usize,
    /// The hash of the last line (what `--head` pins).
    pub(crate) head: String,
    /// Every problem, in order: (line number, what is wrong). After a bad
    /// line the chain is picked up again from that line's own hash, so one
    /// edit shows once and every later tampering still shows.
    pub problems: Vec<(usize, String)>,
    /// What retention removed, as the kept history's `segment` lines say.
    pub retired: Retired,
    /// Heads recorded elsewhere that were checked against a line.
    pub heads_checked: usize,
    /// Heads recorded for lines retention removed: they cannot be checked.
    pub heads_retired: usize,
}

/// The segments retention removed, as one span.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Retired {
    /// How many.
    pub segments: usize,
    /// Their lines, first to last.
    pub lines: Option<(u64, u64)>,
    /// When their first line and their last were written (older records
    /// do not say).
    pub from: Option<String>,
    /// See `from`.
    pub to: Option<String>,
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
///
/// The chain runs through every segment, oldest first, as one sequence of
/// numbered lines. History may start after line 1 only where retention
/// removed the segments before it: a `segment` line names each one it
/// removed with its last hash, and the first line kept must chain to one.
pub fn verify_against(path: &Path, heads: &[head::Head]) -> std::io::Result<Verification> {
    let files = segments::list(path)?;
    if files.is_empty() {
        // As before segments: a log that is not there is an error to show.
        File::open(path)?;
    }
    let mut n: u64 = files.first().and_then(|s| s.first).unwrap_or(1) - 1;
    let start = n;
    let mut prev = GENESIS.to_string();
    let mut first_prev = None;
    let mut retired_heads = Vec::new();
    let mut retired = Retired::default();
    let mut checked = 0;
    let mut problems = Vec::new();
    let mut line = Vec::new();
    'files: for segment in &files {
        let mut reader = BufReader::new(File::open(&segment.path)?);
        let at = |what: String| match segment.first {
            Some(_) => format!("{what} (in {})", segment.path.display()),
            None => what,
        };
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            n += 1;
            if line.last() != Some(&b'\n') {
                problems.push((
                    n as usize,
                    at("incomplete line (a write was cut short)".into()),
                ));
                break 'files;
            }
            let body = &line[..line.len() - 1];
            let parsed = serde_json::from_slice::<Value>(body).ok();
            let claimed = parsed
                .as_ref()
                .and_then(|v| v["prev"].as_str().map(String::from));
            if let Some(number) = parsed.as_ref().and_then(|v| v["n"].as_u64())
                && number != n
            {
                problems.push((
                    n as usize,
                    at(format!(
                        "numbered {number} where line {n} was due: lines were deleted or inserted before it"
                    )),
                ));
                n = number;
            }
            if let Some(v) = parsed.as_ref().filter(|v| v["phase"] == "segment") {
                note_retired(v, &mut retired, &mut retired_heads);
            }
            match claimed {
                None => problems.push((n as usize, at("not a JSON audit line".into()))),
                Some(p) if n == start + 1 => first_prev = Some(p),
                Some(p) if p != prev => problems.push((
                    n as usize,
                    at(format!(
                        "`prev` does not match line {}: a line was edited, deleted or reordered here",
                        n - 1
                    )),
                )),
                Some(_) => {}
            }
            prev = hex(&Sha256::digest(body));
            for h in heads.iter().filter(|h| h.lines == n) {
                checked += 1;
                if h.hash != prev {
                    problems.push((
                        n as usize,
                        at(format!(
                            "does not match the head recorded for line {n} ({}…): the log was rewritten at or before this line",
                            &h.hash[..12]
                        )),
                    ));
                }
            }
        }
    }
    if let Some(p) = first_prev
        && p != GENESIS
        && !retired_heads.contains(&p)
    {
        problems.insert(
            0,
            (
                start as usize + 1,
                "the first line does not start the chain (lines before it were deleted, not removed by retention)".into(),
            ),
        );
    }
    if let Some(h) = heads.iter().filter(|h| h.lines > n).max_by_key(|h| h.lines) {
        problems.push((
            n as usize + 1,
            format!(
                "the log ends at line {n}, but a head was recorded at line {}: lines were cut off the end",
                h.lines
            ),
        ));
    }
    Ok(Verification {
        lines: (n - start) as usize,
        last: n,
        segments: files.len(),
        head: prev,
        problems,
        retired,
        heads_checked: checked,
        heads_retired: heads.iter().filter(|h| h.lines <= start).count(),
    })
}

/// What a `segment` line says retention removed: the whole record so far
/// (`retired`), and the last hash of each segment it names (a chain may
/// start at one).
fn note_retired(v: &Value, retired: &mut Retired, retired_heads: &mut Vec<String>) {
    if let Some(total) = v["detail"]["retired_total"].as_object()
        && total.get("segments").and_then(Value::as_u64).unwrap_or(0) as usize > retired.segments
    {
        // The whole record so far: it names removals whose own
        // `segment` lines retention removed since.
        *retired = Retired {
            segments: total["segments"].as_u64().unwrap_or(0) as usize,
            lines: total
                .get("first")
                .and_then(Value::as_u64)
                .zip(total.get("last").and_then(Value::as_u64)),
            from: total.get("from").and_then(Value::as_str).map(String::from),
            to: total.get("to").and_then(Value::as_str).map(String::from),
        };
    }
    if let Some(gone) = v["detail"]["retired"].as_array() {
        retired_heads.extend(
            gone.iter()
                .filter_map(|r| r["head"].as_str().map(String::from)),
        );
        // Lines of older releases, with no whole record: add up.
        let counted = !v["detail"]["retired_total"].is_null();
        for r in gone.iter().filter(|_| !counted) {
            retired.segments += 1;
            if let (Some(a), Some(b)) = (r["first"].as_u64(), r["last"].as_u64()) {
                let (lo, hi) = retired.lines.unwrap_or((a, b));
                retired.lines = Some((lo.min(a), hi.max(b)));
            }
            if let Some(f) = r["from"].as_str()
                && retired.from.as_deref().is_none_or(|x| f < x)
            {
                retired.from = Some(f.to_string());
            }
            if let Some(t) = r["to"].as_str()
                && retired.to.as_deref().is_none_or(|x| t > x)
            {
                retired.to = Some(t.to_string());
            }
        }
    }
}

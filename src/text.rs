//! Text meant for a person's terminal or an approver's screen.
//!
//! Much of what runwarden shows was written by someone else: a model's
//! answer, a log line a tool read, an alert's annotation. Printed raw, an
//! escape sequence could move the cursor and draw a fake `verdict: ok`, and
//! a bidi override or zero-width character could make a `reason` read
//! differently from what it says. So control characters are shown escaped,
//! and invisible formatting characters are refused where they would be read
//! as a person's words. Untrusted JSON values are kept bounded in size and
//! depth wherever they are stored or shown again.

use serde_json::Value;

/// Characters that change how text reads without being seen: bidi controls,
/// zero-width characters, the soft hyphen and the byte-order mark.
pub(crate) fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}'
        | '\u{FEFF}')
}

/// `text` safe to print: newlines stay, every other control character and
/// every invisible one is shown as an escape (`\u{1b}`).
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\n' || !(c.is_control() || invisible(c)) {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    out
}

/// `text` safe to print on one line: as [`printable`], with newlines (and
/// carriage returns) escaped too, so a value from a file or a tool can
/// never start a line of its own (a journal record, a fake report line).
pub(crate) fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || invisible(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// How deep an untrusted JSON value may nest where runwarden keeps it (an
/// audit line, a report, a model's prompt). serde_json reads at most 128
/// levels; a kept value stays well inside that.
pub(crate) const MAX_VALUE_DEPTH: usize = 32;

/// Replace whatever nests deeper than `depth` levels by a note saying so.
pub(crate) fn fit(v: &mut Value, depth: usize) {
    if !(v.is_array() || v.is_object()) {
        return;
    }
    if depth == 0 {
        *v = Value::String(format!(
            "(a value nested deeper than {MAX_VALUE_DEPTH} levels, not kept)"
        ));
        return;
    }
    match v {
        Value::Array(a) => a.iter_mut().for_each(|c| fit(c, depth - 1)),
        Value::Object(o) => o.values_mut().for_each(|c| fit(c, depth - 1)),
        _ => {}
    }
}

/// Untrusted arguments of a call, kept but bounded in size and depth (the
/// audit line of a denied call, the report and a model's prompt show this form).
pub(crate) fn bounded(args: &Value) -> Value {
    let text = args.to_string();
    if text.len() <= 4096 {
        let mut v = args.clone();
        fit(&mut v, MAX_VALUE_DEPTH);
        v
    } else {
        Value::String(format!(
            "{}… ({} bytes)",
            text.chars().take(512).collect::<String>(),
            text.len()
        ))
    }
}

/// A value read back from text (an audit line, a flag, a query) that is
/// not of the form it must have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?}: {expected}")]
pub struct NotOfForm {
    /// What was given.
    pub(crate) given: String,
    /// The form it must have.
    pub(crate) expected: String,
}

impl NotOfForm {
    /// `given` is not of the form `expected` says.
    pub(crate) fn new(given: &str, expected: impl Into<String>) -> NotOfForm {
        NotOfForm {
            given: given.to_string(),
            expected: expected.into(),
        }
    }
}

/// Suggest the closest known name for a misspelt one ("did you mean ...").
pub(crate) fn did_you_mean<'a>(wrong: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    let best = known
        .into_iter()
        .map(|k| (edit_distance(wrong, k), k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 3))
        .min();
    match best {
        Some((_, k)) => format!(" (did you mean \"{k}\"?)"),
        None => String::new(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(cur)
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_invisibles_are_shown_not_obeyed() {
        assert_eq!(
            printable("ok\x1b[1A\x1b[2Kverdict: ok\r\u{202E}x\u{200B}\nnext"),
            "ok\\u{1b}[1A\\u{1b}[2Kverdict: ok\\u{d}\\u{202e}x\\u{200b}\nnext"
        );
        assert_eq!(printable("plain text, ünïcode"), "plain text, ünïcode");
        assert!(invisible('\u{2067}') && !invisible('a'));
    }
}

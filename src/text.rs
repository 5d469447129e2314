//! Text meant for a person's terminal or an approver's screen.
//!
//! Much of what runwarden shows was written by someone else: a model's
//! answer, a log line a tool read, an alert's annotation. Printed raw, an
//! escape sequence could move the cursor and draw a fake `verdict: ok`, and
//! a bidi override or zero-width character could make a `reason` read
//! differently from what it says. So control characters are shown escaped,
//! and invisible formatting characters are refused where they would be read
//! as a person's words.

/// Characters that change how text reads without being seen: bidi controls,
/// zero-width characters, the soft hyphen and the byte-order mark.
pub fn invisible(c: char) -> bool {
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
pub fn printable(text: &str) -> String {
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

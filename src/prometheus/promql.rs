//! What runwarden reads of a PromQL expression without evaluating it: how
//! far back in time its value looks (its longest range selector or
//! subquery, plus any `offset`), and how a value is written as a PromQL
//! string literal.
//!
//! The look-back decides how long after a good fix a rule can keep
//! firing: `rate(x[10m]) > 1` still sees the bad samples for ten minutes.
//! A wait shorter than that turns every good fix into a failure, so
//! `check` warns and the report says it. This is a scan, not a parser: it
//! skips string literals and comments and reads every `[...]` and
//! `offset`, which is all the windows a PromQL expression can have.

use std::time::Duration;

/// How far back `expr` looks: its longest range selector or subquery
/// range, each with the `offset` that follows it, and the longest bare
/// `offset`. Zero for an expression of instant selectors only.
pub(crate) fn look_back(expr: &str) -> Duration {
    let mut longest = Duration::ZERO;
    let mut last_range = Duration::ZERO;
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            q @ ('"' | '\'' | '`') => {
                last_range = Duration::ZERO;
                i += 1;
                while i < chars.len() && chars[i] != q {
                    if chars[i] == '\\' && q != '`' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '[' => {
                let end = chars[i..].iter().position(|&c| c == ']').map(|n| i + n);
                let Some(end) = end else { break };
                let inside: String = chars[i + 1..end].iter().collect();
                // `[30m:1m]` (a subquery) looks back its range.
                let range = inside.split(':').next().unwrap_or("");
                last_range = duration(range.trim()).unwrap_or_default();
                longest = longest.max(last_range);
                i = end;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                if word.eq_ignore_ascii_case("offset") {
                    let from = i;
                    while i < chars.len() && chars[i].is_whitespace() {
                        i += 1;
                    }
                    let begin = i;
                    while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                        i += 1;
                    }
                    let text: String = chars[begin..i].iter().collect();
                    if let Some(offset) = duration(&text) {
                        // A range's offset shifts the whole range back.
                        longest = longest.max(last_range + offset);
                    } else {
                        i = from;
                    }
                }
                last_range = Duration::ZERO;
                continue;
            }
            // Only whitespace between a range and its `offset`.
            c if !c.is_whitespace() => last_range = Duration::ZERO,
            _ => {}
        }
        i += 1;
    }
    longest
}

/// A PromQL duration (`1h30m`, `90s`, `500ms`, `2d`), or a bare number of
/// seconds as Prometheus 3 accepts.
fn duration(text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ms" => {
                total += Duration::from_millis(n);
                rest = &rest[unit_len..];
                continue;
            }
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 7 * 86_400,
            "y" => 365 * 86_400,
            _ => return None,
        };
        total += Duration::from_secs(n.checked_mul(seconds)?);
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// `value` as a PromQL string literal: double-quoted, with `\` and `"`
/// escaped and every control character written as an escape, so no value
/// can end the string and add to the expression around it.
pub(crate) fn string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_longest_window_is_read_from_ranges_subqueries_and_offsets() {
        assert_eq!(look_back("up == 0"), Duration::ZERO);
        assert_eq!(look_back("rate(x_total[2m]) > 1"), secs(120));
        assert_eq!(
            look_back("avg_over_time(q[10m]) > 5 and rate(y[1h30m]) > 0"),
            secs(5400)
        );
        assert_eq!(
            look_back("predict_linear(node_filesystem_free_bytes[6h], 4 * 3600) < 0"),
            secs(6 * 3600)
        );
        assert_eq!(
            look_back("max_over_time(rate(x[1m])[30m:1m]) > 3"),
            secs(1800)
        );
        assert_eq!(look_back("rate(x[5m] offset 10m) > 1"), secs(900));
        assert_eq!(look_back("x offset 1h > 0"), secs(3600));
        assert_eq!(look_back("rate(a[5m]) > 0 and b offset 1h"), secs(3600));
        assert_eq!(look_back("rate(x[90]) > 0"), secs(90));
        assert_eq!(look_back("rate(x[500ms]) > 0"), Duration::from_millis(500));
    }

    #[test]
    fn brackets_in_strings_and_comments_are_not_windows() {
        assert_eq!(look_back(r#"x{path="/a[1h]"} > 0"#), Duration::ZERO);
        assert_eq!(look_back("x{path='[2d]'} > 0 # not [1w]\n"), Duration::ZERO);
        assert_eq!(look_back(r#"x{p="a\"[1d]"} > 0"#), Duration::ZERO);
        assert_eq!(look_back("x{offset=\"1h\"} > 0"), Duration::ZERO);
    }

    #[test]
    fn a_value_cannot_leave_its_string() {
        assert_eq!(string("local"), "\"local\"");
        assert_eq!(string(r#"a"} or vector(1) #"#), r#""a\"} or vector(1) #""#);
        assert_eq!(string("a\\"), r#""a\\""#);
        assert_eq!(string("a\nb\u{7}"), "\"a\\nb\\u0007\"");
    }
}

//! Alertmanager's label matchers: `name="value"`, `name!="value"`,
//! `name=~"regex"`, `name!~"regex"` (regexes fully anchored, as in
//! Alertmanager). Runbooks write them exactly as in an Alertmanager route.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;

/// One Alertmanager-style matcher: `name=value`, `!=`, `=~` or `!~`.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// The label it tests.
    pub(crate) name: String,
    op: Op,
    value: String,
    regex: Option<Regex>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal,
    NotEqual,
    Regex,
    NotRegex,
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            Op::Equal => "=",
            Op::NotEqual => "!=",
            Op::Regex => "=~",
            Op::NotRegex => "!~",
        };
        write!(f, "{}{op}{:?}", self.name, self.value)
    }
}

impl Matcher {
    /// Parse `name OP value` (the value may be quoted); the error says what
    /// is wrong, as text: the loader reports it at the matcher's file, line
    /// and field, and nothing branches on it.
    pub fn parse(text: &str) -> Result<Matcher, String> {
        let s = text.trim();
        let name_end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        let name = &s[..name_end];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!(
                "matcher {text:?}: expected a label name, e.g. alertname=\"DiskAlmostFull\""
            ));
        }
        let rest = &s[name_end..];
        let (op, rest) = if let Some(r) = rest.strip_prefix("=~") {
            (Op::Regex, r)
        } else if let Some(r) = rest.strip_prefix("!~") {
            (Op::NotRegex, r)
        } else if let Some(r) = rest.strip_prefix("!=") {
            (Op::NotEqual, r)
        } else if let Some(r) = rest.strip_prefix('=') {
            (Op::Equal, r)
        } else {
            return Err(format!(
                "matcher {text:?}: expected one of = != =~ !~ after {name:?}"
            ));
        };
        let value = unquote(rest.trim()).map_err(|e| format!("matcher {text:?}: {e}"))?;
        let regex = match op {
            Op::Regex | Op::NotRegex => Some(
                Regex::new(&format!("^(?:{value})$"))
                    .map_err(|e| format!("matcher {text:?}: bad regex: {e}"))?,
            ),
            _ => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value,
            regex,
        })
    }

    /// This matcher as Alertmanager's API v2 takes it in a silence.
    pub(crate) fn to_api(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "value": self.value,
            "isRegex": matches!(self.op, Op::Regex | Op::NotRegex),
            "isEqual": matches!(self.op, Op::Equal | Op::Regex),
        })
    }

    /// The value this matcher requires of `label` exactly (`label="value"`), if it does.
    pub(crate) fn requires(&self, label: &str) -> Option<&str> {
        (self.op == Op::Equal && self.name == label).then_some(self.value.as_str())
    }

    /// A missing label matches as the empty string, as in Alertmanager.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map(String::as_str).unwrap_or("");
        match (self.op, &self.regex) {
            (Op::Equal, _) => v == self.value,
            (Op::NotEqual, _) => v != self.value,
            (Op::Regex, Some(r)) => r.is_match(v),
            (Op::NotRegex, Some(r)) => !r.is_match(v),
            _ => false,
        }
    }
}

/// A matcher's value without its quotes (the error becomes `parse`'s).
fn unquote(v: &str) -> Result<String, &'static str> {
    let Some(inner) = v.strip_prefix('"') else {
        if v.contains(|c: char| c == '"' || c.is_whitespace()) {
            return Err("unquoted values may not contain quotes or spaces");
        }
        return Ok(v.to_string());
    };
    let inner = inner
        .strip_suffix('"')
        .ok_or("the value's closing quote is missing")?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some(c @ ('"' | '\\')) => out.push(c),
                Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                None => return Err("a trailing backslash"),
            },
            '"' => return Err("an unescaped quote inside the value"),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_four_operators() {
        let l = labels(&[("alertname", "DiskAlmostFull"), ("env", "staging")]);
        assert!(
            Matcher::parse(r#"alertname="DiskAlmostFull""#)
                .unwrap()
                .matches(&l)
        );
        assert!(Matcher::parse(r#"env=~"staging|dev""#).unwrap().matches(&l));
        assert!(
            !Matcher::parse(r#"env=~"stag""#).unwrap().matches(&l),
            "regexes are anchored"
        );
        assert!(Matcher::parse(r#"env!="prod""#).unwrap().matches(&l));
        assert!(!Matcher::parse(r#"env!~"stag.*""#).unwrap().matches(&l));
        assert!(
            Matcher::parse(r#"team="""#).unwrap().matches(&l),
            "missing label = empty"
        );
        assert!(Matcher::parse("env=staging").unwrap().matches(&l));
    }

    #[test]
    fn bad_matchers_say_why() {
        for bad in [
            r#"="x""#,
            r#"env=="x""#,
            r#"env~"x""#,
            r#"env="x"#,
            r#"env=~"(""#,
            r#"env="a"b""#,
        ] {
            assert!(Matcher::parse(bad).is_err(), "{bad}");
        }
    }
}

//! `{{ NAME }}`: the one template form a declared tool has.
//!
//! A hole names a declared argument and is replaced by its checked value,
//! or names one of the host's `vars:` as `{{ host.NAME }}` and is replaced
//! by that host's value (an operator's, checked when the host file loads),
//! inside the one argv element (or the stdin, or the expected-stdout
//! pattern) it is written in. Nothing else is a template: no expression, no
//! filter, no loop; a value never splits into two elements or joins two,
//! because elements are never split or joined at all. Anything else between
//! `{{` and `}}`, and any `{%` or `{#`, is an error of the declaration, so a
//! Jinja habit never passes silently as literal text.

use std::collections::BTreeMap;

/// One piece of a template: literal text, or the value of an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Text as declared.
    Text(String),
    /// The checked value of the argument of this name.
    Arg(String),
}

/// A declared string with `{{ NAME }}` holes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    pieces: Vec<Piece>,
}

/// Why a string is not a template of this form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TemplateError {
    /// A `{{` with no `}}` after it.
    #[error("`{{{{` at byte {0} is never closed with `}}}}`")]
    Unclosed(usize),
    /// Something between `{{` and `}}` that is not one argument's name.
    #[error(
        "`{{{{ {0} }}}}` is not a declared argument's name: a template holds only `{{{{ NAME }}}}` of an argument under args (no expressions, filters or spaces inside the name)"
    )]
    NotAName(String),
    /// Jinja's statement or comment syntax.
    #[error("`{0}` is not supported: a template holds only `{{{{ NAME }}}}` of an argument")]
    Statement(&'static str),
}

impl Template {
    /// Parse a declared string.
    pub(crate) fn parse(s: &str) -> Result<Template, TemplateError> {
        for syntax in ["{%", "{#"] {
            if s.contains(syntax) {
                return Err(TemplateError::Statement(syntax));
            }
        }
        let mut pieces = Vec::new();
        let mut rest = s;
        let mut at = 0;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(TemplateError::Unclosed(at + open));
            };
            let name = after[..close].trim();
            if !is_name(name)
                && !name.strip_prefix(HOST).is_some_and(is_name)
                && !name.strip_prefix(BEFORE).is_some_and(is_name)
            {
                return Err(TemplateError::NotAName(name.to_string()));
            }
            pieces.push(Piece::Arg(name.to_string()));
            let used = open + 2 + close + 2;
            at += used;
            rest = &rest[used..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template { pieces })
    }

    /// The arguments it names, in order (with repeats).
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Arg(n) if !n.contains('.') => Some(n.as_str()),
            _ => None,
        })
    }

    /// The values a `capture:` took before the change that it names
    /// (`{{ before.NAME }}`), by NAME.
    pub(crate) fn before_vars(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Arg(n) => n.strip_prefix(BEFORE),
            Piece::Text(_) => None,
        })
    }

    /// The host's `vars:` it names (`{{ host.NAME }}`), by NAME.
    pub(crate) fn host_vars(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Arg(n) => n.strip_prefix(HOST),
            Piece::Text(_) => None,
        })
    }

    /// Its pieces, in order.
    pub(crate) fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Whether it is one hole and nothing else.
    pub(crate) fn is_one_hole(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [Piece::Arg(n)] => Some(n),
            _ => None,
        }
    }

    /// The text with each hole replaced by its value, passed through `each`
    /// (identity for argv and stdin, a regex escape for a pattern). A hole
    /// with no value stays empty: resolution checks every value first.
    pub(crate) fn render_with(
        &self,
        values: &BTreeMap<String, String>,
        each: impl Fn(&str) -> String,
    ) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Arg(n) => out.push_str(&each(values.get(n).map_or("", String::as_str))),
            }
        }
        out
    }

    /// The text with each hole replaced by its value.
    pub(crate) fn render(&self, values: &BTreeMap<String, String>) -> String {
        self.render_with(values, str::to_string)
    }
}

/// How a hole names a host's var: `{{ host.NAME }}` (and the key its value
/// is rendered under).
pub(crate) const HOST: &str = "host.";

/// How a hole names a value a tier-2 tool's `capture:` took before its
/// change: `{{ before.NAME }}`, in its `verify:` only.
pub(crate) const BEFORE: &str = "before.";

/// An argument's name: `[a-z][a-z0-9_]*`, at most 64 characters.
pub(crate) fn is_name(s: &str) -> bool {
    s.len() <= 64
        && s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn holes_name_arguments_and_nothing_else() {
        let t = Template::parse("set server {{ backend }}/{{server}} state drain\n").unwrap();
        assert_eq!(t.names().collect::<Vec<_>>(), ["backend", "server"]);
        assert_eq!(
            t.render(&values(&[("backend", "web"), ("server", "app1")])),
            "set server web/app1 state drain\n"
        );
        assert_eq!(Template::parse("{{ a }}").unwrap().is_one_hole(), Some("a"));
        assert_eq!(Template::parse("x{{ a }}").unwrap().is_one_hole(), None);
        for (bad, says) in [
            ("{{ backend | upper }}", "not a declared argument's name"),
            ("{{ a + b }}", "not a declared argument's name"),
            ("{{ }}", "not a declared argument's name"),
            ("{{ Backend }}", "not a declared argument's name"),
            ("{{ backend", "never closed"),
            ("{% if x %}y{% endif %}", "not supported"),
            ("{# note #}", "not supported"),
        ] {
            let e = Template::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // A host's var is its own kind of hole.
        let t = Template::parse("UNIX-CONNECT:{{ host.admin_socket }}").unwrap();
        assert_eq!(t.names().count(), 0);
        assert_eq!(t.host_vars().collect::<Vec<_>>(), ["admin_socket"]);
        assert_eq!(
            t.render(&values(&[("host.admin_socket", "/run/h.sock")])),
            "UNIX-CONNECT:/run/h.sock"
        );
        assert!(Template::parse("{{ host.Bad }}").is_err());
        assert!(Template::parse("{{ hosts.x }}").is_err());
        // A lone closing brace pair is text.
        assert_eq!(
            Template::parse("a}}b").unwrap().render(&BTreeMap::new()),
            "a}}b"
        );
    }
}

//! A declared argument: its type, the values it takes, and the check every
//! value passes before it reaches a template.
//!
//! What no value may be, unless the declaration opts in by name
//! (`allow: [leading_dash, slash, dot_dot, whitespace]`): one that starts
//! with `-` (a smuggled flag), holds a `/` outside a `path` (a second path),
//! holds `..`, or holds whitespace. No value, whatever the declaration,
//! holds a newline, a control character or an invisible one: a newline in
//! a stdin template would be a second command. A `string` without a
//! `pattern` takes only `[A-Za-z0-9._:@-]`, 1-255 characters.

use regex::Regex;
use serde_json::{Value, json};

use crate::compiled::CompileError;
use crate::host::Host;
use crate::tools::PathMode;
use crate::tools::args::{ArgError, shown};

/// The longest value any declared argument takes.
pub(crate) const MAX_VALUE_LEN: usize = 4096;

/// What a `string` without a `pattern` takes.
const SAFE_STRING: &str = "^[A-Za-z0-9._:@-]{1,255}$";

/// What one argument takes.
#[derive(Debug, Clone)]
pub(crate) enum ArgType {
    /// One of the host's `allow: { LIST: [...] }` values.
    Allowlist(String),
    /// A string matching `pattern` (whole), at most `max_length` characters.
    String {
        /// Anchored at both ends.
        pattern: Regex,
        /// As declared, for the schema and errors.
        pattern_text: String,
        /// The longest value.
        max_length: usize,
    },
    /// A path under the host's `paths`, resolved as `disk_usage`'s is.
    Path,
    /// An integer within bounds.
    Integer {
        /// The least value.
        min: i64,
        /// The greatest value.
        max: i64,
    },
    /// One of a fixed list.
    Enum(Vec<String>),
}

impl ArgType {
    /// A `string` with no `pattern`: the safe characters only. Read while a
    /// tool file is validated, so a build whose pattern does not compile is
    /// a configuration error that names it, never a run that panics.
    pub(crate) fn safe_string(max_length: Option<usize>) -> Result<ArgType, CompileError> {
        Ok(ArgType::String {
            pattern: safe()?.clone(),
            pattern_text: SAFE_STRING.to_string(),
            max_length: max_length.unwrap_or(255).min(255),
        })
    }
}

/// [`SAFE_STRING`], compiled once; `check` and `serve` ask first.
pub(crate) fn safe() -> Result<&'static Regex, CompileError> {
    static SAFE: std::sync::LazyLock<Result<Regex, CompileError>> =
        std::sync::LazyLock::new(|| {
            crate::compiled::regex("tools::declared::SAFE_STRING", SAFE_STRING)
        });
    SAFE.as_ref().map_err(Clone::clone)
}

/// The refusals a declaration may lift, by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OptIn {
    /// `leading_dash`: a value may start with `-`.
    pub(crate) leading_dash: bool,
    /// `slash`: a value that is not a `path` may hold `/`.
    pub(crate) slash: bool,
    /// `dot_dot`: a value may hold `..`.
    pub(crate) dot_dot: bool,
    /// `whitespace`: a value may hold spaces (never a newline).
    pub(crate) whitespace: bool,
}

impl OptIn {
    /// Every name `allow:` takes.
    pub(crate) const NAMES: [&'static str; 4] = ["leading_dash", "slash", "dot_dot", "whitespace"];

    /// Lift the refusal of that name; `false`: no such name.
    pub(crate) fn set(&mut self, name: &str) -> bool {
        match name {
            "leading_dash" => self.leading_dash = true,
            "slash" => self.slash = true,
            "dot_dot" => self.dot_dot = true,
            "whitespace" => self.whitespace = true,
            _ => return false,
        }
        true
    }
}

/// One declared argument.
#[derive(Debug, Clone)]
pub(crate) struct Arg {
    /// What it takes.
    pub(crate) ty: ArgType,
    /// The refusals it lifts.
    pub(crate) opt_in: OptIn,
    /// What it is, for people and the model.
    pub(crate) description: Option<String>,
}

impl Arg {
    /// Check a caller's `value` of argument `name` against the declaration
    /// and `host`: the value as it enters templates, and as the audit log
    /// records it (a path resolved, an integer as a number).
    pub(crate) fn check(
        &self,
        name: &str,
        value: &Value,
        host: &Host,
        mode: PathMode,
    ) -> Result<(String, Value), ArgError> {
        let text = self.text_of(name, value)?;
        self.refuse_unsafe(name, &text)?;
        match &self.ty {
            ArgType::Allowlist(list) => {
                let allowed = host.allow.get(list).map(Vec::as_slice).unwrap_or_default();
                if allowed.iter().any(|a| a == &text) {
                    Ok((text.clone(), json!(text)))
                } else {
                    Err(ArgError::NotAllowed(format!(
                        "{name} {} is not allowed on host \"{}\" (its allow.{list}: {allowed:?})",
                        shown(&text),
                        host.name
                    )))
                }
            }
            ArgType::Path => {
                let resolved =
                    crate::tools::allowlists::allowed_path(&text, &host.paths, mode, "paths")?;
                let s = resolved.display().to_string();
                Ok((s.clone(), json!(s)))
            }
            _ => self.check_alone(name, &text),
        }
    }

    /// What can be checked without a host (a step's literal argument at
    /// load time): the value's own type, pattern, bounds and refusals.
    pub(crate) fn check_literal(&self, name: &str, value: &Value) -> Result<(), ArgError> {
        let text = self.text_of(name, value)?;
        self.refuse_unsafe(name, &text)?;
        match &self.ty {
            ArgType::Allowlist(_) => Ok(()),
            ArgType::Path if !text.starts_with('/') => Err(ArgError::Value(format!(
                "{name} {} is not an absolute path",
                shown(&text)
            ))),
            ArgType::Path => Ok(()),
            _ => self.check_alone(name, &text).map(drop),
        }
    }

    fn check_alone(&self, name: &str, text: &str) -> Result<(String, Value), ArgError> {
        match &self.ty {
            ArgType::String {
                pattern,
                pattern_text,
                max_length,
            } => {
                if text.chars().count() > *max_length {
                    return Err(ArgError::Value(format!(
                        "{name} {} is longer than {max_length} characters",
                        shown(text)
                    )));
                }
                if !pattern.is_match(text) {
                    return Err(ArgError::Value(format!(
                        "{name} {} does not match {pattern_text}",
                        shown(text)
                    )));
                }
                Ok((text.to_string(), json!(text)))
            }
            ArgType::Integer { min, max } => match text.parse::<i64>() {
                Ok(n) if (*min..=*max).contains(&n) => Ok((n.to_string(), json!(n))),
                Ok(n) => Err(ArgError::Value(format!(
                    "{name} {n} is outside {min}..={max}"
                ))),
                Err(_) => Err(ArgError::Value(format!(
                    "{name} {} is not an integer",
                    shown(text)
                ))),
            },
            ArgType::Enum(values) => match values.iter().any(|v| v == text) {
                true => Ok((text.to_string(), json!(text))),
                false => Err(ArgError::Value(format!(
                    "{name} {} is not one of {values:?}",
                    shown(text)
                ))),
            },
            ArgType::Allowlist(_) | ArgType::Path => Ok((text.to_string(), json!(text))),
        }
    }

    /// The value as text: a string, or an integer for `integer`.
    fn text_of(&self, name: &str, value: &Value) -> Result<String, ArgError> {
        match (value, &self.ty) {
            (Value::String(s), _) => Ok(s.clone()),
            (Value::Number(n), ArgType::Integer { .. }) if n.is_i64() => Ok(n.to_string()),
            _ => Err(ArgError::Shape(format!(
                "{name} must be {}",
                match self.ty {
                    ArgType::Integer { .. } => "an integer",
                    _ => "a string",
                }
            ))),
        }
    }

    /// The refusals every value passes, but those the declaration lifted.
    fn refuse_unsafe(&self, name: &str, s: &str) -> Result<(), ArgError> {
        let refuse = |why: &str| Err(ArgError::Value(format!("{name} {} {why}", shown(s))));
        if s.is_empty() {
            return refuse("is empty");
        }
        if s.len() > MAX_VALUE_LEN {
            return refuse(&format!("is longer than {MAX_VALUE_LEN} bytes"));
        }
        if s.chars().any(|c| c.is_control()) {
            return refuse("holds a newline or control character, which no declared value may");
        }
        if s.chars().any(crate::text::invisible) {
            return refuse(
                "holds an invisible character, which makes it read differently from what it says",
            );
        }
        let path = matches!(self.ty, ArgType::Path);
        if s.starts_with('-') && !self.opt_in.leading_dash {
            return refuse(
                "starts with '-' (it would read as a flag); the declaration does not allow leading_dash",
            );
        }
        if s.contains('/') && !path && !self.opt_in.slash {
            return refuse("holds '/' but is not a path; the declaration does not allow slash");
        }
        if (s.split('/').any(|part| part == "..") || (!path && s.contains("..")))
            && !self.opt_in.dot_dot
        {
            return refuse("holds '..'; the declaration does not allow dot_dot");
        }
        if s.chars().any(char::is_whitespace) && !self.opt_in.whitespace {
            return refuse("holds whitespace; the declaration does not allow whitespace");
        }
        Ok(())
    }

    /// Its JSON schema, as `runwarden tools` shows it and a model is offered.
    pub(crate) fn schema(&self) -> Value {
        let mut s = match &self.ty {
            ArgType::Allowlist(list) => json!({
                "type": "string",
                "description": format!("One of the values the host allows under allow.{list}."),
            }),
            ArgType::String {
                pattern_text,
                max_length,
                ..
            } => {
                json!({ "type": "string", "pattern": pattern_text, "minLength": 1, "maxLength": max_length })
            }
            ArgType::Path => json!({
                "type": "string",
                "pattern": "^/",
                "maxLength": MAX_VALUE_LEN,
                "description": "An absolute path under the host's paths.",
            }),
            ArgType::Integer { min, max } => {
                json!({ "type": "integer", "minimum": min, "maximum": max })
            }
            ArgType::Enum(values) => json!({ "type": "string", "enum": values }),
        };
        if let Some(d) = &self.description {
            s["description"] = json!(d);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(extra: &str) -> (tempfile::TempDir, std::sync::Arc<Host>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("hosts")).unwrap();
        std::fs::create_dir_all(dir.path().join("srv/app")).unwrap();
        std::fs::write(
            dir.path().join("hosts/h.yaml"),
            format!(
                "name: h\nconnection: local\npaths: [{}]\nallow: {{ backends: [web, api] }}\n{extra}",
                dir.path().join("srv").display()
            ),
        )
        .unwrap();
        let config = crate::config::Config::load(dir.path()).unwrap();
        let h = config.hosts["h"].clone();
        (dir, h)
    }

    fn arg(ty: ArgType) -> Arg {
        Arg {
            ty,
            opt_in: OptIn::default(),
            description: None,
        }
    }

    /// The table of what each type takes and refuses by default.
    #[test]
    fn each_type_takes_its_values_and_refuses_the_rest() {
        let (dir, h) = host("");
        let srv = dir.path().join("srv");
        let check = |a: &Arg, v: Value| a.check("x", &v, &h, PathMode::Resolve);
        let backend = arg(ArgType::Allowlist("backends".into()));
        assert_eq!(check(&backend, json!("web")).unwrap().0, "web");
        assert!(matches!(
            check(&backend, json!("db")),
            Err(ArgError::NotAllowed(_))
        ));
        let free = arg(ArgType::safe_string(None).unwrap());
        assert!(check(&free, json!("app-1.example:8080@x")).is_ok());
        for bad in [
            "-rf",
            "a b",
            "a\nb",
            "a/b",
            "..",
            "a..b",
            "",
            "x\u{200B}",
            "$(id)",
            "a;b",
            "`x`",
        ] {
            assert!(check(&free, json!(bad)).is_err(), "{bad:?} let through");
        }
        let patterned = arg(ArgType::String {
            pattern: Regex::new("^(?:[a-z0-9-]+)$").unwrap(),
            pattern_text: "^[a-z0-9-]+$".into(),
            max_length: 8,
        });
        assert!(check(&patterned, json!("app1")).is_ok());
        assert!(check(&patterned, json!("app1234567")).is_err());
        assert!(check(&patterned, json!("APP")).is_err());
        let path = arg(ArgType::Path);
        assert_eq!(
            check(&path, json!(srv.join("app"))).unwrap().0,
            srv.join("app").display().to_string()
        );
        assert!(check(&path, json!("/etc")).is_err());
        assert!(check(&path, json!(format!("{}/app/../../etc", srv.display()))).is_err());
        assert!(check(&path, json!("app")).is_err());
        let count = arg(ArgType::Integer { min: 1, max: 10 });
        assert_eq!(check(&count, json!(3)).unwrap().1, json!(3));
        assert_eq!(check(&count, json!("3")).unwrap().1, json!(3));
        assert!(check(&count, json!(11)).is_err());
        assert!(check(&count, json!("-1")).is_err());
        assert!(check(&count, json!(2.5)).is_err());
        let mode = arg(ArgType::Enum(vec!["soft".into(), "hard".into()]));
        assert!(check(&mode, json!("soft")).is_ok());
        assert!(check(&mode, json!("Soft")).is_err());
    }

    /// Opting in lifts exactly the refusal it names; a newline or a control
    /// character is never taken.
    #[test]
    fn an_opt_in_lifts_only_its_own_refusal() {
        let (_dir, h) = host("");
        let mut a = Arg {
            ty: ArgType::String {
                pattern: Regex::new("^(?:.*)$").unwrap(),
                pattern_text: ".*".into(),
                max_length: 100,
            },
            opt_in: OptIn::default(),
            description: None,
        };
        let check = |a: &Arg, v: &str| a.check("x", &json!(v), &h, PathMode::Resolve);
        assert!(check(&a, "-v").is_err());
        a.opt_in.set("leading_dash");
        assert!(check(&a, "-v").is_ok());
        assert!(check(&a, "a b").is_err());
        a.opt_in.set("whitespace");
        assert!(check(&a, "a b").is_ok());
        assert!(check(&a, "a/b").is_err());
        a.opt_in.set("slash");
        assert!(check(&a, "a/b").is_ok());
        assert!(check(&a, "../x").is_err());
        a.opt_in.set("dot_dot");
        assert!(check(&a, "../x").is_ok());
        for never in ["a\nb", "a\rb", "a\tb", "a\0b", "a\u{1b}[31m"] {
            assert!(check(&a, never).is_err(), "{never:?}");
        }
        assert!(!a.opt_in.set("newline"));
    }
}

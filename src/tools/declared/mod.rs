//! Tools an operator declares in YAML (`tools/NAME.yaml`), under the same
//! gate as the built-ins.
//!
//! A declared tool is a typed operation written as data: its tier (1 or 2,
//! never 3), its arguments with their types, the argv it runs (an absolute
//! program, a list, never a shell), an optional stdin, and for tier 2 a
//! tier-1 probe that shows the change took (`verify`) and what puts it back
//! (`undo`). Everything a built-in gets, it gets: its tier from the
//! declaration (never from a caller), the scope of the runbook that lists
//! it, the host's allowlists for its values, approval, budgets, the audit
//! line before dispatch (naming the declaration's sha256), and for tier 1 a
//! process that cannot write ([`crate::sandbox`]).
//!
//! A call resolves in two steps, both here: every value is checked against
//! its type and the host ([`value`]), then every template is rendered
//! ([`template`]) and an argv element that put a `path` together with
//! other text is resolved again as a whole, so no concatenation leaves the
//! host's `paths`. What runs is exactly what was checked.
//!
//! One file: a declared call's resolve, run, verify and undo share its
//! rendered argv, its captured values and the declaration's digest; the
//! argument types and the templates, which stand alone, are files of their
//! own.

pub(crate) mod template;
pub(crate) mod value;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::args::{ArgError, MAX_REASON_LEN, Reason, shown};
use super::{Ctx, Outcome, PathMode, Tier, ToolResult, from_process};
use crate::host::Host;
use crate::process::{Argv, Confine};
pub(crate) use template::Template;
pub(crate) use value::{Arg, ArgType, OptIn, safe as safe_pattern};

/// The most calls of one tool a sudoers file lists.
pub(crate) const MAX_LISTED_CALLS: usize = 256;

/// The most a result keeps of a declared tool's stdout or stderr.
const KEPT_OUTPUT: usize = 8 * 1024;

/// A command as declared: an absolute program, argument templates, a stdin template.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    /// Absolute.
    pub(crate) program: PathBuf,
    /// One template per element.
    pub(crate) args: Vec<Template>,
    /// What it reads on stdin.
    pub(crate) stdin: Option<Template>,
}

/// How a tier-2 tool shows its change took: a tier-1 probe.
#[derive(Debug, Clone)]
pub(crate) struct Verify {
    /// The probe (run confined, as any tier-1 process).
    pub(crate) command: Command,
    /// The exit status it must end with.
    pub(crate) expect_exit: i32,
    /// A pattern its stdout must match (values in it are matched literally).
    pub(crate) expect_stdout: Option<Template>,
    /// How long the change may take to show: the probe is tried again until then.
    pub(crate) within: Duration,
    /// A value of `capture:` that the probe's output, read with the same
    /// pattern, must show changed ("the pid changed").
    pub(crate) expect_changed: Option<String>,
    /// A number of `capture:` that the probe's output must show lower
    /// ("the queue went down").
    pub(crate) expect_less: Option<String>,
}

/// A tier-2 tool's look before its change: a tier-1 probe whose output
/// `values` reads (its named groups), for `verify:` to compare with. A
/// restart the supervisor made by itself in the same window shows no
/// change of the pid the run's own restart was to make.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    /// The probe (run confined, as any tier-1 process).
    pub(crate) command: Command,
    /// Its named groups are the values (`before.NAME`).
    pub(crate) values: regex::Regex,
}

/// What its stdout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// Text: the result keeps its lines.
    Text,
    /// JSON: the result keeps it parsed, under `output`.
    Json,
}

/// One declared tool: everything its file says, checked.
#[derive(Debug)]
pub struct Declared {
    /// `[a-z][a-z0-9_]*`, never a built-in's.
    pub(crate) name: String,
    /// 1 or 2, from the file.
    pub(crate) tier: Tier,
    /// What it does, for people and the model.
    pub(crate) description: String,
    /// Its arguments, in the file's order.
    pub(crate) args: Vec<(String, Arg)>,
    /// What it runs.
    pub(crate) run: Command,
    /// How long it may run.
    pub(crate) timeout: Duration,
    /// What its stdout is.
    pub(crate) output: Output,
    /// Tier 2: how it shows its change took.
    pub(crate) verify: Option<Verify>,
    /// Tier 2: what puts the change back (run when `verify` fails).
    pub(crate) undo: Option<Command>,
    /// Tier 2: what it reads before the change, for `verify` to compare.
    pub(crate) capture: Option<Capture>,
    /// What a report says it did, as a past-tense verb ("drained"); the
    /// claims rule holds a model's use of it to a call that verified.
    pub(crate) verb: Option<String>,
    /// What its processes may reach (`connect:`); a tier-1 process of it
    /// reaches nothing else.
    pub(crate) connect: std::sync::Arc<crate::sandbox::Net>,
    /// The file that declares it.
    pub(crate) file: PathBuf,
    /// sha256 of that file's bytes: which version of the tool ran.
    pub(crate) sha256: String,
}

impl PartialEq for Declared {
    fn eq(&self, other: &Declared) -> bool {
        self.name == other.name && self.sha256 == other.sha256
    }
}

impl Declared {
    /// Its run, verify, undo and capture commands.
    fn commands(&self) -> impl Iterator<Item = &Command> {
        std::iter::once(&self.run)
            .chain(self.verify.as_ref().map(|v| &v.command))
            .chain(self.undo.as_ref())
            .chain(self.capture.as_ref().map(|c| &c.command))
    }

    /// Every template it holds: its run, verify and undo commands (argv
    /// and stdin) and verify's expected output.
    fn templates(&self) -> impl Iterator<Item = &Template> {
        self.commands()
            .flat_map(|c| c.args.iter().chain(c.stdin.as_ref()))
            .chain(self.verify.as_ref().and_then(|v| v.expect_stdout.as_ref()))
    }

    /// The host's `vars:` it uses (`{{ host.NAME }}`), by NAME.
    pub(crate) fn host_vars(&self) -> std::collections::BTreeSet<&str> {
        self.templates().flat_map(Template::host_vars).collect()
    }

    /// The host's `vars:` that go into a stdin.
    pub(crate) fn stdin_host_vars(&self) -> std::collections::BTreeSet<&str> {
        self.commands()
            .filter_map(|c| c.stdin.as_ref())
            .flat_map(Template::host_vars)
            .collect()
    }

    /// What `host` allows its allowlist and path arguments.
    pub(crate) fn allowed(&self, host: &Host) -> Vec<(&str, super::registry::Allowed)> {
        use super::registry::Allowed;
        self.args
            .iter()
            .filter_map(|(name, arg)| match &arg.ty {
                value::ArgType::Allowlist(list) => Some((
                    name.as_str(),
                    Allowed::OneOf(host.allow.get(list).cloned().unwrap_or_default()),
                )),
                value::ArgType::Path => Some((
                    name.as_str(),
                    Allowed::Under(host.paths.iter().map(|p| p.display().to_string()).collect()),
                )),
                _ => None,
            })
            .collect()
    }

    /// The JSON schema of its arguments (a tier-2 tool's with `reason`).
    pub(crate) fn schema(&self) -> Value {
        let mut properties = serde_json::Map::new();
        let mut required: Vec<String> = Vec::new();
        for (name, arg) in &self.args {
            properties.insert(name.clone(), arg.schema());
            required.push(name.clone());
        }
        if self.tier == Tier::Change {
            properties.insert(
                "reason".into(),
                json!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_REASON_LEN,
                    "description": "The cause, citing the evidence read (kept in the audit log).",
                }),
            );
            required.push("reason".into());
        }
        json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })
    }

    /// What it does, with how a tier-2 tool checks itself ("then verify ...").
    pub(crate) fn described(&self) -> String {
        match &self.verify {
            Some(v) => format!(
                "{}, then verify: {} exits {}{}.",
                self.description.trim_end_matches('.'),
                self.verify_program(v),
                v.expect_exit,
                match &v.expect_stdout {
                    Some(_) => " and its output matches what the change should show",
                    None => "",
                }
            ),
            None => self.description.clone(),
        }
    }

    fn verify_program(&self, v: &Verify) -> String {
        v.command
            .program
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
    }

    /// Check the shape of `args` before any host is known: every declared
    /// argument given (a tier-2 call's `reason` too), nothing else; literal
    /// values against their types (`templated`: values are not known yet).
    pub(crate) fn check_shape(&self, args: &Value, templated: bool) -> Result<(), ArgError> {
        let given = object(args)?;
        self.unknown_or_missing(given)?;
        if templated {
            return Ok(());
        }
        for (name, arg) in &self.args {
            if let Some(v) = given.get(name) {
                arg.check_literal(name, v)?;
            }
        }
        Ok(())
    }

    fn unknown_or_missing(&self, given: &serde_json::Map<String, Value>) -> Result<(), ArgError> {
        let change = self.tier == Tier::Change;
        if let Some(k) = given
            .keys()
            .find(|k| !(self.args.iter().any(|(n, _)| n == *k) || (change && *k == "reason")))
        {
            let mut known: Vec<&str> = self.args.iter().map(|(n, _)| n.as_str()).collect();
            if change {
                known.push("reason");
            }
            return Err(ArgError::Shape(format!(
                "unknown field `{k}`, expected one of {known:?}"
            )));
        }
        for (name, _) in &self.args {
            if !given.contains_key(name) {
                return Err(ArgError::Shape(format!("missing field `{name}`")));
            }
        }
        if change && !given.contains_key("reason") {
            return Err(ArgError::Shape("missing field `reason`".into()));
        }
        Ok(())
    }

    /// Every set of arguments a call of it could have on `host`, when each
    /// argument's values can be listed (an allowlist, an enum, an integer
    /// range of at most 100), at most [`MAX_LISTED_CALLS`]: what a sudoers
    /// file can name without a wildcard. `Err`: the argument whose values
    /// cannot be listed (a free string or a path), or too many.
    pub(crate) fn every_call(&self, host: &Host) -> Result<Vec<Value>, Unlistable> {
        let mut calls = vec![serde_json::Map::new()];
        for (name, arg) in &self.args {
            let values: Vec<Value> = match &arg.ty {
                ArgType::Allowlist(list) => host
                    .allow
                    .get(list)
                    .map(|l| l.iter().map(|v| json!(v)).collect())
                    .unwrap_or_default(),
                ArgType::Enum(v) => v.iter().map(|v| json!(v)).collect(),
                ArgType::Integer { min, max } if max.saturating_sub(*min) < 100 => {
                    (*min..=*max).map(|n| json!(n)).collect()
                }
                ArgType::Integer { .. } => {
                    return Err(Unlistable::Free(
                        name.clone(),
                        "an integer range of more than 100",
                    ));
                }
                ArgType::String { .. } => {
                    return Err(Unlistable::Free(name.clone(), "a free string"));
                }
                ArgType::Path => return Err(Unlistable::Free(name.clone(), "a path")),
            };
            calls = calls
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.insert(name.clone(), v.clone());
                        c
                    })
                })
                .collect();
            if calls.len() > MAX_LISTED_CALLS {
                return Err(Unlistable::TooMany);
            }
        }
        Ok(calls
            .into_iter()
            .map(|mut c| {
                c.insert("reason".into(), json!("install print"));
                Value::Object(c)
            })
            .collect())
    }

    /// Check a call's arguments against the declaration and `host`, and
    /// render what it will run: the only way to a [`Call`].
    pub(crate) fn resolve(
        self: &Arc<Declared>,
        args: &Value,
        host: &Host,
        mode: PathMode,
    ) -> Result<Call, ArgError> {
        let given = object(args)?;
        self.unknown_or_missing(given)?;
        let mut values = BTreeMap::new();
        for var in self.host_vars() {
            let value = host.vars.get(var).ok_or_else(|| {
                ArgError::Value(format!(
                    "host {} has no vars.{var}, which {} uses as {{{{ host.{var} }}}}: add it to the host file",
                    host.name, self.name
                ))
            })?;
            values.insert(format!("{}{var}", template::HOST), value.text());
        }
        let mut recorded = serde_json::Map::new();
        for (name, arg) in &self.args {
            let (text, json) = arg.check(name, &given[name], host, mode)?;
            values.insert(name.clone(), text);
            recorded.insert(name.clone(), json);
        }
        let reason = match self.tier {
            Tier::Change => {
                let text = given["reason"]
                    .as_str()
                    .ok_or_else(|| ArgError::Shape("reason must be a string".into()))?;
                Some(Reason::new(text.to_string())?.as_str().trim().to_string())
            }
            Tier::Observe => None,
        };
        let paths: Vec<&str> = self
            .args
            .iter()
            .filter(|(_, a)| matches!(a.ty, ArgType::Path))
            .map(|(n, _)| n.as_str())
            .collect();
        let run = render(&self.run, &values, &paths, host, mode)?;
        let capture = match &self.capture {
            Some(c) => Some(render(&c.command, &values, &paths, host, mode)?),
            None => None,
        };
        // `{{ before.NAME }}` is known once the capture ran: a marker now,
        // its value then (see `Probe::with_before`).
        let mut probe_values = values.clone();
        if let Some(c) = &self.capture {
            for group in c.values.capture_names().flatten() {
                probe_values.insert(format!("{}{group}", template::BEFORE), marker(group));
            }
        }
        let verify = match &self.verify {
            Some(v) => Some(Probe {
                command: render(&v.command, &probe_values, &paths, host, mode)?,
                expect_exit: v.expect_exit,
                expect_stdout: match &v.expect_stdout {
                    Some(t) => {
                        let pattern =
                            format!("(?m){}", t.render_with(&probe_values, escape_unless_marker));
                        // It must compile whatever the values before are.
                        regex::Regex::new(&unmarked(&pattern, |_| "x".into())).map_err(|e| {
                            ArgError::Value(format!(
                                "the expected output of {}'s verify does not compile with these values: {e}",
                                self.name
                            ))
                        })?;
                        Some(pattern)
                    }
                    None => None,
                },
                within: v.within,
                expect_changed: v.expect_changed.clone(),
                expect_less: v.expect_less.clone(),
                values: self.capture.as_ref().map(|c| c.values.clone()),
            }),
            None => None,
        };
        let undo = match &self.undo {
            Some(u) => Some(render(u, &values, &paths, host, mode)?),
            None => None,
        };
        Ok(Call {
            tool: self.clone(),
            recorded: Value::Object(recorded),
            reason,
            run,
            capture,
            verify,
            undo,
        })
    }
}

fn object(args: &Value) -> Result<&serde_json::Map<String, Value>, ArgError> {
    static EMPTY: std::sync::LazyLock<serde_json::Map<String, Value>> =
        std::sync::LazyLock::new(serde_json::Map::new);
    match args {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(&EMPTY),
        _ => Err(ArgError::Shape("the arguments must be an object".into())),
    }
}

/// A command with every hole filled.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rendered {
    /// The argv.
    pub(crate) argv: Argv,
    /// Its stdin.
    pub(crate) stdin: Option<String>,
}

/// A verify probe with every hole filled, a value of `capture:` as a
/// marker until the capture ran.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    command: Rendered,
    expect_exit: i32,
    /// The pattern (`(?m)` and the declared text, values escaped).
    expect_stdout: Option<String>,
    within: Duration,
    expect_changed: Option<String>,
    expect_less: Option<String>,
    /// `capture:`'s pattern, which reads the probe's output too.
    values: Option<regex::Regex>,
}

impl PartialEq for Probe {
    fn eq(&self, other: &Probe) -> bool {
        self.command == other.command
            && self.expect_exit == other.expect_exit
            && self.expect_stdout == other.expect_stdout
            && self.expect_changed == other.expect_changed
            && self.expect_less == other.expect_less
    }
}

/// What stands for `{{ before.NAME }}` until the capture ran: no argument
/// value can hold it (control characters are refused in every value).
fn marker(name: &str) -> String {
    format!("\u{1}{name}\u{1}")
}

/// `text` with each [`marker`] replaced by what `value` gives its name.
fn unmarked(text: &str, value: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('\u{1}');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    let mut in_marker = true;
    for part in parts {
        match in_marker {
            true => out.push_str(&value(part)),
            false => out.push_str(part),
        }
        in_marker = !in_marker;
    }
    out
}

/// A value in a pattern, escaped; a marker kept as it is (its value is
/// escaped when it replaces it).
fn escape_unless_marker(s: &str) -> String {
    match s.starts_with('\u{1}') {
        true => s.to_string(),
        false => regex::escape(s),
    }
}

/// The values `pattern` reads from `text`: its named groups, each held to
/// what a declared string takes by default (`[A-Za-z0-9._:@-]`, at most
/// 128 characters, no leading `-`, no `..`), or absent. A value goes into
/// `verify`'s argv: it may not become a flag or climb out of a path.
fn read_values(pattern: &regex::Regex, text: &str) -> BTreeMap<String, String> {
    let Some(caps) = pattern.captures(text) else {
        return BTreeMap::new();
    };
    let Ok(safe) = value::safe() else {
        return BTreeMap::new();
    };
    pattern
        .capture_names()
        .flatten()
        .filter_map(|name| {
            let v = caps.name(name)?.as_str();
            let token =
                v.len() <= 128 && safe.is_match(v) && !v.starts_with('-') && !v.contains("..");
            token.then(|| (name.to_string(), v.to_string()))
        })
        .collect()
}

impl Probe {
    /// This probe with the values the capture took in place of its markers.
    fn with_before(&self, before: &BTreeMap<String, String>) -> Probe {
        let value = |name: &str| before.get(name).cloned().unwrap_or_default();
        let mut probe = self.clone();
        // The program is never a template: only the arguments can hold one.
        let words = self.command.argv.to_vec();
        probe.command.argv = Argv::new(std::path::Path::new(&words[0]))
            .args(words[1..].iter().map(|a| unmarked(a, value)));
        probe.command.stdin = self.command.stdin.as_deref().map(|s| unmarked(s, value));
        probe.expect_stdout = self
            .expect_stdout
            .as_deref()
            .map(|p| unmarked(p, |n| regex::escape(&value(n))));
        probe
    }

    /// What the probe's `stdout` says against the values before: `None`
    /// when it shows what `expect_changed`/`expect_less` ask, else why not;
    /// and the values it read.
    fn compare(
        &self,
        before: &BTreeMap<String, String>,
        stdout: &str,
    ) -> (Option<String>, BTreeMap<String, String>) {
        let Some(pattern) = &self.values else {
            return (None, BTreeMap::new());
        };
        let after = read_values(pattern, stdout);
        if let Some(name) = &self.expect_changed {
            match (before.get(name), after.get(name)) {
                (Some(b), Some(a)) if a != b => {}
                (Some(b), Some(_)) => {
                    return (
                        Some(format!("{name} is still {b}: the change did not show")),
                        after,
                    );
                }
                (_, None) => return (Some(format!("the probe's output shows no {name}")), after),
                (None, _) => return (Some(format!("no {name} was captured before")), after),
            }
        }
        if let Some(name) = &self.expect_less {
            let number = |m: &BTreeMap<String, String>| m.get(name)?.parse::<f64>().ok();
            match (number(before), number(&after)) {
                (Some(b), Some(a)) if a < b => {}
                (Some(b), Some(a)) => {
                    return (
                        Some(format!("{name} is {a}, not less than {b} before")),
                        after,
                    );
                }
                _ => {
                    return (
                        Some(format!("{name} is not a number before and after")),
                        after,
                    );
                }
            }
        }
        (None, after)
    }
}

/// Fill `command`'s holes. An element that put a path argument together
/// with other text is resolved again as a whole, from where the path's
/// value starts to the element's end, and refused if that leaves `paths`.
fn render(
    command: &Command,
    values: &BTreeMap<String, String>,
    paths: &[&str],
    host: &Host,
    mode: PathMode,
) -> Result<Rendered, ArgError> {
    let mut argv = Argv::new(&command.program);
    for element in &command.args {
        let text = element.render(values);
        if element.is_one_hole().is_none()
            && let Some(tail) = path_tail(element, values, paths)
        {
            crate::tools::allowlists::allowed_new_path(&tail, &host.paths, mode, "paths")
                .map_err(|e| {
                    ArgError::Path(format!(
                        "the argument {} puts a path together with other text and leaves the host's paths: {e}",
                        shown(&text)
                    ))
                })?;
        }
        argv = argv.arg(text);
    }
    if let Some(t) = &command.stdin {
        stdin_values(t, values)?;
    }
    let stdin = command.stdin.as_ref().map(|t| t.render(values));
    if let Some(s) = &stdin
        && s.len() > crate::process::STDIN_CAP
    {
        return Err(ArgError::Value(format!(
            "the rendered stdin is {} bytes; at most {}",
            s.len(),
            crate::process::STDIN_CAP
        )));
    }
    Ok(Rendered { argv, stdin })
}

/// What stdin separates commands with, for the programs a stdin feeds
/// (haproxy's and most admin sockets: `;` and a newline).
pub(crate) const STDIN_SEPARATORS: [char; 2] = [';', '\n'];

/// Refuse a value that would be a second command in a stdin: an argument's,
/// or a host var's (which no call's arguments can change, and `check`
/// already refuses at the host's file; this holds for a file edited since).
fn stdin_values(stdin: &Template, values: &BTreeMap<String, String>) -> Result<(), ArgError> {
    let holes = stdin.pieces().iter().filter_map(|p| match p {
        template::Piece::Arg(n) => Some(n),
        template::Piece::Text(_) => None,
    });
    for name in holes {
        if let Some(v) = values.get(name)
            && v.contains(STDIN_SEPARATORS)
        {
            return Err(ArgError::Value(format!(
                "{{{{ {name} }}}} goes into stdin, where `;` or a newline would start a second command, and its value {} holds one",
                shown(v)
            )));
        }
    }
    Ok(())
}

/// The text of `element` from its first path argument's value to its end.
fn path_tail(
    element: &Template,
    values: &BTreeMap<String, String>,
    paths: &[&str],
) -> Option<String> {
    use template::Piece;
    let pieces = element.pieces();
    let first = pieces
        .iter()
        .position(|p| matches!(p, Piece::Arg(n) if paths.contains(&n.as_str())))?;
    let mut tail = String::new();
    for p in &pieces[first..] {
        match p {
            Piece::Text(t) => tail.push_str(t),
            Piece::Arg(n) => tail.push_str(values.get(n).map_or("", String::as_str)),
        }
    }
    Some(tail)
}

/// A declared tool's call, every value checked and every command rendered:
/// what an [`Action`](super::Action) holds for it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// The declaration (its sha256 goes to the audit line and the permit).
    pub(crate) tool: Arc<Declared>,
    /// The checked values, as the audit log records them.
    pub(crate) recorded: Value,
    /// A tier-2 call's reason.
    pub(crate) reason: Option<String>,
    run: Rendered,
    /// Tier 2: the look before the change.
    capture: Option<Rendered>,
    verify: Option<Probe>,
    undo: Option<Rendered>,
}

impl PartialEq for Call {
    fn eq(&self, other: &Call) -> bool {
        self.tool == other.tool
            && self.recorded == other.recorded
            && self.reason == other.reason
            && self.run == other.run
            && self.capture == other.capture
            && self.verify == other.verify
            && self.undo == other.undo
    }
}

impl Call {
    /// The commands it runs, as spawned: the change (after `sudo` where the
    /// host says so), then its probe, then its undo.
    pub(crate) fn argv(&self, host: &Host) -> Vec<Argv> {
        let mut out: Vec<Argv> = self.capture.iter().map(|c| c.argv.clone()).collect();
        out.push(self.change_argv(host));
        if let Some(v) = &self.verify {
            out.push(v.command.argv.clone());
        }
        out
    }

    fn change_argv(&self, host: &Host) -> Argv {
        match self.tool.tier {
            Tier::Change => super::privileged(host, self.run.argv.clone()),
            Tier::Observe => self.run.argv.clone(),
        }
    }

    /// What `sudo` runs for this call (the change and its undo, without
    /// the `sudo -n --` prefix): the lines a sudoers file allows.
    pub(crate) fn root_commands(&self, host: &Host) -> Vec<Argv> {
        std::iter::once(&self.run)
            .chain(self.undo.as_ref())
            .map(|r| r.argv.clone())
            .filter(|_| host.sudo)
            .collect()
    }

    /// What puts the change back, as a person would run it.
    pub(crate) fn undo_argv(&self, host: &Host) -> Option<Argv> {
        self.undo
            .as_ref()
            .map(|u| super::privileged(host, u.argv.clone()))
    }

    /// Run it on this machine; a tier-2 call verifies itself and, when it
    /// does not verify, runs its undo.
    pub(crate) async fn run(&self, ctx: &Ctx<'_>) -> ToolResult {
        let tool = &self.tool;
        let deadline = ctx.deadline.min(tokio::time::Instant::now() + tool.timeout);
        // Every process's confinement from the one place that derives it
        // from a tier: a tier-1 process (the call's own) and every probe as
        // the observer this tool's tier 1 would be; the change and its undo
        // as a change.
        let id = crate::tools::ToolId::Declared(tool.clone());
        let observe = super::confinement(&id, Tier::Observe, ctx.host);
        let change = super::confinement(&id, Tier::Change, ctx.host);
        let stdin = |r: &Rendered| r.stdin.clone().map(String::into_bytes);
        let (argv, confine) = match tool.tier {
            Tier::Observe => (self.run.argv.clone(), ctx.confine.clone()),
            Tier::Change => (self.change_argv(ctx.host), change.clone()),
        };
        // The look before the change: without it there is nothing for
        // `verify` to compare with, so nothing is changed.
        let before = match (&self.capture, &tool.capture) {
            (Some(rendered), Some(declared)) if tool.tier == Tier::Change => {
                match capture(ctx, rendered, &declared.values, observe.clone(), deadline).await {
                    Ok(values) => Some(values),
                    Err(why) => {
                        let said = format!("{}: capture {why}; nothing was changed", tool.name);
                        let mut failed = ToolResult::failed(said.clone());
                        failed.data = json!({ "evidence": said });
                        return failed;
                    }
                }
            }
            _ => None,
        };
        let out = match ctx
            .run_fed(&argv, stdin(&self.run), confine, deadline)
            .await
        {
            Ok(out) => out,
            Err(e) => return ToolResult::failed(e),
        };
        let mut data = self.output_fields(&out);
        let mut result = from_process(&out, Value::Null);
        if tool.tier == Tier::Observe || result.outcome != Outcome::Ok {
            if tool.tier == Tier::Change {
                data["evidence"] = json!(format!(
                    "{} {}: not verified",
                    tool.name,
                    out.failure_text()
                ));
            }
            result.data = data;
            return result;
        }
        let Some(probe) = &self.verify else {
            result.data = data;
            return result;
        };
        crate::fault::point(crate::fault::Stage::Verify);
        let probe = match &before {
            Some(values) => probe.with_before(values),
            None => probe.clone(),
        };
        let (verified, seen) = self.probe(ctx, &probe, observe, before.as_ref()).await;
        data["verify"] = seen.clone();
        let mut evidence = format!(
            "{}: exit 0; verify {}",
            tool.name,
            if verified { "passed" } else { "failed" }
        );
        if let Some(why) = seen["why"].as_str() {
            evidence.push_str(&format!(" ({why})"));
        }
        if let Some(values) = &before {
            data["before"] = json!(values);
            let after = &seen["after"];
            let shown: Vec<String> = values
                .iter()
                .map(|(k, b)| format!("{k} {b} -> {}", after[k].as_str().unwrap_or("?")))
                .collect();
            evidence.push_str(&format!("; {}", shown.join(", ")));
        }
        if !verified && let Some(undo) = &self.undo {
            let argv = super::privileged(ctx.host, undo.argv.clone());
            let undone = ctx.run_fed(&argv, stdin(undo), change, ctx.deadline).await;
            let (ok, said) = match &undone {
                Ok(o) if o.exit_code == Some(0) => (true, "undone (exit 0)".to_string()),
                Ok(o) => (false, format!("undo {}", o.failure_text())),
                Err(e) => (false, format!("undo did not start: {e}")),
            };
            data["undo"] = json!({ "argv": argv.to_vec(), "ok": ok, "said": said });
            evidence.push_str(&format!("; {said}"));
        }
        data["evidence"] = json!(evidence);
        result.data = data;
        result.verified = Some(verified);
        if !verified {
            result.outcome = Outcome::Error;
            result.error = Some(evidence);
        }
        result
    }

    /// Run the probe until it passes or its `within` is over: whether it
    /// passed, and what it last saw.
    async fn probe(
        &self,
        ctx: &Ctx<'_>,
        probe: &Probe,
        confine: Confine,
        before: Option<&BTreeMap<String, String>>,
    ) -> (bool, Value) {
        let until = ctx.deadline.min(tokio::time::Instant::now() + probe.within);
        // Compiled at resolution with stand-ins: it compiles with the values.
        let expect = probe
            .expect_stdout
            .as_deref()
            .and_then(|p| regex::Regex::new(p).ok());
        loop {
            let feed = probe.command.stdin.clone().map(String::into_bytes);
            let seen = match ctx
                .run_fed(&probe.command.argv, feed, confine.clone(), ctx.deadline)
                .await
            {
                Ok(out) => {
                    let stdout = out.stdout_text();
                    let exit_ok = out.exit_code == Some(probe.expect_exit);
                    let matched = expect.as_ref().is_none_or(|re| re.is_match(&stdout));
                    let (compared, after) = match before {
                        Some(b) => probe.compare(b, &stdout),
                        None => (None, BTreeMap::new()),
                    };
                    let why = match (exit_ok, matched, compared) {
                        (true, true, None) => None,
                        (false, _, _) => Some(format!(
                            "the probe {}, not {}",
                            out.failure_text(),
                            probe.expect_exit
                        )),
                        (true, false, _) => Some("its output does not show the change".to_string()),
                        (true, true, Some(why)) => Some(why),
                    };
                    json!({
                        "exit_code": out.exit_code,
                        "matched": matched,
                        "stdout": kept(&stdout),
                        "after": after,
                        "why": why,
                    })
                }
                Err(e) => json!({ "why": format!("the probe did not start: {e}") }),
            };
            if seen["why"].is_null() {
                return (true, seen);
            }
            if tokio::time::Instant::now() + Duration::from_millis(250) > until {
                return (false, seen);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn output_fields(&self, out: &crate::process::ProcessOutput) -> Value {
        let stdout = out.stdout_text();
        let mut data = json!({
            "exit_code": out.exit_code,
            "stdout": kept(&stdout),
            "stderr": kept(&out.stderr_text()),
        });
        if self.tool.output == Output::Json {
            data["output"] = match serde_json::from_str::<Value>(&stdout) {
                Ok(mut v) => {
                    crate::text::fit(&mut v, crate::text::MAX_VALUE_DEPTH);
                    v
                }
                Err(e) => json!({ "unparsed": format!("stdout is not JSON: {e}") }),
            };
        }
        data
    }
}

/// Why a tool's calls cannot all be listed (a sudoers line names each).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unlistable {
    /// An argument whose values are not a list: its name, what it is.
    #[error("{0} ({1})")]
    Free(String, &'static str),
    /// Every argument is listed, but together they make too many calls.
    #[error("more than {MAX_LISTED_CALLS} combinations")]
    TooMany,
}

/// Why a `capture:` read no value: then nothing is changed.
#[derive(Debug, thiserror::Error)]
enum NotCaptured {
    /// Its process did not start.
    #[error("did not start: {0}")]
    NotStarted(String),
    /// It failed: what it said.
    #[error("{0}")]
    Failed(String),
    /// It did not print a value the pattern names: the name, its output's first line.
    #[error(
        "read no {0} from its output (1-128 characters of [A-Za-z0-9._:@-], no leading `-`, no `..`): {1}"
    )]
    Missing(String, String),
}

/// Run a tier-2 tool's `capture:` (as the observer) and read its values:
/// every named group of `values`, or why not.
async fn capture(
    ctx: &Ctx<'_>,
    command: &Rendered,
    values: &regex::Regex,
    confine: Confine,
    deadline: tokio::time::Instant,
) -> Result<BTreeMap<String, String>, NotCaptured> {
    let feed = command.stdin.clone().map(String::into_bytes);
    let out = ctx
        .run_fed(&command.argv, feed, confine, deadline)
        .await
        .map_err(|e| NotCaptured::NotStarted(e.to_string()))?;
    if out.exit_code != Some(0) {
        return Err(NotCaptured::Failed(out.failure_text()));
    }
    let read = read_values(values, &out.stdout_text());
    match values
        .capture_names()
        .flatten()
        .find(|n| !read.contains_key(*n))
    {
        Some(missing) => Err(NotCaptured::Missing(
            missing.to_string(),
            kept(&out.stdout_text())
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        )),
        None => Ok(read),
    }
}

/// The end of a long output (where errors usually are), on a char boundary.
fn kept(text: &str) -> String {
    if text.len() <= KEPT_OUTPUT {
        return text.to_string();
    }
    let mut start = text.len() - KEPT_OUTPUT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// What a declared tool's result said, on one line.
pub(crate) fn said(data: &Value) -> Option<String> {
    if let Some(e) = data["evidence"].as_str() {
        return Some(e.to_string());
    }
    let text = data["stdout"].as_str()?.trim();
    if text.is_empty() {
        return Some(match data["exit_code"].as_i64() {
            Some(code) => format!("exit {code}, no output"),
            None => "no output".into(),
        });
    }
    let mut lines = text.lines();
    let first: String = lines.next()?.chars().take(200).collect();
    let more = lines.count();
    Some(match more {
        0 => first,
        n => format!("{first} (+{n} more line(s))"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `capture:` reads goes into verify's argv: a flag, a path that
    /// climbs, a blank or a second word is no value.
    #[test]
    fn a_captured_value_is_a_plain_token_or_nothing() {
        let re = regex::Regex::new(r"(?m)^pid: (?P<pid>.+)$").unwrap();
        assert_eq!(read_values(&re, "pid: 4107\n")["pid"], "4107");
        for bad in ["-rf", "../etc", "a/b", "two words", "x;y"] {
            assert!(
                read_values(&re, &format!("pid: {bad}\n")).is_empty(),
                "{bad}"
            );
        }
    }

    /// A config with one host (paths: `root/allowed`, with a link in it
    /// to `root/outside`) and one declared tool `t`; the tool and the host.
    fn setup(tool: &str) -> (tempfile::TempDir, Arc<Declared>, Arc<Host>) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["hosts", "tools", "allowed/sub", "outside"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(d.join("outside"), d.join("allowed/out")).unwrap();
        std::fs::write(
            d.join("hosts/h.yaml"),
            format!(
                "name: h\nconnection: local\npaths: [{}]\nallow: {{ names: [a, b] }}\n",
                d.join("allowed").display()
            ),
        )
        .unwrap();
        std::fs::write(d.join("tools/t.yaml"), tool).unwrap();
        let config = crate::config::Config::load(d).unwrap();
        let t = config.tools.declared().next().unwrap().clone();
        let h = config.hosts["h"].clone();
        (dir, t, h)
    }

    const TOOL: &str = "name: t\ntier: 1\ndescription: d\nargs:\n  s: { type: string }\n  free: { type: string, pattern: '.*', max_length: 4096, allow: [leading_dash, slash, dot_dot, whitespace] }\n  dir: { type: path }\n\
        run: [/usr/bin/echo, \"{{ s }}\", \"x{{ free }}y\", \"{{ dir }}/sub\", \"{{ dir }}\"]\nstdin: \"cmd {{ free }} {{ s }}\\n\"\n";

    proptest! {
        /// No value ever becomes a second argv element, a second stdin
        /// line, or a path outside the host's `paths`: whatever a caller
        /// sends, a call that resolves has the declared number of elements,
        /// each the declared text with the values in place, one stdin line,
        /// and its paths (alone or put together with text) under `paths`.
        #[test]
        fn no_value_becomes_a_second_element_or_leaves_paths(
            s in "\\PC{0,12}|[A-Za-z0-9._:@-]{1,12}",
            free in "\\PC{0,16}|[ -~\n\t]{0,16}",
            dir in prop::sample::select(vec!["", "sub", "out", "..", "sub/..", "out/..", "../outside", "sub/../out", "./sub", "sub/./.."]),
        ) {
            let (tmp, tool, host) = setup(TOOL);
            let allowed = std::fs::canonicalize(tmp.path().join("allowed")).unwrap();
            let path = format!("{}/{dir}", tmp.path().join("allowed").display());
            let args = serde_json::json!({ "s": s, "free": free, "dir": path });
            if let Ok(call) = tool.resolve(&args, &host, PathMode::Resolve) {
                let argv = call.run.argv.to_vec();
                prop_assert_eq!(argv.len(), 5, "{:?}", argv);
                prop_assert_eq!(&argv[1], &s);
                prop_assert_eq!(&argv[2], &format!("x{free}y"));
                let stdin = call.run.stdin.clone().unwrap();
                prop_assert_eq!(stdin.matches('\n').count(), 1, "{:?}", stdin);
                prop_assert!(!s.chars().any(char::is_control) && !free.chars().any(char::is_control));
                for p in [&argv[3], &argv[4]] {
                    let p = std::path::Path::new(p);
                    let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                    prop_assert!(real.starts_with(&allowed), "{} left {}", real.display(), allowed.display());
                }
            }
        }
    }

    /// The default string, the opt-ins and the allowlist, through the
    /// declaration: what a caller cannot smuggle.
    #[test]
    fn hostile_values_are_refused_through_the_declaration() {
        let (tmp, tool, host) = setup(TOOL);
        let dir = tmp.path().join("allowed").display().to_string();
        let call = |s: &str, free: &str, d: &str| {
            tool.resolve(
                &serde_json::json!({ "s": s, "free": free, "dir": d }),
                &host,
                PathMode::Resolve,
            )
        };
        assert!(call("ok", "any thing -x ../y", &dir).is_ok());
        for s in ["-rf", "a b", "a/b", "$(id)", "a;b", "..", "\u{202e}x"] {
            assert!(call(s, "", &dir).is_err(), "{s:?}");
        }
        // `free` goes into stdin too, where `;` starts a second command.
        for free in [
            "a\nshutdown sessions",
            "a\rb",
            "a\u{0}b",
            "a; shutdown sessions",
        ] {
            assert!(call("ok", free, &dir).is_err(), "{free:?}");
        }
        assert!(
            call("ok", "x", &format!("{dir}/out")).is_err(),
            "a link out"
        );
        assert!(call("ok", "x", "/etc").is_err());
        assert!(
            tool.resolve(
                &serde_json::json!({ "s": "ok", "free": "x" }),
                &host,
                PathMode::Resolve
            )
            .is_err(),
            "a missing argument"
        );
    }
}

//! Reading `tools/*.yaml` into declared tools: one file per tool, every
//! problem named by file, line and field, the whole set loaded or none.
//!
//! What a declaration may not be: a name of a built-in's, tier 3 (a
//! destructive operation is a runbook's `suggest:`, never a tool), a
//! relative program, a template naming no declared argument, a tier-2 tool
//! without `verify` (a change that cannot show it took is not run), a value
//! type it does not know.
//!
//! One file: a declaration's fields and their checks side by side, as a
//! runbook's are, so a field is added in one place.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::diag::{Diagnostics, did_you_mean};
use super::duration;
use crate::sandbox::Net;
use crate::tools::declared::template::{Template, is_name};
use crate::tools::declared::{Arg, ArgType, Capture, Command, Declared, OptIn, Output, Verify};
use crate::tools::{Builtin, Tier, Tools};

type S<T> = Spanned<T>;

/// How long a declared tool may run when its file says nothing.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long its change may take to show, when `verify` says nothing.
const DEFAULT_WITHIN: Duration = Duration::from_secs(3);
/// The most arguments one tool declares, and argv elements one command has.
const MAX_ARGS: usize = 32;
const MAX_ELEMENTS: usize = 64;

/// `tools/NAME.yaml` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolFile {
    name: S<String>,
    tier: S<u8>,
    description: S<String>,
    #[serde(default)]
    args: BTreeMap<String, S<ArgDecl>>,
    run: S<Vec<S<String>>>,
    stdin: Option<S<String>>,
    timeout: Option<S<String>>,
    output: Option<S<String>>,
    verify: Option<S<VerifyDecl>>,
    undo: Option<S<CommandDecl>>,
    capture: Option<S<CaptureDecl>>,
    verb: Option<S<String>>,
    /// Endpoints its processes may connect to (`127.0.0.1:8404`,
    /// `[::1]:8404`, a port alone, `/udp` for UDP); every other is refused
    /// to a tier-1 process.
    connect: Option<Vec<S<String>>>,
}

/// One argument as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ArgDecl {
    #[serde(rename = "type")]
    ty: S<String>,
    list: Option<S<String>>,
    pattern: Option<S<String>>,
    max_length: Option<S<usize>>,
    min: Option<S<i64>>,
    max: Option<S<i64>>,
    values: Option<Vec<S<String>>>,
    allow: Option<Vec<S<String>>>,
    description: Option<S<String>>,
}

/// `verify:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyDecl {
    run: S<Vec<S<String>>>,
    stdin: Option<S<String>>,
    expect_exit: Option<S<i32>>,
    expect_stdout: Option<S<String>>,
    within: Option<S<String>>,
    expect_changed: Option<S<String>>,
    expect_less: Option<S<String>>,
}

/// `capture:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaptureDecl {
    run: S<Vec<S<String>>>,
    stdin: Option<S<String>>,
    values: S<String>,
}

/// Where `PATH` (or the system's own directories) has an executable
/// `name`: the absolute path to suggest for a relative program. Only a
/// suggestion in an error; nothing runs from `PATH`.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if name.is_empty() || name.contains('/') || name.contains("{{") {
        return None;
    }
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain([
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ])
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `undo:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandDecl {
    run: S<Vec<S<String>>>,
    stdin: Option<S<String>>,
}

/// The declared tools of `dir/tools/`, with every problem in `diags`.
pub(super) fn load(dir: &Path, diags: &mut Diagnostics) -> Tools {
    let files = super::yaml_files(&dir.join("tools"), diags);
    let mut declared: BTreeMap<String, Arc<Declared>> = BTreeMap::new();
    // The names of files that do not load: their own errors say why, and
    // a runbook naming one is not also told the tool is unknown.
    let mut broken = std::collections::BTreeSet::new();
    for (file, parsed, text) in super::parse_files::<ToolFile>(dir, &files, diags) {
        let Some((raw, sha256)) = parsed else {
            let named = text
                .and_then(|t| serde_saphyr::from_str::<super::raw::NameOnly>(&t).ok())
                .and_then(|n| n.name);
            let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
            broken.extend(named.into_iter().chain(stem));
            continue;
        };
        let name = raw.name.clone();
        let Some(tool) = validate(raw, &file, sha256, diags) else {
            broken.insert(name.value.clone());
            continue;
        };
        if let Some(other) = declared.get(&tool.name) {
            diags.at(
                &file,
                name.referenced,
                format!(
                    "tool \"{}\" is declared twice (also in {})",
                    tool.name,
                    other.file.display()
                ),
            );
            continue;
        }
        declared.insert(tool.name.clone(), Arc::new(tool));
    }
    Tools::new(declared.into_values()).with_broken(broken)
}

/// One tool file into a [`Declared`], or its problems.
pub(crate) fn validate(
    raw: ToolFile,
    file: &Path,
    sha256: String,
    diags: &mut Diagnostics,
) -> Option<Declared> {
    let before = diags.len();
    check_name(&raw, file, diags);
    let name = &raw.name;
    let tier = tier(&raw, file, diags);
    let description = raw.description.value.trim().to_string();
    if description.is_empty() || description.len() > 1000 {
        diags.at(
            file,
            raw.description.referenced,
            "description must say what the tool does, in 1-1000 characters (people and the model read it)",
        );
    }
    if raw.args.len() > MAX_ARGS {
        diags.at(
            file,
            name.referenced,
            format!("a tool takes at most {MAX_ARGS} arguments"),
        );
    }
    let mut args = Vec::new();
    for (arg_name, decl) in &raw.args {
        if let Some(arg) = argument(arg_name, decl, file, diags) {
            args.push((arg_name.clone(), arg));
        }
    }
    let names: Vec<&str> = args.iter().map(|(n, _)| n.as_str()).collect();
    let run = command(&raw.run, raw.stdin.as_ref(), &names, "run", file, diags);
    let timeout = timeout(&raw, file, diags);
    let output = output(&raw, file, diags);
    let capture = raw
        .capture
        .as_ref()
        .and_then(|c| capture(c, &names, file, diags));
    let groups: Vec<String> = capture
        .as_ref()
        .map(|c| {
            c.values
                .capture_names()
                .flatten()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let verify = raw
        .verify
        .as_ref()
        .and_then(|v| verify(v, &names, &groups, raw.capture.is_some(), file, diags));
    let undo = raw.undo.as_ref().and_then(|u| {
        command(
            &u.value.run,
            u.value.stdin.as_ref(),
            &names,
            "undo.run",
            file,
            diags,
        )
    });
    check_tier_parts(&raw, tier, file, diags);
    let verb = raw.verb.as_ref().and_then(|v| {
        let ok = !v.value.is_empty()
            && v.value.len() <= 32
            && v.value.chars().all(|c| c.is_ascii_lowercase());
        if !ok {
            diags.at(
                file,
                v.referenced,
                "verb must be one lower-case word (what a report says the tool did, e.g. drained)",
            );
        }
        ok.then(|| v.value.clone())
    });
    let connect = connect_policy(raw.connect.as_deref().unwrap_or_default(), file, diags);
    if diags.len() != before {
        return None;
    }
    Some(Declared {
        connect: Arc::new(connect),
        name: name.value.clone(),
        tier,
        description,
        args,
        run: run?,
        timeout,
        output,
        verify,
        undo,
        capture,
        verb,
        file: file.to_path_buf(),
        sha256,
    })
}

/// What `connect:` lets a tier-1 process reach: TCP ports (the kernel,
/// Landlock, holds the port whatever the address), the address families
/// the entries name (`127.0.0.1:8404` is IPv4 only: no `[::1]`; a bare
/// port is either), and UDP when an entry ends in `/udp` (a datagram
/// socket of that family to any port: the kernel holds no UDP port).
fn connect_policy(entries: &[S<String>], file: &Path, diags: &mut Diagnostics) -> Net {
    let mut net = Net::none();
    for e in entries {
        let (endpoint, udp) = match e.value.rsplit_once('/') {
            Some((endpoint, "udp")) => (endpoint, true),
            Some((endpoint, "tcp")) => (endpoint, false),
            _ => (e.value.as_str(), false),
        };
        let (port, v4, v6) = match endpoint.parse::<u16>() {
            Ok(p) => (Some(p), true, true),
            Err(_) => match endpoint.parse::<std::net::SocketAddr>() {
                Ok(a) => (Some(a.port()), a.is_ipv4(), a.is_ipv6()),
                Err(_) => (None, false, false),
            },
        };
        match port {
            Some(p) if p > 0 => {
                net.sockets.ipv4 |= v4;
                net.sockets.ipv6 |= v6;
                match udp {
                    true => net.sockets.udp = true,
                    false => net.tcp_ports.push(p),
                }
            }
            _ => diags.at(
                file,
                e.referenced,
                format!(
                    "connect: \"{}\" is not an endpoint: write ADDRESS:PORT (e.g. 127.0.0.1:8404 or [::1]:8404) or a port, with /udp for UDP; a tier-1 process may connect to these only",
                    e.value
                ),
            ),
        }
    }
    net.tcp_ports.sort_unstable();
    net.tcp_ports.dedup();
    net
}

/// The tool's `name`: an identifier, no built-in's, its file's stem.
fn check_name(raw: &ToolFile, file: &Path, diags: &mut Diagnostics) {
    let name = &raw.name;
    if !is_name(&name.value) {
        diags.at(
            file,
            name.referenced,
            format!(
                "tool name \"{}\" must be [a-z][a-z0-9_]*, at most 64 characters",
                name.value.escape_debug()
            ),
        );
    } else if Builtin::from_name(&name.value).is_some() {
        diags.at(
            file,
            name.referenced,
            format!(
                "\"{}\" is a built-in tool's name: a declared tool never shadows one; name it after what it does on your hosts (e.g. {}_yourapp)",
                name.value, name.value
            ),
        );
    }
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if is_name(&name.value) && stem != name.value {
        diags.at(
            file,
            name.referenced,
            format!(
                "the file of tool \"{}\" must be tools/{}.yaml (one file per tool, named after it)",
                name.value, name.value
            ),
        );
    }
}

/// `tier:` 1 or 2 (3 is never a tool).
fn tier(raw: &ToolFile, file: &Path, diags: &mut Diagnostics) -> Tier {
    match raw.tier.value {
        1 => Tier::Observe,
        2 => Tier::Change,
        3 => {
            diags.at(file, raw.tier.referenced, "tier 3 (destructive, irreversible) is never a tool: write it as a `suggest:` step of a runbook, a command for a person to run");
            Tier::Change
        }
        n => {
            diags.at(
                file,
                raw.tier.referenced,
                format!("tier {n} does not exist: 1 observes, 2 makes a reversible change"),
            );
            Tier::Observe
        }
    }
}

/// `timeout:`, 100ms to 1h.
fn timeout(raw: &ToolFile, file: &Path, diags: &mut Diagnostics) -> Duration {
    match &raw.timeout {
        Some(t) => duration(t, "timeout", file, diags)
            .filter(|d| {
                let ok = (Duration::from_millis(100)..=Duration::from_secs(3600)).contains(d);
                if !ok {
                    diags.at(file, t.referenced, "timeout must be between 100ms and 1h");
                }
                ok
            })
            .unwrap_or(DEFAULT_TIMEOUT),
        None => DEFAULT_TIMEOUT,
    }
}

/// `output:`, text or json.
fn output(raw: &ToolFile, file: &Path, diags: &mut Diagnostics) -> Output {
    match raw.output.as_ref().map(|o| o.value.as_str()) {
        None | Some("text") => Output::Text,
        Some("json") => Output::Json,
        Some(other) => {
            if let Some(o) = &raw.output {
                diags.at(
                    file,
                    o.referenced,
                    format!(
                        "output \"{}\" is not known: `text` or `json`",
                        other.escape_debug()
                    ),
                );
            }
            Output::Text
        }
    }
}

/// `verify:` and `undo:` belong to tier 2, and a tier-2 tool needs `verify:`.
fn check_tier_parts(raw: &ToolFile, tier: Tier, file: &Path, diags: &mut Diagnostics) {
    match (tier, &raw.verify, &raw.undo) {
        (Tier::Change, None, _) => diags.at(
            file,
            raw.tier.referenced,
            "a tier-2 tool needs `verify:`, a tier-1 probe that shows the change took (a change that cannot show it took is never run)",
        ),
        (Tier::Observe, Some(v), _) => diags.at(
            file,
            v.referenced,
            "`verify:` is for tier-2 tools: a tier-1 tool changes nothing to verify",
        ),
        (Tier::Observe, _, Some(u)) => diags.at(
            file,
            u.referenced,
            "`undo:` is for tier-2 tools: a tier-1 tool changes nothing to undo",
        ),
        _ => {}
    }
    if let (Tier::Observe, Some(c)) = (tier, &raw.capture) {
        diags.at(
            file,
            c.referenced,
            "`capture:` is for tier-2 tools: it reads what a change should change, before it",
        );
    }
}

/// One argument's declaration. Long as docs/tools.md's table of argument
/// kinds is: one arm per kind, each holding the fields that kind takes and
/// what its values may be, read top to bottom as that table.
fn argument(name: &str, decl: &S<ArgDecl>, file: &Path, diags: &mut Diagnostics) -> Option<Arg> {
    let at = decl.referenced;
    let d = &decl.value;
    if !is_name(name) || name == "reason" {
        diags.at(
            file,
            at,
            format!(
                "argument \"{}\": a name is [a-z][a-z0-9_]* and not `reason` (a tier-2 call's reason is its own field)",
                name.escape_debug()
            ),
        );
        return None;
    }
    let kind = d.ty.value.as_str();
    let used = |field: &str, given: bool, allowed: &[&str]| {
        (given && !allowed.contains(&kind))
            .then(|| format!("argument {name}: `{field}` does not apply to type {kind}"))
    };
    for problem in [
        used("list", d.list.is_some(), &["allowlist"]),
        used("pattern", d.pattern.is_some(), &["string"]),
        used("max_length", d.max_length.is_some(), &["string"]),
        used("min", d.min.is_some(), &["integer"]),
        used("max", d.max.is_some(), &["integer"]),
        used("values", d.values.is_some(), &["enum"]),
    ]
    .into_iter()
    .flatten()
    {
        diags.at(file, at, problem);
    }
    let ty = match kind {
        "allowlist" => match &d.list {
            Some(l) if is_name(&l.value) => ArgType::Allowlist(l.value.clone()),
            Some(l) => {
                diags.at(
                    file,
                    l.referenced,
                    "list must name a list of the host's `allow:` ([a-z][a-z0-9_]*)",
                );
                return None;
            }
            None => {
                diags.at(file, at, format!("argument {name}: an allowlist argument names its list (`list: NAME`, the host's `allow: {{ NAME: [...] }}`)"));
                return None;
            }
        },
        "string" => {
            let max_length = d.max_length.as_ref().map(|m| m.value);
            if let Some(m) = &d.max_length
                && !(1..=4096).contains(&m.value)
            {
                diags.at(file, m.referenced, "max_length must be between 1 and 4096");
            }
            match &d.pattern {
                None => match ArgType::safe_string(max_length) {
                    Ok(t) => t,
                    Err(e) => {
                        diags.at(file, at, e.to_string());
                        return None;
                    }
                },
                Some(p) => match regex::Regex::new(&format!("^(?:{})$", p.value)) {
                    Ok(re) => ArgType::String {
                        pattern: re,
                        pattern_text: p.value.clone(),
                        max_length: max_length.unwrap_or(255),
                    },
                    Err(e) => {
                        diags.at(file, p.referenced, format!("pattern does not compile: {e}"));
                        return None;
                    }
                },
            }
        }
        "path" => ArgType::Path,
        "integer" => {
            let (min, max) = (
                d.min.as_ref().map_or(i64::MIN, |m| m.value),
                d.max.as_ref().map_or(i64::MAX, |m| m.value),
            );
            if d.min.is_none() || d.max.is_none() || min > max {
                diags.at(
                    file,
                    at,
                    format!("argument {name}: an integer declares `min` and `max`, min <= max"),
                );
                return None;
            }
            ArgType::Integer { min, max }
        }
        "enum" => match &d.values {
            Some(v) if !v.is_empty() => ArgType::Enum(v.iter().map(|s| s.value.clone()).collect()),
            _ => {
                diags.at(
                    file,
                    at,
                    format!("argument {name}: an enum lists its `values`"),
                );
                return None;
            }
        },
        other => {
            diags.at(
                file,
                d.ty.referenced,
                format!(
                    "argument {name}: type \"{}\" is not known{}; one of allowlist, string, path, integer, enum",
                    other.escape_debug(),
                    did_you_mean(other, ["allowlist", "string", "path", "integer", "enum"].into_iter())
                ),
            );
            return None;
        }
    };
    let mut opt_in = OptIn::default();
    for a in d.allow.iter().flatten() {
        if !opt_in.set(&a.value) {
            diags.at(
                file,
                a.referenced,
                format!(
                    "allow: \"{}\" is not a refusal a value may be spared{}; one of {}",
                    a.value.escape_debug(),
                    did_you_mean(&a.value, OptIn::NAMES.into_iter()),
                    OptIn::NAMES.join(", ")
                ),
            );
        }
    }
    Some(Arg {
        ty,
        opt_in,
        description: d.description.as_ref().map(|s| s.value.clone()),
    })
}

/// An argv and its stdin, every template naming a declared argument.
fn command(
    run: &S<Vec<S<String>>>,
    stdin: Option<&S<String>>,
    names: &[&str],
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Command> {
    let before = diags.len();
    let Some((program, rest)) = run.value.split_first() else {
        diags.at(
            file,
            run.referenced,
            format!("{field} is empty: it is an argv, an absolute program first"),
        );
        return None;
    };
    if !program.value.starts_with('/') || program.value.contains("{{") {
        let hint = on_path(&program.value)
            .map(|p| format!(": write {}", p.display()))
            .unwrap_or_default();
        diags.at(
            file,
            program.referenced,
            format!(
                "{field}: the program \"{}\" must be an absolute path, written out (never a template, never found on PATH){hint}",
                program.value.escape_debug()
            ),
        );
    }
    if run.value.len() > MAX_ELEMENTS {
        diags.at(
            file,
            run.referenced,
            format!("{field} has more than {MAX_ELEMENTS} elements"),
        );
    }
    // `{{ before.NAME }}` is verify's alone: the value capture read.
    let only_verify_reads_before = |t: &Template, at, what: &str, diags: &mut Diagnostics| {
        if !field.starts_with("verify") && t.before_vars().next().is_some() {
            diags.at(
                file,
                at,
                format!("{what}: {{{{ before.NAME }}}} is verify's: the value `capture:` read before the change"),
            );
        }
    };
    let mut args = Vec::new();
    for element in rest {
        if let Some(t) = template(element, names, field, file, diags) {
            only_verify_reads_before(&t, element.referenced, field, diags);
            args.push(t);
        }
    }
    let what = format!("{field}'s stdin");
    let stdin = stdin.and_then(|s| {
        let t = template(s, names, &what, file, diags)?;
        only_verify_reads_before(&t, s.referenced, &what, diags);
        Some(t)
    });
    if stdin
        .as_ref()
        .is_some_and(|_| stdin_len(stdin.as_ref()) > crate::process::STDIN_CAP / 2)
    {
        diags.at(
            file,
            run.referenced,
            "stdin is too long (at most 8 KiB as declared)",
        );
    }
    (diags.len() == before).then(|| Command {
        program: program.value.clone().into(),
        args,
        stdin,
    })
}

fn stdin_len(t: Option<&Template>) -> usize {
    t.map_or(0, |t| t.render(&BTreeMap::new()).len())
}

/// One template, naming only declared arguments.
fn template(
    s: &S<String>,
    names: &[&str],
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Template> {
    match Template::parse(&s.value) {
        Ok(t) => {
            for n in t.names() {
                if !names.contains(&n) {
                    diags.at(
                        file,
                        s.referenced,
                        format!(
                            "{field}: {{{{ {n} }}}} names no declared argument{}; declared: {}",
                            did_you_mean(n, names.iter().copied()),
                            if names.is_empty() {
                                "none".to_string()
                            } else {
                                names.join(", ")
                            }
                        ),
                    );
                }
            }
            Some(t)
        }
        Err(e) => {
            diags.at(file, s.referenced, format!("{field}: {e}"));
            None
        }
    }
}

fn verify(
    v: &S<VerifyDecl>,
    names: &[&str],
    groups: &[String],
    captured: bool,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Verify> {
    let d = &v.value;
    let command = command(&d.run, d.stdin.as_ref(), names, "verify.run", file, diags)?;
    // `{{ before.NAME }}` and the comparisons name what `capture:` reads.
    let mut before_named = |name: &str, at: serde_saphyr::Location, field: &str| {
        if !groups.iter().any(|g| g == name) {
            diags.at(
                file,
                at,
                match captured {
                    true => format!(
                        "verify.{field}: {name} is not a value of capture (its pattern's named groups: {})",
                        if groups.is_empty() { "none".to_string() } else { groups.join(", ") }
                    ),
                    false => format!(
                        "verify.{field} compares with a value before the change: add `capture:`, a tier-1 probe whose `values` pattern names {name} as a group, e.g. (?P<{name}>\\d+)"
                    ),
                },
            );
        }
    };
    for (t, at, field) in std::iter::once((&d.run, "run"))
        .flat_map(|(run, field)| run.value.iter().map(move |e| (e, field)))
        .chain(d.stdin.iter().map(|s| (s, "stdin")))
        .chain(d.expect_stdout.iter().map(|s| (s, "expect_stdout")))
        .filter_map(|(e, field)| Some((Template::parse(&e.value).ok()?, e.referenced, field)))
    {
        for name in t.before_vars() {
            before_named(name, at, field);
        }
    }
    for (which, field) in [
        (&d.expect_changed, "expect_changed"),
        (&d.expect_less, "expect_less"),
    ] {
        if let Some(n) = which {
            before_named(&n.value, n.referenced, field);
        }
    }
    let expect_stdout = match &d.expect_stdout {
        Some(p) => {
            let t = template(p, names, "verify.expect_stdout", file, diags)?;
            // With every value a literal, the pattern must compile.
            let sample: BTreeMap<String, String> = names
                .iter()
                .map(|n| (n.to_string(), "x".to_string()))
                .collect();
            if let Err(e) =
                regex::Regex::new(&format!("(?m){}", t.render_with(&sample, regex::escape)))
            {
                diags.at(
                    file,
                    p.referenced,
                    format!("verify.expect_stdout is not a regex: {e}"),
                );
                return None;
            }
            Some(t)
        }
        None => None,
    };
    let within = match &d.within {
        Some(w) => duration(w, "verify.within", file, diags)
            .filter(|d| {
                let ok = *d <= Duration::from_secs(600);
                if !ok {
                    diags.at(file, w.referenced, "verify.within must be at most 10m");
                }
                ok
            })
            .unwrap_or(DEFAULT_WITHIN),
        None => DEFAULT_WITHIN,
    };
    Some(Verify {
        command,
        expect_exit: d.expect_exit.as_ref().map_or(0, |e| e.value),
        expect_stdout,
        within,
        expect_changed: d.expect_changed.as_ref().map(|n| n.value.clone()),
        expect_less: d.expect_less.as_ref().map(|n| n.value.clone()),
    })
}

/// `capture:`: a command (no `{{ before.NAME }}`: it is what makes them)
/// and a pattern whose named groups are the values.
fn capture(
    c: &S<CaptureDecl>,
    names: &[&str],
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Capture> {
    let d = &c.value;
    let command = command(&d.run, d.stdin.as_ref(), names, "capture.run", file, diags)?;
    let values = match regex::RegexBuilder::new(&format!("(?m){}", d.values.value))
        .size_limit(1 << 20)
        .build()
    {
        Ok(re) => re,
        Err(e) => {
            diags.at(
                file,
                d.values.referenced,
                format!("capture.values is not a regex: {e}"),
            );
            return None;
        }
    };
    let groups: Vec<&str> = values.capture_names().flatten().collect();
    if groups.is_empty() || groups.iter().any(|g| !is_name(g)) {
        diags.at(
            file,
            d.values.referenced,
            "capture.values names each value it reads as a group of [a-z][a-z0-9_]*, e.g. '^(?P<pid>\\d+)$'",
        );
        return None;
    }
    Some(Capture { command, values })
}

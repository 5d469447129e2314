//! The registry: the [`Tool`] trait each tool implements in its own file,
//! the table of tools ([`ToolId`] and an action's dispatch are generated
//! from it), and the shape checks made from the argument types before any
//! host is known.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::*;
use super::declared::Declared;
use super::{Ctx, PathMode, ToolResult};
use super::{cert, disk, failed_units, http, journal, logs, pool, process, service};
use crate::host::Host;
use crate::process::Argv;

/// What a tool may do to a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// Only observes; runs without approval.
    Observe = 1,
    /// Makes a reversible change; needs standing approval (L3) or is only proposed (L1).
    Change = 2,
}

impl Tier {
    /// 1 or 2, as reports, audit lines and metric labels write it.
    pub(crate) fn number(self) -> u8 {
        self as u8
    }
}

/// One tool, implemented in its own file: its name, tier and description,
/// its arguments (their JSON schema is generated from the type), how they
/// resolve against a host's allowlists, the commands it runs, how it runs
/// and verifies itself, how its result reads, and what a sudoers file must
/// allow it. The `registry!` table turns the implementations into
/// [`ToolId`] and the dispatch of an [`Action`](super::Action).
pub(crate) trait Tool {
    /// The name runbooks, planners and audit lines use.
    const NAME: &'static str;
    /// The tier, fixed in code.
    const TIER: Tier;
    /// What it does, for people and for the model; a tier-2 tool's ends with
    /// "then verify ..." (how it checks its own effect).
    const DESCRIPTION: &'static str;
    /// The arguments as a caller writes them.
    type Args: DeserializeOwned + JsonSchema;
    /// The arguments once every value was checked against the host.
    type Resolved: std::fmt::Debug + Clone + PartialEq + Send + Sync;

    /// Check `args` against `host`'s allowlists; the error is a sentence a
    /// planner (or a model) can act on.
    fn resolve(args: Self::Args, host: &Host, mode: PathMode) -> Result<Self::Resolved, ArgError>;

    /// The resolved arguments as the audit log records them (the reason has its own field).
    fn args_json(resolved: &Self::Resolved) -> Value;

    /// A tier-2 call's reason.
    fn reason(_resolved: &Self::Resolved) -> Option<&str> {
        None
    }

    /// The commands it runs, exactly as it would spawn them (for `--dry-run`
    /// and the sudoers lines); empty for a tool that spawns nothing.
    fn argv(resolved: &Self::Resolved, host: &Host) -> Vec<Argv>;

    /// Run it on this machine (and, for tier 2, verify its effect).
    fn run(ctx: &Ctx<'_>, resolved: &Self::Resolved) -> impl Future<Output = ToolResult> + Send;

    /// What a result said, on one line; `None` reads a tier-2 result's evidence.
    fn said(_data: &Value) -> Option<String> {
        None
    }

    /// For a tier-2 tool: the argument it acts on and every value `host`
    /// allows for it (a sudoers file lists one command per value).
    fn targets(_host: &Host) -> Option<(&'static str, Vec<String>)> {
        None
    }

    /// What `host` allows each argument that names something of it: a
    /// tier-2 tool's target by default. Shown in the schema a model or an
    /// agent is given for that host, so it picks rather than guesses.
    fn allowed(host: &Host) -> Vec<(&'static str, Allowed)> {
        Self::targets(host)
            .map(|(arg, values)| vec![(arg, Allowed::OneOf(values))])
            .unwrap_or_default()
    }
}

/// What a host allows one argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Allowed {
    /// Exactly one of these values (a unit, a name, a file).
    OneOf(Vec<String>),
    /// A path under one of these directories.
    Under(Vec<String>),
}

/// A tier-2 call's resolved target and the reason it was asked for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change<T> {
    /// What the change acts on (a unit, a configuration, a pool, a certificate).
    pub(crate) target: T,
    /// Why, as the caller wrote it (trimmed).
    pub(crate) reason: String,
}

impl<T> Change<T> {
    pub(super) fn new(target: T, reason: &Reason) -> Change<T> {
        Change {
            target,
            reason: reason.as_str().trim().to_string(),
        }
    }
}

/// The table of built-in tools: one row per tool, naming the type that
/// implements [`Tool`] in the tool's own file.
macro_rules! registry {
    ($($variant:ident => $tool:ty;)*) => {
        /// Every tool compiled in.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Builtin { $(#[doc = concat!("See `", stringify!($tool), "`.")] $variant),* }

        impl Builtin {
            /// Every built-in tool, in registry order.
            pub const ALL: &'static [Builtin] = &[$(Builtin::$variant),*];

            /// The name runbooks, planners and audit lines use.
            pub(crate) fn name(self) -> &'static str {
                match self { $(Builtin::$variant => <$tool as Tool>::NAME),* }
            }

            /// The tier, fixed in code.
            pub(crate) fn tier(self) -> Tier {
                match self { $(Builtin::$variant => <$tool as Tool>::TIER),* }
            }

            /// What it does, for people and for the model.
            pub(crate) fn description(self) -> &'static str {
                match self { $(Builtin::$variant => <$tool as Tool>::DESCRIPTION),* }
            }

            /// The built-in tool of that name.
            pub(crate) fn from_name(name: &str) -> Option<Builtin> {
                Builtin::ALL.iter().copied().find(|t| t.name() == name)
            }

            /// The JSON schema of the arguments, generated from the type that checks them.
            pub(crate) fn schema(self) -> Value {
                match self { $(Builtin::$variant => schema_of::<<$tool as Tool>::Args>()),* }
            }

            fn check_typed(self, args: &Value) -> Result<(), ArgError> {
                match self {
                    $(Builtin::$variant => parse::<<$tool as Tool>::Args>(args).map(|_| ())),*
                }
            }

            /// The argument a tier-2 tool acts on, and every value `host`
            /// allows for it; `None` for a tier-1 tool.
            pub(crate) fn targets(self, host: &Host) -> Option<(&'static str, Vec<String>)> {
                match self { $(Builtin::$variant => <$tool as Tool>::targets(host)),* }
            }

            /// What `host` allows each argument that names something of it.
            pub(crate) fn allowed(self, host: &Host) -> Vec<(&'static str, Allowed)> {
                match self { $(Builtin::$variant => <$tool as Tool>::allowed(host)),* }
            }

            pub(super) fn said_by(self, data: &Value) -> Option<String> {
                match self { $(Builtin::$variant => <$tool as Tool>::said(data)),* }
            }

            pub(super) fn resolve(self, args: &Value, host: &Host, mode: PathMode) -> Result<Resolved, ArgError> {
                Ok(match self {
                    $(Builtin::$variant => Resolved::$variant(<$tool as Tool>::resolve(parse(args)?, host, mode)?)),*
                })
            }
        }

        /// What an [`Action`](super::Action) holds: one tool's resolved arguments.
        #[derive(Debug, Clone, PartialEq)]
        pub(super) enum Resolved {
            $($variant(<$tool as Tool>::Resolved),)*
            /// A declared tool's call (boxed: it holds its rendered commands).
            Declared(Box<super::declared::Call>),
        }

        impl Resolved {
            pub(super) fn tool(&self) -> ToolId {
                match self {
                    $(Resolved::$variant(_) => ToolId::Builtin(Builtin::$variant),)*
                    Resolved::Declared(c) => ToolId::Declared(c.tool.clone()),
                }
            }

            pub(super) fn reason(&self) -> Option<&str> {
                match self {
                    $(Resolved::$variant(r) => <$tool as Tool>::reason(r),)*
                    Resolved::Declared(c) => c.reason.as_deref(),
                }
            }

            pub(super) fn args_json(&self) -> Value {
                match self {
                    $(Resolved::$variant(r) => <$tool as Tool>::args_json(r),)*
                    Resolved::Declared(c) => c.recorded.clone(),
                }
            }

            pub(super) fn argv(&self, host: &Host) -> Vec<Argv> {
                match self {
                    $(Resolved::$variant(r) => <$tool as Tool>::argv(r, host),)*
                    Resolved::Declared(c) => c.argv(host),
                }
            }

            pub(super) async fn run(&self, ctx: &Ctx<'_>) -> ToolResult {
                match self {
                    $(Resolved::$variant(r) => <$tool as Tool>::run(ctx, r).await,)*
                    Resolved::Declared(c) => c.run(ctx).await,
                }
            }
        }
    };
}

registry! {
    DiskUsage => disk::DiskUsage;
    ServiceStatus => service::ServiceStatus;
    ReadJournal => journal::ReadJournal;
    ListProcesses => process::ListProcesses;
    CertExpiry => cert::CertExpiry;
    HttpCheck => http::HttpCheck;
    FailedUnits => failed_units::FailedUnits;
    RestartService => service::RestartService;
    ReloadService => service::ReloadService;
    RotateLogs => logs::RotateLogs;
    RecycleWorkerPool => pool::RecycleWorkerPool;
    RenewCertificate => cert::RenewCertificate;
}

/// A tool a runbook may call: one compiled in, or one declared in
/// `tools/NAME.yaml`. Its tier comes from the registry or the declaration,
/// never from a caller. Two are the same tool when they have the same name
/// (names are unique across both kinds; `check` refuses a declaration that
/// shadows a built-in).
#[derive(Debug, Clone)]
pub enum ToolId {
    /// Compiled in.
    Builtin(Builtin),
    /// Declared in a file.
    Declared(std::sync::Arc<Declared>),
}

impl PartialEq for ToolId {
    fn eq(&self, other: &ToolId) -> bool {
        self.name() == other.name()
    }
}
impl Eq for ToolId {}
impl PartialOrd for ToolId {
    fn partial_cmp(&self, other: &ToolId) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ToolId {
    fn cmp(&self, other: &ToolId) -> std::cmp::Ordering {
        self.name().cmp(other.name())
    }
}
impl std::hash::Hash for ToolId {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name().hash(h);
    }
}

impl From<Builtin> for ToolId {
    fn from(b: Builtin) -> ToolId {
        ToolId::Builtin(b)
    }
}

impl ToolId {
    /// The name runbooks, planners and audit lines use.
    pub(crate) fn name(&self) -> &str {
        match self {
            ToolId::Builtin(b) => b.name(),
            ToolId::Declared(d) => &d.name,
        }
    }

    /// The tier: fixed in code, or in the declaration.
    pub(crate) fn tier(&self) -> Tier {
        match self {
            ToolId::Builtin(b) => b.tier(),
            ToolId::Declared(d) => d.tier,
        }
    }

    /// What it does, for people and for the model (a tier-2 tool's says
    /// "then verify ...").
    pub(crate) fn description(&self) -> std::borrow::Cow<'static, str> {
        match self {
            ToolId::Builtin(b) => b.description().into(),
            ToolId::Declared(d) => d.described().into(),
        }
    }

    /// The JSON schema of its arguments.
    pub(crate) fn schema(&self) -> Value {
        match self {
            ToolId::Builtin(b) => b.schema(),
            ToolId::Declared(d) => d.schema(),
        }
    }

    /// The JSON schema of its arguments on `host`: an argument the host's
    /// allowlists decide lists its values (`enum`), a path says the
    /// directories it must be under. What a model and an MCP agent are
    /// offered, so that they choose instead of guessing; the gate still
    /// checks every value.
    pub(crate) fn schema_for(&self, host: &Host) -> Value {
        let mut schema = self.schema();
        let allowed: Vec<(&str, Allowed)> = match self {
            ToolId::Builtin(b) => b.allowed(host),
            ToolId::Declared(d) => d.allowed(host),
        };
        for (arg, allowed) in allowed {
            let Some(p) = schema["properties"].get_mut(arg) else {
                continue;
            };
            match allowed {
                Allowed::OneOf(values) => p["enum"] = json!(values),
                Allowed::Under(dirs) => {
                    let said = p["description"].as_str().unwrap_or_default().to_string();
                    let under = match dirs.is_empty() {
                        true => "this host allows no path".to_string(),
                        false => format!("on this host, under {}", dirs.join(", ")),
                    };
                    p["description"] = json!(format!("{said} ({under})").trim_start().to_string());
                }
            }
        }
        schema
    }

    /// The declaration, for a declared tool.
    pub(crate) fn declared(&self) -> Option<&std::sync::Arc<Declared>> {
        match self {
            ToolId::Builtin(_) => None,
            ToolId::Declared(d) => Some(d),
        }
    }

    /// The tool as a signed permit names it: a built-in by its name, a
    /// declared tool by its name and the sha256 of its declaration
    /// (`NAME@sha256:HEX`), so a permit allows one version of it only.
    pub(crate) fn signed_name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ToolId::Builtin(b) => b.name().into(),
            ToolId::Declared(d) => format!("{}@sha256:{}", d.name, d.sha256).into(),
        }
    }

    /// The sha256 of a declared tool's file: which version of it ran.
    pub(crate) fn declaration(&self) -> Option<&str> {
        self.declared().map(|d| d.sha256.as_str())
    }

    /// The argument a built-in tier-2 tool acts on, and every value `host`
    /// allows for it; `None` for a tier-1 or declared tool.
    pub(crate) fn targets(&self, host: &Host) -> Option<(&'static str, Vec<String>)> {
        match self {
            ToolId::Builtin(b) => b.targets(host),
            ToolId::Declared(_) => None,
        }
    }

    pub(super) fn said_by(&self, data: &Value) -> Option<String> {
        match self {
            ToolId::Builtin(b) => b.said_by(data),
            ToolId::Declared(_) => super::declared::said(data),
        }
    }

    pub(super) fn resolve(
        &self,
        args: &Value,
        host: &Host,
        mode: PathMode,
    ) -> Result<Resolved, ArgError> {
        match self {
            ToolId::Builtin(b) => b.resolve(args, host, mode),
            ToolId::Declared(d) => d
                .resolve(args, host, mode)
                .map(|c| Resolved::Declared(Box::new(c))),
        }
    }

    /// How a tier-2 tool checks its own effect (from its description).
    pub(crate) fn verification(&self) -> Option<String> {
        let d = self.description();
        let (_, v) = d
            .split_once("then verify")
            .or_else(|| d.split_once("Then verify"))?;
        Some(
            v.trim_start_matches(':')
                .trim()
                .trim_end_matches('.')
                .to_string(),
        )
    }
}

/// The tools one configuration (or one host's policy) knows: every
/// built-in, and the tools declared in its `tools/`.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    declared: std::collections::BTreeMap<String, std::sync::Arc<Declared>>,
    /// Names of tool files that did not load: a runbook naming one is
    /// not told the tool is unknown (its file's own error says why).
    broken: std::collections::BTreeSet<String>,
}

impl Tools {
    /// These declared tools beside the built-ins (their names are checked
    /// to be new by the loader).
    pub(crate) fn new(declared: impl IntoIterator<Item = std::sync::Arc<Declared>>) -> Tools {
        Tools {
            declared: declared.into_iter().map(|d| (d.name.clone(), d)).collect(),
            broken: Default::default(),
        }
    }

    /// With `names` declared in files that did not load.
    pub(crate) fn with_broken(mut self, names: std::collections::BTreeSet<String>) -> Tools {
        self.broken = names;
        self
    }

    /// Whether `name` is declared in a tool file that did not load.
    pub(crate) fn is_broken(&self, name: &str) -> bool {
        self.broken.contains(name)
    }

    /// The tool of that name.
    pub(crate) fn get(&self, name: &str) -> Option<ToolId> {
        Builtin::from_name(name)
            .map(ToolId::Builtin)
            .or_else(|| self.declared.get(name).cloned().map(ToolId::Declared))
    }

    /// Every tool: the built-ins in registry order, then the declared ones by name.
    pub(crate) fn all(&self) -> impl Iterator<Item = ToolId> + '_ {
        Builtin::ALL
            .iter()
            .copied()
            .map(ToolId::Builtin)
            .chain(self.declared.values().cloned().map(ToolId::Declared))
    }

    /// The declared tools, by name.
    pub(crate) fn declared(&self) -> impl Iterator<Item = &std::sync::Arc<Declared>> {
        self.declared.values()
    }
}

/// Every built-in tool's argument schema is a JSON object schema: asked by
/// `check` and `serve` before anything runs (see [`crate::compiled`]), so a
/// schema this build cannot generate stops start-up, naming its tool,
/// instead of reaching a model or an agent as `null`.
pub(crate) fn compile_schemas() -> Result<(), crate::compiled::CompileError> {
    for b in Builtin::ALL {
        let schema = b.schema();
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(crate::compiled::CompileError {
                name: format!("tools::{}'s argument schema", b.name()),
                why: format!(
                    "not a JSON object schema: {}",
                    crate::text::bounded(&schema)
                ),
            });
        }
    }
    Ok(())
}

pub(super) fn schema_of<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap_or(Value::Null);
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
        obj.remove("description");
    }
    schema
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(args: &Value) -> Result<T, ArgError> {
    let args = if args.is_null() {
        json!({})
    } else {
        args.clone()
    };
    serde_json::from_value(args).map_err(|e| ArgError::Shape(e.to_string()))
}

/// Check arguments against a tool's type before any host is known (config load).
/// With templated values, only the field names can be checked now.
pub fn check_shape(tool: &ToolId, args: &Value, templated: bool) -> Result<(), ArgError> {
    let b = match tool {
        ToolId::Builtin(b) => *b,
        ToolId::Declared(d) => return d.check_shape(args, templated),
    };
    if !templated {
        return b.check_typed(args);
    }
    let schema = b.schema();
    let props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let given = args.as_object().cloned().unwrap_or_default();
    if let Some(k) = given.keys().find(|k| !props.contains_key(*k)) {
        let known: Vec<&str> = props.keys().map(String::as_str).collect();
        return Err(ArgError::Shape(format!(
            "unknown field `{k}`, expected one of {known:?}"
        )));
    }
    for r in schema["required"].as_array().into_iter().flatten() {
        if let Some(r) = r.as_str()
            && !given.contains_key(r)
        {
            return Err(ArgError::Shape(format!("missing field `{r}`")));
        }
    }
    Ok(())
}

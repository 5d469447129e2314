//! The registry: every tool's name, tier, description and argument type in
//! one table ([`ToolId`] is generated from it), and the shape checks made
//! from those types before any host is known.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::*;

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
    pub fn number(self) -> u8 {
        self as u8
    }
}

macro_rules! registry {
    ($($variant:ident => $name:literal, $tier:ident, $args:ty, $desc:literal;)*) => {
        /// Every tool that exists.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum ToolId { $(#[doc = $desc] $variant),* }

        impl ToolId {
            /// Every tool, in registry order.
            pub const ALL: &'static [ToolId] = &[$(ToolId::$variant),*];

            /// The name runbooks, planners and audit lines use.
            pub fn name(self) -> &'static str {
                match self { $(ToolId::$variant => $name),* }
            }

            /// The tier, fixed in code.
            pub fn tier(self) -> Tier {
                match self { $(ToolId::$variant => Tier::$tier),* }
            }

            /// What it does, for people and for the model.
            pub fn description(self) -> &'static str {
                match self { $(ToolId::$variant => $desc),* }
            }

            /// How a tier-2 tool checks its own effect (from its description).
            pub fn verification(self) -> Option<&'static str> {
                self.description()
                    .split_once("then verify")
                    .map(|(_, v)| v.trim_start_matches(':').trim().trim_end_matches('.'))
            }

            /// The tool of that name.
            pub fn from_name(name: &str) -> Option<ToolId> {
                match name { $($name => Some(ToolId::$variant),)* _ => None }
            }

            /// The JSON schema of the arguments, generated from the type that checks them.
            pub fn schema(self) -> Value {
                match self { $(ToolId::$variant => schema_of::<$args>()),* }
            }

            fn check_typed(self, args: &Value) -> Result<(), String> {
                match self {
                    $(ToolId::$variant => parse::<$args>(args).map(|_| ())),*
                }
            }
        }
    };
}

registry! {
    DiskUsage => "disk_usage", Observe, DiskUsageArgs,
        "Filesystem usage of an allowed path: use_pct, size/used/avail bytes, filesystem, mount point, and the largest entries one level down (bounded by the host's du_budget: when du did not finish, partial is true, largest is empty and partial_reason says why; largest_truncated says when more than 10 entries were cut).";
    ServiceStatus => "service_status", Observe, UnitArgs,
        "State of an allowed systemd unit: load/active/sub state, main pid, since when, last result, restarts.";
    ReadJournal => "read_journal", Observe, JournalArgs,
        "Recent journal entries of an allowed unit at or above a priority. At most 80 lines, newest last; truncated says when cut.";
    ListProcesses => "list_processes", Observe, ProcessArgs,
        "The top processes by cpu, memory or age: pid, ppid, user, state, cpu%, rss, elapsed seconds, command name.";
    CertExpiry => "cert_expiry", Observe, NameArgs,
        "Expiry of an allowed certificate file: not_after, days_left, subject, issuer.";
    HttpCheck => "http_check", Observe, NameArgs,
        "GET an allowed loopback health-check URL with a hard timeout: healthy, status, latency, body excerpt.";
    RestartService => "restart_service", Change, UnitChangeArgs,
        "Restart an allowed systemd unit, then verify it is active again with a new main pid.";
    ReloadService => "reload_service", Change, UnitChangeArgs,
        "Reload an allowed systemd unit, then verify it is still active with the same main pid.";
    RotateLogs => "rotate_logs", Change, RotateArgs,
        "Force logrotate on an allowed configuration, then verify: exit status, no error lines, state file updated.";
    RecycleWorkerPool => "recycle_worker_pool", Change, PoolArgs,
        "Replace the workers of an allowed pool (reload or signal to its master), then verify new workers and health.";
    RenewCertificate => "renew_certificate", Change, RenewArgs,
        "Run the host's renewal command for an allowed certificate, then verify the new not_after is later than the old.";
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

pub(super) fn parse<T: serde::de::DeserializeOwned>(args: &Value) -> Result<T, String> {
    let args = if args.is_null() {
        json!({})
    } else {
        args.clone()
    };
    serde_json::from_value(args).map_err(|e| e.to_string())
}

/// Check arguments against a tool's type before any host is known (config load).
/// With templated values, only the field names can be checked now.
pub fn check_shape(tool: ToolId, args: &Value, templated: bool) -> Result<(), String> {
    if !templated {
        return tool.check_typed(args);
    }
    let schema = tool.schema();
    let props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let given = args.as_object().cloned().unwrap_or_default();
    if let Some(k) = given.keys().find(|k| !props.contains_key(*k)) {
        let known: Vec<&str> = props.keys().map(String::as_str).collect();
        return Err(format!("unknown field `{k}`, expected one of {known:?}"));
    }
    for r in schema["required"].as_array().into_iter().flatten() {
        if let Some(r) = r.as_str()
            && !given.contains_key(r)
        {
            return Err(format!("missing field `{r}`"));
        }
    }
    Ok(())
}

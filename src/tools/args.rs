//! Argument types of every tool.
//!
//! These types are the single source of truth for what a tool accepts: the
//! JSON schema shown by `runwarden tools` (and to a model) is generated from
//! them, and the same types deserialize and check the values. Newtypes carry
//! their own checks (length, character set, range) in `Deserialize` and
//! describe the same limits in `JsonSchema`, so schema and validation cannot
//! disagree. Membership in the host's allowlists is checked afterwards, in
//! [`super::resolve`], because it depends on the host.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};

/// Longest string any tool argument may be.
pub(crate) const MAX_ARG_LEN: usize = 4096;
/// Longest `reason` of a tier-2 call.
pub(crate) const MAX_REASON_LEN: usize = 500;

/// Show an untrusted value in an error message: escaped and cut short.
pub(crate) fn shown(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    let more = if cut.len() < s.len() { "…" } else { "" };
    format!("\"{}{more}\"", cut.escape_debug())
}

/// Why a tool's arguments were refused: what a caller branches on (the
/// gate tells a planner less about a refused path than a person reads).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A value the tool does not accept (empty, too long, a control or
    /// invisible character, not a unit name, not an absolute path).
    #[error("{0}")]
    Value(String),
    /// The arguments do not fit the tool's type (a missing or unknown field,
    /// a value of the wrong type).
    #[error("{0}")]
    Shape(String),
    /// A name the host's allowlists do not hold.
    #[error("{0}")]
    NotAllowed(String),
    /// A path outside the host's allowlists, or one that cannot be
    /// resolved; the message can say where a link on the host points.
    #[error("{0}")]
    Path(String),
}

fn clean(s: &str, what: &str, max: usize) -> Result<(), ArgError> {
    if s.is_empty() {
        return Err(ArgError::Value(format!("{what} is empty")));
    }
    if s.len() > max {
        return Err(ArgError::Value(format!(
            "{what} is {} bytes long; the limit is {max}",
            s.len()
        )));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(ArgError::Value(format!(
            "{what} {} contains the control character {:?}",
            shown(s),
            c
        )));
    }
    if let Some(c) = s.chars().find(|c| crate::text::invisible(*c)) {
        return Err(ArgError::Value(format!(
            "{what} {} contains the invisible character U+{:04X}, which makes it read differently from what it says",
            shown(s),
            c as u32
        )));
    }
    Ok(())
}

macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $check:expr, $schema:tt) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
        #[serde(transparent)]
        pub(crate) struct $name(String);

        impl $name {
            /// Checked: an error says what is wrong with the value.
            pub(crate) fn new(s: String) -> Result<Self, ArgError> {
                let check: fn(&str) -> Result<(), ArgError> = $check;
                check(&s)?;
                Ok($name(s))
            }
            /// The checked value.
            pub(crate) fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $name::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
            }
        }

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

checked_string!(
    /// A systemd unit name with its suffix, e.g. `nginx.service`.
    UnitName,
    |s| {
        clean(s, "unit", 255)?;
        if crate::host::is_unit_name(s) {
            Ok(())
        } else {
            Err(ArgError::Value(format!("{} is not a unit name: use the full name with its suffix (e.g. nginx.service); letters, digits and . _ - @ : only", shown(s))))
        }
    },
    {
        "type": "string",
        "pattern": "^[A-Za-z0-9][A-Za-z0-9._@:-]*\\.(service|socket|timer|target|path|mount|slice|scope)$",
        "maxLength": 255,
        "description": "A systemd unit the host file allows, with its suffix, e.g. nginx.service."
    }
);

checked_string!(
    /// An absolute path.
    AbsPath,
    |s| {
        clean(s, "path", MAX_ARG_LEN)?;
        if s.starts_with('/') {
            Ok(())
        } else {
            Err(ArgError::Value(format!("{} is not an absolute path", shown(s))))
        }
    },
    {
        "type": "string",
        "pattern": "^/",
        "maxLength": 4096,
        "description": "An absolute path the host file allows."
    }
);

checked_string!(
    /// The name of an entry in one of the host's named allowlists.
    EntryName,
    |s| {
        clean(s, "name", 64)?;
        if crate::host::safe_name(s) {
            Ok(())
        } else {
            Err(ArgError::Value(format!("{} is not a name: a-z, 0-9, '-' and '_' only", shown(s))))
        }
    },
    {
        "type": "string",
        "pattern": "^[a-z0-9][a-z0-9_-]*$",
        "maxLength": 64,
        "description": "The name of an entry the host file defines."
    }
);

checked_string!(
    /// Why a tier-2 call is made, citing the evidence; kept in the audit log.
    Reason,
    |s| clean(s.trim(), "reason", MAX_REASON_LEN),
    {
        "type": "string",
        "minLength": 1,
        "maxLength": 500,
        "description": "The cause, citing the evidence read (kept in the audit log)."
    }
);

/// How many processes to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct Limit(u8);

impl Limit {
    /// The most processes one call lists.
    pub(crate) const MAX: u8 = 50;
    /// How many, as a count.
    pub(crate) fn get(self) -> usize {
        self.0 as usize
    }
}

impl Default for Limit {
    fn default() -> Self {
        Limit(10)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        if (1..=Limit::MAX as u64).contains(&n) {
            Ok(Limit(n as u8))
        } else {
            Err(serde::de::Error::custom(format!(
                "limit {n} is outside 1..={}",
                Limit::MAX
            )))
        }
    }
}

impl JsonSchema for Limit {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Limit".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "integer", "minimum": 1, "maximum": 50, "default": 10})
    }
}

/// How far back to read a journal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// The variants are the values the schema lists (`enum`, named by their
// serde names): a doc comment on each would turn that into a `oneOf`,
// which small models follow worse.
#[allow(missing_docs)]
pub(crate) enum Since {
    #[serde(rename = "15m")]
    Min15,
    #[default]
    #[serde(rename = "1h")]
    Hour1,
    #[serde(rename = "6h")]
    Hour6,
    #[serde(rename = "1d")]
    Day1,
}

impl Since {
    /// The value given to `journalctl --since`.
    pub(crate) fn journalctl(self) -> &'static str {
        match self {
            Since::Min15 => "-15min",
            Since::Hour1 => "-1h",
            Since::Hour6 => "-6h",
            Since::Day1 => "-1d",
        }
    }
}

/// Lowest journal priority to show (this and more severe).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)] // the variants are the schema's `enum` values: see `Since`
pub(crate) enum Priority {
    Emerg,
    Alert,
    Crit,
    Err,
    #[default]
    Warning,
    Notice,
    Info,
    Debug,
}

impl Priority {
    /// Every priority's name, most severe first (`journalctl -p` takes them).
    pub(crate) const NAMES: [&'static str; 8] = [
        "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
    ];
    /// The name `journalctl -p` takes.
    pub(crate) fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// Order of `list_processes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)] // the variants are the schema's `enum` values: see `Since`
pub(crate) enum ProcessSort {
    #[default]
    Cpu,
    Memory,
    Oldest,
    Newest,
}

/// `disk_usage`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DiskUsageArgs {
    /// Under the host's paths.
    pub(crate) path: AbsPath,
}

/// `service_status`, and the unit of a tier-2 service call.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnitArgs {
    /// A unit listed under the host's `units`.
    pub(crate) unit: UnitName,
}

/// `read_journal`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct JournalArgs {
    /// A unit listed under the host's `journals` or `units`.
    pub(crate) unit: UnitName,
    /// How far back to read (default 1h).
    #[serde(default)]
    pub(crate) since: Since,
    /// Lowest priority to show, this and more severe (default warning).
    #[serde(default)]
    pub(crate) priority: Priority,
}

/// `list_processes`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProcessArgs {
    /// Order of the list (default cpu).
    #[serde(default)]
    pub(crate) sort: ProcessSort,
    /// How many processes (1 to 50, default 10).
    #[serde(default)]
    pub(crate) limit: Limit,
}

/// `cert_expiry`, `http_check`: one entry of a named allowlist.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NameArgs {
    /// A name defined under the host's `certificates` (cert_expiry) or `health_checks` (http_check).
    pub(crate) name: EntryName,
}

/// `restart_service`, `reload_service`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnitChangeArgs {
    /// A unit listed under the host's `units`.
    pub(crate) unit: UnitName,
    /// The cause, citing the evidence read (kept in the audit log).
    pub(crate) reason: Reason,
}

/// `rotate_logs`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateArgs {
    /// A logrotate configuration file listed under the host's `logrotate_configs`.
    pub(crate) config: AbsPath,
    /// The cause, citing the evidence read (kept in the audit log).
    pub(crate) reason: Reason,
}

/// `recycle_worker_pool`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolArgs {
    /// A pool defined under the host's `worker_pools`.
    pub(crate) pool: EntryName,
    /// The cause, citing the evidence read (kept in the audit log).
    pub(crate) reason: Reason,
}

/// `renew_certificate`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenewArgs {
    /// A certificate defined under the host's `certificates` with a `renew` command.
    pub(crate) name: EntryName,
    /// The cause, citing the evidence read (kept in the audit log).
    pub(crate) reason: Reason,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(s: &str) -> Result<UnitName, ArgError> {
        UnitName::new(s.to_string())
    }

    #[test]
    fn hostile_unit_names_are_refused() {
        assert!(unit("nginx.service").is_ok());
        for bad in [
            "nginx.service; rm -rf /",
            "nginx.service\0",
            "../../etc/shadow",
            "-H.service",
            "nginx",
            "ngin\\x2dx.service",
            "nginx\u{2024}service",
            "nginx.service\n",
            "$(reboot).service",
        ] {
            assert!(unit(bad).is_err(), "{bad:?} must be refused");
        }
        let long = format!("{}.service", "a".repeat(10_000));
        let err = unit(&long).unwrap_err();
        assert!(err.to_string().contains("limit is 255"), "{err}");
    }

    #[test]
    fn paths_and_reasons_are_bounded() {
        assert!(AbsPath::new("/var".into()).is_ok());
        assert!(AbsPath::new("var/log".into()).is_err());
        assert!(AbsPath::new("/var/\0log".into()).is_err());
        assert!(AbsPath::new(format!("/{}", "x".repeat(10_000))).is_err());
        assert!(Reason::new("disk at 97%".into()).is_ok());
        for sneaky in [
            "disk at 97%\u{202E}%79 ta ksid",
            "restart\u{200B}nginx",
            "disk \u{2066}full\u{2069}",
            "ok\u{FEFF}",
            "soft\u{00AD}hyphen",
        ] {
            let e = Reason::new(sneaky.into()).unwrap_err();
            assert!(e.to_string().contains("invisible character"), "{e}");
        }
        assert!(Reason::new("   ".into()).is_err());
        assert!(Reason::new("x".repeat(501)).is_err());
    }

    #[test]
    fn shown_escapes_and_cuts() {
        let s = shown(&format!("a\u{1b}[31m{}", "b".repeat(200)));
        assert!(s.contains("\\u{1b}"));
        assert!(s.ends_with("…\""));
        assert!(s.len() < 120);
    }

    #[test]
    fn limit_range_matches_schema() {
        assert!(serde_json::from_value::<Limit>(50.into()).is_ok());
        assert!(serde_json::from_value::<Limit>(51.into()).is_err());
        assert!(serde_json::from_value::<Limit>(0.into()).is_err());
        let schema = serde_json::to_value(schemars::schema_for!(Limit)).unwrap();
        assert_eq!(schema["maximum"], 50);
    }
}

//! `runwarden.yaml`: the daemon's settings, each resolved and checked
//! (paths absolute, durations and sizes read), its defaults where absent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;

use super::diag::Diagnostics;
use super::peers;
use super::read::{parse, read_file};
use super::{
    AuditHead, ConfigError, DEFAULT_LISTEN, Rotation, Settings, duration, model, raw, runbook,
};
use crate::host::safe_name;

/// Read `DIR/runwarden.yaml` alone. The kill-switch commands need only this,
/// and must work while a runbook or host file is half edited.
pub(super) fn load_settings(dir: &Path, diags: &mut Diagnostics) -> Settings {
    let settings_file = dir.join("runwarden.yaml");
    let settings = match read_file(&settings_file, dir, diags, true) {
        Some((text, _)) => parse::<raw::Settings>(&settings_file, &text, diags).unwrap_or_default(),
        None => raw::Settings::default(),
    };
    let resolve = |v: &Option<Spanned<String>>, default: &str| -> PathBuf {
        let p = v.as_ref().map(|s| s.value.as_str()).unwrap_or(default);
        dir.join(p)
    };
    let listen = listen(&settings, &settings_file, diags);
    let timezone = timezone(&settings, &settings_file, diags);
    let max_concurrent_runs = match &settings.max_concurrent_runs {
        Some(n) if n.value == 0 || n.value > 1000 => {
            diags.at(
                &settings_file,
                n.referenced,
                "max_concurrent_runs must be between 1 and 1000",
            );
            1
        }
        Some(n) => n.value as usize,
        None => 4,
    };
    let audit_rotation = audit_rotation(settings.audit_rotation.as_ref(), &settings_file, diags);
    let shutdown_grace = settings
        .shutdown_grace
        .as_ref()
        .and_then(|g| duration(g, "shutdown_grace", &settings_file, diags))
        .unwrap_or(Duration::from_secs(30));
    let approval_timeout = settings
        .approval_timeout
        .as_ref()
        .and_then(|t| duration(t, "approval_timeout", &settings_file, diags))
        .unwrap_or(Duration::from_secs(300));
    if let Some(url) = &settings.approval_webhook
        && reqwest::Url::parse(&url.value).is_err()
    {
        diags.at(
            &settings_file,
            url.referenced,
            format!("approval_webhook \"{}\" is not a URL", url.value),
        );
    }
    if let Some(url) = &settings.external_url
        && !reqwest::Url::parse(&url.value).is_ok_and(|u| u.scheme().starts_with("http"))
    {
        diags.at(
            &settings_file,
            url.referenced,
            format!(
                "external_url \"{}\" is not an http(s) URL (how people reach this daemon, e.g. https://runwarden.staging.example)",
                url.value
            ),
        );
    }
    if let (Some(secret), None) = (
        &settings.approval_webhook_secret_file,
        &settings.approval_webhook,
    ) {
        diags.at(
            &settings_file,
            secret.referenced,
            "approval_webhook_secret_file signs the approval webhook, but no approval_webhook is set",
        );
    }
    let model = settings
        .model
        .as_ref()
        .and_then(|m| model::validate(&m.value, &settings_file, dir, diags));
    let fleet_budget = settings
        .fleet_budget
        .as_ref()
        .and_then(|f| runbook::fleet_budget(f, &settings_file, diags));
    let postgres = peers::postgres(&settings, dir, &settings_file, diags);
    let slack = peers::slack(&settings, dir, &settings_file, diags);
    let replica = replica(&settings, &settings_file, diags);
    let mcp_idle_timeout = settings
        .mcp_idle_timeout
        .as_ref()
        .and_then(|t| duration(t, "mcp_idle_timeout", &settings_file, diags))
        .unwrap_or(Duration::from_secs(600));
    let mcp_limits = mcp_limits(&settings, &settings_file, diags);
    let prometheus = settings
        .prometheus
        .as_ref()
        .and_then(|p| peers::prometheus(p, dir, &settings_file, diags));
    let settings = Settings {
        slack,
        prometheus,
        mcp_token_file: settings.mcp_token_file.as_ref().map(|f| dir.join(&f.value)),
        mcp_idle_timeout,
        mcp_limits,
        model,
        fleet_budget,
        postgres,
        replica,
        principals_file: principals_file(&settings, &settings_file, diags).map(|f| dir.join(f)),
        approval_timeout,
        approval_webhook: settings.approval_webhook.as_ref().map(|u| u.value.clone()),
        approval_webhook_secret_file: settings
            .approval_webhook_secret_file
            .as_ref()
            .map(|f| dir.join(&f.value)),
        external_url: settings
            .external_url
            .as_ref()
            .map(|u| u.value.trim_end_matches('/').to_string()),
        audit_log: resolve(&settings.audit_log, "state/audit.jsonl"),
        audit_rotation,
        audit_head: match &settings.audit_head {
            None => AuditHead::Auto,
            Some(v) if v.value == "journal" => AuditHead::Journal,
            Some(v) if v.value == "none" => AuditHead::None,
            Some(v) => {
                diags.at(
                    &settings_file,
                    v.referenced,
                    format!(
                        "audit_head \"{}\" is not known: use `journal` (each run's head goes to the system journal) or `none`",
                        v.value
                    ),
                );
                AuditHead::None
            }
        },
        kill_switch_dir: resolve(&settings.kill_switch_dir, "kill-switch"),
        permit_key_file: resolve(&settings.permit_key_file, "state/permit.key"),
        state_dir: resolve(&settings.state_dir, "state"),
        listen,
        timezone,
        max_concurrent_runs,
        webhook_token_file: settings
            .webhook_token_file
            .as_ref()
            .map(|f| dir.join(&f.value)),
        shutdown_grace,
    };
    for path in settings.secret_paths(dir) {
        crate::sandbox::protect(&path);
    }
    // Each secret this configuration names is held from the start, so that
    // a tool's output quoting it is cut, whichever command reads the file
    // itself (an error here is the reader's to report).
    for file in settings.secret_files() {
        let _ = crate::secret::read_file(&file, "a secret file");
    }
    settings
}

/// `mcp_max_sessions`, `mcp_handshake_timeout`, `mcp_allowed_hosts`.
fn mcp_limits(settings: &raw::Settings, file: &Path, diags: &mut Diagnostics) -> super::McpLimits {
    let max_sessions = match &settings.mcp_max_sessions {
        Some(n) if n.value == 0 || n.value > 10_000 => {
            diags.at(
                file,
                n.referenced,
                "mcp_max_sessions must be between 1 and 10000",
            );
            super::McpLimits::DEFAULT_MAX_SESSIONS
        }
        Some(n) => n.value as usize,
        None => super::McpLimits::DEFAULT_MAX_SESSIONS,
    };
    let handshake_timeout = settings
        .mcp_handshake_timeout
        .as_ref()
        .and_then(|t| duration(t, "mcp_handshake_timeout", file, diags))
        .unwrap_or(Duration::from_secs(30));
    let allowed_hosts = settings.mcp_allowed_hosts.as_ref().map(|names| {
        names
            .iter()
            .filter_map(|n| {
                let name = n.value.trim_start_matches('[').trim_end_matches(']');
                let ok = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
                if !ok {
                    diags.at(
                        file,
                        n.referenced,
                        format!(
                            "mcp_allowed_hosts: \"{}\" is not a host name or address (no port, no scheme)",
                            n.value
                        ),
                    );
                }
                ok.then(|| name.to_ascii_lowercase())
            })
            .collect()
    });
    super::McpLimits {
        max_sessions,
        handshake_timeout,
        allowed_hosts,
    }
}

impl Settings {
    /// What no tier-1 process may read: every secret file the settings
    /// name, the state directory (the permit key, the record of runs and
    /// approvals) and the audit log's directory.
    pub(crate) fn secret_paths(&self, dir: &Path) -> Vec<std::path::PathBuf> {
        let mut paths = self.secret_files();
        paths.push(self.state_dir.clone());
        paths.push(self.audit_log.clone());
        // Its segments lie beside it: the whole directory, unless that is
        // the configuration's own (where the tools' files may be).
        if let Some(parent) = self.audit_log.parent()
            && parent != dir
        {
            paths.push(parent.to_path_buf());
        }
        paths
    }

    /// Every file of a secret the settings name: the tokens, the
    /// approvers, the PostgreSQL URL, the model's key, the permit key.
    pub(crate) fn secret_files(&self) -> Vec<std::path::PathBuf> {
        let mut paths: Vec<std::path::PathBuf> = [
            self.mcp_token_file.as_ref(),
            self.principals_file.as_ref(),
            self.webhook_token_file.as_ref(),
            self.approval_webhook_secret_file.as_ref(),
            self.slack.as_ref().map(|s| &s.signing_secret_file),
            self.slack.as_ref().map(|s| &s.bot_token_file),
            self.prometheus
                .as_ref()
                .and_then(|p| p.bearer_token_file.as_ref()),
            self.postgres.as_ref().map(|pg| &pg.url_file),
            self.model.as_ref().and_then(|m| match &m.api_key {
                Some(super::model::ApiKey::File(f)) => Some(f),
                _ => None,
            }),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        paths.push(self.permit_key_file.clone());
        paths
    }

    /// The settings of `dir`, however its runbooks and hosts are: exactly
    /// what `serve` would use, or the problems of runwarden.yaml.
    pub(crate) fn load(dir: &Path) -> Result<Settings, ConfigError> {
        let mut diags = Diagnostics::default();
        let settings = load_settings(dir, &mut diags);
        if diags.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError(diags.into_vec()))
        }
    }
}

pub(super) fn abs_path(
    v: &Spanned<String>,
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> PathBuf {
    if let Some(why) = path_problem(&v.value) {
        diags.at(file, v.referenced, format!("{field}: {why}"));
    }
    PathBuf::from(&v.value)
}

/// Why `text` is not an absolute path written out (no `..`, no control
/// character), if it is not: what every path of the configuration must be.
pub(super) fn path_problem(text: &str) -> Option<String> {
    let p = Path::new(text);
    if !p.is_absolute() {
        Some(format!(
            "\"{}\" is not an absolute path",
            text.escape_debug()
        ))
    } else if text.contains('\0') {
        Some("path contains a NUL byte".into())
    } else if text.chars().any(char::is_control) {
        Some(format!(
            "\"{}\" contains a control character",
            text.escape_debug()
        ))
    } else if p.components().any(|c| c == std::path::Component::ParentDir) {
        Some(format!(
            "\"{}\" contains `..`; write the path it means",
            text.escape_debug()
        ))
    } else {
        None
    }
}

/// `audit_rotation:`: each field defaults on its own; `max_age` and `keep`
/// also take `never` (no rotation by age; keep every segment).
fn audit_rotation(
    raw: Option<&raw::AuditRotation>,
    file: &Path,
    diags: &mut Diagnostics,
) -> Rotation {
    let mut r = Rotation::default();
    let Some(raw) = raw else {
        return r;
    };
    if let Some(size) = &raw.max_size {
        match bytes(&size.value) {
            Some(b) if (4 << 10..=1 << 40).contains(&b) => r.max_bytes = b,
            _ => diags.at(
                file,
                size.referenced,
                format!(
                    "audit_rotation.max_size \"{}\" is not a size between 4KiB and 1TiB: write e.g. 16MiB (the default; a daemon's start reads the current segment whole)",
                    size.value
                ),
            ),
        }
    }
    let never = |v: &Spanned<String>, field: &str, diags: &mut Diagnostics| match v.value.as_str() {
        "never" => Ok(None),
        _ => duration(v, field, file, diags).map(Some).ok_or(()),
    };
    if let Some(age) = &raw.max_age
        && let Ok(d) = never(age, "audit_rotation.max_age", diags)
    {
        r.max_age = d;
    }
    if let Some(keep) = &raw.keep
        && let Ok(d) = never(keep, "audit_rotation.keep", diags)
    {
        if d.is_some_and(|d| d < Duration::from_secs(86_400)) {
            diags.at(
                file,
                keep.referenced,
                "audit_rotation.keep must be at least 1d (or `never`): it is how long the record of what ran is kept",
            );
        }
        r.keep = d;
    }
    if let Some(total) = &raw.max_total {
        match total.value.as_str() {
            "never" => r.max_total = None,
            text => match bytes(text) {
                Some(b) if b >= 4 * r.max_bytes => r.max_total = Some(b),
                _ => diags.at(
                    file,
                    total.referenced,
                    format!(
                        "audit_rotation.max_total \"{}\" is not a size of at least 4 segments (4 x max_size): write e.g. 10GiB, or `never`",
                        total.value
                    ),
                ),
            },
        }
    }
    r
}

/// `16MiB`, `512KiB`, `1GiB` or a number of bytes.
fn bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits].parse().ok()?;
    let shift = match text[digits..].trim() {
        "" | "B" => 0,
        "KiB" | "K" => 10,
        "MiB" | "M" => 20,
        "GiB" | "G" => 30,
        "TiB" | "T" => 40,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// `listen:`, the daemon's address (127.0.0.1:9731 when unset).
fn listen(settings: &raw::Settings, file: &Path, diags: &mut Diagnostics) -> std::net::SocketAddr {
    match &settings.listen {
        Some(l) => l.value.parse().unwrap_or_else(|e| {
            diags.at(
                file,
                l.referenced,
                format!(
                    "listen \"{}\" is not an address: {e}; write e.g. 127.0.0.1:9731",
                    l.value
                ),
            );
            DEFAULT_LISTEN
        }),
        None => DEFAULT_LISTEN,
    }
}

/// `timezone:`, the schedules' time zone (UTC when unset).
fn timezone(settings: &raw::Settings, file: &Path, diags: &mut Diagnostics) -> jiff::tz::TimeZone {
    let timezone_name = settings
        .timezone
        .as_ref()
        .map_or("UTC".to_string(), |t| t.value.clone());
    // UTC (the default) needs no look into the time-zone database, which
    // costs every command a walk of its directories.
    let timezone = match timezone_name.as_str() {
        "UTC" | "Etc/UTC" => Ok(jiff::tz::TimeZone::UTC),
        name => jiff::tz::TimeZone::get(name),
    };
    timezone.unwrap_or_else(|e| {
            if let Some(t) = &settings.timezone {
                diags.at(file, t.referenced, format!("timezone \"{}\" is not known: {e}; use an IANA name such as UTC or Europe/Berlin", t.value));
            }
            jiff::tz::TimeZone::UTC
        })
}

/// `replica:`, this daemon's name among the replicas (the host name,
/// lowercased, when unset).
fn replica(settings: &raw::Settings, file: &Path, diags: &mut Diagnostics) -> String {
    match &settings.replica {
        Some(r) if !safe_name(&r.value) => {
            diags.at(
                file,
                r.referenced,
                format!("replica \"{}\" must be a lowercase name of letters, digits, '-' or '_' (it labels runs and leases)", r.value),
            );
            String::new()
        }
        Some(r) => r.value.clone(),
        None => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| {
                h.to_lowercase()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .take(64)
                    .collect()
            })
            .unwrap_or_else(|| "localhost".into()),
    }
}

/// `principals_file`, or its older name `approvers_file`: one of the two.
fn principals_file<'a>(
    settings: &'a super::raw::Settings,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<&'a str> {
    match (&settings.principals_file, &settings.approvers_file) {
        (Some(p), Some(a)) => {
            diags.at(
                file,
                a.referenced,
                format!(
                    "approvers_file is the older name of principals_file, which is set too (line {}): keep principals_file alone",
                    p.referenced.line()
                ),
            );
            None
        }
        (Some(f), None) | (None, Some(f)) => Some(f.value.as_str()),
        (None, None) => None,
    }
}

//! `silence:` in a runbook: the Alertmanager silence a run holds for its
//! host's matching alerts while it changes the host (the `silence` module
//! creates and expires it). Checked here: the URL, the matchers, and how
//! long a silence may live.

use std::path::Path;
use std::time::Duration;

use super::super::diag::Diagnostics;
use super::super::matchers::Matcher;
use super::super::{duration, raw};

/// `silence:`, validated.
#[derive(Debug, Clone)]
pub(crate) struct Silence {
    /// Alertmanager's base URL (its API is under `/api/v2`).
    pub(crate) alertmanager: reqwest::Url,
    /// Which of the host's alerts it covers (none: all of them).
    pub(crate) matchers: Vec<Matcher>,
    /// The label that names the host (`HOST` or `HOST:PORT`).
    pub(crate) host_label: String,
    /// The longest it lives: it ends by itself then, even if nothing
    /// expires it.
    pub(crate) longest: Duration,
}

/// The longest a silence may be asked for: a change that takes longer is
/// a person's maintenance window, not a run's.
const LONGEST: Duration = Duration::from_secs(24 * 3600);

pub(super) fn validate(
    raw: &raw::Runbook,
    file: &Path,
    diags: &mut Diagnostics,
) -> Option<Silence> {
    let spanned = raw.silence.as_ref()?;
    let s = &spanned.value;
    let before = diags.len();
    let url = s.alertmanager.value.trim_end_matches('/');
    let alertmanager = match reqwest::Url::parse(url) {
        Ok(u)
            if !u.username().is_empty()
                || u.password().is_some()
                || u.query().is_some()
                || u.fragment().is_some() =>
        {
            diags.at(
                file,
                s.alertmanager.referenced,
                "silence.alertmanager must not carry credentials (no user, password or query string): the URL is written in the audit log; put Alertmanager behind a proxy on loopback that adds them",
            );
            None
        }
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Some(u),
        Ok(_) => {
            diags.at(
                file,
                s.alertmanager.referenced,
                format!("silence.alertmanager \"{url}\" must be an http:// or https:// URL, e.g. http://127.0.0.1:9093"),
            );
            None
        }
        Err(e) => {
            diags.at(
                file,
                s.alertmanager.referenced,
                format!("silence.alertmanager \"{url}\" is not a URL: {e}"),
            );
            None
        }
    };
    let mut matchers = Vec::new();
    for m in &s.matchers {
        match Matcher::parse(&m.value) {
            Ok(m) => matchers.push(m),
            Err(e) => diags.at(file, m.referenced, format!("silence.matchers: {e}")),
        }
    }
    let host_label = match (&s.host_label, &raw.on_alert) {
        (Some(l), _) => l.value.clone(),
        (None, Some(on)) => on.host_label.value.clone(),
        (None, None) => "instance".to_string(),
    };
    if let Some(l) = &s.host_label
        && (l.value.is_empty()
            || !l
                .value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        diags.at(
            file,
            l.referenced,
            format!("silence.host_label \"{}\" is not a label name", l.value),
        );
    }
    let longest = duration(&s.longest, "silence.for", file, diags);
    if let Some(d) = longest
        && (d < Duration::from_secs(60) || d > LONGEST)
    {
        diags.at(
            file,
            s.longest.referenced,
            "silence.for must be between 1m and 24h: the silence ends by itself then, however the run ended",
        );
    }
    if diags.len() != before {
        return None;
    }
    Some(Silence {
        alertmanager: alertmanager?,
        matchers,
        host_label,
        longest: longest?,
    })
}

//! Where log lines go, and in what form.
//!
//! Under systemd, stderr is a stream into journald (`JOURNAL_STREAM` names
//! it). There every event is sent to the journal natively, with its
//! priority (`journalctl -p warning -u runwarden` then shows warnings and
//! errors) and its fields (`RUN_ID=...`), and without a timestamp of our
//! own (journald keeps one). Elsewhere lines are plain text (coloured on a
//! terminal) or, with `--log-format json`, one JSON object each. The few
//! lines printed outside `tracing` (the daemon's "listening on" line, a
//! command's last error) get a syslog priority prefix under journald too.

use std::sync::OnceLock;

/// Whether stderr is the journal stream systemd gave this process: the
/// `dev:inode` in `JOURNAL_STREAM` is stderr's own (a child that inherited
/// the variable but not the stream does not count).
pub(crate) fn under_journald() -> bool {
    static UNDER: OnceLock<bool> = OnceLock::new();
    *UNDER.get_or_init(|| {
        let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
            return false;
        };
        let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
            return false;
        };
        let Ok(st) = nix::sys::stat::fstat(std::io::stderr()) else {
            return false;
        };
        dev.parse() == Ok(st.st_dev) && ino.parse() == Ok(st.st_ino)
    })
}

/// A syslog priority, for a line printed outside `tracing`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Priority {
    /// 3: something failed.
    Err = 3,
    /// 6: what happened.
    Info = 6,
}

/// The prefix journald reads as the line's priority (`<3>`); empty when
/// not under journald.
pub(crate) fn prefix(p: Priority) -> String {
    if under_journald() {
        format!("<{}>", p as u8)
    } else {
        String::new()
    }
}

/// Send `tracing` events where they belong (see the module doc): natively
/// to the journal under journald (unless `json` was asked for), else to
/// stderr as text or JSON.
pub fn init(filter: tracing_subscriber::EnvFilter, json: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    if under_journald() && !json {
        match tracing_journald::layer() {
            Ok(layer) => {
                use tracing_journald::{Priority, PriorityMappings};
                // INFO is what happened (6), not a notice (5); fields keep
                // their own names (RUNBOOK=..., RUN_ID=...).
                let layer = layer
                    .with_syslog_identifier("runwarden".into())
                    .with_field_prefix(None)
                    .with_priority_mappings(PriorityMappings {
                        info: Priority::Informational,
                        debug: Priority::Debug,
                        ..PriorityMappings::new()
                    });
                tracing_subscriber::registry()
                    .with(filter)
                    .with(layer)
                    .init();
                return;
            }
            Err(e) => eprintln!(
                "<4>runwarden: the journal's socket cannot be reached ({e}); logging as text"
            ),
        }
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Log files get plain text, a terminal gets colour.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match (json, under_journald()) {
        (true, _) => logs.json().init(),
        // Never reached unless the journal's socket failed: no second timestamp.
        (false, true) => logs.without_time().init(),
        (false, false) => logs.init(),
    }
}

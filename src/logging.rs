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

/// journald's socket for native messages.
pub(crate) const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Whether this machine has a system journal to send to.
pub(crate) fn journal_socket_exists() -> bool {
    std::path::Path::new(JOURNAL_SOCKET).exists()
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
        .with_writer(|| OneLine(std::io::stderr()))
        // Log files get plain text, a terminal gets colour.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match (json, under_journald()) {
        (true, _) => logs.json().init(),
        // Never reached unless the journal's socket failed: no second timestamp.
        (false, true) => logs.without_time().init(),
        (false, false) => logs.init(),
    }
}

/// A writer of whole log lines: a newline inside one (a value a message
/// quotes) is written as `\n`, so every event stays one line, and one
/// record for journald reading a stream (a quoted `\n<0>` never becomes a
/// priority-0 record of its own).
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !body.iter().any(|&b| b == b'\n' || b == b'\r') {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b => out.push(b),
            }
        }
        if body.len() < buf.len() {
            out.push(b'\n');
        }
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    /// A log line that quotes a newline (and a priority prefix after it)
    /// stays one line.
    #[test]
    fn a_quoted_newline_never_starts_a_log_line() {
        let mut out = super::OneLine(Vec::new());
        out.write_all(b"WARN lock held by run x\n<0>EMERGENCY\r\n")
            .unwrap();
        out.write_all(b"INFO plain\n").unwrap();
        let text = String::from_utf8(out.0).unwrap();
        assert_eq!(
            text,
            "WARN lock held by run x\\n<0>EMERGENCY\\r\nINFO plain\n"
        );
        assert_eq!(text.lines().count(), 2);
    }
}

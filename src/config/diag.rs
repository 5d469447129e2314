//! Configuration problems, reported as `FILE:LINE:COLUMN: message`.
//!
//! The loader collects every problem it finds instead of stopping at the
//! first, so one `runwarden check` shows the whole list: every unknown key
//! of a file too, each with a did-you-mean ([`unknown_fields`]).

use std::fmt;
use std::path::{Path, PathBuf};

use serde_saphyr::Location;

/// One problem in one file. Line and column are 1-based; 0 means "the whole file".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file.
    pub file: PathBuf,
    /// The line (1-based; 0: the whole file).
    pub line: u32,
    /// The column (1-based).
    pub(crate) column: u32,
    /// What is wrong, and what to write instead.
    pub(crate) message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = self.line.max(1);
        let column = self.column.max(1);
        write!(
            f,
            "{}:{line}:{column}: {}",
            self.file.display(),
            self.message
        )
    }
}

/// All the problems found in one load; empty means the config is valid.
#[derive(Debug, Default)]
pub(crate) struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub(crate) fn at(&mut self, file: &Path, loc: Location, message: impl Into<String>) {
        self.items.push(Diagnostic {
            file: file.to_path_buf(),
            line: loc.line() as u32,
            column: loc.column() as u32,
            message: message.into(),
        });
    }

    pub(crate) fn file(&mut self, file: &Path, message: impl Into<String>) {
        self.items.push(Diagnostic {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message: message.into(),
        });
    }

    pub(crate) fn push(&mut self, d: Diagnostic) {
        self.items.push(d);
    }

    pub(crate) fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub(crate) fn into_vec(mut self) -> Vec<Diagnostic> {
        self.items
            .sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        self.items
    }
}

/// The error of a failed load: every problem, in file and line order.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError(pub Vec<Diagnostic>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

pub(crate) use crate::text::did_you_mean;

/// Every unknown key of the file at once, each with a did-you-mean: the
/// keys of the mapping serde stopped in, then, with those lines (and what
/// they hold) blanked out, the next mapping's, and so on. A key inside a
/// flow mapping (`{ a: 1, b: 2 }`) cannot be blanked alone: it is reported
/// as serde named it, and the search stops there.
pub(super) fn unknown_fields<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
    mut msg: String,
    mut loc: serde_saphyr::Location,
    diags: &mut Diagnostics,
) {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for _ in 0..32 {
        let Some((reported, expected)) = unknown_field_expected(&msg) else {
            return;
        };
        let (line, column) = (loc.line() as usize, loc.column() as usize);
        let keys = unknown_keys(&lines, line, column, &expected);
        let report = |n: usize, col: usize, key: &str, diags: &mut Diagnostics| {
            diags.push(Diagnostic {
                file: file.to_path_buf(),
                line: n as u32,
                column: col as u32,
                message: format!(
                    "unknown field `{key}`{}; expected one of {}",
                    did_you_mean(key, expected.iter().map(String::as_str)),
                    expected.join(", ")
                ),
            });
        };
        if keys.is_empty() {
            report(line, column, &reported, diags);
            return;
        }
        for (n, col, key) in &keys {
            report(*n, *col, key, diags);
            // The key's line and the lines indented under it.
            let indent = col - 1;
            lines[n - 1].clear();
            for l in lines.iter_mut().skip(*n) {
                let t = l.trim_start();
                if !t.is_empty() && l.len() - t.len() <= indent {
                    break;
                }
                l.clear();
            }
        }
        let next = match serde_saphyr::from_str::<T>(&lines.join("\n")) {
            Ok(_) => return,
            Err(e) => e,
        };
        loc = next.location().unwrap_or(serde_saphyr::Location::UNKNOWN);
        msg = super::read::strip_location(&next.without_snippet().to_string());
    }
}

/// The unknown field and the fields a struct takes, from serde's
/// "unknown field `x`, expected one of a, b".
pub(super) fn unknown_field_expected(msg: &str) -> Option<(String, Vec<String>)> {
    let (key, list) = msg
        .strip_prefix("unknown field `")?
        .split_once("`, expected one of ")?;
    Some((
        key.to_string(),
        list.split(", ")
            .map(|f| f.trim_matches('`').to_string())
            .collect(),
    ))
}

/// The keys of the mapping around line `line` (1-based; its keys start at
/// `column`) that are not `expected`: (line, column, key) of each. The
/// mapping is the run of lines indented at least as far, with its keys at
/// exactly that indentation.
fn unknown_keys(
    lines: &[String],
    line: usize,
    column: usize,
    expected: &[String],
) -> Vec<(usize, usize, String)> {
    let indent = column.saturating_sub(1);
    let inside = |l: &str| {
        let t = l.trim_start();
        t.is_empty() || t.starts_with('#') || l.len() - t.len() >= indent
    };
    let at = line.saturating_sub(1).min(lines.len().saturating_sub(1));
    let mut first = at;
    while first > 0 && inside(&lines[first - 1]) {
        first -= 1;
    }
    let mut last = at;
    while last + 1 < lines.len() && inside(&lines[last + 1]) {
        last += 1;
    }
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate().take(last + 1).skip(first) {
        let t = l.trim_start();
        if l.len() - t.len() != indent || t.starts_with('#') || t.starts_with('-') {
            continue;
        }
        if let Some((key, _)) = t.split_once(':') {
            let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
            if !key.is_empty() && !expected.iter().any(|e| e == key) {
                found.push((i + 1, indent + 1, key.to_string()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let known = ["restart_service", "reload_service", "disk_usage"];
        assert_eq!(
            did_you_mean("restart_svc", known),
            " (did you mean \"restart_service\"?)"
        );
        assert_eq!(did_you_mean("format_disk_now", known), "");
    }
}

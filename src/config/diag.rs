//! Configuration problems, reported as `FILE:LINE:COLUMN: message`.
//!
//! The loader collects every problem it finds instead of stopping at the
//! first, so one `runwarden check` shows the whole list.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_saphyr::Location;

/// One problem in one file. Line and column are 1-based; 0 means "the whole file".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: u32,
    pub column: u32,
    pub message: String,
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
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn at(&mut self, file: &Path, loc: Location, message: impl Into<String>) {
        self.items.push(Diagnostic {
            file: file.to_path_buf(),
            line: loc.line() as u32,
            column: loc.column() as u32,
            message: message.into(),
        });
    }

    pub fn file(&mut self, file: &Path, message: impl Into<String>) {
        self.items.push(Diagnostic {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message: message.into(),
        });
    }

    pub fn push(&mut self, d: Diagnostic) {
        self.items.push(d);
    }

    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn into_vec(mut self) -> Vec<Diagnostic> {
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

/// Suggest the closest known name for a misspelt one ("did you mean ...").
pub fn did_you_mean<'a>(wrong: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    let best = known
        .into_iter()
        .map(|k| (edit_distance(wrong, k), k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 3))
        .min();
    match best {
        Some((_, k)) => format!(" (did you mean \"{k}\"?)"),
        None => String::new(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(cur)
            };
            prev = cur;
        }
    }
    row[b.len()]
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

//! Reading the configuration's files: bounded in size, opened without
//! following a FIFO or a device, parsed on every core with each problem's
//! file, line and column, a duplicate key named as such.

use std::path::{Path, PathBuf};

use super::diag::Diagnostics;
use super::diag::{self, Diagnostic};
use super::{MAX_FILE_BYTES, sha256_hex};

/// A file's parse: the raw value and its version (sha256), and the text when
/// parsing failed (for a second, lenient look at it).
pub(super) type Parsed<T> = (PathBuf, Option<(T, String)>, Option<String>);

/// Read and parse files on every core (large estates have hundreds), keeping
/// the files' order and all their problems.
pub(super) fn parse_files<T: serde::de::DeserializeOwned + Send>(
    root: &Path,
    files: &[PathBuf],
    diags: &mut Diagnostics,
) -> Vec<Parsed<T>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let chunk = files.len().div_ceil(workers).max(16);
    let parts: Vec<(Vec<Parsed<T>>, Diagnostics)> = std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut d = Diagnostics::default();
                    let out = part
                        .iter()
                        .map(|file| match read_file(file, root, &mut d, false) {
                            None => (file.clone(), None, None),
                            Some((text, version)) => match parse::<T>(file, &text, &mut d) {
                                Some(raw) => (file.clone(), Some((raw, version)), None),
                                None => (file.clone(), None, Some(text)),
                            },
                        })
                        .collect();
                    (out, d)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all = Vec::with_capacity(files.len());
    for (out, d) in parts {
        diags.extend(d);
        all.extend(out);
    }
    all
}

pub(super) fn yaml_files(dir: &Path, diags: &mut Diagnostics) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            diags.file(dir, format!("cannot list directory: {e}"));
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    files
}

/// Read a config file: bounded size, UTF-8, and its sha256 (the version
/// recorded in the audit log). A symlink is followed only to a file inside
/// `root` (the configuration directory): a host file that links to
/// /etc/shadow must not be read, since errors quote what they could not parse.
pub(super) fn read_file(
    file: &Path,
    root: &Path,
    diags: &mut Diagnostics,
    optional: bool,
) -> Option<(String, String)> {
    use std::io::Read;
    // What is opened: the file itself, or the target of a symlink that
    // stays inside the configuration directory (opened by its real path,
    // with no link followed on the way).
    let target = match std::fs::symlink_metadata(file) {
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            diags.file(file, format!("cannot read: {e}"));
            return None;
        }
        Ok(m) if m.file_type().is_symlink() => {
            let target = std::fs::canonicalize(file);
            let inside = std::fs::canonicalize(root)
                .ok()
                .zip(target.as_ref().ok())
                .is_some_and(|(r, t)| t.starts_with(r));
            match target {
                Ok(t) if inside => t,
                target => {
                    let to = target.map_or_else(|e| e.to_string(), |t| t.display().to_string());
                    diags.file(
                        file,
                        format!(
                            "is a symlink to {to}, outside the configuration directory {}; refused (copy the file in, or link to one inside)",
                            root.display()
                        ),
                    );
                    return None;
                }
            }
        }
        Ok(_) => file.to_path_buf(),
    };
    let mut f = match crate::files::open_regular(&target, false) {
        Ok(f) => f,
        Err(e @ crate::files::OpenError::NotRegular(_)) => {
            diags.file(file, format!("{e}; refused (config files are YAML files)"));
            return None;
        }
        Err(e) => {
            diags.file(file, format!("cannot read: {e}"));
            return None;
        }
    };
    match f.metadata() {
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            diags.file(
                file,
                format!(
                    "file is {} bytes; config files are limited to {MAX_FILE_BYTES} bytes",
                    m.len()
                ),
            );
            return None;
        }
        Ok(_) => {}
        Err(e) => {
            diags.file(file, format!("cannot read: {e}"));
            return None;
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = (&mut f).take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        diags.file(file, format!("cannot read: {e}"));
        return None;
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        diags.file(
            file,
            format!("file grew past {MAX_FILE_BYTES} bytes while being read"),
        );
        return None;
    }
    let version = sha256_hex(&bytes);
    match String::from_utf8(bytes) {
        Ok(text) => Some((text, version)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(&e.into_bytes()[..at]).into_owned();
            let line = text.matches('\n').count() as u32 + 1;
            let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
            diags.push(Diagnostic {
                file: file.to_path_buf(),
                line,
                column,
                message: "file is not valid UTF-8".into(),
            });
            None
        }
    }
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
    diags: &mut Diagnostics,
) -> Option<T> {
    match serde_saphyr::from_str::<T>(text) {
        Ok(v) => Some(v),
        Err(e) => {
            let loc = e.location().unwrap_or(serde_saphyr::Location::UNKNOWN);
            let msg = e.without_snippet().to_string();
            let msg = if msg.contains("budget breached") {
                format!(
                    "the document is too large once its aliases are expanded ({}); refused (a YAML alias bomb?)",
                    strip_location(&msg)
                        .trim_start_matches("budget breached: ")
                        .to_lowercase()
                )
            } else {
                strip_location(&msg)
            };
            let line = loc.line() as usize;
            if diag::unknown_field_expected(&msg).is_some() {
                diag::unknown_fields::<T>(file, text, msg, loc, diags);
                return None;
            }
            if msg.starts_with("duplicate mapping key") {
                diags.at(file, loc, duplicate_key(text, &msg, loc));
                return None;
            }
            let msg = if msg.contains("tabs disallowed") {
                format!(
                    "{msg}: YAML indents with spaces only; replace the tab at the start of line {line} with spaces"
                )
            } else if msg.contains("did not find expected key")
                || msg.contains("mapping values are not allowed")
            {
                format!(
                    "{msg}: check this line's indentation against the lines above it (YAML nests by the number of spaces)"
                )
            } else if msg.contains("cannot start with '-'") {
                format!(
                    "{msg}: quote it (\"-\"), as a list element that is a lone dash, e.g. socat's stdin, must be in YAML's flow [ ] lists"
                )
            } else {
                msg
            };
            diags.at(file, loc, msg);
            None
        }
    }
}

/// `duplicate key K (first at line N)`: the key a mapping holds twice,
/// from the YAML crate's own message, and the earlier line where the same
/// key starts at the same column.
fn duplicate_key(text: &str, msg: &str, loc: serde_saphyr::Location) -> String {
    let key = msg
        .strip_prefix("duplicate mapping key: ")
        .and_then(|k| k.split(", set ").next())
        .map(str::trim)
        .unwrap_or("");
    if key.is_empty() {
        return "duplicate key: this mapping holds a key twice; keep one".into();
    }
    let (line, column) = (loc.line() as usize, loc.column() as usize);
    let first = text
        .lines()
        .take(line.saturating_sub(1))
        .enumerate()
        .find_map(|(i, l)| {
            let t = l.trim_start();
            let at = l.len() - t.len() + 1;
            let k = t
                .split_once(':')?
                .0
                .trim()
                .trim_matches(|c| c == '"' || c == '\'');
            (at == column && k == key).then_some(i + 1)
        });
    match first {
        Some(n) => format!("duplicate key {key} (first at line {n}); keep one"),
        None => format!("duplicate key {key}; keep one"),
    }
}

/// serde-saphyr may prefix its message with its own "line N column M"; we print our own.
pub(super) fn strip_location(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or(msg).trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.find(" at line ") {
        Some(i) => first[..i].to_string(),
        None => first.to_string(),
    }
}

//! The gate's guarantee, as compile errors: a permit cannot be forged, a
//! call cannot be dispatched without its intent line nor twice on one, and
//! neither an action, a held call nor an audit line can be built by hand;
//! nothing outside the crate reaches the code that spawns a tool.
//!
//! Each `tests/compile-fail/NAME.rs` must fail to compile with exactly the
//! errors its `NAME.stderr` shows (each `error[CODE]: message` at its
//! `--> file:line:column`). The cases are checked by `rustc` against the
//! crate and dependencies this very `cargo test` built (cargo lists them),
//! so they cost a second or two, not a second build of every dependency.
//! After a deliberate change, `COMPILE_FAIL=overwrite cargo test --test
//! compile_fail` writes the new `.stderr` files.

// A test stops loudly where its setup fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The crates the cases name, by the name they are named by.
const EXTERNS: [&str; 3] = ["runwarden", "tokio", "serde_json"];

/// The `--extern` paths of this build: `cargo test --no-run` with this
/// test's own features and profile has nothing to build and lists them.
fn externs(root: &Path) -> (BTreeMap<String, PathBuf>, PathBuf) {
    let mut cargo = Command::new(env!("CARGO"));
    // What cargo set for this test would make the listing a different build.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key == "CARGO"
            || key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR"
        {
            cargo.env_remove(key);
        }
    }
    let mut features = Vec::new();
    if cfg!(feature = "estate") {
        features.push("estate");
    }
    if cfg!(feature = "internals") {
        features.push("internals");
    }
    let exe = std::env::current_exe().unwrap();
    let release = exe
        .parent()
        .and_then(Path::parent)
        .is_some_and(|p| p.ends_with("release"));
    cargo
        .current_dir(root)
        .args([
            "test",
            "--no-run",
            "--message-format=json",
            "--test",
            "compile_fail",
        ])
        .args(["--features", &features.join(",")]);
    if release {
        cargo.arg("--release");
    }
    let out = cargo.output().unwrap();
    assert!(
        out.status.success(),
        "cargo test --no-run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let msg: serde_json::Value = serde_json::from_str(line).unwrap();
        let name = msg["target"]["name"]
            .as_str()
            .unwrap_or_default()
            .replace('-', "_");
        let lib = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "lib"));
        if msg["reason"] != "compiler-artifact" || !lib || !EXTERNS.contains(&name.as_str()) {
            continue;
        }
        let rlib = msg["filenames"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f.as_str())
            .find(|f| f.ends_with(".rlib"));
        if let Some(rlib) = rlib {
            found.insert(name, PathBuf::from(rlib));
        }
    }
    assert_eq!(found.len(), EXTERNS.len(), "cargo listed {found:?}");
    let deps = found["runwarden"].parent().unwrap().to_path_buf();
    (found, deps)
}

/// Each error a diagnostic text shows: `error[CODE]: message @ file:line:column`.
fn errors(rendered: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = rendered.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("error[") {
            let at = lines
                .peek()
                .and_then(|l| l.trim_start().strip_prefix("--> "))
                .unwrap_or("?");
            out.push(format!("{line} @ {at}"));
        }
    }
    out
}

#[test]
fn bypassing_the_gate_does_not_compile() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (externs, deps) = externs(root);
    let rustc = Path::new(env!("CARGO")).with_file_name("rustc");
    let out_dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root.join("tests/compile-fail"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 10, "the cases are there: {cases:?}");
    let overwrite = std::env::var("COMPILE_FAIL").is_ok_and(|v| v == "overwrite");
    let failures: Vec<String> = std::thread::scope(|s| {
        let checks: Vec<_> = cases
            .iter()
            .map(|case| {
                s.spawn(|| {
                    let name = case.file_stem().unwrap().to_string_lossy().into_owned();
                    let mut rustc = Command::new(&rustc);
                    rustc
                        .current_dir(root)
                        .args([
                            "--edition",
                            "2024",
                            "--crate-type",
                            "bin",
                            "--emit=metadata",
                        ])
                        .args(["--color", "never", "--crate-name", &name])
                        .arg("--out-dir")
                        .arg(out_dir.path())
                        .arg("-L")
                        .arg(format!("dependency={}", deps.display()));
                    for (crate_name, rlib) in &externs {
                        rustc
                            .arg("--extern")
                            .arg(format!("{crate_name}={}", rlib.display()));
                    }
                    let out = rustc
                        .arg(case.strip_prefix(root).unwrap())
                        .output()
                        .unwrap();
                    let got = String::from_utf8_lossy(&out.stderr).into_owned();
                    let expected_file = case.with_extension("stderr");
                    if overwrite {
                        std::fs::write(&expected_file, &got).unwrap();
                    }
                    let expected = std::fs::read_to_string(&expected_file).unwrap_or_default();
                    if out.status.success() {
                        Some(format!("{name}: compiled, and must not"))
                    } else if errors(&got) != errors(&expected) || errors(&got).is_empty() {
                        Some(format!(
                            "{name}: expected {:#?}\ngot {:#?}\n{got}",
                            errors(&expected),
                            errors(&got)
                        ))
                    } else {
                        None
                    }
                })
            })
            .collect();
        checks
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

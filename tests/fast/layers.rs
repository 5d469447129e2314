//! The crate's top-level modules form layers: no two of them import each
//! other, directly or through others. A module is a file or folder directly
//! under `src/` (not `lib.rs` or `main.rs`); `A` imports `B` when `A`'s code
//! outside its tests names a `crate::B` path, doc links included (a doc link
//! upward is a dependency a reader follows).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every top-level module and the modules its non-test code names.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            rust_files(&path, files.entry(name).or_default());
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            files.entry(name).or_default().push(path);
        }
    }
    let path = regex::Regex::new(r"crate::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))").unwrap();
    let mut edges = BTreeMap::new();
    for (module, paths) in &files {
        let mut to = BTreeSet::new();
        for file in paths {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
            for c in path.captures_iter(code) {
                let heads: Vec<&str> = match (c.get(1), c.get(2)) {
                    (Some(group), _) => group.as_str().split(',').collect(),
                    (None, Some(one)) => vec![one.as_str()],
                    _ => continue,
                };
                for head in heads {
                    let head = head.trim().split("::").next().unwrap_or_default().trim();
                    if head != module && files.contains_key(head) {
                        to.insert(head.to_string());
                    }
                }
            }
        }
        edges.insert(module.clone(), to);
    }
    edges
}

/// The modules `from` reaches by following imports.
fn reach(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(m) = todo.pop() {
        for next in &edges[&m] {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}

#[test]
fn no_two_modules_import_each_other_directly_or_through_others() {
    let edges = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(edges.len() > 20, "the walk found the modules: {edges:?}");
    assert!(
        edges["run"].contains("gate"),
        "and their imports: {edges:?}"
    );
    let cycles: Vec<String> = edges
        .keys()
        .filter(|m| reach(&edges, m).contains(*m))
        .map(|m| {
            let back: Vec<&String> = edges[m]
                .iter()
                .filter(|n| reach(&edges, n).contains(m))
                .collect();
            format!("{m} -> {back:?} -> ... -> {m}")
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

//! The crate's top-level modules form layers, and the order is written
//! once: docs/code.md's Layers section holds it (a numbered list of layers, highest
//! first), and this test holds the code to it. A module is a file or folder
//! directly under `src/` (not `lib.rs` or `main.rs`); `A` imports `B` when
//! `A`'s code outside its `#[cfg(test)]` items names a `crate::B` path, doc
//! links included (a doc link upward is a dependency a reader follows). An
//! import may only go down, to a lower layer: so no two modules import each
//! other, and a reader can read the crate bottom-up without meeting a name
//! from above.

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

/// `text` without its `#[cfg(test)]` items: a `mod tests { .. }`, a
/// function, an impl, or a one-line `use`/`mod x;`. The rest of the file
/// still counts.
fn without_tests(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let brace = item.find('{');
        let semi = item.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (None, Some(s)) => s + 1,
            (Some(b), _) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (i, c) in item[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
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
            let code = without_tests(&std::fs::read_to_string(file).unwrap());
            for c in path.captures_iter(&code) {
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

/// docs/code.md's layers: module -> its layer's number (1 is the lowest).
/// The block is the fenced one after `## Layers`, a line per layer:
/// `NUMBER  module, module  what they are`.
fn layers(readme: &str) -> BTreeMap<String, u32> {
    let section = readme
        .split("\n## Layers\n")
        .nth(1)
        .expect("docs/code.md has a `## Layers` section");
    let block = section
        .split("```")
        .nth(1)
        .expect("a fenced block in the Layers section");
    let line = regex::Regex::new(r"^\s*(\d+)\s+([a-z_]+(?:, [a-z_]+)*)(?:\s{2,}.*)?$").unwrap();
    let mut out = BTreeMap::new();
    for l in block.lines().filter(|l| !l.trim().is_empty()) {
        let c = line
            .captures(l)
            .unwrap_or_else(|| panic!("a Layers line reads `N  module, module  what`: {l:?}"));
        let n: u32 = c[1].parse().unwrap();
        for m in c[2].split(", ") {
            assert!(
                out.insert(m.to_string(), n).is_none(),
                "{m} is in two layers of docs/code.md"
            );
        }
    }
    out
}

#[test]
fn without_tests_skips_test_items_and_keeps_the_rest_of_the_file() {
    let text = "use crate::a;\n#[cfg(test)]\nuse crate::b;\n#[cfg(test)]\nfn t() { if x { crate::c } }\nfn f() { crate::d }\n#[cfg(test)]\nmod tests { mod inner { crate::e } }\nconst G: () = crate::g;\n";
    let kept = without_tests(text);
    for gone in ["crate::b", "crate::c", "crate::e"] {
        assert!(!kept.contains(gone), "{gone} is test code: {kept}");
    }
    for stays in ["crate::a", "crate::d", "crate::g"] {
        assert!(kept.contains(stays), "{stays} is not: {kept}");
    }
}

#[test]
fn every_import_goes_down_the_layers_the_code_page_draws() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let edges = imports(&root.join("src"));
    assert!(edges.len() > 20, "the walk found the modules: {edges:?}");
    assert!(
        edges["run"].contains("gate"),
        "and their imports: {edges:?}"
    );
    let layer = layers(&std::fs::read_to_string(root.join("docs/code.md")).unwrap());
    let modules: BTreeSet<&String> = edges.keys().collect();
    let drawn: BTreeSet<&String> = layer.keys().collect();
    assert_eq!(
        modules, drawn,
        "every module of src/ is in exactly one of docs/code.md's layers"
    );
    let upward: Vec<String> = edges
        .iter()
        .flat_map(|(m, to)| to.iter().map(move |t| (m, t)))
        .filter(|(m, t)| layer[*t] >= layer[*m])
        .map(|(m, t)| format!("{m} (layer {}) imports {t} (layer {})", layer[m], layer[t]))
        .collect();
    assert!(
        upward.is_empty(),
        "imports that do not go down (move the type to the lower module, or hand the lower one a closure or a channel):\n{}",
        upward.join("\n")
    );
}

/// A file of more than [`LONG`] lines of code (tests aside) is split along
/// its concepts, or its module doc says why it is one (`//! One file: ...`),
/// so its length is a decision someone made and the next reader can weigh.
#[test]
fn a_long_file_says_why_it_is_one() {
    const LONG: usize = 550;
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut unexplained = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_tests(&text).lines().count();
        let says = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .any(|l| l.starts_with("//! One file: "));
        if code > LONG && !says {
            unexplained.push(format!("{} ({code} lines)", file.display()));
        }
    }
    assert!(
        unexplained.is_empty(),
        "split these along their concepts, or say in the module doc why each is one (`//! One file: ...`): {unexplained:#?}"
    );
}

//! Constants the binary compiles when it first uses them: the patterns that
//! read a model's account, the pattern a declared tool's string value must
//! match, the JSON schemas of the built-in tools.
//!
//! Such a constant is written in the source but turned into a value at run
//! time, by a crate whose features the build chose: a pattern that compiles
//! in the test build can fail in the release build when a feature differs
//! (`(?i)` needs `regex`'s `unicode-case`). A failure found there, in the
//! middle of a run, used to be a panic. So each constant is compiled through
//! here into a `Result` that names it, its owner answers a run that meets a
//! broken one with an error (never a panic), and `check` and `serve`
//! compile them all before anything else (`app::compile_constants`), so a
//! binary that carries a broken one refuses to start, naming it.
//!
//! A leaf: `claims` and `tools` compile through it, `app` asks for all.

use regex::Regex;

/// A constant of the binary that does not compile in this build.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "this runwarden binary carries a constant that does not compile: {name}: {why} (a build problem, not a configuration one: rebuild with the crate's Cargo.toml and Cargo.lock as shipped, `cargo build --release --locked`)"
)]
pub struct CompileError {
    /// Where it is written, as `module::NAME`.
    pub name: String,
    /// What the compiler said.
    pub why: String,
}

/// Compile the pattern `name` holds.
pub(crate) fn regex(name: &str, pattern: &str) -> Result<Regex, CompileError> {
    Regex::new(pattern).map_err(|e| CompileError {
        name: name.to_string(),
        why: e.to_string().replace('\n', " "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_that_does_not_compile_is_named_never_a_panic() {
        let e = regex("claims::BROKEN", "(unclosed").unwrap_err();
        assert_eq!(e.name, "claims::BROKEN");
        let said = e.to_string();
        assert!(
            said.contains("claims::BROKEN") && said.contains("--locked"),
            "{said}"
        );
    }

    /// The feature the release build once lacked: a case-insensitive,
    /// Unicode-aware class. The crate's own dependency line must turn it on,
    /// not a dev-dependency.
    #[test]
    fn case_insensitive_unicode_patterns_compile() {
        regex("t", r"(?i)\bstraße\b").unwrap();
        regex("t", r"\p{Greek}+").unwrap();
    }
}

//! Claims: what a model's words say, held to what the run's record holds.
//!
//! A model's final answer is its account, not evidence. A small model asked
//! to fix a full disk answered, without making a single call, that `/` was
//! "filling up with 90% usage" and that it had "Restarted the `sshd`
//! service"; printed as the run's report, on-call would have believed both.
//! So every sentence of an answer that says something checkable is held to
//! the run's own record, and marked `supported` or not, with why:
//!
//! - a **figure** (a number with `%` or a size unit) must appear in a tool
//!   result (within the rounding the sentence used; sizes in either base);
//! - a **name** (a systemd unit, an absolute path, a `backticked` word, the
//!   members of a list of processes, services or units) must be one a call
//!   returned or acted on;
//! - a **change** ("restarted", "rotated", ...) must match a tier-2 call of
//!   this run that succeeded and verified, on the name the sentence gives
//!   when it gives one. Negated or hedged sentences ("did not restart",
//!   "consider restarting") claim no change.
//!
//! A model's `SUGGEST:` lines are held to the names rule only (they claim
//! nothing happened). The rule is text, so it errs one way: a sentence it
//! cannot read claims nothing, and the verdict (see `run_loop`) turns only on
//! changes claimed and calls made, never on prose it could misread.
//!
//! A leaf: the run loop feeds it the record, step by step.

use std::sync::LazyLock;

use regex::Regex;

use crate::compiled::CompileError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One sentence of a model's account that says something checkable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The sentence, on one line (bounded).
    pub text: String,
    /// Whether every figure, name and change in it is in the record.
    pub supported: bool,
    /// What supports it, or what the record lacks.
    pub why: String,
    /// A `SUGGEST:` line of the model's (a command for a person, unverified).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suggestion: bool,
    /// It says a change was made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change: bool,
}

/// The run's record, as claims are held to it.
#[derive(Debug, Default)]
pub(crate) struct Evidence {
    /// Every string value a call returned or was given, lowercased.
    strings: Vec<String>,
    /// Every number in them.
    numbers: Vec<f64>,
    /// Every size in them, in bytes.
    sizes: Vec<f64>,
    /// Tier-2 calls that succeeded and verified: the tool and its arguments' strings.
    changes: Vec<(String, Vec<String>)>,
    /// What declared tools say they did (`verb:`), and the tool of each.
    verbs: Vec<(String, String)>,
    /// Successful calls of any tier.
    pub(crate) calls_ok: u32,
}

impl Evidence {
    /// A call's arguments or result: what it was given or returned.
    pub(crate) fn saw(&mut self, v: &Value) {
        match v {
            Value::String(s) => {
                // Without its patterns a figure is not read: `mark` says why.
                let found = patterns().map(|p| figures(p, s)).unwrap_or_default();
                for (n, unit) in found {
                    self.numbers.push(n);
                    if let Some(b) = unit.and_then(|u| bytes(n, u)) {
                        self.sizes.extend(b);
                    }
                }
                self.strings.push(s.to_lowercase());
            }
            Value::Number(n) => self.numbers.extend(n.as_f64()),
            Value::Array(a) => a.iter().for_each(|v| self.saw(v)),
            Value::Object(o) => {
                // A use a figure may state more precisely than the tool's
                // rounded percentage: its own ratio.
                if let (Some(used), Some(size)) = (
                    o.get("used_bytes").and_then(Value::as_f64),
                    o.get("size_bytes").and_then(Value::as_f64),
                ) && size > 0.0
                {
                    self.numbers.push(used / size * 100.0);
                }
                for (k, v) in o {
                    // A size field in bytes says so in its name.
                    if let Some(n) = v.as_f64()
                        && (k.contains("bytes") || k == "size")
                    {
                        self.sizes.push(n);
                    }
                    self.saw(v);
                }
            }
            _ => {}
        }
    }

    /// A tier-2 call of `tool` with `args` succeeded and verified.
    pub(crate) fn changed(&mut self, tool: &str, args: &Value) {
        let mut names = Evidence::default();
        names.saw(args);
        self.changes.push((tool.to_string(), names.strings));
    }

    /// A declared tool says it `verb` (e.g. `drained`): a sentence that
    /// says so claims a change of that tool.
    pub(crate) fn verb(&mut self, verb: &str, tool: &str) {
        self.verbs.push((verb.to_lowercase(), tool.to_string()));
    }

    fn has_name(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        self.strings.iter().any(|s| s.contains(&name))
    }

    fn has_path(&self, path: &str) -> bool {
        // The record is kept lowercased: so is the path it is held to.
        let path = path.trim_end_matches('/').to_lowercase();
        let path = path.as_str();
        self.strings.iter().any(|s| {
            let s = s.trim_end_matches('/');
            // The path itself, or one under it the run saw (a directory
            // that holds what was measured); never a name made up under a
            // directory the run looked at.
            s == path
                || s.starts_with(&format!("{path}/"))
                || s.contains(&format!(" {path}"))
                || (path.is_empty() && s.starts_with('/'))
        })
    }

    fn has_figure(&self, n: f64, decimals: usize, unit: Option<&str>) -> bool {
        let slack = 0.5 * 10f64.powi(-(decimals as i32)) + 1e-9;
        let near = |x: &f64| (x - n).abs() <= slack;
        if self.numbers.iter().any(near) {
            return true;
        }
        unit.and_then(|u| bytes(n, u)).is_some_and(|candidates| {
            candidates.iter().any(|b| {
                self.sizes
                    .iter()
                    .any(|s| (s - b).abs() <= 0.05 * b.max(1.0))
            })
        })
    }
}

/// What kind of change each past-tense verb claims, and the tool that makes
/// it (`None`: a change of any tool).
const VERBS: &[(&str, Option<&str>)] = &[
    ("restarted", Some("restart_service")),
    ("reloaded", Some("reload_service")),
    ("rotated", Some("rotate_logs")),
    ("renewed", Some("renew_certificate")),
    ("recycled", Some("recycle_worker_pool")),
    ("changed", None),
    ("fixed", None),
    ("applied", None),
    ("deleted", None),
    ("removed", None),
    ("cleared", None),
    ("cleaned", None),
    ("freed", None),
    ("killed", None),
    ("stopped", None),
    ("truncated", None),
    ("compressed", None),
];

/// Words that make a sentence's verb a hope, a plan or a denial, not a claim.
const HEDGES: &[&str] = &[
    "not",
    "no",
    "never",
    "n't",
    "without",
    "nothing",
    "would",
    "could",
    "should",
    "may",
    "might",
    "can",
    "consider",
    "recommend",
    "suggest",
    "if",
    "unless",
    "need",
    "needs",
    "will",
    "to be",
];

/// The patterns that read a model's account, compiled once, each named
/// for the error that reports it (see [`crate::compiled`]).
pub(crate) struct Patterns {
    /// A number and the unit written after it.
    figure: Regex,
    /// A systemd unit's name.
    unit_name: Regex,
    /// An absolute path.
    path: Regex,
    /// A `backticked` word.
    ticked: Regex,
    /// The members of a list of processes, services or units.
    listed: Regex,
    /// A word.
    word: Regex,
    /// What a verb of acting on something acts on: "restarting httpd or
    /// nginx", "reloaded the sshd service".
    acted: Regex,
}

impl Patterns {
    fn compile() -> Result<Patterns, CompileError> {
        use crate::compiled::regex;
        Ok(Patterns {
            figure: regex(
                "claims::FIGURE",
                r"(?i)(\d+(?:\.\d+)?)\s?(%|percent\b|[kmgtp]i?b\b|[kmgt]\b|bytes?\b)?",
            )?,
            unit_name: regex(
                "claims::UNIT_NAME",
                r"\b[A-Za-z0-9][\w@.:-]*\.(?:service|socket|timer|target|mount|path|slice|scope)\b",
            )?,
            path: regex(
                "claims::PATH",
                r#"(?:^|[\s(`'"])(/[\w.@+-]*(?:/[\w.@+-]+)*)"#,
            )?,
            ticked: regex("claims::TICKED", r"`([^`\s]{1,100})`")?,
            listed: regex(
                "claims::LISTED",
                r"(?i)\b(?:processes|services|units|daemons)\b(?:\s+(?:are|were|include|including|like))?\s*:?\s+((?:[\w@.-]+(?:\s*,\s*|\s+and\s+|\s+or\s+)){0,9}[\w@.-]+)",
            )?,
            word: regex("claims::WORD", r"[\w@.'-]+")?,
            acted: regex(
                "claims::ACTED",
                r"(?i)\b(?:restart|reload|stop|start|kill|recycl|rotat|renew|drain)\w*\s+(?:the\s+)?((?:[\w@.-]+(?:\s*,\s*|\s+and\s+|\s+or\s+)){0,5}[\w@.-]+)",
            )?,
        })
    }
}

/// This module's patterns, or the one that does not compile in this build.
/// `check` and `serve` ask first; a run that meets a broken one gets an
/// error for its account, never a panic.
pub(crate) fn patterns() -> Result<&'static Patterns, CompileError> {
    static COMPILED: LazyLock<Result<Patterns, CompileError>> = LazyLock::new(Patterns::compile);
    COMPILED.as_ref().map_err(Clone::clone)
}

/// Words that name no thing of a host, in a list of them.
const NOT_NAMES: &[&str] = &[
    "and",
    "or",
    "the",
    "a",
    "an",
    "it",
    "them",
    "this",
    "that",
    "service",
    "services",
    "unit",
    "units",
    "process",
    "processes",
    "daemon",
    "daemons",
    "server",
    "servers",
    "to",
    "if",
    "of",
    "on",
    "in",
    "all",
    "any",
    "logs",
    "log",
    "again",
    "now",
    "first",
    "later",
    "anything",
    "nothing",
    "everything",
    "something",
    "because",
    "which",
    "when",
    "its",
    "their",
    "my",
    "our",
    "your",
    "was",
    "were",
    "is",
    "be",
    "been",
    "with",
    "for",
    "after",
    "before",
    "so",
];

/// Numbers in `s` and the unit written after each.
fn figures<'s>(p: &Patterns, s: &'s str) -> Vec<(f64, Option<&'s str>)> {
    p.figure
        .captures_iter(s)
        .filter_map(|c| {
            let n = c.get(1)?.as_str().parse().ok()?;
            Some((n, c.get(2).map(|u| u.as_str())))
        })
        .collect()
}

/// A size in bytes, in the decimal and the binary reading of its unit.
fn bytes(n: f64, unit: &str) -> Option<Vec<f64>> {
    let u = unit.to_ascii_lowercase();
    let power = match u.chars().next()? {
        'b' => 0,
        'k' => 1,
        'm' => 2,
        'g' => 3,
        't' => 4,
        'p' => 5,
        _ => return None,
    };
    Some(vec![n * 1000f64.powi(power), n * 1024f64.powi(power)])
}

/// Hold `answer` (a model's final answer) to `ev`: one claim per sentence
/// that says something checkable, its `SUGGEST:` lines included.
///
/// Without this build's patterns nothing can be checked: the error names
/// the one that does not compile.
pub(crate) fn mark(answer: &str, ev: &Evidence) -> Result<Vec<Claim>, CompileError> {
    let p = patterns()?;
    let mut out = Vec::new();
    for line in answer.lines() {
        let line = line.trim().trim_start_matches(['#', '-', '*', '>', ' ']);
        if let Some(s) = line.strip_prefix("SUGGEST:") {
            let mut lacks = Vec::new();
            names(p, s, ev, &mut lacks);
            out.push(claim(s.trim(), true, false, lacks, ev));
            continue;
        }
        for sentence in sentences(line) {
            let mut lacks = Vec::new();
            let mut checked = figures_of(p, sentence, ev, &mut lacks);
            checked |= names(p, sentence, ev, &mut lacks);
            let change = change(p, sentence, ev, &mut lacks);
            if checked || change {
                out.push(claim(sentence, false, change, lacks, ev));
            }
        }
    }
    Ok(out)
}

fn claim(text: &str, suggestion: bool, change: bool, lacks: Vec<String>, ev: &Evidence) -> Claim {
    let supported = lacks.is_empty();
    let why = match (supported, suggestion) {
        (false, _) => lacks.join("; "),
        (true, true) => "the model's, unverified: every name in it is one the run saw".into(),
        (true, false) if change => format!(
            "a tier-2 call of this run made and verified it ({} successful call(s) in all)",
            ev.calls_ok
        ),
        (true, false) => "every figure and name in it is in a tool result of this run".into(),
    };
    let mut text = crate::text::one_line(text);
    if text.chars().count() > 300 {
        text = text.chars().take(300).collect::<String>() + "...";
    }
    Claim {
        text,
        supported,
        why,
        suggestion,
        change,
    }
}

/// A line's sentences: split at `. `, `; ` and `! `, never inside a number or path.
fn sentences(line: &str) -> impl Iterator<Item = &str> {
    line.split_inclusive([';', '!', '?'])
        .flat_map(|part| part.split_inclusive(". "))
        .map(|s| s.trim().trim_end_matches(['.', ';', '!', '?']))
        .filter(|s| !s.is_empty())
}

/// Figures with a unit: `true` when there was one to check.
fn figures_of(p: &Patterns, sentence: &str, ev: &Evidence, lacks: &mut Vec<String>) -> bool {
    let mut any = false;
    for c in p.figure.captures_iter(sentence) {
        let (Some(n), Some(unit)) = (c.get(1), c.get(2)) else {
            continue;
        };
        let Ok(value) = n.as_str().parse::<f64>() else {
            continue;
        };
        any = true;
        let decimals = n.as_str().split_once('.').map_or(0, |(_, d)| d.len());
        let sized = (!unit.as_str().starts_with('%')
            && !unit.as_str().eq_ignore_ascii_case("percent"))
        .then_some(unit.as_str());
        if !ev.has_figure(value, decimals, sized) {
            lacks.push(format!(
                "{} appears in no tool result of this run",
                c.get(0).map_or("", |m| m.as_str()).trim()
            ));
        }
    }
    any
}

/// Units, paths, `ticked` words and listed processes: `true` when there was one.
fn names(p: &Patterns, sentence: &str, ev: &Evidence, lacks: &mut Vec<String>) -> bool {
    let mut any = false;
    let mut seen = std::collections::BTreeSet::new();
    let mut check = |name: &str, path: bool, lacks: &mut Vec<String>| {
        let name = name.trim_matches(|c: char| c == '.' || c == ',' || c == '\'');
        if name.is_empty() || !seen.insert(name.to_lowercase()) {
            return;
        }
        any = true;
        let found = if path {
            ev.has_path(name)
        } else {
            ev.has_name(name)
        };
        if !found {
            lacks.push(format!(
                "{name} is nothing a call of this run returned or acted on"
            ));
        }
    };
    for m in p.unit_name.find_iter(sentence) {
        check(m.as_str(), false, lacks);
    }
    for c in p.path.captures_iter(sentence) {
        if let Some(p) = c.get(1) {
            check(p.as_str(), true, lacks);
        }
    }
    for c in p.ticked.captures_iter(sentence) {
        if let Some(t) = c.get(1) {
            let t = t.as_str();
            check(t, t.starts_with('/'), lacks);
        }
    }
    for c in p
        .listed
        .captures_iter(sentence)
        .chain(p.acted.captures_iter(sentence))
    {
        let Some(list) = c.get(1) else { continue };
        for w in p.word.find_iter(list.as_str()) {
            let w = w.as_str();
            let lower = w.to_ascii_lowercase();
            if !NOT_NAMES.contains(&lower.as_str()) && !w.starts_with('/') && !w.contains("%") {
                check(w, false, lacks);
            }
        }
    }
    any
}

/// A change claimed in `sentence` and whether a call of the record made it.
fn change(p: &Patterns, sentence: &str, ev: &Evidence, lacks: &mut Vec<String>) -> bool {
    let lower = sentence.to_lowercase();
    let words: Vec<&str> = p.word.find_iter(&lower).map(|m| m.as_str()).collect();
    let Some((at, verb, tool)) = words.iter().enumerate().find_map(|(i, w)| {
        let built_in = VERBS
            .iter()
            .find(|(v, _)| w == v)
            .map(|(v, t)| (i, v.to_string(), t.map(str::to_string)));
        built_in.or_else(|| {
            ev.verbs
                .iter()
                .find(|(v, _)| w == v)
                .map(|(v, t)| (i, v.clone(), Some(t.clone())))
        })
    }) else {
        return false;
    };
    let before = &words[..at];
    if before
        .iter()
        .any(|w| HEDGES.contains(w) || w.ends_with("n't"))
        || lower.contains("to be ")
    {
        return false;
    }
    let mut named = Vec::new();
    let mut scratch = Vec::new();
    let probe = Evidence::default();
    // The names the sentence gives its change, whatever the record holds.
    let _ = names(p, sentence, &probe, &mut scratch);
    for lack in scratch {
        if let Some(name) = lack.split(" is nothing").next() {
            named.push(name.to_lowercase());
        }
    }
    // A verb that names no tool ("cleared", "fixed") is borne out only by a
    // change on something the sentence names.
    let made = (tool.is_some() || !named.is_empty())
        && ev.changes.iter().any(|(t, args)| {
            tool.as_deref().is_none_or(|want| want == t)
                && named
                    .iter()
                    .all(|n| args.iter().any(|a| a.contains(n.as_str())))
        });
    if !made {
        lacks.push(match tool {
            Some(t) => format!(
                "it says {verb}, but no {t} call of this run{} succeeded and verified",
                match named.as_slice() {
                    [] => String::new(),
                    n => format!(" on {}", n.join(", ")),
                }
            ),
            None => format!(
                "it says {verb}, but no tier-2 call of this run succeeded and verified on what it names"
            ),
        });
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The record of a run that measured `/var/log` and listed processes,
    /// and restarted `nginx.service`.
    fn record() -> Evidence {
        let mut ev = Evidence::default();
        ev.saw(&json!({ "path": "/var/log" }));
        ev.saw(&json!({
            "mount": "/", "used_percent": 93, "size_bytes": 16_777_216, "used_bytes": 15_535_702,
            "largest": [{ "path": "/var/log/app/api.log", "bytes": 12_582_912 }],
        }));
        ev.saw(&json!({ "processes": [{ "comm": "postgres", "cpu": 41.5 }] }));
        ev.saw(&json!({ "unit": "nginx.service", "reason": "stuck" }));
        ev.changed("restart_service", &json!({ "unit": "nginx.service" }));
        ev.calls_ok = 4;
        ev
    }

    /// The table: each sentence, whether the record supports it, and a
    /// word of why.
    #[test]
    fn each_claim_is_held_to_the_record() {
        let ev = record();
        let cases: &[(&str, Option<bool>, &str)] = &[
            ("/ is 93% full", Some(true), "in a tool result"),
            ("/ is filling up with 90% usage", Some(false), "90%"),
            ("Disk usage is 92.6% on /", Some(true), ""),
            ("The largest file is 12 MiB", Some(true), ""),
            ("The largest file is 12.6MB", Some(true), ""),
            ("largest entries 100MB, 200MB, 300MB", Some(false), "100MB"),
            (
                "The busiest processes are sshd, httpd and nginx",
                Some(false),
                "sshd",
            ),
            ("The busiest processes are postgres", Some(true), ""),
            (
                "Restarted the `nginx.service` unit",
                Some(true),
                "tier-2 call",
            ),
            ("I restarted nginx.service", Some(true), ""),
            (
                "Restarted the `sshd` service",
                Some(false),
                "restart_service",
            ),
            ("I reloaded nginx.service", Some(false), "reload_service"),
            ("I did not restart anything", None, ""),
            ("nginx.service should be restarted", Some(true), ""),
            ("Consider restarting httpd", Some(false), "httpd is nothing"),
            ("The log /var/log/app/api.log grows", Some(true), ""),
            (
                "The log /srv/data/huge.bin grows",
                Some(false),
                "/srv/data/huge.bin",
            ),
            ("Everything looks fine", None, ""),
            ("I cleared the cache", Some(false), "no tier-2 call"),
            (
                "I fixed it by restarting nginx.service",
                Some(true),
                "tier-2 call",
            ),
            ("Restarted the sshd service", Some(false), "sshd is nothing"),
            (
                "Reloaded the nginx.service unit",
                Some(false),
                "reload_service",
            ),
            (
                "The largest entry is /var/log/app/api.log at 12 MB",
                Some(true),
                "",
            ),
            ("Used: 93%", Some(true), ""),
            ("Used: 97%", Some(false), "97%"),
        ];
        for (text, supported, why) in cases {
            let claims = mark(text, &ev).unwrap();
            match supported {
                None => assert!(claims.is_empty(), "{text}: {claims:?}"),
                Some(s) => {
                    assert_eq!(claims.len(), 1, "{text}: {claims:?}");
                    assert_eq!(claims[0].supported, *s, "{text}: {claims:?}");
                    assert!(claims[0].why.contains(why), "{text}: {claims:?}");
                }
            }
        }
    }

    /// A path with capitals (a temporary directory's, a user's) is found
    /// in a record kept lowercased.
    #[test]
    fn a_path_with_capitals_is_found_in_the_record() {
        let mut ev = Evidence::default();
        ev.saw(&serde_json::json!({ "path": "/tmp/rw-it-VkRmvA/work/Data", "use_pct": 22 }));
        ev.calls_ok = 1;
        let claims = mark("I measured /tmp/rw-it-VkRmvA/work/Data: fine.", &ev).unwrap();
        assert!(claims[0].supported, "{claims:?}");
        let claims = mark("I measured /tmp/rw-it-VkRmvA/work/Other: fine.", &ev).unwrap();
        assert!(!claims[0].supported, "{claims:?}");
    }

    /// The answers a real model (Qwen2.5-Coder-1.5B-Instruct, llama.cpp, 2
    /// CPU cores) gave on the disk runbook having made no call at all: every
    /// figure, name and change in them is marked unsupported.
    #[test]
    fn recorded_answers_of_a_real_model_that_made_no_call() {
        let nothing = Evidence::default();
        for file in ["qwen-1.5b-disk-1.txt", "qwen-1.5b-disk-2.txt"] {
            let answer = std::fs::read_to_string(format!(
                "{}/tests/fixtures/model-answers/{file}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let claims = mark(&answer, &nothing).unwrap();
            assert!(!claims.is_empty(), "{file}");
            assert!(claims.iter().all(|c| !c.supported), "{file}: {claims:#?}");
            assert!(claims.iter().any(|c| c.change), "{file}: {claims:#?}");
        }
        let with_suggestion = std::fs::read_to_string(format!(
            "{}/tests/fixtures/model-answers/qwen-1.5b-disk-2.txt",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let s: Vec<Claim> = mark(&with_suggestion, &nothing)
            .unwrap()
            .into_iter()
            .filter(|c| c.suggestion)
            .collect();
        assert_eq!(s.len(), 1, "{s:#?}");
        assert!(!s[0].supported && s[0].why.contains("httpd"), "{s:#?}");
    }
}

//! Property-based fuzzing of every parser that reads outside input: runbook
//! and host files, Alertmanager payloads, matchers, tool arguments, model
//! replies and the agent's request lines. Each target mutates real seeds
//! (`tests/fuzz-corpus/`, the shipped runbooks and hosts, the captured
//! Alertmanager payloads) and generates inputs from scratch; the properties
//! are "an answer, never a panic" plus what each answer must mean.
//!
//! The test command runs 256 cases per target (`PROPTEST_CASES` to run more
//! by hand, e.g. `PROPTEST_CASES=20000 cargo test --features estate --test it fuzz::`). A case
//! that fails is saved under `tests/proptest-regressions/` (kept in the repository)
//! and replayed first.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::{Value, json};

use runwarden::config::Config;
use runwarden::config::matchers::Matcher;
use runwarden::tools::{self, PathMode};
use runwarden::trigger::alerts::Notification;

use crate::util::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

fn seeds(dir: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "json")
            )
        })
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    out.sort();
    out
}

/// A seed with a few byte-level edits: replace, insert, delete, duplicate a span, truncate.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        0usize..4,
        any::<prop::sample::Index>(),
        any::<u8>(),
        0usize..64,
    );
    (
        prop::sample::select(seeds),
        prop::collection::vec(edit, 1..8),
    )
        .prop_map(|(mut s, edits)| {
            for (kind, at, byte, len) in edits {
                if s.is_empty() {
                    s.push(byte);
                    continue;
                }
                let i = at.index(s.len());
                match kind {
                    0 => s[i] = byte,
                    1 => s.insert(i, byte),
                    2 => {
                        let end = (i + len).min(s.len());
                        s.drain(i..end);
                    }
                    _ => {
                        let end = (i + len).min(s.len());
                        let span = s[i..end].to_vec();
                        s.splice(i..i, span);
                    }
                }
            }
            s
        })
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,40}".prop_map(Value::String),
        prop::sample::select(vec![
            "/tmp",
            "/etc/shadow",
            "/tmp/../etc",
            "nginx.service",
            "web",
            "..",
            "",
            "\u{0}",
        ])
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "path", "unit", "name", "config", "reason", "since", "priority", "sort",
                    "limit", "pool", "x", "force",
                ])
                .prop_map(String::from),
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A config directory to load texts from; reused across cases.
struct Dir {
    e: Estate,
}

impl Dir {
    /// With the hosts the shipped runbooks name (for runbooks), or only `h` (for host files).
    fn new(for_runbooks: bool) -> Dir {
        let e = Estate::new();
        e.host("h", &local_host("h", "paths: [/tmp]"));
        if for_runbooks {
            for h in ["staging-web-1", "staging-web-2", "local"] {
                e.host(h, &local_host(h, "paths: [/tmp]"));
            }
        }
        Dir { e }
    }

    /// Load with `text` as `rel`; every problem must name that file and a line.
    fn load(&self, rel: &str, text: &[u8]) -> Result<(), String> {
        let file = self.e.path().join(rel);
        std::fs::write(&file, text).unwrap();
        let result = Config::load(self.e.path());
        std::fs::remove_file(&file).unwrap();
        match result {
            Ok(_) => Ok(()),
            Err(err) => {
                for d in &err.0 {
                    if d.file != file {
                        return Err(format!("a problem names another file: {d}"));
                    }
                    if d.line == 0 {
                        return Err(format!("no line: {d}"));
                    }
                }
                Ok(())
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn runbook_files(text in mutated(seeds("runbooks"))) {
        thread_local!(static DIR: Dir = Dir::new(true));
        DIR.with(|d| d.load("runbooks/fuzz.yaml", &text)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn host_files(text in mutated(seeds("hosts"))) {
        thread_local!(static DIR: Dir = Dir::new(false));
        DIR.with(|d| d.load("hosts/fuzz.yaml", &text)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn alertmanager_payloads(body in prop_oneof![
        mutated(seeds("tests/fixtures/alertmanager")),
        json_value().prop_map(|v| v.to_string().into_bytes()),
    ]) {
        thread_local!(static CFG: Config = Config::load(&repo()).unwrap());
        if let Ok(n) = Notification::parse(&body) {
            CFG.with(|c| runwarden::trigger::alerts::candidates(&n, c));
        }
    }

    #[test]
    fn matchers(text in prop_oneof![
        "[a-z_]{0,8}(=|!=|=~|!~)\"[^\"]{0,12}\"",
        "[a-zA-Z_=!~\"\\\\ .*+?(){}|\\[\\],]{0,40}",
        ".{0,40}",
    ], value in ".{0,20}") {
        if let Ok(m) = Matcher::parse(&text) {
            let labels = [("alertname".to_string(), value.clone()), ("env".to_string(), value)].into_iter().collect();
            m.matches(&labels);
        }
    }

    #[test]
    fn tool_arguments(tool in prop::sample::select(tools::Builtin::ALL.to_vec()), args in json_value()) {
        thread_local!(static HOST: (Estate, runwarden::config::Host) = {
            let e = Estate::new();
            std::fs::create_dir_all(e.work().join("allowed/sub")).unwrap();
            let a = e.work().join("allowed");
            e.host("h", &local_host("h", &format!("paths: [{}, /tmp]\nunits: [nginx.service]\nlogrotate_configs: [/etc/logrotate.conf]\nhealth_checks:\n  web: http://127.0.0.1/\n", a.display())));
            let c = Config::load(e.path()).unwrap();
            let h = (*c.hosts["h"]).clone();
            (e, h)
        });
        HOST.with(|(_, host)| {
            for mode in [PathMode::Resolve, PathMode::Lexical] {
                if let Ok(action) = tools::resolve(&tool.into(), &args, host, mode) {
                    // Whatever was accepted is inside the host's allowlists.
                    let resolved = action.args_json();
                    if let Some(p) = resolved.get("path").and_then(Value::as_str) {
                        let p = PathBuf::from(p);
                        prop_assert!(host.paths.iter().any(|a| p.starts_with(a) || std::fs::canonicalize(a).is_ok_and(|a| p.starts_with(a))), "{p:?}");
                    }
                    if let Some(u) = resolved.get("unit").and_then(Value::as_str) {
                        prop_assert!(host.units.iter().any(|x| x == u), "{u}");
                    }
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn model_replies(body in prop_oneof![
        mutated(seeds("tests/fuzz-corpus/model")),
        json_value().prop_map(|v| json!({ "choices": [{ "message": v }] }).to_string().into_bytes()),
    ]) {
        if let Ok(reply) = runwarden::planner::openai::parse_reply(&body) {
            for c in reply.tool_calls {
                // Arguments that are not JSON become a refusal at the gate, never a panic here.
                let _ = serde_json::from_str::<Value>(&c.arguments);
            }
        }
    }

    #[test]
    fn agent_request_lines(line in prop_oneof![
        mutated(seeds("tests/fuzz-corpus/agent")),
        json_value().prop_map(|v| v.to_string().into_bytes()),
    ]) {
        thread_local!(static AGENT: (Estate, runwarden::agent::Policy, runwarden::audit::AuditLog, tokio::runtime::Runtime) = {
            let e = Estate::new();
            let policy = e.work().join("agent.yaml");
            std::fs::write(&policy, format!("name: h\nconnection: local\njail: {}/jail\npaths: [{}]\n", e.work().display(), e.work().display())).unwrap();
            let host = runwarden::agent::load_policy(&policy).unwrap();
            let audit = runwarden::audit::AuditLog::open(&e.work().join("audit.jsonl")).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            (e, host, audit, rt)
        });
        let text = String::from_utf8_lossy(&line).into_owned();
        AGENT.with(|(e, host, audit, rt)| {
            let reply = rt.block_on(runwarden::agent::handle(host, audit, text.trim_end()));
            let v = serde_json::to_value(&reply).unwrap();
            // Anything that ran was a tool the policy allows, on an allowed path.
            if let Some(p) = v.get("result").and_then(|r| r["data"]["path"].as_str()) {
                prop_assert!(Path::new(p).starts_with(e.work()), "{p}");
            }
            Ok(())
        })?;
    }
}

//! The tools: every operation runwarden can perform.
//!
//! A tool is a narrow typed operation with a fixed [`Tier`], an argument type
//! (its JSON schema is generated from that type, see [`args`]), an argv
//! builder and an output parser. The tier is a property of the tool in code
//! ([`ToolId::tier`]); nothing read at run time can change it.
//!
//! Tier 3 (destructive, irreversible) does not exist here. There is no shell
//! tool and no generic command tool; a runbook can only *suggest* a tier-3
//! command as text for a person.
//!
//! Calls go through two stages: [`resolve`] turns untrusted JSON arguments into
//! an [`Action`] whose every value is checked against the host's allowlists,
//! and `execute` runs an action on the machine it is called on.

mod action;
mod allowlists;
pub(crate) mod args;
mod cert;
mod context;
pub(crate) mod declared;
mod disk;
mod failed_units;
mod http;
mod journal;
mod logs;
mod pool;
mod process;
mod registry;
mod result;
mod service;

use std::time::Instant;

use serde_json::Value;

pub use action::{Action, PathMode, privileged_commands, resolve};
pub(crate) use context::{Ctx, OUTPUT_CAP, privileged};
pub(crate) use registry::compile_schemas;
pub use registry::{Builtin, Tier, ToolId, Tools, check_shape};

use crate::process::Confine;
pub(crate) use result::{Failure, Outcome, ToolResult, Unreachable};

pub(crate) use context::poll;
pub(crate) use result::from_process;

/// Run a resolved action on this machine, in `host`'s jail directory
/// (made if missing), by `deadline`.
pub(crate) async fn execute_here(
    action: &Action,
    host: &crate::host::Host,
    deadline: tokio::time::Instant,
) -> ToolResult {
    if let Err(e) = std::fs::create_dir_all(&host.jail) {
        return ToolResult::failed(format!(
            "cannot create the jail directory {}: {e}",
            host.jail.display()
        ));
    }
    execute(action, host, deadline).await
}

/// How a call's processes are confined, decided here alone and from the
/// tool's tier in the registry (never from a caller): a tier-1 call's, and
/// every verify probe's, as the observer that changes nothing (see
/// [`crate::sandbox`]); a tier-2 change's in its jail, since a change must
/// write. A declared tool's observer may connect to its `connect:` ports
/// and starts only with every layer of the sandbox, unless the host
/// accepts less (`unsandboxed_tier1: allow`); a built-in's starts with the
/// layers there are (its argv is fixed in code).
pub(crate) fn confinement(tool: &ToolId, tier: Tier, host: &crate::host::Host) -> Confine {
    match (tier, tool) {
        (Tier::Change, _) => Confine::Jail,
        (Tier::Observe, ToolId::Builtin(_)) => Confine::observer(),
        (Tier::Observe, ToolId::Declared(d)) => Confine::Observer {
            required: !host.unsandboxed_tier1,
            net: d.connect.clone(),
        },
    }
}

/// Run a resolved action on this machine and report what happened, its
/// processes confined as its tier says ([`confinement`]).
pub(crate) async fn execute(
    action: &Action,
    host: &crate::host::Host,
    deadline: tokio::time::Instant,
) -> ToolResult {
    let tool = action.tool();
    let ctx = Ctx::new(host, deadline, confinement(&tool, tool.tier(), host));
    let started = Instant::now();
    let mut result = action.0.run(&ctx).await;
    // Whatever left its process group and outlived the call's processes
    // dies with the call.
    crate::process::escapees::sweep();
    result.duration_ms = started.elapsed().as_millis() as u64;
    result.argv = ctx.take_argv();
    if action.tier() == Tier::Change && result.verified.is_none() {
        result.verified = Some(false);
    }
    result.without_secrets()
}

/// Lines of a declared tool's output a report and a transcript show.
pub(crate) const OUTPUT_LINES: usize = 20;

/// A declared tool's output as a person reads it under its step: its
/// first [`OUTPUT_LINES`] lines (each cut at 200 characters, escaped for a
/// terminal) and how many there were; `None` for a built-in's result (its
/// `said` line has what matters), a change's evidence, or one line or none.
pub(crate) fn output_lines(tool: &str, data: &Value) -> Option<(Vec<String>, usize)> {
    if Builtin::from_name(tool).is_some() || data.get("evidence").is_some() {
        return None;
    }
    let text = data["stdout"].as_str()?.trim_end();
    let total = text.lines().count();
    if total < 2 {
        return None;
    }
    let shown = text
        .lines()
        .take(OUTPUT_LINES)
        .map(|l| crate::text::printable(&l.chars().take(200).collect::<String>()))
        .collect();
    Some((shown, total))
}

/// [`output_lines`] under a step, indented by `indent`, with where the rest is.
pub(crate) fn output_block(tool: &str, data: &Value, indent: &str) -> Option<String> {
    let (lines, total) = output_lines(tool, data)?;
    let mut out = match total > lines.len() {
        true => format!(
            "{indent}output ({} of {total} lines; all of it in the audit log's result line, or with --json):\n",
            lines.len()
        ),
        false => format!("{indent}output:\n"),
    };
    for l in lines {
        out.push_str(&format!("{indent}  | {l}\n"));
    }
    Some(out)
}

/// What a result of `tool` said, in the words a person reads it in: the
/// fields that matter for that tool on one line (the whole result is in
/// `--json` and the audit log); a change says its own evidence. `None` for a
/// result without data. Escaped for a terminal.
pub(crate) fn said(tool: &str, data: &Value) -> Option<String> {
    if data.is_null() || data.as_object().is_some_and(|o| o.is_empty()) {
        return None;
    }
    let said = match Builtin::from_name(tool) {
        Some(b) => ToolId::Builtin(b).said_by(data),
        // A declared tool's result reads the same whatever its declaration.
        None => declared::said(data),
    };
    let text = match said {
        Some(text) => text,
        _ => match data["evidence"].as_str() {
            Some(evidence) => evidence.to_string(),
            None => {
                let text = serde_json::to_string(data).unwrap_or_default();
                let cut: String = text.chars().take(300).collect();
                if cut.len() < text.len() {
                    format!("{cut} …")
                } else {
                    cut
                }
            }
        },
    };
    Some(crate::text::printable(&text))
}

/// Bytes as a person reads them (binary units, one decimal).
fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::args::*;
    use super::registry::parse;
    use super::*;
    use serde_json::json;

    /// Host `h` of a config in `dir` from the YAML after its name, with its jail made.
    fn local_host(dir: &std::path::Path, rest: &str) -> std::sync::Arc<crate::host::Host> {
        std::fs::create_dir_all(dir.join("hosts")).unwrap();
        std::fs::write(
            dir.join("hosts/h.yaml"),
            format!("name: h\nconnection: local\n{rest}"),
        )
        .unwrap();
        let config = crate::config::Config::load(dir).unwrap();
        let host = config.hosts["h"].clone();
        std::fs::create_dir_all(&host.jail).unwrap();
        host
    }

    /// Resolve and run one call of `tool` on `host`, here and now.
    fn call(host: &crate::host::Host, tool: Builtin, args: serde_json::Value) -> ToolResult {
        let action =
            resolve(&tool.into(), &args, host, PathMode::Resolve).expect("the gate allows it");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { execute(&action, host, deadline).await })
    }

    /// `disk_usage` measures what the gate checked: a path swapped for a
    /// symlink after the check (its last component, or a middle one) is
    /// refused, not measured.
    #[test]
    fn a_path_swapped_after_the_gate_checked_it_is_not_measured() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let outside = dir.path().join("outside");
        for d in [
            allowed.join("last"),
            allowed.join("mid/inner"),
            outside.join("inner"),
        ] {
            std::fs::create_dir_all(&d).unwrap();
        }
        std::fs::write(outside.join("inner/secret-name"), "x").unwrap();
        std::fs::create_dir_all(dir.path().join("hosts")).unwrap();
        std::fs::write(
            dir.path().join("hosts/h.yaml"),
            format!(
                "name: h\nconnection: local\npaths: [{}]\n",
                allowed.display()
            ),
        )
        .unwrap();
        let config = crate::config::Config::load(dir.path()).unwrap();
        let host = config.hosts["h"].clone();
        std::fs::create_dir_all(&host.jail).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let run = |path: &std::path::Path, swap: &dyn Fn()| {
            let action = resolve(
                &Builtin::DiskUsage.into(),
                &serde_json::json!({ "path": path }),
                &host,
                PathMode::Resolve,
            )
            .expect("the gate allows it");
            swap();
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            rt.block_on(async { execute(&action, &host, deadline).await })
        };
        // Untouched: measured, entries named by the checked path.
        let ok = run(&allowed.join("mid"), &|| {});
        assert_eq!(ok.outcome, Outcome::Ok, "{ok:?}");
        assert_eq!(
            ok.data["largest"][0]["path"],
            allowed.join("mid/inner").display().to_string()
        );
        // The last component replaced by a symlink out, after the check.
        let last = run(&allowed.join("last"), &|| {
            std::fs::remove_dir(allowed.join("last")).unwrap();
            std::os::unix::fs::symlink(&outside, allowed.join("last")).unwrap();
        });
        assert_eq!(last.outcome, Outcome::Error, "{last:?}");
        // A middle component replaced, after the check.
        let mid = run(&allowed.join("mid/inner"), &|| {
            std::fs::rename(allowed.join("mid"), allowed.join("mid-old")).unwrap();
            std::os::unix::fs::symlink(&outside, allowed.join("mid")).unwrap();
        });
        assert_eq!(mid.outcome, Outcome::Error, "{mid:?}");
        assert!(
            mid.error
                .as_deref()
                .unwrap()
                .contains("changed after it was checked"),
            "{mid:?}"
        );
        for r in [&last, &mid] {
            assert!(
                !serde_json::to_string(r).unwrap().contains("secret-name"),
                "nothing outside was read"
            );
            assert!(r.argv.is_empty(), "df and du never ran: {:?}", r.argv);
        }
    }

    /// A `du` that has not finished by the host's `du_budget` has printed
    /// only what finished first: that is never ranked as the largest, and
    /// the answer says it is partial and why.
    #[test]
    fn a_du_cut_by_its_budget_is_partial_and_ranks_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        for d in ["small", "big"] {
            std::fs::create_dir_all(data.join(d)).unwrap();
        }
        std::fs::write(data.join("big/file"), vec![1u8; 1 << 20]).unwrap();
        // The real du, whose first line gets out before the budget ends.
        let slow = dir.path().join("slow-du");
        std::fs::write(
            &slow,
            "#!/bin/sh\n/usr/bin/du \"$@\" | /usr/bin/head -n 1\n/usr/bin/sleep 5\n",
        )
        .unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        let host_file = |budget: &str, du: &std::path::Path| {
            local_host(
                dir.path(),
                &format!(
                    "paths: [{}]\ndu_budget: {budget}\nbinaries: {{ du: {} }}\n",
                    data.display(),
                    du.display()
                ),
            )
        };
        let measure =
            |host: &crate::host::Host| call(host, Builtin::DiskUsage, json!({ "path": data }));
        let cut = measure(&host_file("300ms", &slow));
        assert_eq!(cut.outcome, Outcome::Ok, "{cut:?}");
        assert_eq!(cut.data["partial"], true, "{cut:?}");
        assert_eq!(cut.data["largest"], serde_json::json!([]), "{cut:?}");
        assert!(
            cut.data["partial_reason"]
                .as_str()
                .is_some_and(|r| r.contains("du_budget (300ms)")),
            "{cut:?}"
        );
        let whole = measure(&host_file("10s", std::path::Path::new("/usr/bin/du")));
        assert_eq!(whole.data["partial"], false, "{whole:?}");
        assert_eq!(
            whole.data["largest"][0]["path"],
            data.join("big").display().to_string(),
            "{whole:?}"
        );
    }

    /// `list_processes` lists the machine's processes, not the `ps` that
    /// made the list (which is always busy at the moment it looks).
    #[test]
    fn list_processes_leaves_out_its_own_ps() {
        let dir = tempfile::tempdir().unwrap();
        let host = local_host(dir.path(), "");
        for sort in ["cpu", "newest"] {
            let r = call(
                &host,
                Builtin::ListProcesses,
                json!({ "sort": sort, "limit": 50 }),
            );
            let listed = r.data["processes"].as_array().expect("a list").clone();
            assert!(!listed.is_empty(), "{r:?}");
            let me = u64::from(std::process::id());
            assert!(
                !listed
                    .iter()
                    .any(|p| p["ppid"] == me && p["command"] == "ps"),
                "{sort}: {listed:#?}"
            );
        }
    }

    #[test]
    fn every_tool_has_an_object_schema_and_tier_two_needs_a_reason() {
        for t in Builtin::ALL {
            let s = t.schema();
            assert_eq!(s["type"], "object", "{}", t.name());
            assert_eq!(s["additionalProperties"], false, "{}", t.name());
            let required: Vec<&str> = s["required"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            assert_eq!(
                required.contains(&"reason"),
                t.tier() == Tier::Change,
                "{}",
                t.name()
            );
            assert_eq!(Builtin::from_name(t.name()), Some(*t));
        }
        assert_eq!(Builtin::from_name("run_shell"), None);
    }

    #[test]
    fn schema_enums_match_the_types() {
        let s = Builtin::ReadJournal.schema();
        let since: Vec<String> =
            serde_json::from_value(s["properties"]["since"]["enum"].clone()).unwrap();
        assert_eq!(since, ["15m", "1h", "6h", "1d"]);
        for v in since {
            assert!(parse::<JournalArgs>(&json!({"unit": "a.service", "since": v})).is_ok());
        }
        assert!(parse::<JournalArgs>(&json!({"unit": "a.service", "since": "2y"})).is_err());
    }

    #[test]
    fn shape_check_catches_unknown_and_missing_fields() {
        assert!(check_shape(&Builtin::DiskUsage.into(), &json!({"path": "/"}), false).is_ok());
        let e = check_shape(
            &Builtin::DiskUsage.into(),
            &json!({"path": "/", "recursive": true}),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `recursive`"), "{e}");
        let e = check_shape(
            &Builtin::DiskUsage.into(),
            &json!({"mount": "{{ x }}"}),
            true,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `mount`"), "{e}");
        let e =
            check_shape(&Builtin::RotateLogs.into(), &json!({"reason": "x"}), true).unwrap_err();
        assert!(e.to_string().contains("missing field `config`"), "{e}");
    }
}

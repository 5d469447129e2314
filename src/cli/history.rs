//! Reading the record: `audit verify`, `audit show`, `transcript`, `runs` and `promote-report`.

use std::path::Path;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::check::load;
use super::{EXIT_USAGE, Exit, Failed};
use crate::audit;
use crate::audit::Phase;

pub(super) fn audit_path(file: Option<PathBuf>, dir: &Path) -> Result<PathBuf, Failed> {
    match file {
        Some(f) => Ok(f),
        // runwarden.yaml alone: the log can be read while a runbook is half edited.
        None => crate::config::Settings::load(dir)
            .map(|s| s.audit_log)
            .map_err(Failed::listing),
    }
}

/// The audit log could not be read.
fn unreadable(path: &Path, e: impl std::fmt::Display) -> Failed {
    Failed::usage(format!("cannot read {}: {e}", path.display()))
}

pub(super) fn audit_verify(
    file: Option<PathBuf>,
    dir: &Path,
    mut heads: Vec<audit::head::Head>,
) -> Exit {
    // The log named by the configuration: its record of demotions is held
    // to the state directory's files.
    let settings = file
        .is_none()
        .then(|| crate::config::Settings::load(dir).ok())
        .flatten();
    let path = audit_path(file, dir)?;
    if let Some(settings) = &settings {
        for m in crate::audit::demotions(settings).mismatches() {
            println!("demotion record: {m}");
        }
    }
    let pinned = heads.len();
    let from_journal = journal_heads(&path, &mut heads);
    say_torn(&path);
    let mut v = audit::verify_against(&path, &heads).map_err(|e| unreadable(&path, e))?;
    // A head is said to match only when it was checked against its line;
    // a pinned one that cannot be (retention removed its line) fails.
    let kept_from = v.last + 1 - v.lines as u64;
    for h in heads[..pinned].iter().filter(|h| h.lines < kept_from) {
        v.problems.push((
            h.lines as usize,
            format!(
                "the head pinned for line {} cannot be checked: retention removed the lines before line {kept_from}",
                h.lines
            ),
        ));
    }
    say_retired(&v.retired);
    let against = against(pinned, from_journal, &v);
    match v {
        v if v.problems.is_empty() => {
            match v.segments {
                1 => println!("{}: {} line(s), chain intact", path.display(), v.lines),
                k => println!(
                    "{}: {} line(s) in {k} segment(s) (lines {}-{}), chain intact",
                    path.display(),
                    v.lines,
                    v.last + 1 - v.lines as u64,
                    v.last
                ),
            }
            println!("head: {}:{}", v.head, v.last);
            println!("{against}");
            Ok(0)
        }
        v => {
            for (line, why) in &v.problems {
                println!("{}:{line}: chain broken: {why}", path.display());
            }
            println!(
                "{} problem(s) in {} line(s); the lines before line {} verify",
                v.problems.len(),
                v.lines,
                v.problems[0].0
            );
            Ok(EXIT_USAGE)
        }
    }
}

/// The heads the journal holds for `path`, added to `heads`: how many
/// (`Ok`), or why none were read (`Err`; `Ok(None)`: no journal here).
fn journal_heads(path: &Path, heads: &mut Vec<audit::head::Head>) -> Result<Option<usize>, String> {
    if !audit::head::journal_available() {
        return Ok(None);
    }
    match audit::head::journal_heads(path) {
        Ok(found) => {
            let n = found.trusted.len();
            heads.extend(found.trusted);
            for (uid, n) in found.ignored {
                let who = nix::unistd::User::from_uid(uid.into())
                    .ok()
                    .flatten()
                    .map_or_else(
                        || format!("uid {uid}"),
                        |u| format!("{} (uid {uid})", u.name),
                    );
                println!(
                    "ignored {n} head record(s) in the journal from {who}: only heads sent by the log's owner or root are trusted"
                );
            }
            Ok(Some(n))
        }
        Err(e) => {
            eprintln!("runwarden: {e}; only the chain is checked");
            Err(e.to_string())
        }
    }
}

/// Lines writers killed mid-write left unfinished, set aside beside the log.
fn say_torn(path: &Path) {
    let torn = audit::torn_path(path);
    if let Ok(m) = std::fs::metadata(&torn) {
        println!(
            "{}: {} byte(s) of line(s) that writers killed mid-write left unfinished, set aside (never acknowledged, not part of the chain)",
            torn.display(),
            m.len()
        );
    }
}

/// What retention removed, if it removed anything.
fn say_retired(r: &audit::Retired) {
    if r.segments == 0 {
        return;
    }
    println!(
        "retention removed {} segment(s){}{}",
        r.segments,
        r.lines
            .map_or(String::new(), |(a, b)| format!(" (lines {a}-{b})")),
        match (&r.from, &r.to) {
            (Some(f), Some(t)) => format!(", written from {f} to {t}"),
            (None, Some(t)) => format!(", the last written at {t}"),
            _ => String::new(),
        }
    );
}

/// What the chain was held to besides itself: `pinned` heads given on the
/// command line, and those the journal held (`from_journal`).
fn against(
    pinned: usize,
    from_journal: Result<Option<usize>, String>,
    v: &audit::Verification,
) -> String {
    match (pinned, from_journal) {
        (0, Err(e)) => format!("no head recorded elsewhere was checked ({e})"),
        (0, Ok(None)) => {
            "no head recorded elsewhere was checked (no journal here): pin the one above with --head"
                .to_string()
        }
        (p, j) => format!(
            "matches {} head(s) recorded elsewhere, each checked against its line ({p} pinned, {} from the journal){}",
            v.heads_checked,
            j.ok().flatten().map_or("none".into(), |n| n.to_string()),
            match v.heads_retired {
                0 => String::new(),
                n => format!("; {n} recorded for lines retention removed were not checked"),
            }
        ),
    }
}

pub(super) fn runs(
    mut filter: audit::runs::Filter,
    since: Option<&str>,
    json: bool,
    dir: &Path,
) -> Exit {
    let path = audit_path(None, dir)?;
    if let Some(s) = since {
        filter.since =
            Some(audit::runs::parse_since(s).map_err(|e| Failed::usage(format!("--since {e}")))?);
    }
    let list = audit::runs::list(&path, &filter).map_err(|e| unreadable(&path, e))?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
        return Ok(0);
    }
    if list.is_empty() {
        println!("no runs in {}", path.display());
        return Ok(0);
    }
    let width = |f: fn(&audit::runs::RunSummary) -> usize| list.iter().map(f).max().unwrap_or(0);
    let (rb, host) = (width(|r| r.runbook.len()), width(|r| r.host.len()));
    println!(
        "{:<30} {:<36} {:<rb$} {:<host$} {:<8} STATUS",
        "STARTED", "RUN", "RUNBOOK", "HOST", "TRIGGER"
    );
    for r in &list {
        let mut line = format!(
            "{:<30} {:<36} {:<rb$} {:<host$} {:<8} {}",
            r.started_at, r.run_id, r.runbook, r.host, r.trigger, r.status
        );
        if r.dry_run {
            line += " (dry run)";
        }
        if let Some(u) = &r.user {
            line += &format!("  by {u}");
        }
        // Why it did not end `ok`, in its verdict's words.
        if let Some(why) = r
            .detail
            .as_deref()
            .filter(|_| !matches!(r.status.as_str(), "ok" | "running" | "queued"))
        {
            line += &format!("  ({})", why.chars().take(160).collect::<String>());
        }
        let unsupported = r.claims.iter().filter(|c| c["supported"] == false).count();
        if unsupported > 0 {
            line += &format!("  [{unsupported} unsupported claim(s) of the model]");
        }
        if let Some(a) = &r.alert {
            let name = a["labels"]["alertname"].as_str().unwrap_or("?");
            line += &format!("  alert {name}");
            if let Some(s) = a["summary"].as_str() {
                line += &format!(": {s}");
            }
        }
        println!("{}", crate::text::printable(&line));
    }
    Ok(0)
}

/// `runs --fleet`: every replica's runs, from the shared state.
pub(super) async fn fleet_runs(
    runbook: Option<String>,
    host: Option<String>,
    limit: usize,
    json: bool,
    dir: &Path,
) -> Exit {
    let Some(store) = super::db::shared(dir)? else {
        return Err(Failed::usage(format!(
            "--fleet needs shared state: {}/runwarden.yaml sets no state.postgres (`runwarden runs` lists this machine's runs)",
            dir.display()
        )));
    };
    let runs = store
        .fleet_runs(runbook.as_deref(), host.as_deref(), limit as i64)
        .await
        .map_err(|e| Failed::code(1, e))?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "runs": runs })).unwrap_or_default()
        );
        return Ok(0);
    }
    let list = runs.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no runs in the shared state");
        return Ok(0);
    }
    let text = |r: &Value, k: &str| r[k].as_str().unwrap_or("").to_string();
    println!(
        "{:<32} {:<36} {:<20} {:<16} {:<12} STATUS",
        "STARTED", "RUN", "RUNBOOK", "HOST", "REPLICA"
    );
    for r in &list {
        let status = r["verdict"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| text(r, "status"));
        let line = format!(
            "{:<32} {:<36} {:<20} {:<16} {:<12} {status}",
            text(r, "started_at"),
            text(r, "run_id"),
            text(r, "runbook"),
            text(r, "host"),
            text(r, "replica"),
        );
        println!("{}", crate::text::printable(&line));
    }
    Ok(0)
}

/// A run id or a unique prefix of one, as given on the command line.
pub(super) fn run_id_of(path: &Path, given: &str) -> Result<String, Failed> {
    audit::runs::resolve(path, given).map_err(|e| Failed::code(1, e))
}

/// One run's lines, for a run id or a unique prefix of one; a failure when
/// there are none (exit 1) or the log cannot be read.
fn lines_of_run(given: &str, dir: &Path) -> Result<Vec<audit::Entry>, Failed> {
    let path = audit_path(None, dir)?;
    let run_id = run_id_of(&path, given)?;
    match audit::run_lines(&path, &run_id).map_err(|e| unreadable(&path, e))? {
        lines if lines.is_empty() => Err(Failed::code(
            1,
            format!("no lines for run {run_id} in {}", path.display()),
        )),
        lines => Ok(lines),
    }
}

pub(super) fn transcript(run_id: &str, dir: &Path) -> Exit {
    let lines = lines_of_run(run_id, dir)?;
    print!(
        "{}",
        crate::text::printable(&crate::transcript::render(&lines))
    );
    Ok(0)
}

pub(super) fn audit_show(run_id: &str, dir: &Path, json: bool) -> Exit {
    let lines = lines_of_run(run_id, dir)?;
    let finished: std::collections::BTreeSet<u32> = lines
        .iter()
        .filter(|e| e.phase == Some(Phase::Result))
        .filter_map(|e| e.step)
        .collect();
    let has_verdict = lines.iter().any(|e| e.phase == Some(Phase::Verdict));
    for e in &lines {
        let interrupted =
            e.phase == Some(Phase::Intent) && !e.step.is_some_and(|s| finished.contains(&s));
        if json {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            if interrupted {
                v["interrupted"] = Value::Bool(true);
            }
            println!("{v}");
            continue;
        }
        let mut line = columns(e);
        if interrupted {
            line += "  INTERRUPTED: no result line (the process stopped during this call)";
        }
        line += &in_words(e);
        println!("{}", crate::text::printable(&line));
    }
    if !has_verdict {
        println!("(no verdict line: the run was interrupted or is still running)");
    }
    Ok(0)
}

/// One audit line in aligned columns: time, phase, step, tool, then what varies.
fn columns(e: &audit::Entry) -> String {
    let phase = e
        .phase
        .map(|p| {
            serde_json::to_value(p)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    // Aligned columns: time, phase, step, tool, then what varies.
    let mut line = format!(
        "{:<30} {:<10} {:>8} {:<20}",
        e.ts,
        phase,
        e.step.map(|s| format!("step {s}")).unwrap_or_default(),
        e.tool.as_deref().unwrap_or("")
    );
    if let Some(a) = &e.args {
        line += &format!(" {}", crate::report::args_text(a));
    }
    if e.phase == Some(Phase::Denied)
        && let Some(d) = &e.detail
    {
        line += &format!(
            " DENIED {}: {}",
            d["reason"].as_str().unwrap_or("?"),
            d["message"].as_str().unwrap_or("")
        );
    }
    if let Some(a) = &e.approved_by {
        line += &format!(" approved_by={a}");
    }
    if let Some(d) = &e.declaration {
        line += &format!(
            " declared=sha256:{}",
            d.chars().take(12).collect::<String>()
        );
    }
    if let Some(o) = &e.outcome {
        line += &format!(" outcome={o}");
    }
    if let Some(d) = e.duration_ms {
        line += &format!(" {d}ms");
    }
    if let Some(r) = &e.reason {
        line += &format!(" reason={r:?}");
    }
    line
}

/// What a line says in words, as `transcript` shows it: the error, the
/// verdict's detail and the model's claims, the suggestion, the alert.
fn in_words(e: &audit::Entry) -> String {
    let mut line = String::new();
    let detail = e.detail.as_ref().unwrap_or(&Value::Null);
    match e.phase {
        Some(Phase::Result) => {
            if let Some(err) = detail["error"].as_str() {
                line += &format!("\n{:<30} error: {err}", "");
            }
        }
        Some(Phase::Verdict) => {
            if let Some(d) = detail["detail"].as_str() {
                line += &format!("\n{:<30} {d}", "");
            }
            // The model's claims, as the verdict line marked them.
            for c in detail["claims"].as_array().into_iter().flatten() {
                let mark = if c["supported"] == true {
                    "supported"
                } else {
                    "UNSUPPORTED"
                };
                line += &format!(
                    "\n{:<30} claim {mark}: {} ({})",
                    "",
                    c["text"].as_str().unwrap_or(""),
                    c["why"].as_str().unwrap_or("")
                );
            }
        }
        Some(Phase::Suggestion) => {
            if let Some(t) = detail["suggestion"].as_str() {
                line += &format!(
                    "\n{:<30} suggestion for a person (tier 3, never run): {t}",
                    ""
                );
            }
        }
        Some(Phase::Start) if detail["dry_run"].as_bool() == Some(true) => {
            line += " DRY RUN";
        }
        _ => {}
    }
    if matches!(e.phase, Some(Phase::Start | Phase::Queued)) && !detail["alert"].is_null() {
        for l in crate::transcript::alert_text(&detail["alert"]).lines() {
            line += &format!("\n{:<30} {l}", "");
        }
    }
    line
}

pub(super) async fn promote_report(runbook: &str, since: &str, json: bool, dir: &Path) -> Exit {
    let cfg = load(dir)?;
    let window = humantime::parse_duration(since).map_err(|e| {
        Failed::usage(format!(
            "--since {since:?} is not a duration ({e}); write e.g. 14d"
        ))
    })?;
    if !cfg.runbooks.contains_key(runbook) {
        return Err(Failed::usage(format!(
            "no runbook {runbook:?} in {}{}",
            dir.display(),
            crate::config::did_you_mean(runbook, cfg.runbooks.keys().map(String::as_str))
        )));
    }
    let from = jiff::Timestamp::now() - jiff::SignedDuration::try_from(window).unwrap_or_default();
    let report = audit::promotion(&cfg.settings.audit_log, runbook, from)
        .map_err(|e| unreadable(&cfg.settings.audit_log, e))?;
    let autonomy = cfg
        .runbooks
        .get(runbook)
        .map_or("", |r| r.autonomy.as_str());
    let (demoted, problem) = super::promote::in_force(&cfg.settings, None).await;
    let demotion = demoted.into_iter().find(|d| d.runbook == runbook);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "runbook": runbook,
                "autonomy": autonomy,
                "demoted": demotion,
                "since": from.to_string(),
                "report": report.to_json(),
            })
        );
        return Ok(0);
    }
    println!("runbook {runbook}, autonomy {autonomy}, since {from} ({since})");
    if let Some(d) = &demotion {
        println!("DEMOTED {}", d.summary());
        for f in &d.evidence {
            let line = format!(
                "  failed run {} on {} at {}: {}",
                f.run_id, f.host, f.at, f.detail
            );
            println!("{}", crate::text::printable(&line));
            for c in &f.calls {
                let line = format!(
                    "    step {} {} (tier {}): {}",
                    c.step, c.tool, c.tier, c.error
                );
                println!("{}", crate::text::printable(&line));
            }
        }
        println!(
            "  promote once the evidence leaves its window ({}), or now with --force",
            d.window_ends()
        );
    }
    if let Some(problem) = problem {
        eprintln!("warning: {problem}");
    }
    print!("{report}");
    Ok(0)
}

//! The README's quick start, word for word: its commands are read out of
//! the README (so a change there is a change here), `cargo run --` is the
//! shipped binary, and they run in the order the README gives them, from a
//! copy of the repository's configuration in another directory. The one
//! word changed is the port (a free one instead of 9731, in the copied
//! runwarden.yaml and in every command), so the test never meets a daemon
//! someone runs on this machine.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

/// The quick start's commands: every backticked `cargo run -- ...` and
/// `curl ...` between "## Quick start" and the test command, in order.
fn commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme
        .find("## Quick start")
        .expect("a Quick start section");
    let section = &readme[start..];
    let end = section
        .find("tests/run.sh")
        .expect("the test command ends it");
    let section = &section[..end];
    let mut out = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        // A fenced block: its lines are commands.
        if let Some(block) = after.strip_prefix("``sh\n") {
            let close = block.find("```").unwrap();
            out.extend(block[..close].lines().map(str::to_string));
            rest = &block[close + 3..];
            continue;
        }
        let Some(close) = after.find('`') else { break };
        let span = after[..close]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if span.starts_with("cargo run -- ") || span.starts_with("curl ") {
            out.push(span);
        }
        rest = &after[close + 1..];
    }
    out
}

/// Split a command as a POSIX shell would for what the README writes
/// (words, and single-quoted strings).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in command.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

/// The repository's configuration, copied to `dir` as a user's checkout.
fn checkout(dir: &Path, port: u16) {
    for d in [
        "runbooks",
        "hosts",
        "kill-switch",
        "tools",
        "tests/fixtures/alertmanager",
    ] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
        for entry in std::fs::read_dir(repo().join(d)).unwrap() {
            let p = entry.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, dir.join(d).join(p.file_name().unwrap())).unwrap();
            }
        }
    }
    let settings = std::fs::read_to_string(repo().join("runwarden.yaml")).unwrap();
    assert!(settings.contains("127.0.0.1:9731"), "{settings}");
    std::fs::write(
        dir.join("runwarden.yaml"),
        settings.replace("127.0.0.1:9731", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
}

/// The command as this test runs it: the shipped binary for `cargo run
/// --`, the test's port for 9731.
fn command(line: &str, port: u16, dir: &Path) -> Command {
    let line = line.replace("127.0.0.1:9731", &format!("127.0.0.1:{port}"));
    let words = words(&line);
    let (program, args) = match words.first().map(String::as_str) {
        Some("cargo") => {
            assert_eq!(&words[..3], ["cargo", "run", "--"], "{line}");
            (crate::shipped(), words[3..].to_vec())
        }
        Some("curl") => ("/usr/bin/curl".into(), words[1..].to_vec()),
        _ => panic!("not a command of the quick start: {line}"),
    };
    let mut c = Command::new(program);
    c.args(args).current_dir(dir);
    c
}

#[test]
fn the_quick_start_as_the_readme_writes_it() {
    let commands = commands();
    let expected = [
        "cargo run -- serve",
        "curl 127.0.0.1:9731/api/v1/runs",
        "curl 127.0.0.1:9731/metrics",
        "cargo run -- audit verify",
        "cargo run -- run local-health --host local --via-daemon http://127.0.0.1:9731",
        "cargo run -- alerts test tests/fixtures/alertmanager/firing-two-alerts.json",
    ];
    for want in expected {
        assert!(
            commands.iter().any(|c| c == want),
            "{want:?} not in {commands:#?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    checkout(dir.path(), port);
    let mut daemon = None;
    let mut said = Vec::new();
    for line in &commands {
        if line.ends_with("-- serve") {
            let mut c = command(line, port, dir.path());
            let child = c
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            daemon = Some(Proc(child));
            wait_for("the daemon to listen", Duration::from_secs(20), || {
                http(&format!("127.0.0.1:{port}"), "GET", "/healthz", "").map(|_| ())
            });
            continue;
        }
        assert!(daemon.is_some(), "serve comes first: {commands:#?}");
        // What a person reads is its standard output (curl's progress
        // meter goes to standard error).
        let out = command(line, port, dir.path()).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{line}: exit {:?}: {text}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        said.push((line.clone(), text));
    }
    let of = |prefix: &str| -> &str {
        &said
            .iter()
            .find(|(l, _)| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} ran"))
            .1
    };
    assert!(
        of("cargo run -- run local-health").contains("verdict: ok"),
        "{said:#?}"
    );
    assert!(of("curl 127.0.0.1:9731/metrics").contains("runwarden_audit_write_failures_total 0"));
    serde_json::from_str::<Value>(of("curl 127.0.0.1:9731/api/v1/runs")).unwrap();
    assert!(
        of("cargo run -- alerts test").contains("disk-almost-full"),
        "{said:#?}"
    );
    let posted = said
        .iter()
        .find(|(l, _)| l.contains("/api/v1/alerts"))
        .map(|(_, t)| serde_json::from_str::<Value>(t).unwrap())
        .expect("the notification was posted");
    assert!(posted.to_string().contains("started"), "{posted:#}");
    // The run through the daemon, and the notification's, in the audit log.
    let verify = command("cargo run -- audit verify", port, dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && text.contains("chain intact"),
        "{text}"
    );
    drop(daemon);
}

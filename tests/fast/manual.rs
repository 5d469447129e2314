//! The manual holds together: the README (the front page) and `docs/`
//! link only to files and sections that are there, the alert rules'
//! `runbook_url`s land on a section of the alerts page, and every command
//! of the on-call card is one `--help` knows, with every option it shows.
//! The man page prints the card and the exit codes from the README itself
//! (`src/cli/man.rs`), so they are checked once, here.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::{Path, runwarden_ok};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 13, "docs/ has a page per task: {docs:?}");
    out.extend(docs);
    out
}

/// Markdown outside fenced blocks and inline code: where links and
/// headings are.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") {
            continue;
        }
        let kept: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        out.push(kept);
    }
    out
}

/// The anchors GitHub gives a page's headings: lower case, punctuation
/// but `-` and `_` dropped, spaces as `-`, a repeated one numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(title) = line.strip_prefix('#').filter(|_| !fenced) else {
            continue;
        };
        let title = title.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while out.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        out.insert(candidate);
    }
    out
}

/// Every `[text](target)` of a page's prose.
fn links(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    prose(text)
        .iter()
        .flat_map(|l| {
            re.captures_iter(l)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_relative_link_and_anchor_of_the_manual_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = match path {
                "" => page.clone(),
                p => page.parent().unwrap().join(p),
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if !anchor.is_empty() {
                let there = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&there).contains(anchor) {
                    broken.push(format!("{}: {link}: no such section", page.display()));
                }
            }
        }
    }
    assert!(checked > 30, "the links were found: {checked}");
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn every_alert_rule_links_its_section_of_the_alerts_page() {
    let rules = std::fs::read_to_string(root().join("alerts/runwarden.rules.yml")).unwrap();
    let page = anchors(&std::fs::read_to_string(root().join("docs/alerts.md")).unwrap());
    let mut seen = 0;
    let alert = regex::Regex::new(r"- alert: (\w+)").unwrap();
    let url =
        regex::Regex::new(r"runbook_url: https://runwarden\.example\.org/docs/(\S+)").unwrap();
    let names: Vec<String> = alert
        .captures_iter(&rules)
        .map(|c| c[1].to_string())
        .collect();
    for c in url.captures_iter(&rules) {
        seen += 1;
        let (file, anchor) = c[1].split_once('#').expect("an anchor");
        assert_eq!(file, "alerts.md", "{}", &c[0]);
        assert!(
            page.contains(anchor),
            "docs/alerts.md has no section {anchor}"
        );
    }
    assert_eq!(seen, names.len(), "every alert has a runbook_url");
    for name in names {
        assert!(
            page.contains(&name.to_lowercase()),
            "docs/alerts.md has no section for {name}"
        );
    }
}

/// The README's on-call card: its commands, as typed.
fn card() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let card = readme
        .split_once("<!-- on-call card")
        .and_then(|(_, rest)| rest.split_once("<!-- end"))
        .expect("the README has the on-call card")
        .0;
    let block = card
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a shell block in the card")
        .0;
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn every_command_of_the_on_call_card_is_one_help_knows() {
    let card = card();
    assert!(
        card.iter().any(|c| c.contains("kill-switch engage"))
            && card.iter().any(|c| c.contains("kill-switch release"))
            && card.iter().any(|c| c.contains("kill-switch status")),
        "the card stops, looks and releases: {card:#?}"
    );
    for command in card {
        let words: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(words[0], "runwarden", "{command}");
        // The subcommands: the words before the first option or value.
        let path: Vec<&str> = words[1..]
            .iter()
            .take_while(|w| {
                w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-')
            })
            .copied()
            .collect();
        let mut args: Vec<&std::ffi::OsStr> = path.iter().map(|w| w.as_ref()).collect();
        args.push("--help".as_ref());
        let help = runwarden_ok(&args);
        for option in words.iter().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(option),
                "`runwarden {} --help` does not know {option} (the card says `{command}`)",
                path.join(" ")
            );
        }
    }
}

#[test]
fn the_manual_page_prints_the_card_and_the_exit_codes_of_the_readme() {
    let man = runwarden_ok(&["man".as_ref()]);
    for command in card() {
        assert!(
            man.contains(&command.replace('-', "\\-")),
            "the manual page lacks `{command}`"
        );
    }
    for code in ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "75"] {
        assert!(
            man.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "the manual's exit status lacks {code}"
        );
    }
    assert!(man.contains("\\fBunresolved\\fR: "), "{man}");
}

#[test]
fn the_front_page_stays_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines: move detail to docs/"
    );
    for page in pages().iter().skip(1) {
        let name = page.file_name().unwrap().to_string_lossy();
        assert!(
            readme.contains(&format!("(docs/{name})")),
            "the README's map of docs/ lacks {name}"
        );
    }
}

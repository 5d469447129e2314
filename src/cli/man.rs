//! `runwarden man`: the manual pages, generated from the command line's own
//! definitions (so they never disagree with `--help`), with what only a
//! manual says: exit status, files, and what on-call types.

use std::io::Write;
use std::path::Path;

use super::{Cli, Exit, Failed};

/// The README's front page: the on-call card and the exit codes are
/// written there once, and the manual prints them from it.
const README: &str = include_str!("../../README.md");

/// What the README holds between `<!-- MARK` and `<!-- end`.
fn marked(mark: &str) -> &'static str {
    README
        .split_once(&format!("<!-- {mark}"))
        .and_then(|(_, rest)| rest.split_once("-->"))
        .and_then(|(_, rest)| rest.split_once("<!-- end"))
        .map_or("", |(block, _)| block)
}

/// Text as roff reads it literally: backslashes and dashes escaped, no
/// line taken for a request.
fn roff(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    match t.starts_with(['.', '\'']) {
        true => format!("\\&{t}"),
        false => t,
    }
}

/// Markdown's inline code as bold.
fn bold_code(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in roff(text).split('`').enumerate() {
        match i % 2 {
            1 => out += &format!("\\fB{part}\\fR"),
            _ => out += part,
        }
    }
    out
}

/// The sections after the generated ones, in roff: exit status and
/// on-call from the README, files from here.
fn extra() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for row in marked("exit codes").lines() {
        let cells: Vec<&str> = row
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let [code, verdict, meaning] = cells[..] else {
            continue;
        };
        if !code.chars().all(|c| c.is_ascii_digit()) || code.is_empty() {
            continue;
        }
        let verdict = match verdict {
            "-" => String::new(),
            v => format!("{}: ", bold_code(v)),
        };
        out += &format!(".TP\n\\fB{code}\\fR\n{verdict}{}\n", bold_code(meaning));
    }
    out += FILES;
    out += ".SH ON\\-CALL\n.nf\n";
    let card = marked("on-call card");
    let block = card
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map_or("", |(block, _)| block);
    for line in block.lines() {
        out += &roff(line);
        out.push('\n');
    }
    out += ".fi\n";
    out
}

/// The files a person looks for, in roff.
const FILES: &str = r#".SH FILES
.TP
\fI/etc/runwarden\fR
The packaged configuration directory: \fIrunwarden.yaml\fR, \fIhosts/*.yaml\fR, \fIrunbooks/*.yaml\fR, \fItools/*.yaml\fR, the secret files, and \fIagent.yaml\fR (this machine's agent policy). Commands use \fB\-\-config\fR, else \fBRUNWARDEN_CONFIG\fR, else the current directory if it holds \fIrunwarden.yaml\fR, else this directory.
.TP
\fI/etc/runwarden/kill\-switch/\fR
The kill switch: \fIENGAGED\fR stops every run, \fIRUNBOOK.ENGAGED\fR one runbook's.
.TP
\fI/var/lib/runwarden/\fR
The daemon's state: \fIaudit.jsonl\fR (the hash\-chained audit log) and its closed segments, \fIpermit.key\fR, run locks.
.TP
\fI/var/lib/runwarden\-agent/\fR
Root's agent: its own audit log and the record of the permits it spent.
"#;

/// Print the main page, or write every page (one per subcommand) to `dir`.
pub(super) fn man(dir: Option<&Path>) -> Exit {
    // No `help` subcommand: it would be listed as a page that is not there.
    let cmd = <Cli as clap::CommandFactory>::command().disable_help_subcommand(true);
    let mut main = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut main)
        .and_then(|()| main.write_all(extra().as_bytes()))
        .map_err(|e| Failed::code(1, format!("cannot render the manual page: {e}")))?;
    let Some(dir) = dir else {
        print!("{}", String::from_utf8_lossy(&main));
        return Ok(0);
    };
    let wrote = |e: std::io::Error| {
        Failed::code(
            1,
            format!("cannot write the manual pages to {}: {e}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(wrote)?;
    clap_mangen::generate_to(cmd, dir).map_err(wrote)?;
    std::fs::write(dir.join("runwarden.1"), &main).map_err(wrote)?;
    let mut pages: Vec<String> = std::fs::read_dir(dir)
        .map_err(wrote)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".1"))
        .collect();
    pages.sort();
    for p in pages {
        println!("{}", dir.join(p).display());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code the binary exits with has its row in the table the
    /// README and `runwarden man` print.
    #[test]
    fn the_exit_table_has_a_row_for_every_code_the_binary_exits_with() {
        let table = marked("exit codes");
        let mut codes: Vec<i32> = crate::verdict::Verdict::ALL
            .iter()
            .map(|v| v.exit_code())
            .collect();
        codes.extend([
            super::super::EXIT_USAGE,
            super::super::EXIT_SOFTWARE,
            super::super::EXIT_BUSY,
        ]);
        for code in codes {
            assert!(
                table.lines().any(|l| l.starts_with(&format!("| {code} |"))),
                "exit code {code} has no row in the README's exit table:\n{table}"
            );
        }
    }
}

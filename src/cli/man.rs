//! `runwarden man`: the manual pages, generated from the command line's own
//! definitions (so they never disagree with `--help`), with what only a
//! manual says: exit status, files, and what on-call types.

use std::io::Write;
use std::path::Path;

use super::{Cli, Exit, Failed};

/// The sections after the generated ones, in roff.
const EXTRA: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success: a run's verdict \fBok\fR, a clean \fBcheck\fR or \fBaudit verify\fR, a released kill switch (\fBkill-switch status\fR).
.TP
\fB1\fR
A run \fBfailed\fR; \fBkill-switch status\fR: a switch is engaged.
.TP
\fB2\fR
Usage or configuration error (nothing ran), a broken audit chain, or no configuration found.
.TP
\fB3\fR, \fB4\fR, \fB5\fR, \fB6\fR
A run's verdict: \fBdenied\fR, \fBstep_limit\fR, \fBbudget_exhausted\fR, \fBbroken\fR (or, through the daemon, \fBinterrupted\fR).
.TP
\fB7\fR
\fBhalted\fR: the kill switch stopped the run, or refused to start it.
.TP
\fB75\fR
Another run of this runbook on this host is in progress: nothing ran, try again.
.SH FILES
.TP
\fI/etc/runwarden\fR
The packaged configuration directory: \fIrunwarden.yaml\fR, \fIhosts/*.yaml\fR, \fIrunbooks/*.yaml\fR, the secret files, and \fIagent.yaml\fR (this machine's agent policy). Commands use \fB\-\-config\fR, else \fBRUNWARDEN_CONFIG\fR, else the current directory if it holds \fIrunwarden.yaml\fR, else this directory.
.TP
\fI/etc/runwarden/kill\-switch/\fR
The kill switch: \fIENGAGED\fR stops every run, \fIRUNBOOK.ENGAGED\fR one runbook's.
.TP
\fI/var/lib/runwarden/\fR
The daemon's state: \fIaudit.jsonl\fR (the hash\-chained audit log), \fIpermit.key\fR, run locks.
.TP
\fI/var/lib/runwarden\-agent/\fR
Root's agent: its own audit log and the record of the permits it spent.
.SH ON\-CALL
.nf
runwarden kill\-switch engage \-\-reason "INC\-123"            # stop every run, now
runwarden kill\-switch engage \-\-reason "..." \-\-for 2h       # releases itself
runwarden kill\-switch status                              # what is engaged, where, how long
runwarden kill\-switch release                             # says what stays engaged
runwarden runs \-\-since 12h                                 # what ran, and which alert started it
runwarden transcript RUN_ID                               # one run as a person reads it
runwarden audit verify                                    # the chain, and the journal's heads
journalctl \-u runwarden \-p warning                         # warnings and errors only
.fi
"#;

/// Print the main page, or write every page (one per subcommand) to `dir`.
pub(super) fn man(dir: Option<&Path>) -> Exit {
    // No `help` subcommand: it would be listed as a page that is not there.
    let cmd = <Cli as clap::CommandFactory>::command().disable_help_subcommand(true);
    let mut main = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut main)
        .and_then(|()| main.write_all(EXTRA.as_bytes()))
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

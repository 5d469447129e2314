//! The command line: clap types (`args`), one module per command family,
//! and [`main`], which runs a parsed command and returns its exit code.
//! Messages and exit codes are decided here and nowhere in the library:
//! each command returns an [`Exit`], its exit code or a [`Failed`] that
//! [`main`] says once (`runwarden: ...` on stderr) before it exits with
//! that failure's code.
//!
//! Exit codes: 0 success; 1 a run failed (see [`crate::verdict::Verdict::exit_code`] for the
//! others of `run`); 2 usage or configuration error, or a broken audit chain.

mod alerts;
mod approvals;
mod args;
mod check;
mod db;
mod history;
mod host;
mod killswitch;
mod man;
mod promote;
mod rollout;
mod run;

use std::path::PathBuf;

use crate::audit;
use crate::run::RunRequest;

use args::{
    AlertsCommand, ApprovalsCommand, AuditCommand, Command, DbCommand, HostCommand, InstallCommand,
    KillSwitchCommand,
};
pub use args::{Cli, LogFormat};

use approvals::approvals;
use check::{check, tools};
use history::{audit_show, audit_verify, promote_report, runs, transcript};
use host::{agent, host_check, install_print};
use killswitch::kill_switch;
use run::{read_alert, run, via_daemon};

/// Exit code for usage and configuration errors.
pub(crate) const EXIT_USAGE: i32 = 2;
/// `run`: another run of the runbook on the host holds its lock (EX_TEMPFAIL).
pub(crate) const EXIT_BUSY: i32 = crate::rules::exit::TRY_AGAIN;
/// `check`, `serve`: this binary carries a constant that does not compile
/// (EX_SOFTWARE): a build problem, named (see [`crate::compiled`]).
pub(crate) const EXIT_SOFTWARE: i32 = 70;

/// A command that could not do what it was asked: the one message [`main`]
/// prints for it, on stderr, and the exit code. Commands return
/// [`Exit`]: `Ok` carries a code the command's own result decided (a run's
/// verdict, a check's findings), already reported on stdout.
#[derive(Debug)]
pub(crate) struct Failed {
    code: i32,
    /// Lines printed as they are, first: the loader's problems, each
    /// naming its own FILE:LINE:COLUMN.
    listing: Option<String>,
    /// Then one line, `runwarden: ...`.
    error: Option<anyhow::Error>,
}

impl Failed {
    /// A usage or configuration error (exit 2).
    pub(crate) fn usage(e: impl std::fmt::Display) -> Failed {
        Failed::code(EXIT_USAGE, e)
    }

    /// Exit `code`, saying `e`.
    pub(crate) fn code(code: i32, e: impl std::fmt::Display) -> Failed {
        Failed {
            code,
            listing: None,
            error: Some(anyhow::anyhow!("{e}")),
        }
    }

    /// The configuration loader's problems (exit 2), as it wrote them.
    pub(crate) fn listing(problems: impl std::fmt::Display) -> Failed {
        Failed {
            code: EXIT_USAGE,
            listing: Some(problems.to_string()),
            error: None,
        }
    }

    /// The problems, then what they come to.
    pub(crate) fn then(mut self, summary: impl std::fmt::Display) -> Failed {
        self.error = Some(anyhow::anyhow!("{summary}"));
        self
    }

    /// Say it, once, and give the exit code.
    fn report(self) -> i32 {
        let err = crate::logging::prefix(crate::logging::Priority::Err);
        // Each line gets the priority, and whatever a message quotes (a
        // lock file's holder, a file's name) is shown escaped: a quoted
        // `\n<0>` can neither start a journal record of its own nor move
        // a terminal's cursor.
        if let Some(listing) = self.listing {
            for line in crate::text::printable(&listing).lines() {
                eprintln!("{err}{line}");
            }
        }
        if let Some(error) = self.error {
            let said = crate::chain_text(error.chain().map(|e| e.to_string()));
            for line in crate::text::printable(&format!("runwarden: {said}")).lines() {
                eprintln!("{err}{line}");
            }
        }
        self.code
    }
}

impl From<anyhow::Error> for Failed {
    fn from(error: anyhow::Error) -> Failed {
        Failed {
            code: EXIT_USAGE,
            listing: None,
            error: Some(error),
        }
    }
}

/// What a command comes to: its exit code, or why it could not do its work.
pub(crate) type Exit = Result<i32, Failed>;

/// The configuration directory a command works on: `--config`, else
/// `RUNWARDEN_CONFIG`, else the current directory if it holds a
/// `runwarden.yaml`, else `/etc/runwarden` (the package's). With none of
/// these the command refuses (exit 2), naming what it looked for: a command
/// typed from the wrong directory must never act on a directory no daemon
/// reads (a kill switch engaged in `./kill-switch` stops nothing).
pub(crate) fn config_dir(given: Option<PathBuf>) -> Result<PathBuf, Failed> {
    // Named: it must be there (a typo must not become a new directory of
    // kill-switch files nothing reads).
    let named = given.map(|d| (d, "--config")).or_else(|| {
        std::env::var_os("RUNWARDEN_CONFIG")
            .filter(|d| !d.is_empty())
            .map(|d| (PathBuf::from(d), "RUNWARDEN_CONFIG"))
    });
    if let Some((dir, how)) = named {
        return match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(dir),
            Ok(_) => Err(Failed::usage(format!(
                "{how} {}: not a directory (give the directory that holds runwarden.yaml)",
                dir.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failed::usage(format!(
                "{how} {} does not exist (give the directory that holds runwarden.yaml, the one the daemon runs with)",
                dir.display()
            ))),
            Err(e) => Err(Failed::usage(format!(
                "{how} {}: {e} (give the directory that holds runwarden.yaml, the one the daemon runs with)",
                dir.display()
            ))),
        };
    }
    let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    if here.join("runwarden.yaml").is_file() {
        trusted(&here)?;
        return Ok(PathBuf::from("."));
    }
    let packaged = std::path::Path::new(PACKAGED_CONFIG);
    if packaged.is_dir() {
        return Ok(packaged.to_path_buf());
    }
    Err(Failed::usage(format!(
        "which configuration? No --config, no RUNWARDEN_CONFIG, no runwarden.yaml in {} and no {PACKAGED_CONFIG}: give --config DIR (the directory the daemon runs with)",
        here.display()
    )))
}

/// A configuration found in the current directory (not named) is used
/// only if it could have been written by no one but this user or root:
/// `runwarden.yaml` and its directory owned by either and writable by no
/// other (group or others). Root typing a command in another user's
/// checkout would otherwise run that user's hosts, binaries and runbooks.
fn trusted(here: &std::path::Path) -> Result<(), Failed> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    for path in [here.to_path_buf(), here.join("runwarden.yaml")] {
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| Failed::usage(format!("{}: {e}", path.display())))?;
        let owner = meta.uid();
        let why = if meta.file_type().is_symlink() {
            "is a symbolic link".to_string()
        } else if owner != me && owner != 0 {
            let name = nix::unistd::User::from_uid(owner.into())
                .ok()
                .flatten()
                .map_or(owner.to_string(), |u| u.name);
            format!("is owned by {name}, not by you or root")
        } else if meta.mode() & 0o022 != 0 {
            format!(
                "is writable by {}",
                if meta.mode() & 0o002 != 0 {
                    "everyone"
                } else {
                    "its group"
                }
            )
        } else {
            continue;
        };
        return Err(Failed::usage(format!(
            "the configuration found in the current directory is not trusted: {} {why}, so someone else could choose what runs as you. Name it to use it anyway (--config {} or RUNWARDEN_CONFIG), or run from another directory",
            path.display(),
            here.display()
        )));
    }
    Ok(())
}

/// Where the package puts the configuration.
pub(crate) const PACKAGED_CONFIG: &str = "/etc/runwarden";

/// Run a parsed command; returns the process exit code. Every failure is
/// said here, once.
pub async fn main(cli: Cli) -> i32 {
    dispatch(cli).await.unwrap_or_else(Failed::report)
}

/// One arm per command, each a call into its command's module: long as the
/// command list is long, with nothing in it but the routing.
async fn dispatch(cli: Cli) -> Exit {
    match cli.command {
        Command::Check {
            config,
            json: false,
        } => check(&config_dir(config)?).await,
        Command::Check { config, json: true } => check::check_json(&config_dir(config)?),
        Command::Tools { json, config, host } => {
            // Named: it must be there. Not named and none found: the
            // built-ins alone, said so.
            let dir = match config {
                Some(c) => Some(config_dir(Some(c))?),
                None if host.is_some() => Some(config_dir(None)?),
                None => config_dir(None).ok(),
            };
            tools(json, dir.as_deref(), host.as_deref())
        }
        // Both are written to memory first, then printed the way every other
        // output is (a closed stdout ends the command quietly, as 141).
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut cmd, "runwarden", &mut text);
            print!("{}", String::from_utf8_lossy(&text));
            Ok(0)
        }
        Command::Man { dir } => man::man(dir.as_deref()),
        Command::Mcp {
            runbook,
            host,
            config,
        } => {
            let runner = run::runner(&config_dir(config)?).await?;
            match crate::mcp::stdio::serve(runner, &runbook, &host).await {
                Ok(Some(report)) => Ok(report.verdict.exit_code()),
                Ok(None) => Ok(0),
                Err(why) => Err(Failed::usage(why)),
            }
        }
        Command::Run {
            runbook,
            host,
            all_hosts,
            via_daemon: Some(daemon),
            token_file,
            dry_run,
            no_wait,
            json,
            ..
        } => {
            let ask = run::ViaDaemon {
                base: &daemon,
                token_file: token_file.as_deref(),
                wait: !no_wait,
                json,
            };
            via_daemon(ask, &runbook, &host, all_hosts, dry_run).await
        }
        Command::Run {
            runbook,
            host,
            dry_run,
            config,
            json,
            planner,
            alert,
            ..
        } => {
            let [host] = <[String; 1]>::try_from(host).map_err(|_| {
                Failed::usage("give one --host (several, or --all-hosts, go through the daemon: --via-daemon URL)")
            })?;
            let mut req = RunRequest::cli(runbook, host, dry_run);
            req.planner = planner;
            if let Some(file) = alert {
                req.alert = Some(read_alert(&file).map_err(Failed::usage)?);
            }
            run(&config_dir(config)?, req, json).await
        }
        Command::Transcript { run_id, config } => transcript(&run_id, &config_dir(config)?),
        Command::Runs {
            runbook,
            host,
            limit,
            json,
            config,
            fleet: true,
            ..
        } => history::fleet_runs(runbook, host, limit, json, &config_dir(config)?).await,
        Command::Runs {
            runbook,
            host,
            status,
            since,
            limit,
            json,
            config,
            fleet: false,
        } => runs(
            audit::runs::Filter {
                runbook,
                host,
                status,
                since: None,
                limit: Some(limit),
            },
            since.as_deref(),
            json,
            &config_dir(config)?,
        ),
        Command::Serve { config, listen } => serve(config_dir(config)?, listen).await,
        Command::Agent {
            stdio,
            policy,
            audit,
            request_timeout,
            idle_timeout,
        } => {
            let timeouts = crate::agent::Timeouts {
                first_request: request_timeout,
                idle: idle_timeout,
            };
            agent(stdio, &policy, &audit, timeouts).await
        }
        Command::Install {
            command: InstallCommand::Print { host, config },
        } => install_print(&host, &config_dir(config)?),
        Command::Host {
            command: HostCommand::Check { host, config },
        } => host_check(&host, &config_dir(config)?).await,
        Command::Approvals {
            command,
            daemon,
            token_file,
            config,
        } => approvals(command, daemon, token_file, &config_dir(config)?).await,
        Command::Rollout {
            command,
            daemon,
            token_file,
            config,
        } => rollout::rollout(command, daemon, token_file, &config_dir(config)?).await,
        Command::PromoteReport {
            runbook,
            since,
            json,
            config,
        } => promote_report(&runbook, &since, json, &config_dir(config)?).await,
        Command::Promote {
            runbook,
            reason,
            force,
            config,
        } => promote::promote(&runbook, &reason, force, &config_dir(config)?).await,
        Command::Audit {
            command: AuditCommand::Verify { file, config, head },
        } => audit_verify(file, &config_dir(config)?, head),
        Command::Audit {
            command:
                AuditCommand::Show {
                    run_id,
                    config,
                    json,
                },
        } => audit_show(&run_id, &config_dir(config)?, json),
        Command::KillSwitch { command } => kill_switch(command).await,
        Command::Db { command } => db::db(command).await,
        Command::Alerts {
            command:
                AlertsCommand::Test {
                    file,
                    json,
                    plan,
                    config,
                },
        } => alerts::alerts_test(&file, &config_dir(config)?, json, plan).await,
    }
}

async fn serve(config_dir: PathBuf, listen: Option<std::net::SocketAddr>) -> Exit {
    crate::app::compile_constants().map_err(|e| Failed::code(EXIT_SOFTWARE, e))?;
    let opts = crate::app::ServeOptions { config_dir, listen };
    let (ready, listening) = tokio::sync::oneshot::channel::<crate::app::Listening>();
    let say = tokio::spawn(async move {
        if let Ok(l) = listening.await {
            println!(
                "{}runwarden: listening on {}; {} runbook(s), {} host(s)",
                crate::logging::prefix(crate::logging::Priority::Info),
                l.addr,
                l.runbooks,
                l.hosts
            );
        }
    });
    let served = crate::app::serve(opts, shutdown_signal(), Some(ready)).await;
    say.abort();
    served?;
    Ok(0)
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

//! The command line's shape: clap types, one variant per subcommand.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::planner::PlannerChoice;

#[derive(Debug, Parser)]
#[command(
    name = "runwarden",
    version = crate::VERSION,
    about = "Runbook-scoped remediation runner: narrow typed tools, one gate, a hash-chained audit log"
)]
/// The command line, parsed by clap; the binary hands it to [`super::main`].
pub struct Cli {
    #[command(subcommand)]
    /// What to do.
    pub(crate) command: Command,
    /// Log level or filter (`info`, `debug`, `runwarden=debug`); overrides
    /// RUNWARDEN_LOG. Default: `info` for serve, `warn` for other commands.
    #[arg(long, global = true)]
    pub(crate) log_level: Option<String>,
    /// `text` (the default) or `json`, one object per line, for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Plain lines, coloured on a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

impl Cli {
    /// The log filter: `--log-level`, else RUNWARDEN_LOG, else the command's default.
    pub fn log_filter(&self) -> String {
        // The MCP library's own lines are about the protocol (a client
        // trying a newer revision first, each session's handshake): only
        // its errors are the operator's business.
        let default = match self.command {
            Command::Serve { .. } => "info,rmcp=error",
            _ => "warn,rmcp=error",
        };
        self.log_level
            .clone()
            .or_else(|| std::env::var("RUNWARDEN_LOG").ok())
            .unwrap_or_else(|| default.to_string())
    }

    /// Whether the command is the daemon, whose main thread must never wait
    /// on a tool (its runs have threads of their own).
    pub fn is_daemon(&self) -> bool {
        matches!(self.command, Command::Serve { .. })
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Load and validate runwarden.yaml, hosts/ and runbooks/; print every problem as FILE:LINE:COLUMN.
    Check {
        /// One JSON object: ok, the problems (file, line, column, message), the warnings, the hosts and runbooks.
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell), generated
    /// from these very definitions; the package installs them.
    Completions {
        /// The shell to print them for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from these very definitions.
    Man {
        /// Write every page (the main one and one per subcommand) into this
        /// directory and list them, instead of printing the main page.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List every tool, built-in and declared in tools/, with its tier,
    /// description and argument schema.
    Tools {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Each schema as a model and an agent get it on this host: an
        /// argument its allowlists decide lists their values (`enum`), a
        /// path says the directories it must be under.
        #[arg(long)]
        host: Option<String>,
        /// The configuration directory whose tools/ to list (see `check`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run one runbook on one host through the gate and print the report.
    Run {
        /// The runbook, by name.
        runbook: String,
        /// The host; through the daemon it may repeat.
        #[arg(long, required_unless_present = "all_hosts")]
        host: Vec<String>,
        /// Every host the runbook names (through the daemon, `--via-daemon`).
        #[arg(long, requires = "via_daemon", conflicts_with = "host")]
        all_hosts: bool,
        /// Ask the daemon at this URL to run it (`POST /api/v1/runs`), under its
        /// locks, cooldown, concurrency limit and kill switch, and wait for the verdicts.
        #[arg(long)]
        via_daemon: Option<String>,
        /// The webhook token for `--via-daemon`, when the daemon requires one.
        #[arg(long, requires = "via_daemon")]
        token_file: Option<PathBuf>,
        /// With `--via-daemon`: print each started run's id and return at
        /// once, instead of waiting for its report.
        #[arg(long, requires = "via_daemon")]
        no_wait: bool,
        /// Run tier-1 calls for real; show tier-2 calls as the argv they would run.
        #[arg(long)]
        dry_run: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Who picks the calls: the model for runbooks with an agent goal when
        /// runwarden.yaml configures one (auto), or force one.
        #[arg(long, value_enum, default_value = "auto")]
        planner: PlannerChoice,
        /// Run as if for this alert: a JSON file with `labels` and `annotations`
        /// (one alert), seen by templates as `alert.*`; or a whole Alertmanager
        /// notification (its first firing alert is `alert`, all are `alerts`).
        #[arg(long)]
        alert: Option<PathBuf>,
    },
    /// Serve one MCP session on stdin and stdout: an agent's tool calls are
    /// one run of RUNBOOK on HOST, each through the gate.
    Mcp {
        /// The runbook whose scope the agent works in.
        runbook: String,
        /// The host.
        #[arg(long)]
        host: String,
        /// The configuration directory (see `run`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// List runs from the audit log: every run of any process, across restarts.
    Runs {
        /// Only this runbook's runs.
        #[arg(long)]
        runbook: Option<String>,
        /// Only runs on this host.
        #[arg(long)]
        host: Option<String>,
        /// A verdict (`ok`, `failed`, ...), `running`, `queued` or `interrupted`.
        #[arg(long)]
        status: Option<String>,
        /// A duration back from now (`1h`, `7d`) or an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// The newest this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Every replica's runs, from the shared state (state.postgres), as
        /// `GET /api/v1/fleet/runs` lists them.
        #[arg(long)]
        fleet: bool,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print a run from the audit log as a person reads it: each model turn
    /// (what it was sent, what it answered), each call with the gate's decision, each result.
    Transcript {
        /// The run id (a unique prefix will do).
        run_id: String,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the daemon: cron schedules, the Alertmanager webhook, the kill-switch watcher, metrics.
    Serve {
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on (default: `listen` in runwarden.yaml, else 127.0.0.1:9731).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// On a managed host: the forced-command agent that re-checks and runs each call sent over SSH.
    Agent {
        /// Read requests on stdin, answer on stdout (the only mode).
        #[arg(long)]
        stdio: bool,
        /// This host's own policy: a host file; the host wins over the runner's.
        #[arg(long, default_value = "/etc/runwarden/agent.yaml")]
        policy: PathBuf,
        /// The host's own append-only audit log.
        #[arg(long, default_value = "/var/lib/runwarden/agent-audit.jsonl")]
        audit: PathBuf,
        /// How long a connection may take to send its first request line.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        request_timeout: std::time::Duration,
        /// How long a connection may stay silent after a reply (default: no
        /// limit, for SSH sessions that stay open for a whole run).
        #[arg(long, value_parser = humantime::parse_duration)]
        idle_timeout: Option<std::time::Duration>,
    },
    /// Named hosts: `check` connects, verifies the host key, and compares the host's policy with the host file.
    Host {
        /// What to do with the host.
        #[command(subcommand)]
        command: HostCommand,
    },
    /// Print what an operator installs for a host: agent policy, authorized_keys line, sudoers file, systemd unit.
    Install {
        /// What to print.
        #[command(subcommand)]
        command: InstallCommand,
    },
    /// List, show, approve or deny L2 approval requests (talks to `runwarden serve`).
    Approvals {
        /// What to do with the requests.
        #[command(subcommand)]
        command: ApprovalsCommand,
        /// The daemon's address (default: `listen` from runwarden.yaml).
        #[arg(long, global = true)]
        daemon: Option<String>,
        /// File holding your approver token (default: $RUNWARDEN_APPROVER_TOKEN_FILE).
        #[arg(long, global = true)]
        token_file: Option<PathBuf>,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long, global = true)]
        config: Option<PathBuf>,
    },
    /// What a person needs before raising a runbook's autonomy: runs, proposals, approvals, denials, failed verifications.
    PromoteReport {
        /// The runbook, by name.
        runbook: String,
        /// How far back to look, e.g. 14d.
        #[arg(long, default_value = "14d")]
        since: String,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Give a demoted runbook (`demote_after`) its standing approval back,
    /// on every replica. Refused while the failed runs that demoted it are
    /// in their window, unless --force. Exit 0 when promoted, 1 when refused.
    Promote {
        /// The runbook, by name.
        runbook: String,
        /// Why it is safe again: written to the audit log.
        #[arg(long)]
        reason: String,
        /// Promote even though the failed runs are still in their window.
        #[arg(long)]
        force: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Read the audit log.
    Audit {
        /// What to do with the log.
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Alertmanager notifications: `test FILE` says what each alert would start, or why nothing.
    Alerts {
        /// What to do with a notification.
        #[command(subcommand)]
        command: AlertsCommand,
    },
    /// Stop every run (or one runbook's) at its next call.
    KillSwitch {
        /// What to do with the switch.
        #[command(subcommand)]
        command: KillSwitchCommand,
    },
    /// Fan-outs in waves (`rollout:` in a runbook): list, status, resume a halted one, abort.
    Rollout {
        /// What to do.
        #[command(subcommand)]
        command: RolloutCommand,
        /// The daemon's address (default: `listen` from runwarden.yaml).
        #[arg(long, global = true)]
        daemon: Option<String>,
        /// File holding the API's bearer token (`webhook_token_file`), if it has one.
        #[arg(long, global = true)]
        token_file: Option<PathBuf>,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long, global = true)]
        config: Option<PathBuf>,
    },
    /// The shared state of several daemons (`state.postgres` in runwarden.yaml).
    Db {
        /// What to do with the database.
        #[command(subcommand)]
        command: DbCommand,
    },
}

/// `runwarden db ...`
#[derive(Debug, Subcommand)]
pub(crate) enum DbCommand {
    /// Bring the database's schema to this runwarden's (tables and functions);
    /// safe to run again. Exit 0 when done, 1 when the database refused.
    Migrate {
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Connect with this URL file instead of `state.postgres.url_file`
        /// (the owner's, when the daemons' role may not change the schema).
        #[arg(long)]
        url_file: Option<PathBuf>,
    },
    /// Say whether the database can be reached and its schema is this
    /// runwarden's. Exit 0 when it is, 1 when not.
    Status {
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `runwarden audit ...`
#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Check the hash chain; report the first broken or missing line.
    /// Also checked, where there is a system journal: every head the journal
    /// recorded for this log as runs ended.
    Verify {
        /// The log file (default: the configured audit log).
        file: Option<PathBuf>,
        /// A head recorded elsewhere, as `HASH:LINES` (printed by this command); may repeat.
        #[arg(long, value_parser = clap::value_parser!(crate::audit::head::Head))]
        head: Vec<crate::audit::head::Head>,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print one run's lines in order; an intent without a result is marked.
    Show {
        /// The run id (a unique prefix will do).
        run_id: String,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `runwarden host ...`
#[derive(Debug, Subcommand)]
pub(crate) enum HostCommand {
    /// Exit 0 when the host answers and its policy agrees with the host file, 1 when they differ, 2 when it cannot be reached.
    Check {
        /// The host, by name (its file in hosts/).
        host: String,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `runwarden alerts ...`
#[derive(Debug, Subcommand)]
pub(crate) enum AlertsCommand {
    /// For each alert of a notification (a webhook body, as Alertmanager
    /// sends it), the runbook and host it would start, or why not: which
    /// matcher failed, a host label missing or not the runbook's, the kill
    /// switch, the cooldown. Nothing runs.
    Test {
        /// The notification, e.g. tests/fixtures/alertmanager/firing-two-alerts.json.
        file: PathBuf,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Also take each run it would start through the real gate: every
        /// call with its argv and the gate's first decision, steps that
        /// depend on results not known before they run, a model's scope.
        /// Nothing runs and nothing is written.
        #[arg(long)]
        plan: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `runwarden install ...`
#[derive(Debug, Subcommand)]
pub(crate) enum InstallCommand {
    /// Print the files (nothing is installed).
    Print {
        /// The host, by name (its file in hosts/).
        #[arg(long)]
        host: String,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `runwarden rollout ...`
#[derive(Debug, Subcommand)]
pub(crate) enum RolloutCommand {
    /// Every rollout the daemon knows, newest first.
    List {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One rollout: each wave's hosts and outcomes, and what it waits on.
    /// Exits with its worst verdict's code; a halted or aborted one never 0 or 75 (7 then).
    Status {
        /// The rollout's id (or a prefix of it).
        id: String,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Let a halted rollout go on: the failures so far are accepted, and
    /// max_failures counts from now.
    Resume {
        /// The rollout's id (or a prefix of it).
        id: String,
        /// Why it is safe to go on: written to the audit log.
        #[arg(long)]
        reason: String,
    },
    /// End a rollout: nothing more starts; runs in flight finish.
    Abort {
        /// The rollout's id (or a prefix of it).
        id: String,
        /// Why: written to the audit log.
        #[arg(long)]
        reason: String,
    },
}

/// `runwarden approvals ...`
#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// Every request the daemon holds, pending first.
    List {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One request, with the exact call and its digest.
    Show {
        /// The request id.
        id: String,
    },
    /// Approve the call shown by `show` (its digest is sent along).
    Approve {
        /// The request id.
        id: String,
        /// Why, for the audit log and whoever reads it next.
        #[arg(long, default_value = "")]
        comment: String,
    },
    /// Deny the call.
    Deny {
        /// The request id.
        id: String,
        /// Why, for the audit log and whoever reads it next.
        #[arg(long, default_value = "")]
        comment: String,
    },
}

/// `runwarden kill-switch ...`
#[derive(Debug, Subcommand)]
pub(crate) enum KillSwitchCommand {
    /// Engage: every run stops before its next call.
    Engage {
        /// Why: written into the switch file, shown by `status` and in every refusal.
        #[arg(long)]
        reason: String,
        /// Stop only this runbook.
        #[arg(long)]
        runbook: Option<String>,
        /// Release itself after this long (`2h`, `30m`); without it (or
        /// --until) the switch holds until a person releases it.
        #[arg(long = "for", value_parser = humantime::parse_duration, conflicts_with = "until")]
        for_: Option<std::time::Duration>,
        /// Release itself at this time (RFC 3339, e.g. `2026-12-03T06:00:00Z`).
        #[arg(long)]
        until: Option<jiff::Timestamp>,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Release the switch.
    Release {
        /// Release only this runbook's switch.
        #[arg(long)]
        runbook: Option<String>,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print the state and what each engaged switch file says. Exit 0 when
    /// released, 1 when any switch is engaged, 2 when runwarden.yaml does not load.
    Status {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// The configuration directory (runwarden.yaml, hosts/, runbooks/); default: $RUNWARDEN_CONFIG, else this directory if it holds runwarden.yaml, else /etc/runwarden.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

//! The command line: clap types and one function per subcommand.
//!
//! Exit codes: 0 success; 1 a run failed (see [`Verdict::exit_code`] for the
//! others of `run`); 2 usage or configuration error, or a broken audit chain.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use serde_json::Value;

use crate::audit::{self, AuditLog, Phase};
use crate::config::{Config, Connection};
use crate::gate::KillSwitch;
use crate::planner::PlannerChoice;
use crate::run::{RunReport, RunRequest, Runner, StartError, StepReport, Verdict};
use crate::tools::ToolId;

/// Exit status when stdout is closed under us (`runwarden tools | head`), as
/// for a process killed by SIGPIPE: the command ends quietly, never a panic.
const EXIT_BROKEN_PIPE: i32 = 141;

// `print!`/`println!` that end the process quietly when stdout is closed.
macro_rules! print {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if write!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
    }};
}
macro_rules! println {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
    }};
}

/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: i32 = 2;
/// `run`: another run of the runbook on the host holds its lock (EX_TEMPFAIL).
pub const EXIT_BUSY: i32 = 75;

#[derive(Debug, Parser)]
#[command(
    name = "runwarden",
    version,
    about = "Runbook-scoped remediation runner: narrow typed tools, one gate, a hash-chained audit log"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log level or filter (`info`, `debug`, `runwarden=debug`); overrides
    /// RUNWARDEN_LOG. Default: `info` for serve, `warn` for other commands.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// `text` (the default) or `json`, one object per line, for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Cli {
    /// The log filter: `--log-level`, else RUNWARDEN_LOG, else the command's default.
    pub fn log_filter(&self) -> String {
        let default = match self.command {
            Command::Serve { .. } => "info",
            _ => "warn",
        };
        self.log_level
            .clone()
            .or_else(|| std::env::var("RUNWARDEN_LOG").ok())
            .unwrap_or_else(|| default.to_string())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and validate runwarden.yaml, hosts/ and runbooks/; print every problem as FILE:LINE:COLUMN.
    Check {
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// List every tool with its tier, description and argument schema.
    Tools {
        #[arg(long)]
        json: bool,
    },
    /// Run one runbook on one host through the gate and print the report.
    Run {
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
        /// Run tier-1 calls for real; show tier-2 calls as the argv they would run.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, default_value = ".")]
        config: PathBuf,
        #[arg(long)]
        json: bool,
        /// Who picks the calls: the model for runbooks with an agent goal when
        /// runwarden.yaml configures one (auto), or force one.
        #[arg(long, value_enum, default_value = "auto")]
        planner: PlannerChoice,
        /// Run as if for this alert: a JSON file with `labels` and `annotations`
        /// (one alert of an Alertmanager notification), seen by templates as `alert.*`.
        #[arg(long)]
        alert: Option<PathBuf>,
    },
    /// List runs from the audit log: every run of any process, across restarts.
    Runs {
        #[arg(long)]
        runbook: Option<String>,
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
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// Print a run from the audit log as a person reads it: each model turn
    /// (what it was sent, what it answered), each call with the gate's decision, each result.
    Transcript {
        run_id: String,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// Run the daemon: cron schedules, the Alertmanager webhook, the kill-switch watcher, metrics.
    Serve {
        #[arg(long, default_value = ".")]
        config: PathBuf,
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
    },
    /// Named hosts: `check` connects, verifies the host key, and compares the host's policy with the host file.
    Host {
        #[command(subcommand)]
        command: HostCommand,
    },
    /// Print what an operator installs for a host: agent policy, authorized_keys line, sudoers file, systemd unit.
    Install {
        #[command(subcommand)]
        command: InstallCommand,
    },
    /// List, show, approve or deny L2 approval requests (talks to `runwarden serve`).
    Approvals {
        #[command(subcommand)]
        command: ApprovalsCommand,
        /// The daemon's address (default: `listen` from runwarden.yaml).
        #[arg(long, global = true)]
        daemon: Option<String>,
        /// File holding your approver token (default: $RUNWARDEN_APPROVER_TOKEN_FILE).
        #[arg(long, global = true)]
        token_file: Option<PathBuf>,
        #[arg(long, global = true, default_value = ".")]
        config: PathBuf,
    },
    /// What a person needs before raising a runbook's autonomy: runs, proposals, approvals, denials, failed verifications.
    PromoteReport {
        runbook: String,
        /// How far back to look, e.g. 14d.
        #[arg(long, default_value = "14d")]
        since: String,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// Read the audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Stop every run (or one runbook's) at its next call.
    KillSwitch {
        #[command(subcommand)]
        command: KillSwitchCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain; report the first broken or missing line.
    /// Also checked, where there is a system journal: every head the journal
    /// recorded for this log as runs ended.
    Verify {
        /// The log file (default: the configured audit log).
        file: Option<PathBuf>,
        /// A head recorded elsewhere, as `HASH:LINES` (printed by this command); may repeat.
        #[arg(long, value_parser = clap::value_parser!(crate::audit::head::Head))]
        head: Vec<crate::audit::head::Head>,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// Print one run's lines in order; an intent without a result is marked.
    Show {
        run_id: String,
        #[arg(long, default_value = ".")]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Exit 0 when the host answers and its policy agrees with the host file, 1 when they differ, 2 when it cannot be reached.
    Check {
        host: String,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum InstallCommand {
    /// Print the files (nothing is installed).
    Print {
        #[arg(long)]
        host: String,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// Every request the daemon holds, pending first.
    List,
    /// One request, with the exact call and its digest.
    Show { id: String },
    /// Approve the call shown by `show` (its digest is sent along).
    Approve {
        id: String,
        #[arg(long, default_value = "")]
        comment: String,
    },
    /// Deny the call.
    Deny {
        id: String,
        #[arg(long, default_value = "")]
        comment: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum KillSwitchCommand {
    /// Engage: every run stops before its next call.
    Engage {
        #[arg(long)]
        reason: String,
        /// Stop only this runbook.
        #[arg(long)]
        runbook: Option<String>,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// Release the switch.
    Release {
        #[arg(long)]
        runbook: Option<String>,
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
    /// Print the state and what each engaged switch file says. Exit 0 when
    /// released, 1 when any switch is engaged, 2 when runwarden.yaml does not load.
    Status {
        #[arg(long, default_value = ".")]
        config: PathBuf,
    },
}

/// Run a parsed command; returns the process exit code.
pub async fn main(cli: Cli) -> i32 {
    match cli.command {
        Command::Check { config } => check(&config),
        Command::Tools { json } => tools(json),
        Command::Run {
            runbook,
            host,
            all_hosts,
            via_daemon: Some(daemon),
            token_file,
            dry_run,
            ..
        } => {
            via_daemon(
                &daemon,
                &runbook,
                &host,
                all_hosts,
                dry_run,
                token_file.as_deref(),
            )
            .await
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
            let [host] = <[String; 1]>::try_from(host).unwrap_or_else(|_| {
                eprintln!("runwarden: give one --host (several, or --all-hosts, go through the daemon: --via-daemon URL)");
                std::process::exit(EXIT_USAGE);
            });
            let mut req = RunRequest::cli(runbook, host, dry_run);
            req.planner = planner;
            if let Some(file) = alert {
                match read_alert(&file) {
                    Ok(a) => req.alert = Some(a),
                    Err(e) => {
                        eprintln!("runwarden: {e}");
                        return EXIT_USAGE;
                    }
                }
            }
            run(&config, req, json).await
        }
        Command::Transcript { run_id, config } => transcript(&run_id, &config),
        Command::Runs {
            runbook,
            host,
            status,
            since,
            limit,
            json,
            config,
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
            &config,
        ),
        Command::Serve { config, listen } => serve(config, listen).await,
        Command::Agent {
            stdio,
            policy,
            audit,
        } => agent(stdio, &policy, &audit).await,
        Command::Install {
            command: InstallCommand::Print { host, config },
        } => install_print(&host, &config),
        Command::Host {
            command: HostCommand::Check { host, config },
        } => host_check(&host, &config).await,
        Command::Approvals {
            command,
            daemon,
            token_file,
            config,
        } => approvals(command, daemon, token_file, &config).await,
        Command::PromoteReport {
            runbook,
            since,
            config,
        } => promote_report(&runbook, &since, &config),
        Command::Audit {
            command: AuditCommand::Verify { file, config, head },
        } => audit_verify(file, &config, head),
        Command::Audit {
            command:
                AuditCommand::Show {
                    run_id,
                    config,
                    json,
                },
        } => audit_show(&run_id, &config, json),
        Command::KillSwitch { command } => kill_switch(command),
    }
}

async fn serve(config_dir: PathBuf, listen: Option<std::net::SocketAddr>) -> i32 {
    let opts = crate::app::ServeOptions { config_dir, listen };
    match crate::app::serve(opts, shutdown_signal(), None).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("runwarden: {e:#}");
            EXIT_USAGE
        }
    }
}

async fn approvals(
    command: ApprovalsCommand,
    daemon: Option<String>,
    token_file: Option<PathBuf>,
    dir: &Path,
) -> i32 {
    let base = match daemon {
        Some(d) => d,
        None => match Config::load(dir) {
            Ok(c) => format!("http://{}", c.settings.listen),
            Err(_) => format!("http://{}", crate::config::DEFAULT_LISTEN),
        },
    };
    let Some(file) =
        token_file.or_else(|| std::env::var_os("RUNWARDEN_APPROVER_TOKEN_FILE").map(PathBuf::from))
    else {
        eprintln!(
            "runwarden: give your approver token with --token-file FILE or RUNWARDEN_APPROVER_TOKEN_FILE (never on the command line)"
        );
        return EXIT_USAGE;
    };
    let token = match crate::secret::read_file(&file, "approver token file") {
        Ok(t) => t.trim().to_string(),
        Err(e) => {
            eprintln!("runwarden: {e}");
            return EXIT_USAGE;
        }
    };
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut req = client
            .request(method, format!("{base}{path}"))
            .bearer_auth(&token);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let base = base.clone();
        async move {
            let resp = req.send().await.map_err(|e| {
                format!(
                    "cannot reach the daemon at {base}: {}",
                    crate::error_chain(&e)
                )
            })?;
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if status.is_success() {
                Ok(v)
            } else {
                Err(format!(
                    "{status}: {}",
                    v["error"].as_str().unwrap_or(&v.to_string())
                ))
            }
        }
    };
    let outcome = match command {
        ApprovalsCommand::List => call(reqwest::Method::GET, "/api/v1/approvals".into(), None)
            .await
            .map(|v| {
                for r in v["approvals"].as_array().into_iter().flatten() {
                    println!(
                        "{}  {:<9} {} on {}: {} {}  reason: {}",
                        r["id"].as_str().unwrap_or(""),
                        r["state"].as_str().unwrap_or(""),
                        r["runbook"].as_str().unwrap_or(""),
                        r["host"].as_str().unwrap_or(""),
                        r["tool"].as_str().unwrap_or(""),
                        r["args"],
                        r["reason"].as_str().unwrap_or("")
                    );
                }
            }),
        ApprovalsCommand::Show { id } => call(
            reqwest::Method::GET,
            format!("/api/v1/approvals/{id}"),
            None,
        )
        .await
        .map(|v| println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())),
        ApprovalsCommand::Approve { id, comment } => decide(&call, &id, &comment, true).await,
        ApprovalsCommand::Deny { id, comment } => decide(&call, &id, &comment, false).await,
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("runwarden: {e}");
            1
        }
    }
}

async fn host_check(name: &str, dir: &Path) -> i32 {
    use crate::executor::agent::{AgentRequest, HELLO, allowlists, policy_digest};
    let cfg = match load(dir) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(host) = cfg.hosts.get(name) else {
        eprintln!("runwarden: no host named \"{name}\" in hosts/");
        return EXIT_USAGE;
    };
    let Connection::Ssh(ssh) = &host.connection else {
        println!("host {name} is local: nothing to check");
        return 0;
    };
    let request = AgentRequest {
        run_id: "host-check".into(),
        step: 0,
        runbook: String::new(),
        tool: HELLO.into(),
        args: Value::Null,
        permit: None,
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut once = ssh.clone();
    once.multiplex = false;
    let reply = crate::executor::ssh::Session::new(once, "host-check")
        .call(host, &request, deadline)
        .await;
    if reply.outcome != crate::tools::Outcome::Ok {
        println!(
            "host {name}: {}: {}",
            crate::executor::ssh::failure_kind(&reply),
            reply.error.unwrap_or_default()
        );
        return EXIT_USAGE;
    }
    println!(
        "host {name} ({}:{}): host key verified, agent {}",
        ssh.address,
        ssh.port,
        reply.data["version"].as_str().unwrap_or("?")
    );
    let theirs = &reply.data["policy"];
    let ours = allowlists(host);
    let mut differ = false;
    for (field, mine) in ours.as_object().into_iter().flatten() {
        let set = |v: &Value| -> std::collections::BTreeSet<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        };
        let (mine, host_side) = (set(mine), set(&theirs[field]));
        for only in mine.difference(&host_side) {
            differ = true;
            println!(
                "  {field}: {only:?} is in the host file but not in the host's policy: the host will refuse it"
            );
        }
        for only in host_side.difference(&mine) {
            differ = true;
            println!(
                "  {field}: {only:?} is allowed by the host's policy but not by the host file"
            );
        }
    }
    let digest = policy_digest(host);
    if differ || reply.data["policy_digest"].as_str() != Some(digest.as_str()) {
        println!(
            "policies differ (host file {digest}, host {})",
            reply.data["policy_digest"].as_str().unwrap_or("?")
        );
        1
    } else {
        println!("policies agree ({digest})");
        0
    }
}

fn install_print(host: &str, dir: &Path) -> i32 {
    let cfg = match load(dir) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match cfg.hosts.get(host) {
        Some(h) => {
            print!("{}", crate::install::print(&cfg, h));
            0
        }
        None => {
            eprintln!("runwarden: no host named \"{host}\" in hosts/");
            EXIT_USAGE
        }
    }
}

async fn agent(stdio: bool, policy: &Path, audit_file: &Path) -> i32 {
    if !stdio {
        eprintln!(
            "runwarden: the agent only speaks on stdio: `runwarden agent --stdio` (as an authorized_keys forced command)"
        );
        return EXIT_USAGE;
    }
    let policy = match crate::executor::agent::load_policy(policy) {
        Ok(p) => p,
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({ "refused": format!("the host's policy does not load: {e}") })
            );
            return EXIT_USAGE;
        }
    };
    let log = match AuditLog::open(audit_file) {
        Ok(l) => l,
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({ "refused": format!("the host's audit log cannot be opened, nothing runs: {e}") })
            );
            return Verdict::Broken.exit_code();
        }
    };
    crate::executor::agent::serve_stdio(&policy, &log).await
}

/// Show the call, then decide on exactly that call (its digest goes along).
async fn decide<F, Fut>(call: &F, id: &str, comment: &str, approve: bool) -> Result<(), String>
where
    F: Fn(reqwest::Method, String, Option<Value>) -> Fut,
    Fut: std::future::Future<Output = Result<Value, String>>,
{
    let shown = call(
        reqwest::Method::GET,
        format!("/api/v1/approvals/{id}"),
        None,
    )
    .await?;
    let field = |k: &str| shown[k].as_str().unwrap_or("").to_string();
    let verb = if approve { "approving" } else { "denying" };
    println!(
        "{verb} {} on {}: {} {}",
        field("runbook"),
        field("host"),
        field("tool"),
        shown["args"]
    );
    println!("reason: {}", field("reason"));
    let body = serde_json::json!({ "digest": shown["digest"], "comment": comment });
    let action = if approve { "approve" } else { "deny" };
    let decided = call(
        reqwest::Method::POST,
        format!("/api/v1/approvals/{id}/{action}"),
        Some(body),
    )
    .await?;
    println!("{}", decided["state"].as_str().unwrap_or(""));
    Ok(())
}

fn promote_report(runbook: &str, since: &str, dir: &Path) -> i32 {
    let cfg = match load(dir) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let window = match humantime::parse_duration(since) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("runwarden: --since {since:?} is not a duration ({e}); write e.g. 14d");
            return EXIT_USAGE;
        }
    };
    let from = jiff::Timestamp::now() - jiff::SignedDuration::try_from(window).unwrap_or_default();
    let report = match audit::promotion(&cfg.settings.audit_log, runbook, from) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "runwarden: cannot read {}: {e}",
                cfg.settings.audit_log.display()
            );
            return EXIT_USAGE;
        }
    };
    let autonomy = cfg
        .runbooks
        .get(runbook)
        .map_or("(not in the config)", |r| r.autonomy.as_str());
    println!("runbook {runbook}, autonomy {autonomy}, since {from} ({since})");
    print!("{report}");
    0
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

fn load(dir: &Path) -> Result<Config, i32> {
    Config::load(dir).map_err(|e| {
        eprintln!("{e}");
        eprintln!(
            "runwarden: {} problem(s) in {}; nothing was loaded",
            e.0.len(),
            dir.display()
        );
        EXIT_USAGE
    })
}

fn check(dir: &Path) -> i32 {
    let cfg = match load(dir) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // What `serve` would refuse, `check` refuses too; what it would warn of, check shows.
    match cfg.serve_problems(None) {
        Ok(warnings) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!(
                "runwarden: {} problem(s) that `runwarden serve` would refuse in {}",
                e.0.len(),
                dir.display()
            );
            return EXIT_USAGE;
        }
    }
    for h in cfg.hosts.values() {
        let conn = match &h.connection {
            Connection::Local => "local".to_string(),
            Connection::Ssh(s) => format!("ssh {}@{}:{}", s.user, s.address, s.port),
        };
        println!("host {:<24} {conn:<28} {}", h.name, h.source.display());
    }
    for r in cfg.runbooks.values() {
        println!(
            "runbook {:<21} {} hosts={} observe={} approve={} steps={}{} {}",
            r.name,
            r.autonomy.as_str(),
            r.hosts.iter().map(|h| &**h).collect::<Vec<_>>().join(","),
            r.observe.len(),
            r.approve.len(),
            r.steps.len(),
            match &r.agent {
                Some(a) => format!(" agent(max_steps={})", a.max_steps),
                None => String::new(),
            },
            r.source.display()
        );
    }
    match &cfg.settings.model {
        Some(m) => println!(
            "model {} at {} (timeout {}, {} retries){}",
            m.name,
            m.endpoint,
            humantime::format_duration(m.timeout),
            m.retries,
            match &m.api_key {
                Some(crate::config::ApiKey::Env(v)) => format!(", key from ${v}"),
                Some(crate::config::ApiKey::File(f)) => format!(", key from {}", f.display()),
                None => String::new(),
            }
        ),
        None => println!("model: none configured (runbooks run their steps)"),
    }
    println!(
        "ok: {} host(s), {} runbook(s)",
        cfg.hosts.len(),
        cfg.runbooks.len()
    );
    0
}

fn tools(json: bool) -> i32 {
    if json {
        let list: Vec<Value> = ToolId::ALL
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name(),
                    "tier": t.tier().number(),
                    "description": t.description(),
                    "parameters": t.schema(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
    } else {
        for t in ToolId::ALL {
            println!(
                "{} (tier {})\n    {}\n    parameters: {}\n",
                t.name(),
                t.tier().number(),
                t.description(),
                t.schema()
            );
        }
        println!(
            "Tier 3 (destructive, irreversible) is never a tool: runbooks may only `suggest:` such a command for a person."
        );
    }
    0
}

async fn run(dir: &Path, req: RunRequest, json: bool) -> i32 {
    let cfg = match load(dir) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let audit = match AuditLog::open(&cfg.settings.audit_log) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("runwarden: {e}");
            return Verdict::Broken.exit_code();
        }
    };
    let runner = Runner::new(Arc::new(cfg), audit);
    match runner.run(&req).await {
        Ok(report) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                );
            } else {
                print!("{}", crate::text::printable(&render(&report)));
            }
            report.verdict.exit_code()
        }
        Err(e @ (StartError::Audit(_) | StartError::Lock(_))) => {
            eprintln!("runwarden: {e}");
            Verdict::Broken.exit_code()
        }
        Err(e @ StartError::Busy(_)) => {
            eprintln!("runwarden: {e}; try again when it has ended");
            EXIT_BUSY
        }
        Err(e) => {
            eprintln!("runwarden: {e}");
            EXIT_USAGE
        }
    }
}

/// `run --via-daemon`: start the runs through the daemon, wait for each
/// verdict, exit with the worst one's code (75 when a run was refused as busy).
async fn via_daemon(
    base: &str,
    runbook: &str,
    hosts: &[String],
    all_hosts: bool,
    dry_run: bool,
    token_file: Option<&Path>,
) -> i32 {
    let token = match token_file.map(|f| crate::secret::read_file(f, "webhook token file")) {
        Some(Ok(t)) => Some(t.trim().to_string()),
        Some(Err(e)) => {
            eprintln!("runwarden: {e}");
            return EXIT_USAGE;
        }
        None => None,
    };
    let base = base.trim_end_matches('/');
    let client = reqwest::Client::new();
    let auth = |r: reqwest::RequestBuilder| match &token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    let body = if all_hosts {
        serde_json::json!({ "runbook": runbook, "all_hosts": true, "dry_run": dry_run })
    } else {
        serde_json::json!({ "runbook": runbook, "hosts": hosts, "dry_run": dry_run })
    };
    let answer = auth(client.post(format!("{base}/api/v1/runs")))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    let (status, answer) = match answer {
        Ok(r) => (
            r.status(),
            r.bytes()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .unwrap_or(Value::Null),
        ),
        Err(e) => {
            eprintln!(
                "runwarden: cannot reach the daemon at {base}: {}",
                crate::error_chain(&e)
            );
            return EXIT_USAGE;
        }
    };
    if status != reqwest::StatusCode::ACCEPTED {
        eprintln!(
            "runwarden: the daemon answered {status}: {}",
            answer["error"].as_str().unwrap_or("")
        );
        return EXIT_USAGE;
    }
    let mut worst = 0;
    for o in answer["outcomes"].as_array().into_iter().flatten() {
        let host = o["host"].as_str().unwrap_or("?");
        let Some(id) = o["run_id"].as_str() else {
            let result = o["result"].as_str().unwrap_or("?");
            println!("{host}: not started ({result})");
            worst = worst.max(EXIT_BUSY);
            continue;
        };
        println!("{host}: run {id} started");
        let verdict = loop {
            let run = auth(client.get(format!("{base}/api/v1/runs/{id}")))
                .send()
                .await
                .ok();
            let status = match run {
                Some(r) => r
                    .bytes()
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    .and_then(|v| v["status"].as_str().map(String::from)),
                None => None,
            };
            match status.as_deref() {
                Some("queued" | "running") | None => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await
                }
                Some(v) => break v.to_string(),
            }
        };
        println!("{host}: run {id}: {verdict}");
        let code = verdict
            .parse::<Verdict>()
            .map_or(Verdict::Broken.exit_code(), Verdict::exit_code);
        worst = worst.max(code);
    }
    worst
}

/// The report as a person reads it.
pub fn render(r: &RunReport) -> String {
    let mut s = format!(
        "run {}  runbook {} ({}, {}{})  host {}\n",
        r.run_id,
        r.runbook,
        r.autonomy,
        r.planner,
        if r.dry_run { ", dry run" } else { "" },
        r.host
    );
    for step in &r.steps {
        s += &render_step(step);
    }
    if let Some(answer) = &r.final_answer {
        s += &format!(
            "  final answer of {}:\n",
            r.model.as_deref().unwrap_or("the model")
        );
        for line in answer.lines() {
            s += &format!("     | {line}\n");
        }
    }
    for sug in &r.suggestions {
        s += &format!("  suggestion for a person (tier 3, not run): {sug}\n");
    }
    s += &format!(
        "verdict: {} ({}) in {} ms, {} mutation(s)\n",
        r.verdict.as_str(),
        r.verdict_detail,
        r.duration_ms,
        r.mutations
    );
    s
}

fn render_step(step: &StepReport) -> String {
    let mut s = format!("{:>3}. {:<12} ", step.step, step.id);
    match &step.tool {
        Some(tool) => {
            s += &format!("{tool} {}", compact(&step.args));
            if let Some(t) = step.tier {
                s += &format!("  tier {t}");
            }
            if let Some(a) = &step.approved_by {
                s += &format!("  approved_by {a}");
            }
        }
        None => s += "-",
    }
    let duration = step
        .result
        .as_ref()
        .map(|r| format!("  {} ms", r.duration_ms))
        .unwrap_or_default();
    let verified = match step.result.as_ref().and_then(|r| r.verified) {
        Some(true) => " (verified)",
        Some(false) => " (NOT verified)",
        None => "",
    };
    let status = match step.status.as_str() {
        "dry_run" => "would run (dry run: not run)",
        other => other,
    };
    s += &format!("  => {status}{verified}{duration}\n");
    if let Some(reason) = &step.reason {
        s += &format!("       reason: {reason}\n");
    }
    if let Some(d) = &step.detail {
        s += &format!("       {d}\n");
    }
    for argv in step.argv.iter().flatten() {
        let label = if step.status == "dry_run" {
            "would run"
        } else {
            "argv"
        };
        s += &format!(
            "       {label}: {}\n",
            serde_json::to_string(argv).unwrap_or_default()
        );
    }
    if step.status == "dry_run"
        && let Some(check) = step
            .tool
            .as_deref()
            .and_then(ToolId::from_name)
            .and_then(ToolId::verification)
    {
        s += &format!("       would verify: {check}\n");
    }
    if let Some(res) = &step.result {
        if let Some(e) = &res.error {
            s += &format!("       error: {e}\n");
        }
        if !res.data.is_null() {
            let text = compact(&res.data);
            let cut: String = text.chars().take(600).collect();
            s += &format!(
                "       result: {cut}{}\n",
                if cut.len() < text.len() { " …" } else { "" }
            );
        }
    }
    s
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn audit_path(file: Option<PathBuf>, dir: &Path) -> Result<PathBuf, i32> {
    match file {
        Some(f) => Ok(f),
        // runwarden.yaml alone: the log can be read while a runbook is half edited.
        None => crate::config::Settings::load(dir)
            .map(|s| s.audit_log)
            .map_err(|e| {
                eprintln!("{e}");
                EXIT_USAGE
            }),
    }
}

fn audit_verify(file: Option<PathBuf>, dir: &Path, mut heads: Vec<audit::head::Head>) -> i32 {
    let path = match audit_path(file, dir) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let pinned = heads.len();
    let mut from_journal = None;
    if audit::head::journal_available() {
        match audit::head::journal_heads(&path) {
            Ok(found) => {
                from_journal = Some(found.len());
                heads.extend(found);
            }
            Err(e) => eprintln!("runwarden: {e}; only the chain is checked"),
        }
    }
    let against = match (pinned, from_journal) {
        (0, None) => {
            "no head recorded elsewhere was checked (no journal here): pin the one above with --head"
                .to_string()
        }
        (p, j) => format!(
            "matches {} head(s) recorded elsewhere ({p} pinned, {} from the journal)",
            p + j.unwrap_or(0),
            j.map_or("none".into(), |n| n.to_string())
        ),
    };
    match audit::verify_against(&path, &heads) {
        Ok(v) if v.problems.is_empty() => {
            println!("{}: {} line(s), chain intact", path.display(), v.lines);
            println!("head: {}:{}", v.head, v.lines);
            println!("{against}");
            0
        }
        Ok(v) => {
            for (line, why) in &v.problems {
                println!("{}:{line}: chain broken: {why}", path.display());
            }
            println!(
                "{} problem(s) in {} line(s); the first {} line(s) verify",
                v.problems.len(),
                v.lines,
                v.problems[0].0 - 1
            );
            EXIT_USAGE
        }
        Err(e) => {
            eprintln!("runwarden: cannot read {}: {e}", path.display());
            EXIT_USAGE
        }
    }
}

/// `run --alert FILE`: one alert's labels and annotations, as the webhook would pass them.
fn read_alert(file: &Path) -> Result<Value, String> {
    let text = std::fs::read(file).map_err(|e| format!("--alert {}: {e}", file.display()))?;
    if text.len() > 1 << 20 {
        return Err(format!("--alert {}: larger than 1 MiB", file.display()));
    }
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| format!("--alert {}: not JSON: {e}", file.display()))?;
    let strings = |key: &str| -> Result<Value, String> {
        match &v[key] {
            Value::Null => Ok(Value::Object(Default::default())),
            Value::Object(m) if m.values().all(Value::is_string) => Ok(v[key].clone()),
            _ => Err(format!(
                "--alert {}: `{key}` must be an object of strings",
                file.display()
            )),
        }
    };
    Ok(serde_json::json!({
        "labels": strings("labels")?,
        "annotations": strings("annotations")?,
        "fingerprint": v["fingerprint"].as_str().unwrap_or(""),
    }))
}

fn runs(mut filter: audit::runs::Filter, since: Option<&str>, json: bool, dir: &Path) -> i32 {
    let path = match audit_path(None, dir) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(s) = since {
        match audit::runs::parse_since(s) {
            Ok(t) => filter.since = Some(t),
            Err(e) => {
                eprintln!("runwarden: {e}");
                return EXIT_USAGE;
            }
        }
    }
    let list = match audit::runs::list(&path, &filter) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("runwarden: cannot read {}: {e}", path.display());
            return EXIT_USAGE;
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
        return 0;
    }
    if list.is_empty() {
        println!("no runs in {}", path.display());
        return 0;
    }
    let width = |f: fn(&audit::runs::RunSummary) -> usize| list.iter().map(f).max().unwrap_or(0);
    let (rb, host) = (width(|r| r.runbook.len()), width(|r| r.host.len()));
    println!(
        "{:<30} {:<36} {:<rb$} {:<host$} {:<8} STATUS",
        "STARTED", "RUN", "RUNBOOK", "HOST", "TRIGGER"
    );
    for r in &list {
        let line = format!(
            "{:<30} {:<36} {:<rb$} {:<host$} {:<8} {}",
            r.started_at, r.run_id, r.runbook, r.host, r.trigger, r.status
        );
        println!("{}", crate::text::printable(&line));
    }
    0
}

/// A run id or a unique prefix of one, as given on the command line.
fn run_id_of(path: &Path, given: &str) -> Result<String, i32> {
    audit::runs::resolve(path, given).map_err(|e| {
        eprintln!("runwarden: {e}");
        1
    })
}

fn transcript(run_id: &str, dir: &Path) -> i32 {
    let path = match audit_path(None, dir) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let run_id = &match run_id_of(&path, run_id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    match audit::run_lines(&path, run_id) {
        Ok(lines) if lines.is_empty() => {
            eprintln!("runwarden: no lines for run {run_id} in {}", path.display());
            1
        }
        Ok(lines) => {
            print!(
                "{}",
                crate::text::printable(&crate::transcript::render(&lines))
            );
            0
        }
        Err(e) => {
            eprintln!("runwarden: cannot read {}: {e}", path.display());
            EXIT_USAGE
        }
    }
}

fn audit_show(run_id: &str, dir: &Path, json: bool) -> i32 {
    let path = match audit_path(None, dir) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let run_id = &match run_id_of(&path, run_id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    let lines = match audit::run_lines(&path, run_id) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("runwarden: cannot read {}: {e}", path.display());
            return EXIT_USAGE;
        }
    };
    if lines.is_empty() {
        eprintln!("runwarden: no lines for run {run_id} in {}", path.display());
        return 1;
    }
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
        let phase = e
            .phase
            .map(|p| {
                serde_json::to_value(p)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        let mut line = format!("{} {:<10}", e.ts, phase);
        if let Some(s) = e.step {
            line += &format!(" step {s}");
        }
        if let Some(t) = &e.tool {
            line += &format!(" {t}");
        }
        if let Some(a) = &e.args {
            line += &format!(" {}", compact(a));
        }
        if let Some(a) = &e.approved_by {
            line += &format!(" approved_by={a}");
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
        if interrupted {
            line += "  INTERRUPTED: no result line (the process stopped during this call)";
        }
        println!("{}", crate::text::printable(&line));
    }
    if !has_verdict {
        println!("(no verdict line: the run was interrupted or is still running)");
    }
    0
}

fn kill_switch(command: KillSwitchCommand) -> i32 {
    let dir = match &command {
        KillSwitchCommand::Engage { config, .. }
        | KillSwitchCommand::Release { config, .. }
        | KillSwitchCommand::Status { config } => config.clone(),
    };
    // The directory `serve` uses, read from runwarden.yaml alone: the switch
    // must work while a runbook or host file is half edited, and must never
    // guess a directory nothing watches.
    let settings = match crate::config::Settings::load(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "runwarden: cannot tell which kill-switch directory runwarden uses, because runwarden.yaml does not load:\n{e}\nFix runwarden.yaml, or stop everything by hand: `touch KILL_SWITCH_DIR/ENGAGED` (the kill_switch_dir it names) or stop the service"
            );
            return EXIT_USAGE;
        }
    };
    let ks = KillSwitch::new(settings.kill_switch_dir);
    let runbook = match &command {
        KillSwitchCommand::Engage { runbook, .. } | KillSwitchCommand::Release { runbook, .. } => {
            runbook.clone()
        }
        KillSwitchCommand::Status { .. } => None,
    };
    let runbook = runbook.as_deref();
    if let Some(rb) = runbook {
        let known = crate::config::runbook_names(&dir);
        if !known.contains(rb) {
            eprintln!(
                "runwarden: {:?} is not a runbook of {}{}; a switch for it would stop nothing (omit --runbook to stop every runbook)",
                rb,
                dir.join("runbooks").display(),
                crate::config::did_you_mean(rb, known.iter().map(String::as_str))
            );
            return EXIT_USAGE;
        }
    }
    let shown = ks.dir().display();
    match command {
        KillSwitchCommand::Engage { reason, .. } => match ks.engage(runbook, &reason) {
            Ok(path) => {
                println!(
                    "engaged: {} (runs stop before their next call)",
                    path.display()
                );
                0
            }
            Err(e) => {
                eprintln!(
                    "runwarden: cannot engage the kill switch in {shown}: {e}; as a fallback, `touch {shown}/ENGAGED` or remove the directory (both stop everything)"
                );
                1
            }
        },
        KillSwitchCommand::Release { .. } => match ks.release(runbook) {
            Ok(true) => {
                println!("released: {}", ks.file_of(runbook).display());
                match ks.status() {
                    Ok(left) if !left.is_empty() => {
                        for (scope, detail) in left {
                            println!("still ENGAGED {scope}: {detail}");
                        }
                    }
                    Err(e) => println!("still ENGAGED {e}"),
                    Ok(_) => {}
                }
                0
            }
            Ok(false) => {
                println!("was not engaged: no {}", ks.file_of(runbook).display());
                0
            }
            Err(e) => {
                eprintln!(
                    "runwarden: cannot release {}: {e}",
                    ks.file_of(runbook).display()
                );
                1
            }
        },
        // Exit 0: released (calls may run); 1: engaged (something is stopped).
        KillSwitchCommand::Status { .. } => match ks.status() {
            Ok(list) if list.is_empty() => {
                println!("released: no switch file in {shown}");
                0
            }
            Ok(list) => {
                for (scope, detail) in list {
                    println!("ENGAGED {scope}: {detail}");
                }
                1
            }
            Err(e) => {
                println!("ENGAGED {e}");
                1
            }
        },
    }
}

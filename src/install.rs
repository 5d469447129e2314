//! What an operator installs, printed, never installed: for a managed host,
//! the agent's own policy, the `authorized_keys` line that forces the agent,
//! and a sudoers file with exactly the commands the runbooks can have run as
//! root there, each built by the tool that runs it (absolute paths, explicit
//! arguments, no wildcards); for the management host, a hardened systemd
//! unit for `runwarden serve`.

use std::fmt::Write;

use crate::config::Host;
use crate::config::runbook::{Autonomy, Runbook, StepAction, is_template};
use crate::config::{Config, Connection};
use crate::host::{Recycle, quoted as q};
use crate::process::Argv;
use crate::tools::ToolId;

/// Where the agent binary is expected on a managed host.
pub(crate) const AGENT_PATH: &str = "/usr/local/bin/runwarden";

/// Where the agent reached over SSH works, and where root's agent on the
/// daemon's own machine does (its own state directory).
const SSH_AGENT_JAIL: &str = "/var/lib/runwarden/jail";
const LOCAL_AGENT_JAIL: &str = "/var/lib/runwarden-agent/jail";

/// The host's allowlists as the agent's policy file (a host file with
/// `connection: local`), with the runner's public key that signs tier-2
/// permits; `sudo` and `jail` are the agent's own.
pub(crate) fn policy(
    host: &Host,
    permit_public_key: Option<&str>,
    sudo: bool,
    jail: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# runwarden agent policy for {} (the host wins over the runner's host file)",
        host.name
    );
    let _ = writeln!(s, "name: {}", host.name);
    let _ = writeln!(s, "connection: local");
    let _ = writeln!(s, "sudo: {sudo}");
    let _ = writeln!(s, "jail: {jail}");
    match permit_public_key {
        Some(k) => {
            let _ = writeln!(
                s,
                "# The runner's key: a tier-2 call runs only with a permit it signed.\npermit_public_key: {k}"
            );
        }
        None => {
            let _ = writeln!(
                s,
                "# permit_public_key: (none: this host takes no tier-2 call)"
            );
        }
    }
    let _ = writeln!(
        s,
        "tool_timeout: {}",
        humantime::format_duration(host.tool_timeout)
    );
    let _ = writeln!(
        s,
        "du_budget: {}",
        humantime::format_duration(host.du_budget)
    );
    for kind in &crate::host::ALLOWLISTS {
        s += &(kind.written)(host);
    }
    if let Some(st) = &host.logrotate_state {
        let _ = writeln!(s, "logrotate_state: {}", q(&st.display().to_string()));
    }
    if host.unsandboxed_tier1 {
        let _ = writeln!(s, "unsandboxed_tier1: allow");
    }
    // The agent renders its own copy of a tool file with its own values.
    if !host.vars.is_empty() {
        let _ = writeln!(s, "vars:");
        for (name, var) in &host.vars {
            let _ = writeln!(s, "  {name}: {}", var.written());
        }
    }
    s
}

/// Every command a runbook can have run as root on `host`, exactly as the
/// tools build it: for each runbook that names the host and may run tier-2
/// calls (L2 after a person's approval, L3 on its own; L1 only proposes),
/// each tier-2 tool it approves, on the targets it can ask for (see
/// `asked_targets`).
pub(crate) fn mutating_commands<'a>(
    host: &Host,
    runbooks: impl IntoIterator<Item = &'a Runbook>,
) -> Vec<Argv> {
    let mut cmds: Vec<Argv> = Vec::new();
    for rb in runbooks
        .into_iter()
        .filter(|r| r.allows_host(&host.name) && r.autonomy != Autonomy::L1)
    {
        for tool in &rb.approve {
            if let Some(d) = tool.declared() {
                for args in d.every_call(host).unwrap_or_default() {
                    if let Ok(call) = d.resolve(&args, host, crate::tools::PathMode::Lexical) {
                        for c in call.root_commands(host) {
                            if !cmds.contains(&c) {
                                cmds.push(c);
                            }
                        }
                    }
                }
                continue;
            }
            let Some((field, allowed)) = tool.targets(host) else {
                continue;
            };
            for target in asked_targets(rb, tool, field, &allowed) {
                for c in crate::tools::privileged_commands(tool, host, &target) {
                    if !cmds.contains(&c) {
                        cmds.push(c);
                    }
                }
            }
        }
    }
    cmds
}

/// The targets a runbook can ask `tool` for: everything the host allows
/// when a model plans its calls or a step's target is a template, otherwise
/// the ones its steps name.
fn asked_targets(rb: &Runbook, tool: &ToolId, field: &str, allowed: &[String]) -> Vec<String> {
    if rb.agent.is_some() {
        return allowed.to_vec();
    }
    let mut named = Vec::new();
    for step in &rb.steps {
        if let StepAction::Call { tool: t, args, .. } = &step.action
            && t == tool
        {
            match args.get(field).and_then(|v| v.as_str()) {
                Some(s) if !is_template(s) => named.push(s.to_string()),
                _ => return allowed.to_vec(),
            }
        }
    }
    named
}

/// A sudoers line argument list: sudoers needs spaces, commas, colons, `=` and `\` escaped.
fn sudoers_command(a: &Argv) -> String {
    a.to_vec()
        .iter()
        .map(|arg| {
            arg.chars()
                .flat_map(|c| match c {
                    ',' | ':' | '=' | '\\' | ' ' => vec!['\\', c],
                    c => vec![c],
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The sudoers file for `host`: exactly the commands `runbooks` can have
/// run as root there ([`mutating_commands`]).
pub(crate) fn sudoers<'a>(
    host: &Host,
    user: &str,
    runbooks: impl IntoIterator<Item = &'a Runbook> + Clone,
) -> String {
    let mut s = format!(
        "# /etc/sudoers.d/runwarden for {}: exactly the commands its runbooks can have run as root.\n",
        host.name
    );
    let _ = writeln!(s, "Defaults:{user} !requiretty");
    let cmds = mutating_commands(host, runbooks.clone());
    if cmds.is_empty() {
        let _ = writeln!(s, "# (no runbook can change this host)");
        return s;
    }
    let alias = "RUNWARDEN_CHANGES";
    let _ = writeln!(s, "Cmnd_Alias {alias} = \\");
    for (i, c) in cmds.iter().enumerate() {
        let sep = if i + 1 < cmds.len() { ", \\" } else { "" };
        let _ = writeln!(s, "    {}{sep}", sudoers_command(c));
    }
    let _ = writeln!(s, "{user} ALL=(root) NOPASSWD: {alias}");
    for (tool, why) in unlistable(host, runbooks) {
        let _ = writeln!(
            s,
            "# {tool} is not listed: its argv takes {why}, which sudoers cannot name without a wildcard.\n# This host runs it only through an agent that runs as root (connection: agent), never through sudo."
        );
    }
    if host
        .worker_pools
        .values()
        .any(|p| matches!(p.recycle, Recycle::Signal(_)))
    {
        let _ = writeln!(
            s,
            "# Pools recycled by signal are not listed: their master's pid is only known at run time.\n# Run those masters as {user}'s group, or use `recycle: reload` with a unit."
        );
    }
    s
}

/// The declared tier-2 tools the runbooks naming `host` may run whose argv
/// sudoers cannot list (a free value), each with why.
fn unlistable<'a>(
    host: &Host,
    runbooks: impl IntoIterator<Item = &'a Runbook>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for rb in runbooks
        .into_iter()
        .filter(|r| r.allows_host(&host.name) && r.autonomy != Autonomy::L1)
    {
        for d in rb.approve.iter().filter_map(ToolId::declared) {
            if let Err(why) = d.every_call(host)
                && !out.iter().any(|(n, _)| *n == d.name)
            {
                out.push((d.name.clone(), why.to_string()));
            }
        }
    }
    out
}

/// The declared tools the runbooks naming `host` may call, each file as it
/// is: the host's agent runs only its own copy, and only the same bytes.
fn declared_files<'a>(host: &Host, runbooks: impl IntoIterator<Item = &'a Runbook>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut s = String::new();
    for rb in runbooks.into_iter().filter(|r| r.allows_host(&host.name)) {
        for d in rb
            .observe
            .iter()
            .chain(rb.approve.iter())
            .filter_map(ToolId::declared)
        {
            if seen.contains(&d.name.as_str()) {
                continue;
            }
            seen.push(&d.name);
            let bytes = std::fs::read_to_string(&d.file).unwrap_or_default();
            let now = crate::config::sha256_hex(bytes.as_bytes());
            let _ = writeln!(s, "### /etc/runwarden/tools/{}.yaml", d.name);
            if now != d.sha256 {
                let _ = writeln!(
                    s,
                    "# {} changed since this configuration was loaded (sha256 {} then, {now} now): check and reload, then print again",
                    d.file.display(),
                    d.sha256
                );
            }
            s.push_str(&bytes);
            if !bytes.ends_with('\n') {
                s.push('\n');
            }
        }
    }
    s
}

/// The `authorized_keys` line for the runner's key (the agent as forced
/// command, `restrict`: no forwarding, no terminal), with the commands
/// that make the account.
pub(crate) fn authorized_keys(user: &str, public_key: &str) -> String {
    format!(
        "# The account: a real shell (sshd runs the forced command through it), unlocked, and in\n# systemd-journal for read_journal:\n#   useradd --create-home --shell /bin/sh --groups systemd-journal {user} && usermod --password '*' {user}\n#   install -d -o {user} -m 0700 /var/lib/runwarden\ncommand=\"{AGENT_PATH} agent --stdio\",restrict {}\n",
        public_key.trim()
    )
}

/// The account every tier-1 process runs as (see [`crate::sandbox`]), as
/// the package's sysusers.d file makes it.
pub(crate) fn observer_account() -> String {
    let user = crate::sandbox::OBSERVER;
    let journal = crate::sandbox::JOURNAL_GROUP;
    format!(
        "# The account tier-1 processes run as, on every machine whose agent or daemon runs as root:
# it reads (CAP_DAC_READ_SEARCH, group {journal}) and changes nothing. The Debian package
# installs this file; elsewhere run `systemd-sysusers` after copying it, or
#   useradd --system --no-create-home --shell /usr/sbin/nologin --groups {journal} {user}
u {user} - \"runwarden tier-1 observer (reads, changes nothing)\" - /usr/sbin/nologin
m {user} {journal}
"
    )
}

/// The daemon's unit, as the package installs it (`packaging/systemd/`).
pub(crate) const SERVE_UNIT: &str = include_str!("../packaging/systemd/runwarden.service");
/// Root's side of the privileged path on the daemon's own machine.
pub(crate) const AGENT_SOCKET_UNIT: &str =
    include_str!("../packaging/systemd/runwarden-agent.socket");
/// One agent per connection on [`AGENT_SOCKET_UNIT`].
pub(crate) const AGENT_SERVICE_UNIT: &str =
    include_str!("../packaging/systemd/runwarden-agent@.service");

/// The daemon's unit. It names no directory of the machine `install print`
/// ran on: the package's layout (`/etc/runwarden`, `/var/lib/runwarden`);
/// a config elsewhere is a drop-in that overrides `ExecStart=`.
pub(crate) fn systemd_unit(config: &Config) -> String {
    let mut unit = format!(
        "# /etc/systemd/system/runwarden.service (the management host). The Debian package\n# already installs this very unit as /lib/systemd/system/runwarden.service: copy it\n# only where runwarden was installed without the package.\n{SERVE_UNIT}"
    );
    let packaged = std::path::Path::new("/etc/runwarden");
    if std::path::absolute(&config.dir).ok().as_deref() != Some(packaged) {
        let _ = write!(
            unit,
            "# This config is not in /etc/runwarden: add a drop-in\n#   systemctl edit runwarden.service\n# with\n#   [Service]\n#   ExecStart=\n#   ExecStart=/usr/bin/runwarden serve --config DIR\n#   ReadWritePaths=DIR/state\n"
        );
    }
    unit
}

/// Everything for one host, in sections named after where each file goes.
/// `public` is the runner's permit key's public half, which the host's
/// policy names (without it, the policy takes no tier-2 call).
pub(crate) fn print(config: &Config, host: &Host, public: Option<&str>) -> String {
    let (user, public_key) = match &host.connection {
        Connection::Ssh(ssh) => {
            let pubfile = format!("{}.pub", ssh.identity.display());
            let key = std::fs::read_to_string(&pubfile)
                .unwrap_or_else(|_| format!("ssh-ed25519 AAAA...  # the contents of {pubfile}"));
            (ssh.user.clone(), key)
        }
        Connection::Local => (
            "runwarden".to_string(),
            "ssh-ed25519 AAAA...  # not used: this host is local".to_string(),
        ),
        Connection::Agent(socket) => {
            // Root runs this agent: no account, no sudo.
            // The agent reads tools/ beside its policy: on this machine the
            // daemon's own directory, so these are the files already there.
            return format!(
                "### /etc/runwarden/agent.yaml\n{}\n{}### /usr/lib/sysusers.d/runwarden-observe.conf\n{}\n### /etc/systemd/system/runwarden-agent.socket (its ListenStream= is the host file's {})\n# The Debian package installs both agent units in /lib/systemd/system: copy them only\n# where runwarden was installed without the package.\n{AGENT_SOCKET_UNIT}\n### /etc/systemd/system/runwarden-agent@.service\n{AGENT_SERVICE_UNIT}\n### /etc/systemd/system/runwarden.service\n{}",
                policy(host, public, false, LOCAL_AGENT_JAIL),
                declared_files(host, config.runbooks.values().map(|r| &**r)),
                observer_account(),
                socket.display(),
                systemd_unit(config)
            );
        }
    };
    let runbooks = || config.runbooks.values().map(|r| &**r);
    format!(
        "### /etc/runwarden/agent.yaml\n{}\n{}### /usr/lib/sysusers.d/runwarden-observe.conf\n{}\n### ~{user}/.ssh/authorized_keys\n{}\n### /etc/sudoers.d/runwarden\n{}\n### /etc/systemd/system/runwarden.service\n{}",
        policy(host, public, host.sudo, SSH_AGENT_JAIL),
        declared_files(host, runbooks()),
        observer_account(),
        authorized_keys(&user, &public_key),
        sudoers(host, &user, runbooks()),
        systemd_unit(config)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with host `h` (units a and b, two logrotate configs, sudo)
    /// and the given runbooks.
    fn config(runbooks: &[(&str, &str)]) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        for d in ["hosts", "runbooks"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(
            dir.path().join("hosts/h.yaml"),
            "name: h\nconnection: local\nsudo: true\nunits: [a.service, b.service]\nlogrotate_configs: [/etc/logrotate.d/one, /etc/logrotate.d/two]\nlogrotate_state: /var/lib/runwarden/lr.state\n",
        )
        .unwrap();
        for (name, body) in runbooks {
            std::fs::write(
                dir.path().join(format!("runbooks/{name}.yaml")),
                format!("name: {name}\ndescription: t\nhosts: [h]\n{body}"),
            )
            .unwrap();
        }
        let config = Config::load(dir.path()).unwrap();
        (dir, config)
    }

    fn lines(config: &Config) -> Vec<Vec<String>> {
        mutating_commands(&config.hosts["h"], config.runbooks.values().map(|r| &**r))
            .iter()
            .map(Argv::to_vec)
            .collect()
    }

    /// Only what a runbook can ask for: the tool it approves, on the target
    /// its step names; nothing for a proposing (L1) runbook; every allowed
    /// target for a templated step; and each line is what the tool spawns
    /// after `sudo -n --`.
    #[test]
    fn sudoers_allows_only_what_a_runbook_can_ask_for_as_the_tool_builds_it() {
        let restart_a = "autonomy: L3\ntools: { approve: [restart_service] }\nsteps:\n  - call: restart_service\n    args: { unit: a.service }\n    reason: r\n";
        let (_d, c) = config(&[("ra", restart_a)]);
        assert_eq!(
            lines(&c),
            [["/usr/bin/systemctl", "restart", "a.service"]],
            "no reload, no b.service"
        );
        let host = &c.hosts["h"];
        let action = crate::tools::resolve(
            &crate::tools::Builtin::RestartService.into(),
            &serde_json::json!({ "unit": "a.service", "reason": "r" }),
            host,
            crate::tools::PathMode::Lexical,
        )
        .unwrap();
        let spawned = action.planned_argv(host)[0].to_vec();
        assert_eq!(spawned[..3], ["/usr/bin/sudo", "-n", "--"]);
        assert_eq!(spawned[3..], lines(&c)[0][..], "the tool's own argv");

        let proposes = "autonomy: L1\ntools: { approve: [reload_service] }\nsteps:\n  - call: reload_service\n    args: { unit: b.service }\n    reason: r\n";
        let (_d, c) = config(&[("p", proposes)]);
        assert!(lines(&c).is_empty(), "{:?}", lines(&c));

        let templated = "autonomy: L3\ntools: { approve: [rotate_logs] }\nsteps:\n  - call: rotate_logs\n    args: { config: \"{{ alert.labels.config }}\" }\n    reason: r\n";
        let (_d, c) = config(&[("t", templated), ("ra", restart_a)]);
        let got = lines(&c);
        for conf in ["/etc/logrotate.d/one", "/etc/logrotate.d/two"] {
            assert!(
                got.contains(&vec![
                    "/usr/sbin/logrotate".to_string(),
                    "--verbose".into(),
                    "--force".into(),
                    "--state".into(),
                    "/var/lib/runwarden/lr.state".into(),
                    conf.into(),
                ]),
                "{got:?}"
            );
        }
        assert_eq!(got.len(), 3, "{got:?}");

        let text = sudoers(&c.hosts["h"], "rw", c.runbooks.values().map(|r| &**r));
        assert!(
            text.contains("/usr/bin/systemctl restart a.service"),
            "{text}"
        );
        assert!(!text.contains("b.service"), "{text}");
    }

    /// A host file naming an entry of every kind of allowlist.
    const EVERY_KIND: &str = "name: h\nconnection: local\n\
        units: [a.service]\njournals: [j.service]\npaths: [/var/log/app]\n\
        logrotate_configs: [/etc/logrotate.d/app]\n\
        certificates:\n  web: { path: /etc/ssl/web.pem, unit: a.service }\n\
        health_checks:\n  web: http://127.0.0.1:8080/health\n\
        worker_pools:\n  app: { unit: a.service, recycle: reload, health_check: web }\n\
        allow:\n  backends: [web, api]\n";

    fn host_from(text: &str) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h.yaml");
        std::fs::write(&file, text).unwrap();
        let host = crate::config::load_host_file(&file, dir.path()).unwrap();
        (dir, host)
    }

    /// The policy `install print` writes holds every allowlist of the host
    /// file, and the agent reports each of them: a kind of allowlist added
    /// to the host file and forgotten in either is caught here (the host
    /// file above names every kind).
    #[test]
    fn the_policy_install_print_writes_holds_every_allowlist_of_the_host_file() {
        let (_d, host) = host_from(EVERY_KIND);
        let reported = crate::agent::allowlists(&host);
        for (list, entries) in reported.as_object().unwrap() {
            assert!(
                !entries.as_array().unwrap().is_empty(),
                "{list} is empty: name an entry of it in EVERY_KIND"
            );
        }
        assert_eq!(
            reported["allow.backends"],
            serde_json::json!(["web", "api"])
        );
        let written = policy(&host, None, false, "/var/lib/runwarden/jail");
        let (_d, read_back) = host_from(&written);
        assert_eq!(crate::agent::allowlists(&read_back), reported, "{written}");
    }

    /// A host file and an agent's policy that differ only in a declared
    /// tool's list (`allow:`) differ: the agent would refuse the value.
    #[test]
    fn a_policy_that_differs_only_in_a_declared_tools_list_differs() {
        let (_d, ours) = host_from(EVERY_KIND);
        let (_d, theirs) = host_from(&EVERY_KIND.replace("[web, api]", "[web]"));
        let differences = crate::agent::policy_differences(
            &crate::agent::allowlists(&ours),
            &crate::agent::allowlists(&theirs),
        );
        assert_eq!(
            differences,
            [("allow.backends".to_string(), "api".to_string(), true)]
        );
        // A list only one side has is all differences, either way round.
        let (_d, none) = host_from(&EVERY_KIND.replace("allow:\n  backends: [web, api]\n", ""));
        let differences = crate::agent::policy_differences(
            &crate::agent::allowlists(&none),
            &crate::agent::allowlists(&ours),
        );
        assert_eq!(differences.len(), 2, "{differences:?}");
        assert!(
            differences
                .iter()
                .all(|(list, _, ours)| list == "allow.backends" && !ours)
        );
    }
}

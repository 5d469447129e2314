//! What an operator installs, printed, never installed: for a managed host,
//! the agent's own policy, the `authorized_keys` line that forces the agent,
//! and a sudoers file with exactly the mutating commands the policy allows
//! (absolute paths, explicit arguments, no wildcards); for the management
//! host, a hardened systemd unit for `runwarden serve`.

use std::fmt::Write;

use crate::config::Host;
use crate::config::host::{PoolMaster, Recycle};
use crate::config::{Config, Connection};
use crate::executor::process::Argv;

/// Where the agent binary is expected on a managed host.
pub const AGENT_PATH: &str = "/usr/local/bin/runwarden";

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn list<I: IntoIterator<Item = String>>(items: I) -> String {
    let v: Vec<String> = items.into_iter().map(|s| q(&s)).collect();
    format!("[{}]", v.join(", "))
}

/// The host's allowlists as the agent's policy file (a host file with
/// `connection: local`), with the runner's public key that signs tier-2 permits.
pub fn policy(host: &Host, permit_public_key: Option<&str>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# runwarden agent policy for {} (the host wins over the runner's host file)",
        host.name
    );
    let _ = writeln!(s, "name: {}", host.name);
    let _ = writeln!(s, "connection: local");
    let _ = writeln!(s, "sudo: {}", host.sudo);
    let _ = writeln!(s, "jail: /var/lib/runwarden/jail");
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
        "paths: {}",
        list(host.paths.iter().map(|p| p.display().to_string()))
    );
    let _ = writeln!(s, "units: {}", list(host.units.iter().cloned()));
    let _ = writeln!(s, "journals: {}", list(host.journals.iter().cloned()));
    let _ = writeln!(
        s,
        "logrotate_configs: {}",
        list(
            host.logrotate_configs
                .iter()
                .map(|p| p.display().to_string())
        )
    );
    if let Some(st) = &host.logrotate_state {
        let _ = writeln!(s, "logrotate_state: {}", q(&st.display().to_string()));
    }
    if !host.certificates.is_empty() {
        let _ = writeln!(s, "certificates:");
        for (name, c) in &host.certificates {
            let _ = writeln!(
                s,
                "  {name}:\n    path: {}",
                q(&c.path.display().to_string())
            );
            if let Some(u) = &c.unit {
                let _ = writeln!(s, "    unit: {}", q(u));
            }
            if let Some(r) = &c.renew {
                let _ = writeln!(s, "    renew: {}", list(r.iter().cloned()));
            }
        }
    }
    if !host.health_checks.is_empty() {
        let _ = writeln!(s, "health_checks:");
        for (name, url) in &host.health_checks {
            let _ = writeln!(s, "  {name}: {}", q(url));
        }
    }
    if !host.worker_pools.is_empty() {
        let _ = writeln!(s, "worker_pools:");
        for (name, p) in &host.worker_pools {
            let _ = writeln!(s, "  {name}:");
            match &p.master {
                PoolMaster::Unit(u) => {
                    let _ = writeln!(s, "    unit: {}", q(u));
                }
                PoolMaster::PidFile { file, executable } => {
                    let _ = writeln!(s, "    pid_file: {}", q(&file.display().to_string()));
                    let _ = writeln!(
                        s,
                        "    executable: {}",
                        q(&executable.display().to_string())
                    );
                }
            }
            match p.recycle {
                Recycle::Reload => {
                    let _ = writeln!(s, "    recycle: reload");
                }
                Recycle::Signal(sig) => {
                    let _ = writeln!(s, "    recycle: {{ signal: {} }}", sig.name());
                }
            }
            if let Some(h) = &p.health_check {
                let _ = writeln!(s, "    health_check: {h}");
            }
        }
    }
    s
}

/// Every mutating command the policy allows, exactly as the tools build it.
pub fn mutating_commands(host: &Host) -> Vec<Argv> {
    let b = &host.binaries;
    let mut cmds = Vec::new();
    for unit in &host.units {
        for verb in ["restart", "reload"] {
            cmds.push(Argv::new(&b.systemctl).arg(verb).arg(unit.clone()));
        }
    }
    for config in &host.logrotate_configs {
        let mut a = Argv::new(&b.logrotate).args(["--verbose", "--force"]);
        if let Some(st) = &host.logrotate_state {
            a = a.arg("--state").arg(st.to_string_lossy());
        }
        cmds.push(a.arg(config.to_string_lossy()));
    }
    for c in host.certificates.values() {
        if let Some((program, args)) = c.renew.as_ref().and_then(|r| r.split_first()) {
            cmds.push(Argv::new(std::path::Path::new(program)).args(args.iter().cloned()));
        }
    }
    cmds.dedup();
    cmds
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

pub fn sudoers(host: &Host, user: &str) -> String {
    let mut s = format!(
        "# /etc/sudoers.d/runwarden for {}: exactly the mutating commands its policy allows.\n",
        host.name
    );
    let _ = writeln!(s, "Defaults:{user} !requiretty");
    let cmds = mutating_commands(host);
    if cmds.is_empty() {
        let _ = writeln!(s, "# (the policy allows no mutating command)");
        return s;
    }
    let alias = "RUNWARDEN_CHANGES";
    let _ = writeln!(s, "Cmnd_Alias {alias} = \\");
    for (i, c) in cmds.iter().enumerate() {
        let sep = if i + 1 < cmds.len() { ", \\" } else { "" };
        let _ = writeln!(s, "    {}{sep}", sudoers_command(c));
    }
    let _ = writeln!(s, "{user} ALL=(root) NOPASSWD: {alias}");
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

pub fn authorized_keys(user: &str, public_key: &str) -> String {
    format!(
        "# The account: a real shell (sshd runs the forced command through it), unlocked, and in\n# systemd-journal for read_journal:\n#   useradd --create-home --shell /bin/sh --groups systemd-journal {user} && usermod --password '*' {user}\n#   install -d -o {user} -m 0700 /var/lib/runwarden\ncommand=\"{AGENT_PATH} agent --stdio\",restrict {}\n",
        public_key.trim()
    )
}

pub fn systemd_unit(config: &Config) -> String {
    // systemd takes absolute paths only.
    let abs = |p: &std::path::Path| {
        std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string()
    };
    let dir = abs(&config.dir);
    let state = abs(&config.settings.state_dir);
    let mut writable = vec![state.clone(), abs(&config.settings.kill_switch_dir)];
    if let Some(audit_dir) = config.settings.audit_log.parent().map(abs)
        && !audit_dir.starts_with(&state)
    {
        writable.push(audit_dir);
    }
    let writable = writable.join(" ");
    format!(
        "# /etc/systemd/system/runwarden.service (the management host)
[Unit]
Description=runwarden remediation runner
After=network-online.target
Wants=network-online.target

[Service]
User=runwarden
Group=runwarden
ExecStart={AGENT_PATH} serve --config {dir}
ExecReload=/bin/kill -HUP $MAINPID
WorkingDirectory={dir}
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictSUIDSGID=yes
LockPersonality=yes
ReadWritePaths={writable}
KillMode=mixed
TimeoutStopSec=60
Restart=on-failure

[Install]
WantedBy=multi-user.target
"
    )
}

/// Everything for one host, in sections named after where each file goes.
/// The runner's permit key is made here (`permit_key_file`, mode 0600) if
/// there is none yet: its public half goes into the host's policy.
pub fn print(config: &Config, host: &Host) -> String {
    let permit_key =
        crate::gate::signed::PermitKey::load_or_create(&config.settings.permit_key_file);
    let public = match &permit_key {
        Ok(k) => Some(k.public_hex()),
        Err(e) => {
            eprintln!("runwarden: {e}; the policy below takes no tier-2 call");
            None
        }
    };
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
    };
    format!(
        "### /etc/runwarden/agent.yaml\n{}\n### ~{user}/.ssh/authorized_keys\n{}\n### /etc/sudoers.d/runwarden\n{}\n### /etc/systemd/system/runwarden.service\n{}",
        policy(host, public.as_deref()),
        authorized_keys(&user, &public_key),
        sudoers(host, &user),
        systemd_unit(config)
    )
}

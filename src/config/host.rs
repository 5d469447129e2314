//! Reading a host file into a validated [`Host`]: every allowlist entry
//! checked, every error named by file, line and field.
//!
//! One file: a host's fields and their checks side by side, as a runbook's
//! are.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::diag::Diagnostics;
use super::duration;
use super::raw;
use super::settings::abs_path;
use crate::host::*;

const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_DU_BUDGET: Duration = Duration::from_secs(3);

pub(super) fn validate(
    raw: raw::Host,
    file: &Path,
    config_dir: &Path,
    diags: &mut Diagnostics,
) -> Option<Host> {
    let before = diags.len();
    let name = raw.name.value.clone();
    if !safe_name(&name) {
        diags.at(
            file,
            raw.name.referenced,
            format!("host name \"{name}\" must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit"),
        );
    }
    let connection = connection(&raw, file, diags);
    let jail = match &raw.jail {
        Some(j) => abs_path(j, "jail", file, diags),
        None => config_dir.join("state/jail"),
    };
    // Beside the jail by default: every agent on a host reads the same
    // policy file, so they share one record whatever log each keeps.
    let spent_permits = match &raw.spent_permits {
        Some(d) => abs_path(d, "spent_permits", file, diags),
        None => jail
            .parent()
            .unwrap_or(Path::new("/"))
            .join("agent-permits"),
    };
    let permit_public_key = raw.permit_public_key.as_ref().map(|k| {
        let key = k.value.trim().to_ascii_lowercase();
        if !crate::signing::is_public_key(&key) {
            diags.at(
                file,
                k.referenced,
                "permit_public_key must be the runner's Ed25519 public key in hex (64 characters), as `runwarden install print` gives it",
            );
        }
        key
    });
    let tool_timeout = raw
        .tool_timeout
        .as_ref()
        .and_then(|t| duration(t, "tool_timeout", file, diags))
        .unwrap_or(DEFAULT_TOOL_TIMEOUT);
    let du_budget = raw
        .du_budget
        .as_ref()
        .and_then(|t| duration(t, "du_budget", file, diags))
        .unwrap_or(DEFAULT_DU_BUDGET);

    let units = unit_set(&raw.units, "units", file, diags);
    let journals = unit_set(&raw.journals, "journals", file, diags);
    let paths = raw
        .paths
        .iter()
        .map(|p| abs_path(p, "paths", file, diags))
        .collect();
    let logrotate_configs = raw
        .logrotate_configs
        .iter()
        .map(|p| abs_path(p, "logrotate_configs", file, diags))
        .collect();
    let logrotate_state = raw
        .logrotate_state
        .as_ref()
        .map(|p| abs_path(p, "logrotate_state", file, diags));

    let certificates = certificates(&raw, file, diags);
    let health_checks = health_checks(&raw, file, diags);
    let worker_pools = worker_pools(&raw, file, diags);
    let binaries = binaries(&raw, file, diags);

    let allow = allow_lists(&raw.allow, file, diags);
    let vars = vars(&raw.vars, file, diags);
    let unsandboxed_tier1 = match &raw.unsandboxed_tier1 {
        None => false,
        Some(v) if v.value == "allow" => true,
        Some(v) => {
            diags.at(
                file,
                v.referenced,
                format!(
                    "unsandboxed_tier1 \"{}\" is not known: write `allow` (declared tier-1 tools run without Landlock where it is missing) or leave it out",
                    v.value.escape_debug()
                ),
            );
            false
        }
    };

    if diags.len() != before {
        return None;
    }
    Some(Host {
        allow,
        vars,
        unsandboxed_tier1,
        name,
        connection,
        example: raw.example,
        sudo: raw.sudo,
        jail,
        spent_permits,
        tool_timeout,
        du_budget,
        units,
        journals,
        paths,
        logrotate_configs,
        logrotate_state,
        certificates,
        health_checks,
        worker_pools,
        binaries,
        source: file.to_path_buf(),
        permit_public_key,
    })
}

/// `vars:`: each named like an argument and of one type: a `path`
/// (absolute, no `..`), a `string` (1-255 characters, no control or
/// invisible character, not starting with `-`) or an `integer`; kept as
/// the text a tool's argv gets.
fn vars(
    raw: &BTreeMap<String, serde_saphyr::Spanned<raw::Var>>,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeMap<String, crate::host::Var> {
    use crate::host::Var;
    let mut out = BTreeMap::new();
    for (name, var) in raw {
        let bad = |diags: &mut Diagnostics, why: String| {
            diags.at(
                file,
                var.referenced,
                format!("vars.{}: {why}", name.escape_debug()),
            );
        };
        if !crate::tools::declared::template::is_name(name) {
            bad(
                diags,
                "a var's name is [a-z][a-z0-9_]* (a tool file writes it as {{ host.NAME }})".into(),
            );
            continue;
        }
        let v = &var.value;
        let text = match (&v.path, &v.string, v.integer) {
            (Some(p), None, None) => {
                if let Some(why) = super::settings::path_problem(p) {
                    bad(
                        diags,
                        format!("a var's path must be absolute, written out: {why}"),
                    );
                    continue;
                }
                Var::Path(p.clone())
            }
            (None, Some(s), None) => {
                if s.is_empty()
                    || s.len() > 255
                    || s.starts_with('-')
                    || s.chars()
                        .any(|c| c.is_control() || crate::text::invisible(c))
                {
                    bad(
                        diags,
                        format!(
                            "the string {s:?} must be 1-255 characters, not start with `-`, and hold no control or invisible character"
                        ),
                    );
                    continue;
                }
                Var::String(s.clone())
            }
            (None, None, Some(n)) => Var::Integer(n),
            _ => {
                bad(diags, "give exactly one of `path:`, `string:` or `integer:` (e.g. `admin_socket: { path: /run/haproxy/admin.sock }`)".into());
                continue;
            }
        };
        out.insert(name.clone(), text);
    }
    out
}

/// `allow:`: each list named like an argument, each value safe to put in
/// an argv element (the value checks of a declared argument apply to them
/// again at every call).
/// `connection:`: this machine, its agent's socket, or SSH.
fn connection(raw: &raw::Host, file: &Path, diags: &mut Diagnostics) -> Connection {
    match &raw.connection.value {
        raw::Connection::Local => Connection::Local,
        raw::Connection::Agent(socket) => {
            Connection::Agent(abs_path(socket, "connection.agent", file, diags))
        }
        raw::Connection::Ssh(ssh) => {
            if ssh.address.value.is_empty()
                || ssh.address.value.starts_with('-')
                || ssh
                    .address
                    .value
                    .contains(|c: char| c.is_whitespace() || c == '@')
            {
                diags.at(
                    file,
                    ssh.address.referenced,
                    "ssh.address must be a host name or an IP address",
                );
            }
            if !safe_name(&ssh.user.value) {
                diags.at(
                    file,
                    ssh.user.referenced,
                    "ssh.user must be a plain account name",
                );
            }
            let identity = abs_path(&ssh.identity, "ssh.identity", file, diags);
            // The private key that reaches the host: no tier-1 process reads it.
            crate::sandbox::protect(&identity);
            Connection::Ssh(Ssh {
                address: ssh.address.value.clone(),
                port: ssh.port.unwrap_or(22),
                user: ssh.user.value.clone(),
                identity,
                known_hosts: abs_path(&ssh.known_hosts, "ssh.known_hosts", file, diags),
                multiplex: ssh.multiplex.unwrap_or(true),
            })
        }
    }
}

/// `certificates:`: each one's path, the unit that serves it, its renew argv.
fn certificates(
    raw: &raw::Host,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeMap<String, Certificate> {
    let mut certificates = BTreeMap::new();
    for (cname, c) in &raw.certificates {
        check_key(cname, "certificates", c.referenced, file, diags);
        let unit = c.value.unit.as_ref().map(|u| {
            if !is_unit_name(&u.value) {
                diags.at(file, u.referenced, bad_unit_message(&u.value));
            }
            u.value.clone()
        });
        let renew = c.value.renew.as_ref().map(|argv| {
            match argv.value.first() {
                Some(p) if Path::new(p).is_absolute() => {}
                _ => diags.at(
                    file,
                    argv.referenced,
                    format!("certificates.{cname}.renew must be an argv list whose first element is an absolute program path, e.g. [/usr/bin/certbot, renew, --cert-name, {cname}]"),
                ),
            }
            if argv.value.iter().any(|a| a.contains('\0')) {
                diags.at(file, argv.referenced, "renew arguments must not contain NUL bytes");
            }
            argv.value.clone()
        });
        certificates.insert(
            cname.clone(),
            Certificate {
                path: abs_path(&c.value.path, "certificates.path", file, diags),
                unit,
                renew,
            },
        );
    }
    certificates
}

/// `health_checks:`: loopback URLs by name.
fn health_checks(
    raw: &raw::Host,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeMap<String, String> {
    let mut health_checks = BTreeMap::new();
    for (hname, url) in &raw.health_checks {
        check_key(hname, "health_checks", url.referenced, file, diags);
        if let Err(why) = loopback_url(&url.value) {
            diags.at(
                file,
                url.referenced,
                format!("health_checks.{hname}: {why}"),
            );
        }
        health_checks.insert(hname.clone(), url.value.clone());
    }
    health_checks
}

/// `worker_pools:`, each through [`worker_pool`].
fn worker_pools(
    raw: &raw::Host,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeMap<String, WorkerPool> {
    let mut worker_pools = BTreeMap::new();
    for (pname, p) in &raw.worker_pools {
        check_key(pname, "worker_pools", p.referenced, file, diags);
        let pool = worker_pool(pname, p, &raw.health_checks, file, diags);
        worker_pools.insert(pname.clone(), pool);
    }
    worker_pools
}

/// One worker pool: how its master is found (a unit, or a pid file and
/// the program it must be), how it is recycled, the health check after.
fn worker_pool<H>(
    pname: &str,
    p: &serde_saphyr::Spanned<raw::WorkerPool>,
    health_checks: &BTreeMap<String, H>,
    file: &Path,
    diags: &mut Diagnostics,
) -> WorkerPool {
    let pool = &p.value;
    let master = match (&pool.unit, &pool.pid_file) {
        (Some(u), None) => {
            if !is_unit_name(&u.value) {
                diags.at(file, u.referenced, bad_unit_message(&u.value));
            }
            PoolMaster::Unit(u.value.clone())
        }
        (None, Some(f)) => {
            let pid_file = abs_path(f, "worker_pools.pid_file", file, diags);
            let executable = match &pool.executable {
                Some(x) => abs_path(x, "worker_pools.executable", file, diags),
                None => {
                    diags.at(
                        file,
                        f.referenced,
                        format!("worker_pools.{pname}: with `pid_file`, name the master's program too (`executable: /usr/bin/gunicorn`): the pid in the file is checked against it before any signal"),
                    );
                    PathBuf::new()
                }
            };
            PoolMaster::PidFile {
                file: pid_file,
                executable,
            }
        }
        _ => {
            diags.at(
                file,
                p.referenced,
                format!("worker_pools.{pname}: give exactly one of `unit` or `pid_file` to find the master process"),
            );
            PoolMaster::PidFile {
                file: PathBuf::new(),
                executable: PathBuf::new(),
            }
        }
    };
    let recycle = match &pool.recycle.value {
        raw::Recycle::Reload => {
            if !matches!(master, PoolMaster::Unit(_)) {
                diags.at(
                    file,
                    pool.recycle.referenced,
                    format!("worker_pools.{pname}: `recycle: reload` needs `unit`; with a pid_file use `recycle: {{signal: HUP}}`"),
                );
            }
            Recycle::Reload
        }
        raw::Recycle::Signal(s) => match s.trim_start_matches("SIG") {
            "HUP" => Recycle::Signal(PoolSignal::Hup),
            "USR2" => Recycle::Signal(PoolSignal::Usr2),
            other => {
                diags.at(
                    file,
                    pool.recycle.referenced,
                    format!("worker_pools.{pname}: signal \"{other}\" is not a recycle signal; use HUP (nginx, gunicorn) or USR2 (php-fpm)"),
                );
                Recycle::Signal(PoolSignal::Hup)
            }
        },
    };
    let health_check = pool.health_check.as_ref().map(|h| {
        if !health_checks.contains_key(&h.value) {
            diags.at(
                file,
                h.referenced,
                format!(
                    "worker_pools.{pname}.health_check \"{}\" is not defined under health_checks",
                    h.value
                ),
            );
        }
        h.value.clone()
    });
    WorkerPool {
        master,
        recycle,
        health_check,
    }
}

/// `binaries:`: each an absolute path, Debian's where unset.
fn binaries(raw: &raw::Host, file: &Path, diags: &mut Diagnostics) -> Binaries {
    let defaults = Binaries::default();
    let b = &raw.binaries;
    let bin = |v: &Option<serde_saphyr::Spanned<String>>,
               default: &PathBuf,
               diags: &mut Diagnostics| match v {
        Some(p) => abs_path(p, "binaries", file, diags),
        None => default.clone(),
    };
    Binaries {
        systemctl: bin(&b.systemctl, &defaults.systemctl, diags),
        journalctl: bin(&b.journalctl, &defaults.journalctl, diags),
        logrotate: bin(&b.logrotate, &defaults.logrotate, diags),
        df: bin(&b.df, &defaults.df, diags),
        du: bin(&b.du, &defaults.du, diags),
        ps: bin(&b.ps, &defaults.ps, diags),
        kill: bin(&b.kill, &defaults.kill, diags),
        sudo: bin(&b.sudo, &defaults.sudo, diags),
        ssh: bin(&b.ssh, &defaults.ssh, diags),
    }
}

fn allow_lists(
    raw: &BTreeMap<String, serde_saphyr::Spanned<Vec<serde_saphyr::Spanned<String>>>>,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (name, values) in raw {
        if !crate::tools::declared::template::is_name(name) {
            diags.at(
                file,
                values.referenced,
                format!(
                    "allow.{}: a list's name is [a-z][a-z0-9_]* (it is what a declared tool's `list:` names)",
                    name.escape_debug()
                ),
            );
            continue;
        }
        let mut list = Vec::new();
        for v in &values.value {
            if v.value.is_empty()
                || v.value.len() > 255
                || v.value
                    .chars()
                    .any(|c| c.is_control() || crate::text::invisible(c))
            {
                diags.at(
                    file,
                    v.referenced,
                    format!(
                        "allow.{}: {:?} must be 1-255 characters with no control or invisible character",
                        name, v.value
                    ),
                );
                continue;
            }
            list.push(v.value.clone());
        }
        out.insert(name.clone(), list);
    }
    out
}

fn unit_set(
    list: &[serde_saphyr::Spanned<String>],
    field: &str,
    file: &Path,
    diags: &mut Diagnostics,
) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for u in list {
        if !is_unit_name(&u.value) {
            diags.at(
                file,
                u.referenced,
                format!("{field}: {}", bad_unit_message(&u.value)),
            );
        } else if !set.insert(u.value.clone()) {
            diags.at(
                file,
                u.referenced,
                format!("{field}: \"{}\" is listed twice", u.value),
            );
        }
    }
    set
}

fn bad_unit_message(u: &str) -> String {
    crate::tools::args::UnitName::new(u.to_string())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

fn check_key(
    key: &str,
    field: &str,
    loc: serde_saphyr::Location,
    file: &Path,
    diags: &mut Diagnostics,
) {
    if !safe_name(key) {
        diags.at(
            file,
            loc,
            format!(
                "{field}: name \"{}\" must be 1-64 characters of a-z, 0-9, '-' or '_'",
                key.escape_debug()
            ),
        );
    }
}

/// Health checks run on the host itself; only loopback HTTP URLs are
/// allowed. The error is text the loader reports at the host file's line.
pub(crate) fn loopback_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("\"{url}\" is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("\"{url}\" must be an http:// or https:// URL"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("credentials do not belong in a health-check URL".into());
    }
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    if !loopback {
        return Err(format!(
            "\"{url}\" is not a loopback URL: health checks run on the host itself (127.0.0.1, ::1 or localhost)"
        ));
    }
    Ok(())
}

//! The runner side of SSH: the system OpenSSH client, by argv.
//!
//! Why OpenSSH and not a Rust SSH library: it is the client operators already
//! audit and configure; its `known_hosts` pinning, `BatchMode` and connection
//! multiplexing (`ControlMaster`) are well understood; and nothing about keys
//! or host verification is reimplemented here. Every call is one request on
//! the connection's stdin and one JSON line back from the forced-command
//! agent; the remote command line is fixed and ignored by the host anyway.
//! Each call is one connection for now: a multiplexing master would have to
//! live outside the call's process group, which every call kills when it ends.
//! Host keys are never accepted on first use (`StrictHostKeyChecking=yes`
//! against the host file's own `known_hosts`).

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::agent::{AgentReply, AgentRequest};
use super::process::{self, Argv, Limits};
use crate::config::Host;
use crate::config::host::Ssh;
use crate::tools::{Outcome, ToolResult};

/// OpenSSH's exit status for its own failures (connection, authentication, host key).
const SSH_FAILED: i32 = 255;

pub fn argv(host: &Host, ssh: &Ssh) -> Argv {
    Argv::new(&host.binaries.ssh)
        .args(["-F", "/dev/null", "-T"])
        .arg("-i")
        .arg(ssh.identity.to_string_lossy())
        .args([
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
        ])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", ssh.known_hosts.display()))
        .args([
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=5",
        ])
        .args(["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2"])
        .args(["-o", "ControlMaster=no"])
        .arg("-p")
        .arg(ssh.port.to_string())
        .arg("-l")
        .arg(ssh.user.clone())
        .arg("--")
        .arg(ssh.address.clone())
        .arg("runwarden-agent")
}

/// Whether a failed result was the connection's fault (safe to retry a tier-1 call).
pub fn is_transport_error(r: &ToolResult) -> bool {
    r.data.get("transport").and_then(|v| v.as_bool()) == Some(true)
}

/// Send one request to the host's agent and read its answer.
pub async fn call(
    host: &Host,
    ssh: &Ssh,
    request: &AgentRequest,
    deadline: tokio::time::Instant,
) -> ToolResult {
    if let Err(e) = create_private_dir(&host.jail) {
        return ToolResult::failed(format!("cannot create {}: {e}", host.jail.display()));
    }
    let mut input = serde_json::to_vec(request).unwrap_or_default();
    input.push(b'\n');
    let limits = Limits {
        deadline,
        output_cap: crate::tools::OUTPUT_CAP * 2,
        kill_grace: Duration::from_secs(2),
        jail: host.jail.clone(),
        input: Some(input),
    };
    let out = match process::run(&argv(host, ssh), &limits).await {
        Ok(o) => o,
        Err(e @ process::SpawnError::NoTimeLeft(_)) => {
            return ToolResult {
                outcome: Outcome::Timeout,
                ..ToolResult::failed(format!("host {}: {e}", host.name))
            };
        }
        Err(e) => return ToolResult::failed(e.to_string()),
    };
    let transport = |what: String| ToolResult {
        data: json!({ "transport": true, "host": host.name }),
        ..ToolResult::failed(what)
    };
    if out.timed_out {
        let mut r = transport(format!(
            "host {} ({}) did not answer in time; the ssh process group was killed",
            host.name, ssh.address
        ));
        r.outcome = Outcome::Timeout;
        return r;
    }
    if out.exit_code == Some(SSH_FAILED) {
        let why = out.failure_text();
        return transport(format!(
            "ssh to host {} ({}:{}) failed: {why}",
            host.name, ssh.address, ssh.port
        ));
    }
    let stdout = out.stdout_text();
    let Some(line) = stdout.lines().rev().find(|l| !l.trim().is_empty()) else {
        return transport(format!(
            "the agent on host {} answered nothing ({})",
            host.name,
            out.failure_text()
        ));
    };
    match serde_json::from_str::<AgentReply>(line) {
        Ok(AgentReply::Result(r)) => r,
        Ok(AgentReply::Refused(why)) => ToolResult {
            data: json!({ "refused_by_host": true, "host": host.name }),
            ..ToolResult::failed(format!("host {} refused the call: {why}", host.name))
        },
        Err(e) => transport(format!(
            "malformed reply from the agent on host {}: {e} ({} bytes{})",
            host.name,
            stdout.len(),
            if out.stdout_truncated {
                ", cut at the cap"
            } else {
                ""
            }
        )),
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

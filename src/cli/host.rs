//! `runwarden host check`, `install print` and `agent`: reaching a host, and the host's side.

use std::path::Path;

use super::check::load;
use super::{EXIT_USAGE, Exit, Failed};
use crate::audit::AuditLog;
use crate::config::Connection;
use crate::verdict::Verdict;

/// The host `name`, or why there is none.
fn host_named<'a>(
    cfg: &'a crate::config::Config,
    name: &str,
) -> Result<&'a crate::config::Host, Failed> {
    cfg.hosts
        .get(name)
        .map(|h| &**h)
        .ok_or_else(|| Failed::usage(crate::run::StartError::UnknownHost(name.into())))
}

pub(super) async fn host_check(name: &str, dir: &Path) -> Exit {
    use crate::agent::{allowlists, policy_digest, wire::Request};
    let cfg = load(dir)?;
    let host = host_named(&cfg, name)?;
    let Connection::Ssh(ssh) = &host.connection else {
        println!("host {name} is local: nothing to check");
        return Ok(0);
    };
    let request = Request::Hello;
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
        return Ok(EXIT_USAGE);
    }
    println!(
        "host {name} ({}:{}): host key verified, agent {}",
        ssh.address,
        ssh.port,
        reply.data["version"].as_str().unwrap_or("?")
    );
    let theirs = &reply.data["policy"];
    let ours = allowlists(host);
    let differences = crate::agent::policy_differences(&ours, theirs);
    for (field, entry, in_host_file) in &differences {
        match in_host_file {
            true => println!(
                "  {field}: {entry:?} is in the host file but not in the host's policy: the host will refuse it"
            ),
            false => println!(
                "  {field}: {entry:?} is allowed by the host's policy but not by the host file"
            ),
        }
    }
    let differ = !differences.is_empty();
    let digest = policy_digest(host);
    if differ || reply.data["policy_digest"].as_str() != Some(digest.as_str()) {
        println!(
            "policies differ (host file {digest}, host {})",
            reply.data["policy_digest"].as_str().unwrap_or("?")
        );
        Ok(1)
    } else {
        println!("policies agree ({digest})");
        Ok(0)
    }
}

pub(super) fn install_print(host: &str, dir: &Path) -> Exit {
    let cfg = load(dir)?;
    let h = host_named(&cfg, host)?;
    // The runner's permit key is made here (`permit_key_file`, mode 0600)
    // if there is none yet: its public half goes into the host's policy.
    let key = crate::signing::PermitKey::load_or_create(&cfg.settings.permit_key_file);
    let public = match &key {
        Ok(k) => Some(k.public_hex()),
        Err(e) => {
            eprintln!("runwarden: {e}; the policy below takes no tier-2 call");
            None
        }
    };
    print!("{}", crate::install::print(&cfg, h, public.as_deref()));
    Ok(0)
}

/// The agent answers on stdout, in its protocol, even when it cannot start:
/// the runner reads a refusal there (its codes are results, not failures).
pub(super) async fn agent(
    stdio: bool,
    policy: &Path,
    audit_file: &Path,
    timeouts: crate::agent::Timeouts,
) -> Exit {
    if !stdio {
        return Err(Failed::usage(
            "the agent only speaks on stdio: `runwarden agent --stdio` (as an authorized_keys forced command)",
        ));
    }
    let policy = match crate::agent::load_policy(policy) {
        Ok(p) => p,
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({ "refused": format!("the host's policy does not load: {e}") })
            );
            return Ok(EXIT_USAGE);
        }
    };
    let log = match AuditLog::open(audit_file) {
        Ok(l) => l,
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({ "refused": format!("the host's audit log cannot be opened, nothing runs: {e}") })
            );
            return Ok(Verdict::Broken.exit_code());
        }
    };
    Ok(crate::agent::serve_stdio(&policy, &log, timeouts).await)
}

//! This machine's own agent for the tests, as the package serves it: its
//! policy out of `install print`, and one real `runwarden agent --stdio`
//! per connection on a unix socket (as `runwarden-agent.socket`'s
//! `Accept=yes` starts it). Shared by the fast and root tiers.

#![allow(dead_code)]

use std::path::Path;

/// The agent's policy that `install print` wrote (`print`), its jail moved
/// to `jail`.
pub fn policy_from_print(print: &str, jail: &Path) -> String {
    print
        .split("### ")
        .find(|s| s.starts_with("/etc/runwarden/agent.yaml"))
        .and_then(|s| s.split_once('\n'))
        .map(|(_, body)| body.to_string())
        .expect("the agent's policy")
        .replace(
            "jail: /var/lib/runwarden-agent/jail",
            &format!("jail: {}", jail.display()),
        )
}

/// Listen on `socket`: one `bin agent --stdio` per connection, with
/// `policy` and `audit`, on the accepted stream, alongside the others. The
/// listener lives until the process ends.
pub fn listen(bin: &str, socket: &Path, policy: &Path, audit: &Path) {
    use std::os::fd::OwnedFd;
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    let (bin, policy, audit) = (bin.to_string(), policy.to_path_buf(), audit.to_path_buf());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let fd = OwnedFd::from(stream);
            let child = std::process::Command::new(&bin)
                .args(["agent", "--stdio", "--policy"])
                .arg(&policy)
                .arg("--audit")
                .arg(&audit)
                .stdin(fd.try_clone().unwrap())
                .stdout(fd)
                .spawn();
            if let Ok(mut child) = child {
                std::thread::spawn(move || child.wait());
            }
        }
    });
}

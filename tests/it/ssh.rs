//! `connection: ssh` against real OpenSSH: Debian's sshd in a network
//! namespace of its own, a pinned host key, and the forced-command agent
//! (this very binary) under an unprivileged account, with a policy of its own.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::util::*;

/// One sshd host; stopped and its namespace removed on drop.
struct SshHost {
    name: String,
    index: u32,
    dir: PathBuf,
}

impl Drop for SshHost {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("tests/estate/ssh-hosts.sh"))
            .args([
                "down",
                &self.name,
                &self.index.to_string(),
                self.dir.to_str().unwrap(),
            ])
            .output();
    }
}

static NEXT: AtomicU32 = AtomicU32::new(1);

/// Boot a host whose own policy is `policy` (host-file allowlists).
fn ssh_host(e: &Estate, policy: &str) -> (SshHost, PathBuf) {
    ssh_host_with(e, policy, None)
}

/// Boot a host whose forced command is `command` instead of the agent.
fn ssh_host_with(e: &Estate, policy: &str, command: Option<&str>) -> (SshHost, PathBuf) {
    let index = (std::process::id() % 200) + NEXT.fetch_add(1, Ordering::SeqCst);
    let name = format!("t{index}");
    let dir = e.work().join(format!("host-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    // The agent's account must reach its policy, jail and any test script in here.
    use std::os::unix::fs::PermissionsExt;
    for d in [e.path(), e.work().as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let key = e.work().join("client_key");
    if !key.exists() {
        keygen(&key);
    }
    std::fs::copy(e.work().join("client_key.pub"), dir.join("client_key.pub")).unwrap();
    // The host knows the runner's permit key, as `install print` would set it
    // up, and its own name is the runner's name for it (permits name the host).
    let permit =
        runwarden::signing::PermitKey::load_or_create(&e.path().join("state/permit.key")).unwrap();
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "name: web\nconnection: local\njail: {}/jail\npermit_public_key: {}\n{policy}\n",
            dir.display(),
            permit.public_hex()
        ),
    )
    .unwrap();
    let out = Command::new(repo().join("tests/estate/ssh-hosts.sh"))
        .args([
            "up",
            &name,
            &index.to_string(),
            dir.to_str().unwrap(),
            bin(),
        ])
        .args(command)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh host: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (SshHost { name, index, dir }, key)
}

fn host_file(
    h: &SshHost,
    key: &std::path::Path,
    known_hosts: &std::path::Path,
    extra: &str,
) -> String {
    format!(
        "name: web\nconnection:\n  ssh:\n    address: 10.239.{}.2\n    port: 22\n    user: rw-agent\n    identity: {}\n    known_hosts: {}\n{extra}\n",
        h.index,
        key.display(),
        known_hosts.display()
    )
}

fn pinned(e: &Estate, h: &SshHost) -> PathBuf {
    let pub_key = std::fs::read_to_string(h.dir.join("ssh_host_ed25519_key.pub")).unwrap();
    let kh = e.work().join(format!("known_hosts-{}", h.name));
    let fields: Vec<&str> = pub_key.split_whitespace().take(2).collect();
    std::fs::write(&kh, format!("10.239.{}.2 {}\n", h.index, fields.join(" "))).unwrap();
    kh
}

const RUNBOOK: &str = "name: look\ndescription: t\nhosts: [web]\nautonomy: L3\ntools: { observe: [disk_usage, list_processes] }\nsteps:
  - id: tmp
    call: disk_usage
    args: { path: /tmp }
  - id: procs
    call: list_processes
    args: { limit: 3 }
  - id: var
    call: disk_usage
    args: { path: /var }
";

#[test]
fn calls_run_through_the_agent_and_the_host_policy_wins() {
    let e = Estate::new();
    let (h, key) = ssh_host(&e, "paths: [/tmp]");
    let kh = pinned(&e, &h);
    // The runner's host file allows /var; the host's own policy does not.
    e.host("web", &host_file(&h, &key, &kh, "paths: [/tmp, /var]"));
    e.runbook("look", RUNBOOK);
    let (code, report) = e.run_json("look", "web", &[]);
    assert_eq!(step(&report, "tmp")["status"], "ok", "{report:#}");
    assert!(step(&report, "tmp")["result"]["data"]["use_pct"].is_u64());
    assert_eq!(step(&report, "procs")["status"], "ok");
    let users: Vec<&str> = step(&report, "procs")["result"]["data"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["user"].as_str())
        .collect();
    assert!(!users.is_empty());
    let var = step(&report, "var");
    assert_eq!(var["status"], "error");
    assert!(
        var["result"]["error"]
            .as_str()
            .unwrap()
            .contains("refused the call"),
        "{var:#}"
    );
    assert_eq!(code, 1);
    // Audited on both sides: the runner's intent, the host's own refusal.
    assert_eq!(e.audit_phase("intent").len(), 3);
    let host_audit = std::fs::read_to_string(h.dir.join("agent-audit.jsonl")).unwrap();
    assert!(
        host_audit.contains("\"phase\":\"denied\"") && host_audit.contains("host_policy"),
        "{host_audit}"
    );
    assert_eq!(host_audit.matches("\"phase\":\"intent\"").count(), 2);
    let verify = e.run(&[
        "audit",
        "verify",
        h.dir.join("agent-audit.jsonl").to_str().unwrap(),
    ]);
    assert!(verify.status.success());
    // The run's three calls shared one connection (the multiplexing master).
    let sshd_log = std::fs::read_to_string(h.dir.join("sshd.log")).unwrap();
    assert_eq!(
        sshd_log.matches("Accepted publickey").count(),
        1,
        "{sshd_log}"
    );
    let masters = Command::new("/usr/bin/pgrep")
        .args(["-f", &format!("ControlMaster=yes.* 10.239.{}.2$", h.index)])
        .output()
        .unwrap();
    assert!(masters.stdout.is_empty(), "the master ended with the run");
}

#[test]
fn a_host_key_that_does_not_match_is_refused() {
    let e = Estate::new();
    let (h, key) = ssh_host(&e, "paths: [/tmp]");
    let wrong = e.work().join("wrong_host_key");
    keygen(&wrong);
    let fake = std::fs::read_to_string(wrong.with_extension("pub")).unwrap();
    let kh = e.work().join("known_hosts-wrong");
    let fields: Vec<&str> = fake.split_whitespace().take(2).collect();
    std::fs::write(&kh, format!("10.239.{}.2 {}\n", h.index, fields.join(" "))).unwrap();
    e.host("web", &host_file(&h, &key, &kh, "paths: [/tmp]"));
    e.runbook("look", "name: look\ndescription: t\nhosts: [web]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - id: tmp\n    call: disk_usage\n    args: { path: /tmp }\n");
    let (code, report) = e.run_json("look", "web", &[]);
    assert_eq!(code, 1, "{report:#}");
    let err = step_error(&report, "tmp");
    assert!(
        err.contains("ssh to host web") && err.contains("Host key verification failed"),
        "{err}"
    );
    let host_audit = std::fs::read_to_string(h.dir.join("agent-audit.jsonl")).unwrap_or_default();
    assert!(host_audit.is_empty(), "nothing reached the agent");
}

#[test]
fn install_print_gives_a_policy_the_agent_loads_and_a_sudoers_file_visudo_accepts() {
    let e = Estate::new();
    let key = e.work().join("id");
    sh(
        "/usr/bin/ssh-keygen",
        &["-q", "-t", "ed25519", "-N", "", "-f", key.to_str().unwrap()],
    );
    e.host(
        "web",
        &format!(
            "name: web\nconnection:\n  ssh:\n    address: 10.239.250.2\n    user: rw-agent\n    identity: {}\n    known_hosts: /dev/null\nsudo: true\npaths: [/tmp]\nunits: [nginx.service]\nlogrotate_configs: [/etc/logrotate.conf]\ncertificates:\n  web:\n    path: /etc/ssl/web.pem\n    renew: [/usr/bin/certbot, renew, --cert-name, web]\n",
            key.display()
        ),
    );
    e.runbook(
        "web-fix",
        "name: web-fix\ndescription: t\nhosts: [web]\nautonomy: L3\ntools: { approve: [restart_service, renew_certificate] }\nsteps:\n  - call: restart_service\n    args: { unit: nginx.service }\n    reason: t\n  - call: renew_certificate\n    args: { name: web }\n    reason: t\n",
    );
    let out = e.run(&["install", "print", "--host", "web"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let section = |name: &str| -> String {
        let start = text
            .find(&format!("### {name}\n"))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        let rest = text[start..].split_once('\n').unwrap().1;
        rest.split("\n### ").next().unwrap().to_string()
    };
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    assert!(section("~rw-agent/.ssh/authorized_keys").contains(&format!(
        "command=\"/usr/local/bin/runwarden agent --stdio\",restrict {}",
        public.trim()
    )));
    let sudoers = e.work().join("sudoers");
    std::fs::write(&sudoers, section("/etc/sudoers.d/runwarden")).unwrap();
    let check = Command::new("/usr/sbin/visudo")
        .args(["-c", "-f"])
        .arg(&sudoers)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let rules = section("/etc/sudoers.d/runwarden");
    assert!(
        rules.contains("/usr/bin/systemctl restart nginx.service")
            && rules.contains("/usr/bin/certbot renew --cert-name web")
            && !rules.contains('*'),
        "{rules}"
    );
    // What no runbook asks for is not allowed, though the policy would allow it.
    assert!(
        !rules.contains("reload") && !rules.contains("logrotate"),
        "{rules}"
    );
    // The printed policy is one the agent loads and enforces.
    let policy = e.work().join("agent.yaml");
    std::fs::write(
        &policy,
        section("/etc/runwarden/agent.yaml").replace(
            "/var/lib/runwarden/jail",
            e.work().join("jail").to_str().unwrap(),
        ),
    )
    .unwrap();
    let mut agent = Command::new(bin())
        .args([
            "agent",
            "--stdio",
            "--policy",
            policy.to_str().unwrap(),
            "--audit",
            e.work().join("a.jsonl").to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    agent
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"run_id\":\"r\",\"step\":1,\"runbook\":\"x\",\"tool\":\"disk_usage\",\"args\":{\"path\":\"/tmp\"}}\n{\"run_id\":\"r\",\"step\":2,\"runbook\":\"x\",\"tool\":\"disk_usage\",\"args\":{\"path\":\"/etc\"}}\n")
        .unwrap();
    let out = agent.wait_with_output().unwrap();
    let replies: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies[0]["result"]["outcome"], "ok", "{replies:#?}");
    assert!(
        replies[1]["refused"]
            .as_str()
            .unwrap()
            .contains("not allowed"),
        "{replies:#?}"
    );
}

#[test]
fn host_check_verifies_the_key_and_names_each_policy_difference() {
    let e = Estate::new();
    let (h, key) = ssh_host(&e, "paths: [/tmp]");
    let kh = pinned(&e, &h);
    e.host("web", &host_file(&h, &key, &kh, "paths: [/tmp, /var]"));
    let out = e.run(&["host", "check", "web"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("host key verified"), "{text}");
    assert!(
        text.contains("paths: \"/var\" is in the host file but not in the host's policy"),
        "{text}"
    );
    e.host("web", &host_file(&h, &key, &kh, "paths: [/tmp]"));
    let out = e.run(&["host", "check", "web"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

const ONE_CALL: &str = "name: look\ndescription: t\nhosts: [web]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - id: tmp\n    call: disk_usage\n    args: { path: /tmp }\n";

#[test]
fn a_wrong_identity_is_an_authentication_failure_naming_the_host() {
    let e = Estate::new();
    let (h, _) = ssh_host(&e, "paths: [/tmp]");
    let kh = pinned(&e, &h);
    let other = e.work().join("other_key");
    keygen(&other);
    e.host("web", &host_file(&h, &other, &kh, "paths: [/tmp]"));
    e.runbook("look", ONE_CALL);
    let (code, report) = e.run_json("look", "web", &[]);
    assert_eq!(code, 1);
    let err = step_error(&report, "tmp");
    assert!(
        err.contains("ssh to host web") && err.contains("Permission denied"),
        "{err}"
    );
}

/// Run `ONE_CALL` against a host whose forced command is the script `body`
/// instead of the agent.
fn against_broken_agent(body: &str, extra: &str) -> (i32, serde_json::Value) {
    let e = Estate::new();
    let script = e.script("broken-agent", body);
    let (h, key) = ssh_host_with(&e, "paths: [/tmp]", Some(script.to_str().unwrap()));
    let kh = pinned(&e, &h);
    e.host(
        "web",
        &host_file(&h, &key, &kh, &format!("paths: [/tmp]\n{extra}")),
    );
    e.runbook("look", ONE_CALL);
    let out = e.run_json("look", "web", &[]);
    drop(h);
    out
}

#[test]
fn a_hung_agent_is_a_timeout_and_a_flood_is_capped() {
    let started = std::time::Instant::now();
    let (code, report) = against_broken_agent("sleep 60", "tool_timeout: 2s");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the timeout and its grace, no retry"
    );
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(
        step(&report, "tmp")["status"],
        "timeout",
        "{:#}",
        step(&report, "tmp")
    );

    // An agent that is missing (the shell cannot find it) or crashes at once.
    for (body, status) in [
        ("/usr/local/bin/no-such-agent", "127"),
        ("kill -SEGV $$", "139"),
    ] {
        let (code, report) = against_broken_agent(body, "");
        assert_eq!(code, 1, "{report:#}");
        let err = step_error(&report, "tmp");
        assert!(
            err.contains("the agent on host web answered nothing") && err.contains(status),
            "{body}: {err}"
        );
    }

    let (code, report) = against_broken_agent("head -c 50000000 /dev/zero | tr '\\0' x", "");
    assert_eq!(code, 1);
    let err = step_error(&report, "tmp");
    assert!(
        err.contains("malformed reply") && err.contains("cut at the cap"),
        "{err}"
    );
}

/// A host whose logrotate takes 4 s (a wrapper in its own policy), a log the
/// agent's account may rotate, and the runner's host file for it.
fn slow_rotation_host(e: &Estate) -> (SshHost, String) {
    let logs = e.work().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("app.log"), "x\n".repeat(1000)).unwrap();
    let conf = e.work().join("lr.conf");
    std::fs::write(
        &conf,
        format!(
            "{}/app.log {{\n  rotate 3\n  missingok\n}}\n",
            logs.display()
        ),
    )
    .unwrap();
    let slow = e.script("slow-logrotate", "sleep 4\nexec /usr/sbin/logrotate \"$@\"");
    let (h, key) = ssh_host(
        e,
        &format!(
            "paths: [/tmp]\nlogrotate_configs: [{c}]\nlogrotate_state: {s}\ntool_timeout: 60s\nbinaries:\n  logrotate: {slow}",
            c = conf.display(),
            s = e.work().join("host-state/lr.state").display(),
            slow = slow.display()
        ),
    );
    std::fs::create_dir_all(e.work().join("host-state")).unwrap();
    sh(
        "/bin/chown",
        &[
            "-R",
            "rw-agent",
            logs.to_str().unwrap(),
            e.work().join("host-state").to_str().unwrap(),
        ],
    );
    let kh = pinned(e, &h);
    e.host(
        "web",
        &host_file(
            &h,
            &key,
            &kh,
            &format!(
                "logrotate_configs: [{}]\ntool_timeout: 60s\npaths: [/tmp]",
                conf.display()
            ),
        ),
    );
    e.runbook(
        "rotate",
        &format!(
            "name: rotate\ndescription: t\nhosts: [web]\nautonomy: L3\ntools: {{ observe: [disk_usage], approve: [rotate_logs] }}\nbudget: {{ max_duration: 5m }}\nsteps:\n  - id: before\n    call: disk_usage\n    args: {{ path: /tmp }}\n  - id: rotate\n    call: rotate_logs\n    args: {{ config: {} }}\n    reason: the log is large\n  - id: after\n    call: disk_usage\n    args: {{ path: /tmp }}\n",
            conf.display()
        ),
    );
    (h, logs.display().to_string())
}

#[test]
fn a_link_cut_during_a_change_is_verified_from_the_host_after_it_comes_back() {
    let e = Estate::new();
    let (h, logs) = slow_rotation_host(&e);
    let run = e
        .cmd(&["run", "rotate", "--host", "web", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Cut the link once the host's agent has started the rotation.
    let agent_audit = h.dir.join("agent-audit.jsonl");
    wait_for(
        "the rotation's intent on the host",
        std::time::Duration::from_secs(20),
        || {
            std::fs::read_to_string(&agent_audit)
                .ok()
                .filter(|t| t.contains("\"tool\":\"rotate_logs\""))
        },
    );
    let veth = format!("rws{}", h.index);
    sh("/usr/sbin/ip", &["link", "set", &veth, "down"]);
    std::thread::sleep(std::time::Duration::from_secs(20));
    sh("/usr/sbin/ip", &["link", "set", &veth, "up"]);
    sh(
        "/usr/sbin/ip",
        &[
            "addr",
            "replace",
            &format!("10.239.{}.1/24", h.index),
            "dev",
            &veth,
        ],
    );
    let out = run.wait_with_output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rotate = step(&report, "rotate");
    assert_eq!(rotate["status"], "ok", "{report:#}");
    assert_eq!(rotate["result"]["verified"], true, "{rotate:#}");
    let reconnected = rotate["result"]["data"]["reconnected"].as_str().unwrap();
    assert!(
        reconnected.starts_with("the connection failed during the call (")
            && reconnected.contains("reconnected (attempt"),
        "{reconnected}"
    );
    assert_eq!(report["verdict"], "ok", "{report:#}");
    assert_eq!(step(&report, "after")["status"], "ok", "the run went on");
    // Exactly one rotation happened on the host: no blind retry.
    let host_audit = std::fs::read_to_string(&agent_audit).unwrap();
    assert_eq!(
        host_audit
            .lines()
            .filter(|l| l.contains("\"phase\":\"intent\"") && l.contains("rotate_logs"))
            .count(),
        1
    );
    assert!(std::path::Path::new(&format!("{logs}/app.log.1")).exists());
    assert!(!std::path::Path::new(&format!("{logs}/app.log.2")).exists());
}

#[test]
fn a_change_to_an_unreachable_host_is_never_retried_blindly() {
    // The link is down before the change: it cannot reach the host, and the
    // runner cannot learn otherwise within the budget, so the outcome is
    // reported unknown and unverified; it is never sent twice.
    let e = Estate::new();
    let (h, _) = slow_rotation_host(&e);
    sh(
        "/usr/sbin/ip",
        &["link", "set", &format!("rws{}", h.index), "down"],
    );
    let rb = std::fs::read_to_string(e.path().join("runbooks/rotate.yaml")).unwrap();
    let rb = rb.replace("max_duration: 5m", "max_duration: 12s");
    let only_rotate = rb[..rb.find("  - id: before").unwrap()].to_string()
        + &rb[rb.find("  - id: rotate").unwrap()..rb.find("  - id: after").unwrap()];
    e.runbook("rotate", &only_rotate);
    let (code, report) = e.run_json("rotate", "web", &[]);
    assert_eq!(code, 1, "{report:#}");
    let rotate = step(&report, "rotate");
    assert_eq!(rotate["result"]["verified"], false, "{rotate:#}");
    let err = rotate["result"]["error"].as_str().unwrap();
    assert!(
        err.starts_with("outcome unknown: the connection to host web failed"),
        "{err}"
    );
    let host_audit = std::fs::read_to_string(h.dir.join("agent-audit.jsonl")).unwrap();
    assert!(
        !host_audit.contains("rotate_logs"),
        "it never reached the host"
    );
}

/// One signed tier-2 permit sent on 16 SSH connections at the same moment
/// (16 agent processes, as sshd starts them), 50 times over: each time
/// exactly one agent dispatches it (one intent line on the host) and the 15
/// others are refused `permit_replayed`.
#[test]
fn one_permit_sent_on_sixteen_ssh_connections_at_once_runs_once() {
    use runwarden::signing::{CallId, PermitKey};
    let e = Estate::new();
    let logs = e.work().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("app.log"), "x\n".repeat(100)).unwrap();
    let conf = e.work().join("lr.conf");
    std::fs::write(
        &conf,
        format!(
            "{}/app.log {{\n  rotate 3\n  missingok\n}}\n",
            logs.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(e.work().join("host-state")).unwrap();
    let (h, key) = ssh_host(
        &e,
        &format!(
            "paths: [/tmp]\nlogrotate_configs: [{}]\nlogrotate_state: {}",
            conf.display(),
            e.work().join("host-state/lr.state").display()
        ),
    );
    sh(
        "/bin/chown",
        &[
            "-R",
            "rw-agent",
            logs.to_str().unwrap(),
            e.work().join("host-state").to_str().unwrap(),
        ],
    );
    let permits = PermitKey::load(&e.path().join("state/permit.key")).unwrap();
    let args = serde_json::json!({ "config": conf, "reason": "the log is large" });
    let agent_audit = h.dir.join("agent-audit.jsonl");
    let mut replayed = Vec::new();
    for trial in 0..50 {
        let run_id = format!("ssh-trial-{trial}");
        let permit = permits.sign(
            &CallId {
                run_id: &run_id,
                step: 1,
                host: "web",
                tool: "rotate_logs",
                args: &args,
            },
            "standing:rotate",
        );
        let line = serde_json::json!({
            "run_id": run_id, "step": 1, "runbook": "rotate", "tool": "rotate_logs",
            "args": args, "permit": permit,
        })
        .to_string();
        let clients: Vec<std::process::Child> = (0..16)
            .map(|_| {
                let mut c = Command::new("/usr/bin/ssh")
                    .args(["-i", key.to_str().unwrap()])
                    .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
                    .args(["-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
                    .arg(format!("rw-agent@10.239.{}.2", h.index))
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                use std::io::Write;
                let mut stdin = c.stdin.take().unwrap();
                writeln!(stdin, "{line}").unwrap();
                drop(stdin);
                c
            })
            .collect();
        let replies: Vec<String> = clients
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().unwrap();
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr)
            })
            .collect();
        let ran = replies.iter().filter(|r| r.contains("\"result\"")).count();
        let refused = replies
            .iter()
            .filter(|r| r.contains("already used"))
            .count();
        assert_eq!((ran, refused), (1, 15), "trial {trial}: {replies:#?}");
        let host_audit = std::fs::read_to_string(&agent_audit).unwrap();
        let of_trial: Vec<serde_json::Value> = host_audit
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["run_id"] == run_id.as_str())
            .collect();
        let intents = of_trial.iter().filter(|l| l["phase"] == "intent").count();
        assert_eq!(intents, 1, "trial {trial}");
        replayed.extend(
            of_trial
                .iter()
                .filter(|l| l["phase"] == "denied")
                .map(|l| l["detail"]["reason"].as_str().unwrap_or("").to_string()),
        );
    }
    assert_eq!(replayed.len(), 50 * 15);
    assert!(
        replayed.iter().all(|r| r == "permit_replayed"),
        "{replayed:?}"
    );
}

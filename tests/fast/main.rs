//! The fast tier: what runs with plain `cargo test`, as any user, in
//! seconds. The daemon is started in-process through `app::serve` on
//! `127.0.0.1:0` (its ready hook says where), with real HTTP on loopback and
//! real tool processes for tier-1 calls on a temporary directory; nothing
//! needs root. The root tier (systemd, sshd, Prometheus, Alertmanager,
//! full filesystems) is `sudo tests/run.sh`.

// A test stops loudly where its setup fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

mod agent;
mod alerts;
mod layers;
mod oncall;
mod reload;

const TOKEN: &str = "fast-tier-token-0123456789";

/// A config directory: runbook `disk` (alert `DiskAlmostFull`, tier 1 only)
/// on hosts `web-01` and `web-02`, a bearer token, and the paths under the temp dir.
fn config(dir: &Path) {
    for d in ["hosts", "runbooks", "kill-switch", "data"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let secret = dir.join("token");
    std::fs::write(&secret, TOKEN).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(
        dir.join("runwarden.yaml"),
        "listen: 127.0.0.1:0\nwebhook_token_file: token\naudit_head: none\n",
    )
    .unwrap();
    for host in ["web-01", "web-02"] {
        std::fs::write(
            dir.join(format!("hosts/{host}.yaml")),
            format!(
                "name: {host}\nconnection: local\npaths: [{}]\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("runbooks/disk.yaml"),
        format!(
            "name: disk\ndescription: measure the data directory\nhosts: [web-01, web-02]\nautonomy: L3\n\
             on_alert:\n  matchers: ['alertname=\"DiskAlmostFull\"']\n  host_label: instance\n\
             cooldown: 1h\ntools:\n  observe: [disk_usage]\n\
             steps:\n  - id: data\n    call: disk_usage\n    args: {{ path: {} }}\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
}

/// The daemon, in this process; stopped when dropped.
struct Daemon {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Daemon {
    async fn start(dir: &Path) -> Daemon {
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let opts = runwarden::app::ServeOptions {
            config_dir: dir.to_path_buf(),
            listen: None,
        };
        let task = tokio::spawn(runwarden::app::serve(
            opts,
            async move {
                let _ = stopped.await;
            },
            Some(ready_tx),
        ));
        let addr = tokio::time::timeout(Duration::from_secs(20), ready)
            .await
            .expect("the daemon is ready")
            .expect("the daemon started");
        Daemon {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stop it and return how `serve` ended.
    async fn shutdown(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap()
    }
}

/// One series of the daemon's `/metrics` (the first line that starts with `name`).
async fn metric(d: &Daemon, name: &str) -> Option<f64> {
    let text = client()
        .get(d.url("/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Wait (20 s at most) until the series reads a value `ok` accepts; that value.
async fn wait_metric(d: &Daemon, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match metric(d, name).await {
            Some(v) if ok(v) => return v,
            got => assert!(
                std::time::Instant::now() < deadline,
                "{name} never read what was waited for: {got:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn json_of(r: reqwest::Response) -> Value {
    serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null)
}

fn notification() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/alertmanager/firing-two-alerts.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

async fn post_alerts(d: &Daemon, body: &Value) -> (u16, Value) {
    let r = client()
        .post(d.url("/api/v1/alerts"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, json_of(r).await)
}

/// Post `body`, which must start a run (its first alert's), and wait for that
/// run's verdict.
async fn run_to_its_verdict(d: &Daemon, body: &Value) -> Value {
    let (status, answer) = post_alerts(d, body).await;
    assert_eq!(status, 200, "{answer}");
    let run_id = answer["outcomes"][0]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no run started: {answer}"))
        .to_string();
    verdict_of(d, &run_id).await
}

/// Poll the run history until `run_id` has a verdict.
async fn verdict_of(d: &Daemon, run_id: &str) -> Value {
    for _ in 0..200 {
        let r = client()
            .get(d.url(&format!("/api/v1/runs/{run_id}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            let v = json_of(r).await;
            if v["status"] != "running" && v["status"] != "queued" {
                return v;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run_id} never got a verdict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_alertmanager_notification_starts_one_run_that_ends_ok_and_is_in_the_history() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::write(dir.path().join("data/file"), vec![0u8; 64 << 10]).unwrap();
    let d = Daemon::start(dir.path()).await;

    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{body}");
    // Two alerts for one host: one run, and the second alert is deduplicated.
    let outcomes = body["outcomes"].as_array().expect("outcomes");
    let started: Vec<&Value> = outcomes
        .iter()
        .filter(|o| o["result"] == "started")
        .collect();
    assert_eq!(started.len(), 1, "{body}");
    let run_id = started[0]["run_id"].as_str().expect("a run id").to_string();

    let run = verdict_of(&d, &run_id).await;
    assert_eq!(run["status"], "ok", "{run}");
    assert_eq!(run["runbook"], "disk");
    assert_eq!(run["host"], "web-01");
    let used = &run["report"]["steps"][0]["result"]["data"]["used_bytes"];
    assert!(
        used.as_u64().is_some_and(|b| b >= 64 << 10),
        "disk_usage measured the file: {run}"
    );

    // Within the cooldown the same notification starts nothing.
    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200);
    assert!(
        body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["result"] != "started"),
        "{body}"
    );

    // The audit log the run wrote verifies.
    let v = runwarden::audit::verify(&dir.path().join("state/audit.jsonl")).unwrap();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    assert!(
        v.lines >= 4,
        "queued, start, intent, result, verdict: {}",
        v.lines
    );
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_without_the_token_and_the_switch_stops_the_webhook() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = Daemon::start(dir.path()).await;
    let c = client();

    for path in ["/api/v1/runs", "/api/v1/runs/0123"] {
        let r = c.get(d.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without a token");
        let r = c
            .get(d.url(path))
            .bearer_auth("not-the-token-at-all-000")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path} with a wrong token");
    }
    let r = c
        .post(d.url("/api/v1/alerts"))
        .header("content-type", "application/json")
        .body(notification().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the webhook without its token");
    let r = c.get(d.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "health needs no token");

    std::fs::write(dir.path().join("kill-switch/ENGAGED"), "fast tier").unwrap();
    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["result"] == "kill_switch" || o["result"] == "deduplicated"),
        "{body}"
    );
    assert!(
        body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["result"] == "kill_switch"),
        "{body}"
    );
    let metrics = c
        .get(d.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("runwarden_kill_switch_engaged{scope=\"global\"} 1")
            || metrics.contains(
                "runwarden_alert_triggers_total{result=\"kill_switch\",runbook=\"disk\"} 1"
            ),
        "{metrics}"
    );
    // The gauge follows the switch, with since when (the file's time).
    let mtime = std::fs::metadata(dir.path().join("kill-switch/ENGAGED"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut since = None;
    for _ in 0..200 {
        let text = c
            .get(d.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        since = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "runwarden_kill_switch_engaged_since_timestamp_seconds{scope=\"global\"} ",
                )
            })
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v > 0.0);
        if since.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        since.is_some_and(|s| (s - mtime).abs() < 1.0),
        "since {since:?}, file {mtime}"
    );
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_config_it_cannot_use_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::write(
        dir.path().join("runbooks/disk.yaml"),
        "name: disk\nhosts: [nowhere]\n",
    )
    .unwrap();
    let (ready, _r) = tokio::sync::oneshot::channel();
    let opts = runwarden::app::ServeOptions {
        config_dir: dir.path().to_path_buf(),
        listen: None,
    };
    let err = runwarden::app::serve(opts, async {}, Some(ready))
        .await
        .expect_err("a broken runbook");
    let text = format!("{err:#}");
    assert!(text.contains("disk.yaml"), "{text}");
}

#[test]
fn a_closed_stdout_ends_a_command_quietly_with_141() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(["tools", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// What the kernel leaves when a writer is killed in the middle of a write
/// larger than a page (SIGKILL cuts a multi-page `write` short on ext4): the
/// log's whole lines, then part of the next one.
fn tear(audit: &Path) -> Vec<u8> {
    use std::io::Write;
    let fragment = br#"{"ts":"2026-12-01T20:31:53.9Z","run_id":"01a2334e","phase":"que"#.to_vec();
    std::fs::OpenOptions::new()
        .append(true)
        .open(audit)
        .unwrap()
        .write_all(&fragment)
        .unwrap();
    fragment
}

/// The captured notification, for `web-02` (a second host of the runbook):
/// no cooldown or dedupe of `web-01`'s run stands in its way.
fn for_web_02() -> Value {
    let mut n = notification();
    n["groupKey"] = "web-02".into();
    for a in n["alerts"].as_array_mut().unwrap() {
        a["labels"]["instance"] = "web-02:9100".into();
        a["fingerprint"] = format!("web-02-{}", a["fingerprint"].as_str().unwrap()).into();
    }
    n
}

/// A daemon killed mid-write must not keep the next one from starting: the
/// torn fragment (never acknowledged: its writer died inside the write) is
/// set aside beside the log, the chain goes on from the last whole line, and
/// `audit verify` passes and says where the fragment went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_torn_by_a_killed_writer_is_set_aside_and_the_next_daemon_starts() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let audit = dir.path().join("state/audit.jsonl");
    let d = Daemon::start(dir.path()).await;
    run_to_its_verdict(&d, &notification()).await;
    d.shutdown().await.unwrap();
    let whole = std::fs::read(&audit).unwrap();
    let fragment = tear(&audit);

    let d = Daemon::start(dir.path()).await;
    assert_eq!(
        std::fs::read(&audit).unwrap(),
        whole,
        "the fragment is cut off"
    );
    let aside = std::fs::read(dir.path().join("state/audit.jsonl.torn")).unwrap();
    assert!(
        aside.windows(fragment.len()).any(|w| w == fragment),
        "the fragment is kept: {}",
        String::from_utf8_lossy(&aside)
    );
    // The chain goes on: a run for another host appends to it.
    assert_eq!(run_to_its_verdict(&d, &for_web_02()).await["status"], "ok");
    d.shutdown().await.unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(["audit", "verify", "--config"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("audit.jsonl.torn"),
        "verify names the set-aside fragment: {text}"
    );
}

/// The same tear while a daemon has the log open (a command-line run killed
/// mid-write beside it): the daemon's next trigger is still recorded and
/// answered 200, not refused with 503 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_torn_under_a_running_daemon_is_set_aside_at_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let audit = dir.path().join("state/audit.jsonl");
    let d = Daemon::start(dir.path()).await;
    run_to_its_verdict(&d, &notification()).await;
    let fragment = tear(&audit);

    // Another host's alert: no cooldown or dedupe stands in its way.
    let (status, body) = post_alerts(&d, &for_web_02()).await;
    assert_ne!(status, 503, "{body}");
    let aside = std::fs::read(dir.path().join("state/audit.jsonl.torn")).unwrap();
    assert!(aside.windows(fragment.len()).any(|w| w == fragment));
    d.shutdown().await.unwrap();
    let v = runwarden::audit::verify(&audit).unwrap();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
}

/// `runwarden ARGS...`, whatever it comes to (no approver token in its environment).
fn runwarden<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(args)
        .env_remove("RUNWARDEN_APPROVER_TOKEN_FILE")
        .output()
        .unwrap()
}

/// `runwarden ARGS...` that must succeed: its standard output.
fn runwarden_ok(args: &[&std::ffi::OsStr]) -> String {
    let out = runwarden(args);
    assert!(
        out.status.success(),
        "runwarden {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `runwarden install print --host me` for the config in `dir` (it makes the permit key).
fn install_print(dir: &Path) -> String {
    runwarden_ok(&[
        "install".as_ref(),
        "print".as_ref(),
        "--host".as_ref(),
        "me".as_ref(),
        "--config".as_ref(),
        dir.as_os_str(),
    ])
}

/// This machine's own agent on a unix socket, as `runwarden-agent.socket`
/// serves it (one real `runwarden agent --stdio` per connection, on the
/// accepted stream, as systemd's `Accept=yes` starts it). Returns the
/// policy file's path; the listener lives until the process ends.
fn agent_socket(dir: &Path, socket: &Path, policy_allows: &Path) -> std::path::PathBuf {
    use std::os::fd::OwnedFd;
    let text = install_print(dir);
    let policy_text: String = text
        .split("### ")
        .find(|s| s.starts_with("/etc/runwarden/agent.yaml"))
        .and_then(|s| s.split_once('\n'))
        .map(|(_, body)| body.to_string())
        .expect("the agent's policy");
    assert!(policy_text.contains("sudo: false"), "{policy_text}");
    let policy = dir.join("agent.yaml");
    std::fs::write(
        &policy,
        policy_text
            .replace(
                "jail: /var/lib/runwarden-agent/jail",
                &format!("jail: {}", dir.join("agent-jail").display()),
            )
            .replace(
                &format!("paths: [\"{}\"]", dir.join("data").display()),
                &format!("paths: [\"{}\"]", policy_allows.display()),
            ),
    )
    .unwrap();
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    let (policy_path, audit) = (policy.clone(), dir.join("agent-audit.jsonl"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let fd = OwnedFd::from(stream);
            // Each connection's agent runs alongside the others, as
            // systemd's Accept=yes starts them.
            let child = std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"))
                .args(["agent", "--stdio", "--policy"])
                .arg(&policy_path)
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
    policy
}

/// A config whose host `me` is this machine through its agent's socket,
/// with runbook `look` (one tier-1 call) and `fix` (one tier-2 call).
fn agent_config(dir: &Path) -> std::path::PathBuf {
    for d in ["hosts", "runbooks", "kill-switch", "data"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let socket = dir.join("agent.sock");
    std::fs::write(dir.join("runwarden.yaml"), "audit_head: none\n").unwrap();
    std::fs::write(
        dir.join("hosts/me.yaml"),
        format!(
            "name: me\nconnection:\n  agent: {}\npaths: [{}]\nunits: [demo.service]\n",
            socket.display(),
            dir.join("data").display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("runbooks/look.yaml"),
        format!(
            "name: look\ndescription: t\nhosts: [me]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: {} }}\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("runbooks/fix.yaml"),
        "name: fix\ndescription: t\nhosts: [me]\nautonomy: L3\ntools: { approve: [restart_service] }\nsteps:\n  - call: restart_service\n    args: { unit: demo.service }\n    reason: t\n",
    )
    .unwrap();
    socket
}

fn run_json(dir: &Path, runbook: &str) -> (Option<i32>, Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(["run", runbook, "--host", "me", "--json", "--config"])
        .arg(dir)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no report ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

/// Calls to this machine through its agent's socket: a call goes through
/// the real agent, which writes its own audit line and whose policy wins;
/// with no agent listening nothing is sent, a change included, and the
/// run says which socket to look at.
#[test]
fn this_machine_through_its_agent_socket_and_without_it() {
    // No agent listening: nothing is sent, the run fails naming the socket.
    let dir = tempfile::tempdir().unwrap();
    let socket = agent_config(dir.path());
    // The runner's permit key exists (install print makes it), so a change
    // is refused for the socket alone.
    install_print(dir.path());
    for runbook in ["look", "fix"] {
        let (code, report) = run_json(dir.path(), runbook);
        assert_eq!(code, Some(1), "{runbook}: {report:#}");
        let error = report["steps"][0]["result"]["error"].as_str().unwrap_or("");
        assert!(
            error.starts_with("not sent") && error.contains(&socket.display().to_string()),
            "{runbook}: {report:#}"
        );
    }

    // The agent listening: a tier-1 call goes through it and its audit log.
    let _policy = agent_socket(dir.path(), &socket, &dir.path().join("data"));
    let (code, report) = run_json(dir.path(), "look");
    assert_eq!(code, Some(0), "{report:#}");
    assert!(
        report["steps"][0]["result"]["data"]["size_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{report:#}"
    );
    let agent_audit = std::fs::read_to_string(dir.path().join("agent-audit.jsonl")).unwrap();
    assert!(agent_audit.contains("disk_usage"), "{agent_audit}");

    // The agent's own policy wins over the runner's host file.
    let other = tempfile::tempdir().unwrap();
    let socket = agent_config(other.path());
    agent_socket(other.path(), &socket, Path::new("/nonexistent-elsewhere"));
    let (code, report) = run_json(other.path(), "look");
    assert_eq!(code, Some(1), "{report:#}");
    assert!(
        report["steps"][0]["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{report:#}"
    );
}

/// `runwarden alerts test FILE --json` against a config directory.
fn alerts_test(dir: &Path, file: &Path) -> Value {
    let out = runwarden_ok(&[
        "alerts".as_ref(),
        "test".as_ref(),
        "--json".as_ref(),
        "--config".as_ref(),
        dir.as_os_str(),
        file.as_os_str(),
    ]);
    serde_json::from_str(&out).unwrap()
}

/// The captured notification (`/` and `/var` filling on web-01) against the
/// shipped example runbook and host: `alerts test` says the first alert
/// starts a run and the second joins it; posted to the webhook it starts
/// one run that sees both alerts (`alerts` in its templates) and measures
/// both filesystems; afterwards `alerts test` names the cooldown, and an
/// alert no runbook takes says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_captured_notification_starts_the_shipped_example_and_one_run_sees_both_alerts() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::remove_file(dir.path().join("runbooks/disk.yaml")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["runbooks/disk-almost-full.yaml", "hosts/web-01.yaml"] {
        std::fs::copy(repo.join(f), dir.path().join(f)).unwrap();
    }
    let fixture = repo.join("tests/fixtures/alertmanager/firing-two-alerts.json");

    let before = alerts_test(dir.path(), &fixture);
    let results: Vec<&str> = before["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcomes"][0]["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["would_start", "joins"], "{before:#}");

    let d = Daemon::start(dir.path()).await;
    let (status, body) = post_alerts(&d, &notification()).await;
    assert_eq!(status, 200, "{body}");
    let run_id = body["outcomes"][0]["run_id"]
        .as_str()
        .expect("a run")
        .to_string();
    assert_eq!(body["outcomes"][1]["result"], "deduplicated", "{body}");
    let run = verdict_of(&d, &run_id).await;
    assert_eq!(run["status"], "ok", "{run:#}");
    let measured: Vec<&str> = run["report"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["args"]["path"].as_str())
        .collect();
    assert_eq!(measured, ["/", "/var"], "{run:#}");
    d.shutdown().await.unwrap();

    // The same notification again is what the webhook deduplicates; a new
    // alert for the host waits out the cooldown: the scheduler's own rule.
    let again = alerts_test(dir.path(), &fixture);
    assert_eq!(
        again["alerts"][0]["outcomes"][0]["result"], "deduplicated",
        "{again:#}"
    );
    let fresh = dir.path().join("fresh.json");
    std::fs::write(
        &fresh,
        std::fs::read_to_string(&fixture)
            .unwrap()
            .replace("d262fe820fddf66b", "0000000000000001")
            .replace("7723640f18b12a3c", "0000000000000002")
            .replace("\"groupKey\":\"{}", "\"groupKey\":\"new{}"),
    )
    .unwrap();
    let after = alerts_test(dir.path(), &fresh);
    let first = &after["alerts"][0]["outcomes"][0];
    assert_eq!(first["result"], "cooldown", "{after:#}");
    assert!(
        first["why"].as_str().unwrap().contains("cooldown of 10m"),
        "{after:#}"
    );

    let other = dir.path().join("other.json");
    std::fs::write(
        &other,
        std::fs::read_to_string(&fixture)
            .unwrap()
            .replace("DiskAlmostFull", "MemoryPressure"),
    )
    .unwrap();
    let unmatched = alerts_test(dir.path(), &other);
    let o = &unmatched["alerts"][0]["outcomes"][0];
    assert_eq!(o["result"], "no_match", "{unmatched:#}");
    assert!(
        o["why"].as_str().unwrap().contains("DiskAlmostFull"),
        "{unmatched:#}"
    );
}

/// The dashboard as a person meets it, checked without a Grafana (none is
/// packaged where the tests run; every query is run against a real
/// Prometheus in the root tier): every panel says what it shows and in
/// which unit, every query follows the `job` and `instance` variables,
/// panels do not overlap, the kill switch is red when engaged, and kill
/// switch changes and reloads are annotations.
#[test]
fn the_dashboard_describes_every_panel_and_follows_its_variables() {
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/dashboards/runwarden.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let panels = d["panels"].as_array().unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let mut cells = std::collections::BTreeMap::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "{title}: duplicate id"
        );
        assert!(
            p["description"].as_str().is_some_and(|s| s.len() > 20),
            "{title}: no description"
        );
        assert!(
            p["fieldConfig"]["defaults"]["unit"].as_str().is_some(),
            "{title}: no unit"
        );
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let selectors = expr.matches("runwarden_").count();
            assert_eq!(
                expr.matches("job=~\"$job\",instance=~\"$instance\"")
                    .count(),
                selectors,
                "{title}: {expr}"
            );
        }
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "{title}: wider than the grid");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.to_string()) {
                    panic!("{title} overlaps {other}");
                }
            }
        }
    }
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance"]);
    let switch = panels.iter().find(|p| p["title"] == "Kill switch").unwrap();
    let steps = &switch["fieldConfig"]["defaults"]["thresholds"]["steps"];
    assert_eq!(steps[1], serde_json::json!({ "color": "red", "value": 1 }));
    let annotations: Vec<&str> = d["annotations"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["expr"].as_str().unwrap())
        .collect();
    assert!(
        annotations
            .iter()
            .any(|e| e.contains("runwarden_kill_switch_engaged"))
    );
    assert!(
        annotations
            .iter()
            .any(|e| e.contains("runwarden_config_reloads_total"))
    );
}

/// `run --alert` takes a whole notification as Alertmanager sends it (its
/// first firing alert starts the run, which sees all of them as `alerts`),
/// and `promote-report` of a runbook that is not there is a usage error
/// with a did-you-mean.
#[test]
fn run_takes_a_whole_notification_and_promote_report_names_a_misspelt_runbook() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::remove_file(dir.path().join("runbooks/disk.yaml")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["runbooks/disk-almost-full.yaml", "hosts/web-01.yaml"] {
        std::fs::copy(repo.join(f), dir.path().join(f)).unwrap();
    }
    let fixture = repo.join("tests/fixtures/alertmanager/firing-two-alerts.json");
    let out = runwarden_ok(&[
        "run".as_ref(),
        "disk-almost-full".as_ref(),
        "--host".as_ref(),
        "web-01".as_ref(),
        "--json".as_ref(),
        "--alert".as_ref(),
        fixture.as_os_str(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    let report: Value = serde_json::from_str(&out).unwrap();
    let measured: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["args"]["path"].as_str())
        .collect();
    assert_eq!(measured, ["/", "/var"], "{report:#}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(["promote-report", "disk-almost-ful", "--config"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean \"disk-almost-full\"?"), "{err}");
}

/// The text report and the transcript say what each result said in a
/// person's words (the `use_pct` the run looked at, the largest entries),
/// one line per step, not a JSON blob cut short.
#[test]
fn the_report_and_the_transcript_say_what_each_result_said() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::create_dir_all(dir.path().join("data/big")).unwrap();
    std::fs::write(dir.path().join("data/big/file"), vec![1u8; 3 << 20]).unwrap();
    let report = runwarden_ok(&[
        "run".as_ref(),
        "disk".as_ref(),
        "--host".as_ref(),
        "web-01".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    let said = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("said: "))
        .unwrap_or_else(|| panic!("no said line: {report}"));
    assert!(said.contains("% used of "), "{report}");
    assert!(
        said.contains(&format!(
            "largest: {}/big 3.0 MiB",
            dir.path().join("data").display()
        )),
        "{report}"
    );
    assert!(
        !report.contains("{\""),
        "no JSON in the text report: {report}"
    );
    let run_id = report.split_whitespace().nth(1).unwrap().to_string();
    let transcript = runwarden_ok(&[
        "transcript".as_ref(),
        run_id.as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(
        transcript.contains(&format!("   said: {said}")),
        "{transcript}"
    );
}

/// `--json` where a script reads the answer: `kill-switch status` (with the
/// same exit codes as the text), `check` (problems with file, line, column);
/// and `audit show` lines up its columns and says why the gate denied a call.
#[test]
fn kill_switch_status_and_check_speak_json_and_audit_show_names_a_denial() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"))
            .args(args)
            .arg("--config")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let status = cli(&["kill-switch", "status", "--json"]);
    assert_eq!(status.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["state"], "released", "{v}");
    std::fs::write(dir.path().join("kill-switch/disk.ENGAGED"), "disk work").unwrap();
    let status = cli(&["kill-switch", "status", "--json"]);
    assert_eq!(status.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["state"], "engaged", "{v}");
    assert_eq!(v["engaged"][0]["scope"], "disk", "{v}");
    std::fs::remove_file(dir.path().join("kill-switch/disk.ENGAGED")).unwrap();

    let check = cli(&["check", "--json"]);
    assert_eq!(check.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["runbooks"][0]["name"], "disk", "{v}");
    std::fs::write(
        dir.path().join("runbooks/broken.yaml"),
        "name: broken\ndescription: t\nhosts: [web-01]\nautonomy: L1\nschedule: \"0 3 31 2 *\"\n",
    )
    .unwrap();
    let check = cli(&["check", "--json"]);
    assert_eq!(check.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    let p = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["message"].as_str().unwrap().contains("can never fire"))
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        (p["line"].as_u64(), p["column"].as_u64()),
        (Some(5), Some(11)),
        "{v}"
    );
    assert!(
        p["message"].as_str().unwrap().contains("can never fire"),
        "{v}"
    );
    std::fs::remove_file(dir.path().join("runbooks/broken.yaml")).unwrap();

    // A call the gate refuses: its reason is on its line of `audit show`.
    std::fs::write(
        dir.path().join("runbooks/outside.yaml"),
        "name: outside\ndescription: t\nhosts: [web-01]\nautonomy: L3\ntools: { observe: [disk_usage] }\nsteps:\n  - call: disk_usage\n    args: { path: /etc }\n",
    )
    .unwrap();
    let run = cli(&["run", "outside", "--host", "web-01", "--json"]);
    let report: Value = serde_json::from_slice(&run.stdout).unwrap();
    let run_id = report["run_id"].as_str().unwrap().to_string();
    let show = cli(&["audit", "show", &run_id]);
    let text = String::from_utf8_lossy(&show.stdout);
    let denied = text
        .lines()
        .find(|l| l.contains(" denied "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        denied.contains("DENIED invalid_arguments: ") && denied.contains("path=/etc"),
        "{text}"
    );
    // The tool column starts at the same place on every line with a step.
    let starts: std::collections::BTreeSet<usize> = text
        .lines()
        .filter(|l| l.contains(" step "))
        .filter_map(|l| l.find("disk_usage"))
        .collect();
    assert_eq!(starts.len(), 1, "{text}");
}

/// Shell completions and the manual page come from the command line's own
/// definitions, so they name every command there is.
#[test]
fn completions_and_the_manual_page_name_every_command() {
    let bash = runwarden_ok(&["completions".as_ref(), "bash".as_ref()]);
    let man = runwarden_ok(&["man".as_ref()]);
    assert!(bash.contains("_runwarden()"), "{bash}");
    assert!(
        man.starts_with(".ie") && man.contains(".TH runwarden 1"),
        "{man}"
    );
    for command in [
        "run",
        "serve",
        "kill-switch",
        "alerts",
        "audit",
        "approvals",
        "check",
    ] {
        assert!(bash.contains(command), "completions lack {command}");
        assert!(
            man.contains(&command.replace('-', "\\-")),
            "the manual page lacks {command}"
        );
    }
    let fish = runwarden_ok(&["completions".as_ref(), "fish".as_ref()]);
    assert!(fish.contains("complete -c runwarden"), "{fish}");
}

/// A command that cannot do its work says so once, on stderr, as one
/// `runwarden: ...` line (after the loader's own FILE:LINE lines), prints
/// nothing on stdout, and exits with the documented code.
#[test]
fn every_failure_is_said_once_with_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["promote-report", "dsik", "--config", cfg],
            2,
            "no runbook \"dsik\"",
        ),
        (
            &["runs", "--since", "yesterday-ish", "--config", cfg],
            2,
            "yesterday-ish",
        ),
        (&["transcript", "0000", "--config", cfg], 1, "0000"),
        (
            &[
                "kill-switch",
                "engage",
                "--reason",
                "t",
                "--runbook",
                "nope",
                "--config",
                cfg,
            ],
            2,
            "is not a runbook",
        ),
        (
            &[
                "run", "disk", "--host", "web-01", "--host", "web-02", "--config", cfg,
            ],
            2,
            "give one --host",
        ),
        (
            &["run", "disk", "--host", "web-09", "--config", cfg],
            2,
            "web-09",
        ),
        (
            &["install", "print", "--host", "web-09", "--config", cfg],
            2,
            "no host named \"web-09\"",
        ),
        (
            &["alerts", "test", "/nonexistent.json", "--config", cfg],
            2,
            "cannot read /nonexistent.json",
        ),
        (&["approvals", "list", "--config", cfg], 2, "--token-file"),
        (&["agent"], 2, "only speaks on stdio"),
    ];
    for (args, code, says) in cases {
        let out = runwarden(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("runwarden: "))
            .collect();
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert_eq!(said.len(), 1, "{args:?}: said once: {stderr}");
        assert!(said[0].contains(says), "{args:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // A configuration that does not load: its problems as FILE:LINE lines,
    // then one line that sums them up.
    std::fs::write(
        dir.path().join("runbooks/disk.yaml"),
        "name: disk\nhosts: [web-01]\nautonomy: L9\n",
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines[0].contains("runbooks/disk.yaml:"), "{stderr}");
    assert!(
        lines.last().unwrap().starts_with("runwarden: ")
            && lines.last().unwrap().contains("nothing was loaded"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("runwarden: ").count(), 1, "{stderr}");
}

/// A `fleet_budget` that cannot hold is refused where it is written.
#[test]
fn a_fleet_budget_that_cannot_hold_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    for (yaml, says) in [
        (
            "fleet_budget: { max_mutations: 3, per: 0s }\n",
            "fleet_budget.per must be longer than zero",
        ),
        (
            "fleet_budget: { max_mutations: 3, per: 40d }\n",
            "fleet_budget.per must be at most 31d",
        ),
        (
            "fleet_budget: { max_mutations: 200000, per: 1h }\n",
            "fleet_budget.max_mutations must be at most 100000",
        ),
        (
            "fleet_budget: { max_mutation: 3, per: 1h }\n",
            "max_mutation",
        ),
        ("fleet_budget: { per: 1h }\n", "max_mutations"),
    ] {
        std::fs::write(dir.path().join("runwarden.yaml"), yaml).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {stderr}");
        assert!(stderr.contains("runwarden.yaml:1:"), "{yaml}: {stderr}");
        assert!(stderr.contains(says), "{yaml}: {stderr}");
    }
    std::fs::write(
        dir.path().join("runwarden.yaml"),
        "fleet_budget: { max_mutations: 20, per: 1h }\n",
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("fleet budget: 20 tier-2 calls per 1h across every run"),
        "{said}"
    );
    let out = runwarden(&["check", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["fleet_budget"],
        serde_json::json!({ "max_mutations": 20, "per_seconds": 3600 })
    );
}

#[test]
fn shared_state_that_cannot_work_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    for (yaml, at, says) in [
        (
            "state:\n  postgres:\n    url_file: pg-url\n    lease: 1s\n",
            "runwarden.yaml:4:",
            "state.postgres.lease must be between 3s and 10m",
        ),
        (
            "state:\n  postgres:\n    url_file: pg-url\n    lease: 1h\n",
            "runwarden.yaml:4:",
            "state.postgres.lease must be between 3s and 10m",
        ),
        (
            "state:\n  postgres:\n    lease: 15s\n",
            "runwarden.yaml:",
            "url_file",
        ),
        ("state:\n  postgre: {}\n", "runwarden.yaml:2:", "postgre"),
        ("replica: Web_A\n", "runwarden.yaml:1:", "replica \"Web_A\""),
    ] {
        std::fs::write(dir.path().join("runwarden.yaml"), yaml).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {stderr}");
        assert!(
            stderr.contains(at) && stderr.contains(says),
            "{yaml}: {stderr}"
        );
    }
    // A good one: shown by check; db status names what is missing.
    std::fs::write(
        dir.path().join("runwarden.yaml"),
        "state:\n  postgres:\n    url_file: pg-url\nreplica: web-a\n",
    )
    .unwrap();
    let out = runwarden(&["check", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"]["store"], "postgres", "{v:#}");
    assert_eq!(v["state"]["replica"], "web-a");
    assert_eq!(v["state"]["lease_seconds"], 15.0);
    let out = runwarden(&["db", "status", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("pg-url") && stderr.contains("mode 0600"),
        "{stderr}"
    );
    // Without `state:` there is no database to migrate, and it says so.
    std::fs::write(dir.path().join("runwarden.yaml"), "").unwrap();
    let out = runwarden(&["db", "migrate", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sets no `state: postgres:`"), "{stderr}");
}

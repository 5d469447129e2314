//! The fast tier: what runs with plain `cargo test`, as any user, in
//! seconds. The daemon is started in-process through `app::serve` on
//! `127.0.0.1:0` (its ready hook says where), with real HTTP on loopback and
//! real tool processes for tier-1 calls on a temporary directory; nothing
//! needs root. The root tier (systemd, sshd, Prometheus, Alertmanager,
//! full filesystems) is `sudo tests/run.sh`.

// A test stops loudly where its setup fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub use std::path::Path;
pub use std::time::Duration;

pub use serde_json::Value;

mod access;
mod agent;
mod alerts;
mod api;
mod check;
mod cli;
mod dashboard;
mod declared;
mod demotion;
mod history;
mod layers;
#[path = "../support/agent.rs"]
mod local_agent;
mod manual;
mod model;
mod oncall;
mod reload;

const TOKEN: &str = "fast-tier-token-0123456789";

/// A config directory: runbook `disk` (alert `DiskAlmostFull`, tier 1 only)
/// on hosts `web-01` and `web-02`, a bearer token, and the paths under the temp dir.
/// The binary the command tests drive: the shipped build when
/// `RUNWARDEN_BIN` names it (`tests/run.sh` builds it with `cargo build
/// --release --locked`, as the package does), else this test build's.
fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("RUNWARDEN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_runwarden").into())
    })
}

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

/// Audit segments of 4 KiB (the least): a few runs close one.
fn small_segments(dir: &Path) {
    let settings = dir.join("runwarden.yaml");
    let mut yaml = std::fs::read_to_string(&settings).unwrap();
    yaml.push_str("audit_rotation: { max_size: 4KiB }\n");
    std::fs::write(&settings, yaml).unwrap();
}

/// The audit log's lines, as written.
fn audit_lines(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("state/audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// How many closed audit segments `state/` holds.
fn segments(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("state"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("audit.jsonl.")
        })
        .count()
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
            .expect("the daemon started")
            .addr;
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

/// `runwarden ARGS...`, whatever it comes to (no approver token in its environment).
fn runwarden<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    std::process::Command::new(bin())
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
    let policy_text = local_agent::policy_from_print(&install_print(dir), &dir.join("agent-jail"));
    assert!(policy_text.contains("sudo: false"), "{policy_text}");
    let policy = dir.join("agent.yaml");
    std::fs::write(
        &policy,
        policy_text.replace(
            &format!("paths: [\"{}\"]", dir.join("data").display()),
            &format!("paths: [\"{}\"]", policy_allows.display()),
        ),
    )
    .unwrap();
    agent_listener(socket, &policy, &dir.join("agent-audit.jsonl"));
    policy
}

/// Listen on `socket` as `runwarden-agent.socket` does, with `policy` and
/// `audit` (see `tests/support/agent.rs`).
fn agent_listener(socket: &Path, policy: &Path, audit: &Path) {
    local_agent::listen(bin(), socket, policy, audit);
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
    run_json_on(dir, runbook, "me")
}

/// `runwarden run RUNBOOK --host HOST --json`: its exit code and report.
fn run_json_on(dir: &Path, runbook: &str, host: &str) -> (Option<i32>, Value) {
    let out = std::process::Command::new(bin())
        .args(["run", runbook, "--host", host, "--json", "--config"])
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

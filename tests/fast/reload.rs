//! What a reload does with files it cannot take: config files that are not
//! regular files, secret files at the wrong mode, and a relative `--config`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Daemon, TOKEN, client, config};

/// Put something that is not a regular file at `path`: what kinds this user
/// can make (a device needs root).
fn plant(kind: &str, path: &Path) {
    match kind {
        "fifo" => nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap(),
        "socket" => {
            let l = std::os::unix::net::UnixListener::bind(path).unwrap();
            std::mem::forget(l);
        }
        "directory" => std::fs::create_dir(path).unwrap(),
        "device" => nix::sys::stat::mknod(
            path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::S_IRUSR,
            nix::sys::stat::makedev(1, 5),
        )
        .unwrap(),
        "link-to-dev-zero" => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        _ => unreachable!(),
    }
}

fn kinds() -> Vec<(&'static str, &'static str)> {
    let mut k = vec![
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("socket", "is a socket, not a regular file"),
        ("directory", "is a directory, not a regular file"),
        ("link-to-dev-zero", "outside the configuration directory"),
    ];
    if nix::unistd::geteuid().is_root() {
        k.push(("device", "is a character device, not a regular file"));
    }
    k
}

/// `runwarden check` and `serve` at start with each kind of non-file named
/// `*.yaml` under runbooks/ and hosts/: each answers at once (no hang) and
/// names the file and what it is; serve does not start.
#[test]
fn check_and_serve_refuse_a_config_file_that_is_not_a_file_without_blocking() {
    for (kind, said) in kinds() {
        for sub in ["runbooks", "hosts"] {
            let dir = tempfile::tempdir().unwrap();
            config(dir.path());
            let bad = dir.path().join(sub).join("x.yaml");
            plant(kind, &bad);
            for args in [&["check"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
                let started = Instant::now();
                let mut child = Command::new(crate::bin())
                    .args(args)
                    .arg("--config")
                    .arg(dir.path())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                while child.try_wait().unwrap().is_none() {
                    if started.elapsed() > Duration::from_secs(20) {
                        let _ = child.kill();
                        panic!(
                            "{args:?} with a {kind} at {}: still running after 20 s",
                            bad.display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let out = child.wait_with_output().unwrap();
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(out.status.code(), Some(2), "{args:?} {kind}: {text}");
                assert!(
                    text.contains(&format!("{}:", bad.display())) && text.contains(said),
                    "{args:?} {kind} in {sub}: {text}"
                );
            }
        }
    }
}

/// Wait until the metric reads `want` (a reload is inotify's and 300 ms of quiet away).
async fn until_metric(d: &Daemon, name: &str, want: f64) {
    super::wait_metric(d, name, |v| v == want).await;
}

/// Change a runbook (its description says `n`), so the watcher reloads.
fn touch_config(dir: &Path, n: u32) {
    let rb = dir.join("runbooks/disk.yaml");
    let text: String = std::fs::read_to_string(&rb)
        .unwrap()
        .lines()
        .map(|l| match l.starts_with("description:") {
            true => format!("description: measure the data directory ({n})\n"),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(rb, text).unwrap();
}

/// A FIFO (or socket, directory) dropped into runbooks/ while the daemon
/// runs: the reload fails (the metric says so), the daemon keeps answering
/// /healthz, /metrics and the webhook on its old config, and a later good
/// change reloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_meets_a_fifo_fails_and_the_daemon_keeps_serving() {
    for (kind, _) in kinds() {
        let dir = tempfile::tempdir().unwrap();
        config(dir.path());
        let d = Daemon::start(dir.path()).await;
        plant(kind, &dir.path().join("runbooks/x.yaml"));
        until_metric(&d, "runwarden_config_last_reload_successful", 0.0).await;
        for path in ["/healthz", "/metrics"] {
            let r = client().get(d.url(path)).send().await.unwrap();
            assert_eq!(r.status(), 200, "{kind}: {path}");
        }
        let (status, body) = super::post_alerts(&d, &super::notification()).await;
        assert_eq!(status, 200, "{kind}: the webhook on the old config: {body}");
        std::fs::remove_file(dir.path().join("runbooks/x.yaml"))
            .or_else(|_| std::fs::remove_dir(dir.path().join("runbooks/x.yaml")))
            .unwrap();
        touch_config(dir.path(), 1);
        until_metric(&d, "runwarden_config_last_reload_successful", 1.0).await;
        d.shutdown().await.unwrap();
    }
}

fn approvers(dir: &Path, lines: &str, mode: u32) {
    let f = dir.join("approvers");
    let _ = std::fs::remove_file(&f);
    std::fs::write(&f, lines).unwrap();
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

async fn approvals_status(d: &Daemon, token: &str) -> u16 {
    client()
        .get(d.url("/api/v1/approvals"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789ab";

/// Revoking an approver by writing a new approvers file at mode 0644: the
/// file is refused, the reload fails (metric 0), and nobody can approve,
/// the revoked token included, until the file is fixed; then the new list
/// alone holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approvers_file_refused_at_reload_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    approvers(dir.path(), &format!("alice {ALICE}\nbob {BOB}\n"), 0o600);
    let settings = dir.path().join("runwarden.yaml");
    let text = std::fs::read_to_string(&settings).unwrap();
    std::fs::write(&settings, format!("{text}approvers_file: approvers\n")).unwrap();
    let d = Daemon::start(dir.path()).await;
    assert_eq!(approvals_status(&d, ALICE).await, 200);
    assert_eq!(approvals_status(&d, BOB).await, 200);

    // Bob is revoked, but the new file is world-readable.
    approvers(dir.path(), &format!("alice {ALICE}\n"), 0o644);
    touch_config(dir.path(), 1);
    until_metric(&d, "runwarden_config_last_reload_successful", 0.0).await;
    assert_eq!(approvals_status(&d, BOB).await, 503, "the revoked token");
    assert_eq!(approvals_status(&d, ALICE).await, 503, "nobody approves");

    std::fs::set_permissions(
        dir.path().join("approvers"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    touch_config(dir.path(), 2);
    until_metric(&d, "runwarden_config_last_reload_successful", 1.0).await;
    assert_eq!(approvals_status(&d, ALICE).await, 200);
    assert_eq!(approvals_status(&d, BOB).await, 401);
    d.shutdown().await.unwrap();
}

/// The webhook token replaced by a file at mode 0644: the reload fails, and
/// neither the old token nor the new one is taken (503, which Alertmanager
/// retries) until the file is fixed; then only the new token is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_token_refused_at_reload_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let d = Daemon::start(dir.path()).await;
    let status = |token: &'static str| {
        let url = d.url("/api/v1/runs");
        async move {
            client()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(TOKEN).await, 200);
    const NEW: &str = "a-new-webhook-token-0123";
    let file = dir.path().join("token");
    std::fs::write(&file, NEW).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    touch_config(dir.path(), 1);
    until_metric(&d, "runwarden_config_last_reload_successful", 0.0).await;
    assert_eq!(status(TOKEN).await, 503, "the old token");
    assert_eq!(status(NEW).await, 503, "the new token, from a refused file");
    let (code, body) = super::post_alerts(&d, &super::notification()).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.to_string().contains("refused at the last reload"),
        "{body}"
    );

    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    touch_config(dir.path(), 2);
    until_metric(&d, "runwarden_config_last_reload_successful", 1.0).await;
    assert_eq!(status(TOKEN).await, 401);
    assert_eq!(status(NEW).await, 200);
    d.shutdown().await.unwrap();
}

/// `runwarden serve --config .` run from the config directory picks up an
/// edited runbook by itself, as an absolute path does.
#[test]
fn a_relative_config_directory_reloads_on_edits() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut daemon = Command::new(crate::bin())
        .args([
            "serve",
            "--config",
            ".",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reloads = || -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        use std::io::{Read, Write};
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.lines()
            .find(|l| l.starts_with("runwarden_config_reloads_total{result=\"success\"}"))
            .map(str::to_string)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let wait_for = |want: &str| {
        while reloads().as_deref() != Some(want) {
            if Instant::now() > deadline {
                let _ = Command::new("kill").arg(daemon.id().to_string()).status();
                panic!("never saw {want}: {:?}", reloads());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("runwarden_config_reloads_total{result=\"success\"} 0");
    touch_config(dir.path(), 1);
    wait_for("runwarden_config_reloads_total{result=\"success\"} 1");
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// The lock files of alert-triggered runs are made when the daemon starts
/// and when a reload adds a runbook, before any alert: a file made at a
/// run's start would ride on its first intent sync. A scheduled runbook's
/// are not (nothing waits on its start), and a file a run holds is left as
/// it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_files_of_alert_triggered_runs_are_made_ahead_at_start_and_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let locks = dir.path().join("state/locks");
    std::fs::create_dir_all(&locks).unwrap();
    std::fs::write(
        locks.join("disk@web-01.lock"),
        "run r0, pid 1, since then\n",
    )
    .unwrap();
    let d = Daemon::start(dir.path()).await;
    until_locks(&locks, &["disk@web-01.lock", "disk@web-02.lock"]).await;
    assert_eq!(
        std::fs::read_to_string(locks.join("disk@web-01.lock")).unwrap(),
        "run r0, pid 1, since then\n",
        "a file that was there is not touched"
    );
    assert_eq!(
        std::fs::metadata(locks.join("disk@web-02.lock"))
            .unwrap()
            .len(),
        0
    );
    let data = dir.path().join("data");
    for (name, trigger) in [
        (
            "late",
            "on_alert:\n  matchers: ['alertname=\"Late\"']\n  host_label: instance\n",
        ),
        ("weekly", "schedule: \"0 3 * * 1\"\n"),
    ] {
        std::fs::write(
            dir.path().join(format!("runbooks/{name}.yaml")),
            format!(
                "name: {name}\ndescription: d\nhosts: [web-02]\nautonomy: L3\n{trigger}tools:\n  observe: [disk_usage]\nsteps:\n  - call: disk_usage\n    args: {{ path: {} }}\n",
                data.display()
            ),
        )
        .unwrap();
    }
    let made = ["disk@web-01.lock", "disk@web-02.lock", "late@web-02.lock"];
    until_locks(&locks, &made).await;
    d.shutdown().await.unwrap();
}

/// Wait until `locks` holds exactly the files `want` (sorted).
async fn until_locks(locks: &Path, want: &[&str]) {
    let files = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(locks)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let t = Instant::now();
    while files() != want {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "lock files: {:?}, want {want:?}",
            files()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tool files reload like runbooks: a new declared tool and a runbook that
/// lists it are picked up together; a broken tool file is a failed reload
/// (the old set is kept and the runbook still runs), and fixing it reloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_files_reload_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    std::fs::create_dir_all(dir.path().join("tools")).unwrap();
    let d = Daemon::start(dir.path()).await;
    let tool = "name: peek\ntier: 1\ndescription: list the data directory\nargs:\n  dir: { type: path }\nrun: [/usr/bin/ls, \"{{ dir }}\"]\n";
    std::fs::write(dir.path().join("tools/peek.yaml"), tool).unwrap();
    std::fs::write(
        dir.path().join("runbooks/peek.yaml"),
        format!(
            "name: peek\ndescription: t\nhosts: [web-01]\nautonomy: L3\ntools: {{ observe: [peek] }}\nsteps:\n  - call: peek\n    args: {{ dir: {} }}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let runs = || async {
        client()
            .post(d.url("/api/v1/runs"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(r#"{"runbook": "peek", "hosts": ["web-01"]}"#)
            .send()
            .await
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while runs().await.status() != 202 {
        assert!(
            Instant::now() < deadline,
            "the new tool and runbook never loaded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broken tool file: the reload fails, the old set stays in force.
    std::fs::write(
        dir.path().join("tools/peek.yaml"),
        tool.replace("/usr/bin/ls", "ls"),
    )
    .unwrap();
    until_metric(&d, "runwarden_config_last_reload_successful", 0.0).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = runs().await;
        if r.status() == 202 {
            break;
        }
        // A run of it may still hold its lock: asked again.
        assert!(Instant::now() < deadline, "{}", r.text().await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(dir.path().join("tools/peek.yaml"), tool).unwrap();
    until_metric(&d, "runwarden_config_last_reload_successful", 1.0).await;
    d.shutdown().await.unwrap();
}

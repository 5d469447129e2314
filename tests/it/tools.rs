//! Tools against real parts on this machine: real logrotate (with its real
//! "insecure permissions" failure), real certificates made by openssl, a real
//! tmpfs filled past 90%, a real HTTP server, a real gunicorn worker pool.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::*;

fn logrotate_case(dir_mode: u32) -> (Estate, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let e = Estate::new();
    let logs = e.work().join("app");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("api.log"), "GET /health 200\n".repeat(1000)).unwrap();
    sh("/usr/bin/chgrp", &["adm", logs.to_str().unwrap()]);
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    let conf = e.work().join("app.conf");
    std::fs::write(
        &conf,
        format!(
            "{}/api.log {{\n  rotate 3\n  missingok\n  notifempty\n}}\n",
            logs.display()
        ),
    )
    .unwrap();
    let state = e.work().join("state");
    e.host(
        "h",
        &local_host(
            "h",
            &format!(
                "logrotate_configs: [{}]\nlogrotate_state: {}",
                conf.display(),
                state.display()
            ),
        ),
    );
    e.runbook(
        "rot",
        &format!(
            "name: rot\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ approve: [rotate_logs] }}\nsteps:\n  - id: rotate\n    call: rotate_logs\n    args: {{ config: {} }}\n    reason: app log too big\n",
            conf.display()
        ),
    );
    (e, logs)
}

/// Three logs of one glob, `rotate 1000`: logrotate -v prints a `renaming`
/// line for every older copy it shifts (a thousand a log, most of them not
/// there); the report counts the logs it rotated, three.
#[test]
fn rotate_logs_counts_the_logs_it_rotated_not_logrotates_rename_lines() {
    let (e, logs) = logrotate_case(0o755);
    for name in ["web.log", "worker.log"] {
        std::fs::write(logs.join(name), "line\n").unwrap();
    }
    let conf = e.work().join("app.conf");
    std::fs::write(
        &conf,
        format!(
            "{}/*.log {{\n  rotate 1000\n  missingok\n  notifempty\n}}\n",
            logs.display()
        ),
    )
    .unwrap();
    let (code, report) = e.run_json("rot", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    let r = &step(&report, "rotate")["result"];
    let rotated: Vec<&str> = r["data"]["rotated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let expected: Vec<String> = ["api.log", "web.log", "worker.log"]
        .iter()
        .map(|n| logs.join(n).display().to_string())
        .collect();
    assert_eq!(rotated, expected, "{r:#}");
    assert!(
        r["data"]["evidence"]
            .as_str()
            .unwrap()
            .contains("3 file(s) rotated"),
        "{r:#}"
    );
}

#[test]
fn rotate_logs_rotates_and_verifies() {
    let (e, logs) = logrotate_case(0o755);
    let (code, report) = e.run_json("rot", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    let r = &step(&report, "rotate")["result"];
    assert_eq!(r["verified"], true, "{r:#}");
    assert_eq!(r["data"]["state_updated"], true);
    assert!(logs.join("api.log.1").exists());
}

#[test]
fn rotate_logs_reports_the_real_insecure_permissions_failure() {
    let (e, logs) = logrotate_case(0o775);
    let (code, report) = e.run_json("rot", "h", &[]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["verdict"], "failed");
    let r = &step(&report, "rotate")["result"];
    assert_eq!(r["verified"], false);
    assert_eq!(r["exit_code"], 1);
    let evidence = r["data"]["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("parent directory has insecure permissions"),
        "{evidence}"
    );
    // The error a person reads quotes logrotate's own `error:` line.
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("parent directory has insecure permissions"),
        "{error}"
    );
    assert!(!logs.join("api.log.1").exists(), "nothing rotated");
}

#[test]
fn rotate_logs_reads_stderr_when_logrotate_exits_zero() {
    let (e, _) = logrotate_case(0o755);
    let conf = e.work().join("app.conf");
    let text = std::fs::read_to_string(&conf)
        .unwrap()
        .replace("missingok", "missingok\n  bogusdirective");
    std::fs::write(&conf, text).unwrap();
    let (code, report) = e.run_json("rot", "h", &[]);
    let r = &step(&report, "rotate")["result"];
    assert_eq!(r["exit_code"], 0, "logrotate itself exits 0 here: {r:#}");
    assert_eq!(r["verified"], false);
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("unknown option 'bogusdirective'"),
        "{r:#}"
    );
    assert_eq!(code, 1);
}

/// A certificate with any validity window, made by the real openssl (`openssl ca` takes explicit dates).
fn make_cert(dir: &Path, name: &str, start: &str, end: &str) -> std::path::PathBuf {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let pem = dir.join(format!("{name}.pem"));
    let ca = dir.join(format!("{name}-ca"));
    std::fs::create_dir_all(ca.join("new")).unwrap();
    std::fs::write(ca.join("index.txt"), "").unwrap();
    std::fs::write(ca.join("serial"), "01\n").unwrap();
    let cnf = dir.join(format!("{name}.cnf"));
    std::fs::write(
        &cnf,
        format!(
            "[ca]\ndefault_ca=d\n[d]\ndir={c}\ndatabase={c}/index.txt\nserial={c}/serial\nnew_certs_dir={c}/new\ndefault_md=sha256\npolicy=p\n[p]\ncommonName=supplied\n",
            c = ca.display()
        ),
    )
    .unwrap();
    sh(
        "/usr/bin/openssl",
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            csr.to_str().unwrap(),
            "-subj",
            &format!("/CN={name}.staging.test"),
        ],
    );
    sh(
        "/usr/bin/openssl",
        &[
            "ca",
            "-batch",
            "-config",
            cnf.to_str().unwrap(),
            "-selfsign",
            "-keyfile",
            key.to_str().unwrap(),
            "-in",
            csr.to_str().unwrap(),
            "-out",
            pem.to_str().unwrap(),
            "-startdate",
            start,
            "-enddate",
            end,
        ],
    );
    pem
}

fn ymd(days_from_now: i64) -> String {
    // An hour past the day boundary, so `days_left` cannot flip while the test runs.
    let t = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24 * days_from_now + 1);
    t.strftime("%Y%m%d%H%M%SZ").to_string()
}

#[test]
fn cert_expiry_reads_real_certificates_and_renewal_is_verified() {
    let e = Estate::new();
    let soon = make_cert(&e.work(), "soon", &ymd(-80), &ymd(5));
    let expired = make_cert(&e.work(), "old", &ymd(-100), &ymd(-10));
    let key = e.work().join("soon.key");
    e.host(
        "h",
        &local_host(
            "h",
            &format!(
                "certificates:\n  web:\n    path: {s}\n    renew: [/usr/bin/openssl, req, -x509, -newkey, ec, -pkeyopt, 'ec_paramgen_curve:P-256', -nodes, -days, '90', -subj, /CN=soon.staging.test, -keyout, {k}, -out, {s}]\n  old:\n    path: {o}\n",
                s = soon.display(),
                k = key.display(),
                o = expired.display()
            ),
        ),
    );
    e.runbook(
        "certs",
        "name: certs\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [cert_expiry], approve: [renew_certificate] }\nsteps:
  - id: old
    call: cert_expiry
    args: { name: old }
  - id: web
    call: cert_expiry
    args: { name: web }
  - id: renew
    call: renew_certificate
    when: steps.web.days_left < 14
    args: { name: web }
    reason: \"{{ steps.web.days_left }} days left\"
  - id: after
    call: cert_expiry
    args: { name: web }
",
    );
    let (code, report) = e.run_json("certs", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    let old = &step(&report, "old")["result"]["data"];
    assert_eq!(old["expired"], true);
    assert_eq!(old["days_left"], -10, "{old:#}");
    assert_eq!(old["subject"], "CN=old.staging.test");
    let web = &step(&report, "web")["result"]["data"];
    assert_eq!(web["days_left"], 5, "{web:#}");
    let renew = &step(&report, "renew");
    assert_eq!(renew["reason"], "5 days left");
    assert_eq!(renew["result"]["verified"], true, "{renew:#}");
    let after = step(&report, "after")["result"]["data"]["days_left"]
        .as_i64()
        .unwrap();
    assert!((89..=90).contains(&after), "{after}");
}

#[test]
fn disk_usage_sees_a_real_full_filesystem() {
    let e = Estate::new();
    let mnt = e.work().join("data");
    std::fs::create_dir_all(&mnt).unwrap();
    e.host(
        "h",
        &local_host("h", &format!("paths: [{}]", mnt.display())),
    );
    e.runbook(
        "disk",
        &format!("name: disk\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - id: d\n    call: disk_usage\n    args: {{ path: {m} }}\n  - id: logs\n    call: disk_usage\n    args: {{ path: {m}/logs }}\n", m = mnt.display()),
    );
    // A 16 MiB tmpfs in a private mount namespace, filled to ~97%; runwarden runs inside it.
    let m = mnt.display();
    let out = run_on_small_tmpfs(
        &e,
        &mnt,
        &format!("mkdir {m}/logs; fallocate -l $((16*1024*1024*97/100 - 65536)) {m}/logs/ballast"),
        "run disk --host h",
        &[],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let d = &step(&report, "d")["result"]["data"];
    assert_eq!(d["fstype"], "tmpfs", "{d:#}");
    assert!(d["use_pct"].as_u64().unwrap() >= 95, "{d:#}");
    assert_eq!(d["size_bytes"], 16 * 1024 * 1024);
    assert_eq!(d["largest"][0]["path"], format!("{}/logs", mnt.display()));
    assert_eq!(d["largest_truncated"], false);
    // A directory of files: its own total, and its files among the largest.
    let logs = &step(&report, "logs")["result"]["data"];
    assert_eq!(
        logs["largest"][0]["path"],
        format!("{}/logs/ballast", mnt.display()),
        "{logs:#}"
    );
    assert!(
        logs["dir_bytes"].as_u64().unwrap() >= 15 * 1024 * 1024,
        "{logs:#}"
    );
}

/// A loopback HTTP server answering `status` to every request, `count` times.
fn http_server(status: u16, count: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for conn in listener.incoming().take(count) {
            let Ok(mut c) = conn else { continue };
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            let body = format!("status {status} {}", "x".repeat(2000));
            let _ = write!(
                c,
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn http_check_reports_health_and_never_follows_redirects() {
    let ok = http_server(200, 1);
    let bad = http_server(503, 1);
    let redirect = http_server(302, 1);
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = Estate::new();
    e.host(
        "h",
        &local_host(
            "h",
            &format!("health_checks:\n  ok: http://127.0.0.1:{ok}/health\n  bad: http://127.0.0.1:{bad}/\n  moved: http://127.0.0.1:{redirect}/\n  down: http://127.0.0.1:{closed}/\n"),
        ),
    );
    let mut rb = "name: web\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [http_check] }\nsteps:\n".to_string();
    for n in ["ok", "bad", "moved", "down"] {
        rb += &format!("  - id: {n}\n    call: http_check\n    args: {{ name: {n} }}\n");
    }
    e.runbook("web", &rb);
    let (_, report) = e.run_json("web", "h", &[]);
    let data = |id: &str| step(&report, id)["result"]["data"].clone();
    assert_eq!(data("ok")["healthy"], true);
    assert_eq!(data("ok")["body_truncated"], true);
    assert_eq!(data("ok")["body_excerpt"].as_str().unwrap().len(), 512);
    assert_eq!(data("bad")["status"], 503);
    assert_eq!(data("bad")["healthy"], false);
    assert_eq!(data("moved")["status"], 302);
    assert_eq!(data("down")["healthy"], false);
    assert!(
        data("down")["error"].as_str().unwrap().contains("onnect"),
        "{:#}",
        data("down")
    );
}

/// A real gunicorn pool whose workers are "poisoned" when a flag file exists at their start.
pub struct Gunicorn {
    pub child: Child,
    pub port: u16,
    pub pidfile: std::path::PathBuf,
}

impl Drop for Gunicorn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn gunicorn(dir: &Path, poisoned: bool) -> Gunicorn {
    let poison = dir.join("poison");
    if poisoned {
        std::fs::write(&poison, "").unwrap();
    }
    std::fs::write(
        dir.join("app.py"),
        format!(
            "import os\nPOISONED = os.path.exists({p:?})\ndef app(environ, start):\n    status = '503 Service Unavailable' if POISONED else '200 OK'\n    start(status, [('Content-Type', 'text/plain')])\n    return [('poisoned' if POISONED else 'ok %d' % os.getpid()).encode()]\n",
            p = poison.display().to_string()
        ),
    )
    .unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pidfile = dir.join("gunicorn.pid");
    let child = Command::new("/usr/bin/gunicorn")
        .args([
            "--workers",
            "2",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--pid",
            pidfile.to_str().unwrap(),
            "--chdir",
            dir.to_str().unwrap(),
            "app:app",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gunicorn (Debian package gunicorn)");
    // Ready when both workers answer (the master binds and writes its pid file before they boot).
    let expect = if poisoned { "503" } else { "200" };
    let mut answered = 0;
    for _ in 0..200 {
        if answered >= 4 && pidfile.exists() {
            break;
        }
        if http_status(port).as_deref() == Some(expect) {
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(answered >= 4, "gunicorn did not come up on port {port}");
    if poisoned {
        std::fs::remove_file(&poison).unwrap();
    }
    Gunicorn {
        child,
        port,
        pidfile,
    }
}

/// The status code of `GET /health` on a loopback port, if anything answers.
fn http_status(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(c, "GET /health HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    c.read_exact(&mut head).ok()?;
    Some(String::from_utf8_lossy(&head[9..12]).into_owned())
}

pub fn pool_estate(g: &Gunicorn) -> Estate {
    pool_estate_with(g, &g.pidfile)
}

/// [`pool_estate`] with the pool's master found through `pid_file`.
fn pool_estate_with(g: &Gunicorn, pid_file: &Path) -> Estate {
    let e = Estate::new();
    e.shipped_runbook("worker-pool-recycle");
    e.host("staging-web-2", &local_host("staging-web-2", ""));
    e.host(
        "staging-web-1",
        &local_host(
            "staging-web-1",
            &format!(
                "health_checks:\n  web: http://127.0.0.1:{}/health\nworker_pools:\n  web:\n    pid_file: {}\n    executable: /usr/bin/gunicorn\n    recycle: {{ signal: HUP }}\n    health_check: web\n",
                g.port,
                pid_file.display()
            ),
        ),
    );
    e
}

#[test]
fn worker_pool_recycle_replaces_poisoned_gunicorn_workers() {
    let dir = tempfile::tempdir().unwrap();
    let g = gunicorn(dir.path(), true);
    let e = pool_estate(&g);
    let (code, report) = e.run_json("worker-pool-recycle", "staging-web-1", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(step(&report, "health")["result"]["data"]["status"], 503);
    let recycle = step(&report, "recycle");
    assert_eq!(recycle["result"]["verified"], true, "{recycle:#}");
    assert!(recycle["reason"].as_str().unwrap().contains("503"));
    let before: Vec<u64> =
        serde_json::from_value(recycle["result"]["data"]["workers_before"].clone()).unwrap();
    let after: Vec<u64> =
        serde_json::from_value(recycle["result"]["data"]["workers_after"].clone()).unwrap();
    assert_eq!(before.len(), 2);
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "{before:?} -> {after:?}"
    );
    let master: u64 = std::fs::read_to_string(&g.pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(recycle["result"]["data"]["master_pid"], master);
    assert_eq!(step(&report, "after")["result"]["data"]["healthy"], true);
}

#[test]
fn worker_pool_recycle_leaves_a_healthy_pool_alone() {
    let dir = tempfile::tempdir().unwrap();
    let g = gunicorn(dir.path(), false);
    let e = pool_estate(&g);
    let (code, report) = e.run_json("worker-pool-recycle", "staging-web-1", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(step(&report, "recycle")["status"], "skipped");
    assert!(e.audit_phase("intent").iter().all(|l| l["tier"] == 1));
}

#[test]
fn a_pid_file_that_names_another_process_or_that_others_can_write_signals_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let g = gunicorn(dir.path(), true);
    let master = std::fs::read_to_string(&g.pidfile)
        .unwrap()
        .trim()
        .to_string();
    let workers = |pid: &str| sh("/usr/bin/pgrep", &["-P", pid]);
    let before = workers(&master);
    // A bystander that a HUP would kill.
    let mut bystander = Proc(Command::new("/bin/sleep").arg("300").spawn().unwrap());
    let planted = dir.path().join("planted.pid");
    std::fs::write(&planted, format!("{}\n", bystander.0.id())).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::copy(&g.pidfile, shared.join("g.pid")).unwrap();
    let writable = dir.path().join("writable.pid");
    std::fs::copy(&g.pidfile, &writable).unwrap();
    std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o666)).unwrap();
    let foreign = dir.path().join("foreign.pid");
    std::fs::copy(&g.pidfile, &foreign).unwrap();
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    for (what, file, says) in [
        (
            "a pid file naming an unrelated process",
            planted,
            "which is not /usr/bin/gunicorn",
        ),
        (
            "a pid file others can write",
            writable,
            "someone other than root",
        ),
        (
            "a pid file owned by nobody",
            foreign,
            "someone other than root",
        ),
        (
            "a pid file in a directory anyone can write",
            shared.join("g.pid"),
            "can replace it",
        ),
    ] {
        let e = pool_estate_with(&g, &file);
        let (_, report) = e.run_json("worker-pool-recycle", "staging-web-1", &[]);
        let error = step_error(&report, "recycle");
        assert!(error.contains(says), "{what}: {error}");
        assert!(error.contains("nothing was signalled"), "{what}: {error}");
        assert_eq!(report["verdict"], "failed", "{what}: {report:#}");
        assert!(
            bystander.0.try_wait().unwrap().is_none(),
            "{what}: the bystander was signalled"
        );
        assert_eq!(workers(&master), before, "{what}: the pool was signalled");
    }
    let _ = bystander.0.kill();
}

#[test]
fn a_pid_file_pool_must_name_its_program() {
    let e = Estate::new();
    e.host(
        "h",
        &local_host("h", "worker_pools:\n  web:\n    pid_file: /run/gunicorn.pid\n    recycle: { signal: HUP }\n"),
    );
    let out = e.run(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("hosts/h.yaml:5:15") && err.contains("executable: /usr/bin/gunicorn"),
        "{err}"
    );
}

//! The shipped runbooks end to end on real systemd hosts: a Debian 12 root
//! booted with systemd-nspawn (systemd is PID 1 inside), with real units,
//! journald, logrotate.timer and nginx, and a real 16 MiB tmpfs as /var/log.
//! The runwarden binary under test is bind-mounted into the host and run
//! there with `connection: local`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

mod realmodel;

fn estate_script() -> PathBuf {
    repo().join("tests/estate/systemd-hosts.sh")
}

/// Build (or find cached) the root filesystem once per test process.
fn rootfs() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Command::new(estate_script())
            .arg("build")
            .output()
            .expect("systemd-hosts.sh");
        assert!(
            out.status.success(),
            "estate build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// One booted systemd host; halted and cleaned up on drop.
struct SystemdHost {
    name: String,
    dir: tempfile::TempDir,
    nspawn: Child,
    leader: u32,
    /// Reachable from the machine at 10.238.N.2 (its own network namespace), or private.
    net: Option<u32>,
}

const HOST_FILE: &str = "connection: local
paths: [/, /var, /var/log]
units: [nginx.service, logrotate.service, logrotate.timer, demo.service, broken.service, missing.service, once.service, flush.service, flaky.service]
logrotate_configs: [/etc/logrotate.conf]
certificates:
  web:
    path: /etc/ssl/runwarden/web.pem
    unit: nginx.service
    renew: [/usr/bin/openssl, req, -x509, -newkey, ec, -pkeyopt, 'ec_paramgen_curve:P-256', -nodes, -days, '90',
            -subj, /CN=staging-web.test, -keyout, /etc/ssl/runwarden/web.key, -out, /etc/ssl/runwarden/web.pem]
health_checks:
  web: http://127.0.0.1/health
worker_pools:
  web:
    unit: nginx.service
    recycle: reload
    health_check: web
";

/// `runwarden run RUNBOOK` on staging-web-1 with the host's bind-mounted config.
fn run_argv(runbook: &str) -> [&str; 8] {
    [
        "/usr/local/bin/runwarden",
        "run",
        runbook,
        "--host",
        "staging-web-1",
        "--json",
        "--config",
        "/srv/runwarden",
    ]
}

impl SystemdHost {
    /// Boot a host whose web certificate expires in `cert_days` days.
    fn boot(tag: &str, cert_days: u32) -> SystemdHost {
        SystemdHost::boot_on(tag, cert_days, None)
    }

    /// Boot a host on network `net`: 10.238.`net`.2, reached over a veth.
    fn boot_on(tag: &str, cert_days: u32, net: Option<u32>) -> SystemdHost {
        rootfs();
        let name = format!("rw-{tag}-{}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("rw-nspawn-")
            .tempdir()
            .unwrap();
        let config = dir.path().join("config");
        for d in ["runbooks", "hosts", "kill-switch"] {
            std::fs::create_dir_all(config.join(d)).unwrap();
        }
        for rb in ["staging-disk-full", "worker-pool-recycle", "cert-expiry"] {
            std::fs::copy(
                repo().join(format!("runbooks/{rb}.yaml")),
                config.join(format!("runbooks/{rb}.yaml")),
            )
            .unwrap();
        }
        for h in ["staging-web-1", "staging-web-2"] {
            std::fs::write(
                config.join(format!("hosts/{h}.yaml")),
                format!("name: {h}\n{HOST_FILE}"),
            )
            .unwrap();
        }
        let ssl = dir.path().join("ssl");
        std::fs::create_dir_all(&ssl).unwrap();
        sh(
            "/usr/bin/openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                &cert_days.to_string(),
                "-subj",
                "/CN=staging-web.test",
                "-keyout",
                ssl.join("web.key").to_str().unwrap(),
                "-out",
                ssl.join("web.pem").to_str().unwrap(),
            ],
        );
        let console = std::fs::File::create(dir.path().join("console.log")).unwrap();
        let netns = net.map(|n| {
            sh(
                estate_script().to_str().unwrap(),
                &["net-up", &name, &n.to_string()],
            );
            format!("rw-sd-{name}")
        });
        let nspawn = Command::new(estate_script())
            .args(["boot", &name, dir.path().to_str().unwrap(), bin()])
            .args(netns.as_deref())
            .stdin(Stdio::null())
            .stdout(console.try_clone().unwrap())
            .stderr(console)
            .spawn()
            .expect("systemd-nspawn");
        let mut host = SystemdHost {
            name,
            dir,
            nspawn,
            leader: 0,
            net,
        };
        let started = Instant::now();
        let mut state = String::new();
        while started.elapsed() < Duration::from_secs(60) {
            // nspawn's first child can be a short-lived helper: look again each time.
            let pid = host.nspawn.id();
            host.leader = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
                .unwrap_or(0);
            if host.leader != 0 {
                let out = host.exec(&["/usr/bin/systemctl", "is-system-running"]);
                state = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if state == "running" || state == "degraded" {
                    return host;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let console =
            std::fs::read_to_string(host.dir.path().join("console.log")).unwrap_or_default();
        let tail: Vec<&str> = console.lines().rev().take(30).collect();
        panic!(
            "host {} did not boot: {state:?}; console (last lines, newest first):\n{}",
            host.name,
            tail.join("\n")
        );
    }

    fn exec(&self, argv: &[&str]) -> Output {
        Command::new("/usr/bin/nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "-r", "-w", "--"])
            .args(argv)
            .output()
            .expect("nsenter")
    }

    /// `runwarden run` inside the host (its mounts, pids, cgroup and systemd)
    /// but on the machine's network, where the test's model endpoint listens.
    fn run_with_model(&self, runbook: &str, key: &str) -> (i32, Value) {
        let out = Command::new("/usr/bin/nsenter")
            .args([
                "-t",
                &self.leader.to_string(),
                "-m",
                "-u",
                "-i",
                "-p",
                "-C",
                "-r",
                "-w",
                "--",
            ])
            .args(run_argv(runbook))
            .args(["--planner", "model"])
            .env("RUNWARDEN_MODEL_KEY", key)
            .output()
            .expect("nsenter");
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("no report ({e}): {}", String::from_utf8_lossy(&out.stderr))
        });
        (out.status.code().unwrap_or(-1), report)
    }

    /// Test setup inside the host (the test's own shell, never runwarden's).
    fn setup(&self, script: &str) -> String {
        let out = self.exec(&["/bin/sh", "-c", script]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// `runwarden run RUNBOOK --host staging-web-1 --json` inside the host.
    fn run(&self, runbook: &str) -> (i32, Value) {
        let out = self.exec(&run_argv(runbook));
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no report ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.config().join("state/audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for SystemdHost {
    fn drop(&mut self) {
        // The first SIGTERM asks nspawn for a clean halt; a second one forces it.
        let pid = nix::unistd::Pid::from_raw(self.nspawn.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                break;
            }
            if started.elapsed() > Duration::from_secs(5) {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        let _ = Command::new(estate_script())
            .args(["cleanup", &self.name])
            .output();
        if let Some(n) = self.net {
            let _ = Command::new(estate_script())
                .args(["net-down", &self.name, &n.to_string()])
                .output();
        }
    }
}

fn fill_app_log(host: &SystemdHost) {
    // ~15 MiB of a repetitive access log on the 16 MiB /var/log: compresses to almost nothing.
    host.setup(
        "yes 'GET /api/v1/items HTTP/1.1 200 12ms' | head -c 15728640 > /var/log/app/api.log",
    );
}

#[test]
fn staging_disk_full_rotates_when_the_timer_is_not_running() {
    let host = SystemdHost::boot("disk", 90);
    host.setup("systemctl stop logrotate.timer");
    fill_app_log(&host);
    let (code, report) = host.run("staging-disk-full");
    assert_eq!(code, 0, "{report:#}");
    let logs = &step(&report, "logs")["result"]["data"];
    assert_eq!(logs["fstype"], "tmpfs");
    assert!(logs["use_pct"].as_u64().unwrap() >= 90, "{logs:#}");
    assert_eq!(
        step(&report, "timer")["result"]["data"]["active_state"],
        "inactive"
    );
    let rotate = step(&report, "rotate");
    assert_eq!(rotate["approved_by"], "standing:staging-disk-full");
    assert_eq!(rotate["result"]["verified"], true, "{rotate:#}");
    assert!(
        rotate["reason"]
            .as_str()
            .unwrap()
            .contains("logrotate.timer inactive"),
        "{rotate:#}"
    );
    let after = step(&report, "after")["result"]["data"]["use_pct"]
        .as_u64()
        .unwrap();
    assert!(after < 50, "usage after rotation: {after}%");
    assert!(host.setup("ls /var/log/app").contains("api.log.1.gz"));
    let audit = host.audit();
    let changes = audit
        .iter()
        .filter(|l| l["phase"] == "intent" && l["tier"] == 2)
        .count();
    assert_eq!(changes, 1, "one tier-2 call, audited before it ran");
}

#[test]
fn staging_disk_full_reports_the_insecure_permissions_incident() {
    let host = SystemdHost::boot("perm", 90);
    host.setup("chgrp adm /var/log/app && chmod 0775 /var/log/app");
    fill_app_log(&host);
    host.setup("systemctl start logrotate.service || true");
    let (code, report) = host.run("staging-disk-full");
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["verdict"], "failed");
    assert_eq!(
        step(&report, "service")["result"]["data"]["result"],
        "exit-code"
    );
    assert!(
        !step(&report, "journal")["result"]["data"]["lines"]
            .as_array()
            .unwrap()
            .is_empty(),
        "systemd's own warning line is read"
    );
    let rotate = &step(&report, "rotate")["result"];
    assert_eq!(rotate["verified"], false);
    assert!(
        rotate["data"]["evidence"]
            .as_str()
            .unwrap()
            .contains("parent directory has insecure permissions"),
        "{rotate:#}"
    );
    let suggestion = report["suggestions"][0].as_str().unwrap();
    assert!(suggestion.contains("su root <group>"), "{suggestion}");
}

#[test]
fn cert_expiry_renews_reloads_and_the_new_certificate_is_served() {
    let host = SystemdHost::boot("cert", 3);
    let pid_before = host.setup("systemctl show -P MainPID nginx");
    let (code, report) = host.run("cert-expiry");
    assert_eq!(code, 0, "{report:#}");
    // Three days from the certificate's creation, minus the boot (0 or 1 second).
    let days_left = step(&report, "cert")["result"]["data"]["days_left"]
        .as_i64()
        .unwrap();
    assert!((2..=3).contains(&days_left), "{days_left}");
    assert_eq!(step(&report, "renew")["result"]["verified"], true);
    let reload = step(&report, "reload");
    assert_eq!(reload["result"]["verified"], true, "{reload:#}");
    assert_eq!(
        host.setup("systemctl show -P MainPID nginx"),
        pid_before,
        "a reload keeps the master"
    );
    let days = step(&report, "after")["result"]["data"]["days_left"]
        .as_i64()
        .unwrap();
    assert!((89..=90).contains(&days), "{days}");
    // What nginx serves now is the renewed certificate.
    let served = host.setup("openssl s_client -connect 127.0.0.1:443 </dev/null 2>/dev/null | openssl x509 -noout -enddate");
    let on_disk = host.setup("openssl x509 -noout -enddate -in /etc/ssl/runwarden/web.pem");
    assert_eq!(served, on_disk);
}

#[test]
fn cert_expiry_agent_renews_and_reloads_on_real_systemd() {
    use crate::model::{ModelServer, answer, call, results};
    let host = SystemdHost::boot("certai", 3);
    let pid_before = host.setup("systemctl show -P MainPID nginx");
    let server = ModelServer::start(|n, req| match n {
        0 => call("cert_expiry", serde_json::json!({ "name": "web" })),
        1 => {
            let c = &results(req)[0];
            call(
                "renew_certificate",
                serde_json::json!({ "name": "web", "reason": format!("not_after {}, {} days left (under 14)", c["not_after"].as_str().unwrap(), c["days_left"]) }),
            )
        }
        2 => {
            let r = &results(req)[0];
            call(
                "reload_service",
                serde_json::json!({ "unit": "nginx.service", "reason": format!("serve the renewed certificate (not_after {})", r["after"]["not_after"].as_str().unwrap()) }),
            )
        }
        3 => call("cert_expiry", serde_json::json!({ "name": "web" })),
        _ => answer(&format!(
            "Renewed and reloaded; {} days left now.",
            results(req)[0]["days_left"]
        )),
    });
    std::fs::write(host.config().join("runwarden.yaml"), server.settings("")).unwrap();
    let (code, report) = host.run_with_model("cert-expiry", "sk-cert-test");
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["planner"], "model");
    let tools: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "cert_expiry",
            "renew_certificate",
            "reload_service",
            "cert_expiry"
        ]
    );
    let steps = report["steps"].as_array().unwrap();
    let days_before = steps[0]["result"]["data"]["days_left"].as_i64().unwrap();
    assert!(
        steps[1]["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("{days_before} days left")),
        "{:#}",
        steps[1]
    );
    assert_eq!(steps[1]["result"]["verified"], true);
    assert_eq!(steps[2]["result"]["verified"], true, "{:#}", steps[2]);
    assert_eq!(host.setup("systemctl show -P MainPID nginx"), pid_before);
    let days_after = steps[3]["result"]["data"]["days_left"].as_i64().unwrap();
    assert!((89..=90).contains(&days_after), "{days_after}");
    assert!(
        report["final_answer"]
            .as_str()
            .unwrap()
            .contains(&format!("{days_after} days left"))
    );
    let served = host.setup("openssl s_client -connect 127.0.0.1:443 </dev/null 2>/dev/null | openssl x509 -noout -enddate");
    let on_disk = host.setup("openssl x509 -noout -enddate -in /etc/ssl/runwarden/web.pem");
    assert_eq!(served, on_disk);
}

/// Each run's audit head goes to the host's real journal, and `audit verify`
/// checks the file against every head recorded there.
#[test]
fn audit_heads_in_the_journal_catch_an_edited_verdict_and_a_cut() {
    let host = SystemdHost::boot("heads", 90);
    for _ in 0..2 {
        let (code, report) = host.run("cert-expiry");
        assert_eq!(code, 0, "{report:#}");
    }
    let verify = || {
        let out = host.exec(&[
            "/usr/local/bin/runwarden",
            "audit",
            "verify",
            "--config",
            "/srv/runwarden",
        ]);
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, out) = verify();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("2 from the journal"), "{out}");
    let records =
        host.setup("journalctl -o json SYSLOG_IDENTIFIER=runwarden | grep -c RUNWARDEN_AUDIT_HEAD");
    assert_eq!(records.trim(), "2", "one head per run");
    // Any local user can send a record naming the log: heads from `nobody`
    // (a forged one, and a true one it copied) are ignored and said to be.
    let head = out
        .lines()
        .find_map(|l| l.strip_prefix("head: "))
        .unwrap()
        .split_once(':')
        .unwrap()
        .0
        .to_string();
    for (hash, lines) in [("a".repeat(64), "1".to_string()), (head, "2".into())] {
        host.setup_ok(&format!(
            "printf 'MESSAGE=forged\\nSYSLOG_IDENTIFIER=runwarden\\nRUNWARDEN_AUDIT_LOG=%s\\nRUNWARDEN_AUDIT_HEAD={hash}\\nRUNWARDEN_AUDIT_LINES={lines}\\n' \
               \"$(readlink -f /srv/runwarden/state/audit.jsonl)\" > /tmp/forged && chmod 644 /tmp/forged \
             && setpriv --reuid=65534 --regid=65534 --clear-groups logger --journald=/tmp/forged"
        ));
    }
    host.setup("journalctl --sync");
    let (code, out) = verify();
    assert_eq!(
        code,
        Some(0),
        "a stranger's heads do not break verify: {out}"
    );
    assert!(
        out.contains("ignored 2 head record(s) in the journal from nobody (uid 65534)")
            && out.contains("2 from the journal"),
        "{out}"
    );
    let file = host.config().join("state/audit.jsonl");
    let original = std::fs::read_to_string(&file).unwrap();
    let mut lines: Vec<String> = original.lines().map(String::from).collect();
    let last = lines
        .last()
        .unwrap()
        .replace("\"outcome\":\"ok\"", "\"outcome\":\"failed\"");
    assert_ne!(&last, lines.last().unwrap());
    *lines.last_mut().unwrap() = last;
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let (code, out) = verify();
    assert_eq!(code, Some(2), "the edited verdict is caught: {out}");
    assert!(out.contains("does not match the head recorded"), "{out}");
    let kept: Vec<&str> = original.lines().collect();
    std::fs::write(&file, kept[..kept.len() - 2].join("\n") + "\n").unwrap();
    let (code, out) = verify();
    assert_eq!(code, Some(2), "the cut is caught: {out}");
    assert!(out.contains("cut off the end"), "{out}");
    std::fs::write(&file, &original).unwrap();
    assert_eq!(verify().0, Some(0));
}

#[test]
fn service_tools_against_real_systemd() {
    let host = SystemdHost::boot("svc", 90);
    host.setup("systemctl start broken.service || true");
    std::fs::write(
        host.config().join("runbooks/services.yaml"),
        "name: services
description: every service tool once
hosts: [staging-web-1]
autonomy: L3
tools:
  observe: [service_status, read_journal, http_check]
  approve: [restart_service, reload_service, recycle_worker_pool]
budget: { max_steps: 12, max_mutations: 3 }
steps:
  - id: before
    call: service_status
    args: { unit: demo.service }
  - id: restart
    call: restart_service
    args: { unit: demo.service }
    reason: test restart
  - id: reload
    call: reload_service
    args: { unit: demo.service }
    reason: test reload
  - id: journal
    call: read_journal
    args: { unit: broken.service, since: 15m, priority: err }
  - id: broken
    call: service_status
    args: { unit: broken.service }
  - id: recycle
    call: recycle_worker_pool
    args: { pool: web }
    reason: test recycle
  - id: missing
    call: service_status
    args: { unit: missing.service }
",
    )
    .unwrap();
    let (_, report) = host.run("services");
    let restart = &step(&report, "restart")["result"];
    assert_eq!(restart["verified"], true, "{restart:#}");
    assert_ne!(
        restart["data"]["before"]["main_pid"],
        restart["data"]["after"]["main_pid"]
    );
    let reload = &step(&report, "reload")["result"];
    assert_eq!(reload["verified"], true, "{reload:#}");
    assert_eq!(
        reload["data"]["before"]["main_pid"],
        reload["data"]["after"]["main_pid"]
    );
    let lines = step(&report, "journal")["result"]["data"]["lines"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        lines
            .iter()
            .any(|l| l["priority"] == "err"
                && l["message"].as_str().unwrap().contains("config error")),
        "{lines:#?}"
    );
    let broken = &step(&report, "broken")["result"]["data"];
    assert_eq!(
        (broken["active_state"].as_str(), broken["result"].as_str()),
        (Some("failed"), Some("exit-code"))
    );
    let recycle = &step(&report, "recycle")["result"];
    assert_eq!(recycle["verified"], true, "{recycle:#}");
    assert_eq!(recycle["data"]["health"]["healthy"], true);
    let missing = step(&report, "missing");
    assert_eq!(missing["status"], "error");
    assert!(
        missing["result"]["error"]
            .as_str()
            .unwrap()
            .contains("not loaded"),
        "{missing:#}"
    );
    assert_eq!(
        report["verdict"], "failed",
        "the missing unit is a failed observation"
    );
}

/// `restart_service` on units with no main pid, under real systemd: a
/// oneshot that stays active is verified by its new activation, one that
/// does not stay active by running again to success, and one whose second
/// run fails is not verified; none of them by a pid that went 0 -> 0.
#[test]
fn a_restart_of_a_unit_without_a_main_pid_is_verified_by_what_changed() {
    let host = SystemdHost::boot("oneshot", 90);
    host.setup(
        "printf '[Service]\\nType=oneshot\\nRemainAfterExit=yes\\nExecStart=/bin/true\\n' >/etc/systemd/system/once.service; \
         printf '[Service]\\nType=oneshot\\nExecStart=/bin/true\\n' >/etc/systemd/system/flush.service; \
         printf '[Service]\\nType=oneshot\\nRemainAfterExit=yes\\nExecStart=/bin/sh -c \"test ! -e /run/flaky; r=$$?; touch /run/flaky; exit $$r\"\\n' >/etc/systemd/system/flaky.service; \
         systemctl daemon-reload && systemctl start once.service flush.service flaky.service",
    );
    std::fs::write(
        host.config().join("runbooks/oneshots.yaml"),
        "name: oneshots
description: restart units that have no main pid
hosts: [staging-web-1]
autonomy: L3
tools:
  approve: [restart_service]
budget: { max_steps: 3, max_mutations: 3 }
steps:
  - id: once
    call: restart_service
    args: { unit: once.service }
    reason: test
  - id: flush
    call: restart_service
    args: { unit: flush.service }
    reason: test
  - id: flaky
    call: restart_service
    args: { unit: flaky.service }
    reason: test
",
    )
    .unwrap();
    let (_, report) = host.run("oneshots");
    let once = &step(&report, "once")["result"];
    assert_eq!(once["verified"], true, "{once:#}");
    assert!(
        once["data"]["evidence"]
            .as_str()
            .unwrap()
            .contains("entered its active state anew"),
        "{once:#}"
    );
    let flush = &step(&report, "flush")["result"];
    assert_eq!(flush["verified"], true, "{flush:#}");
    assert!(
        flush["data"]["evidence"]
            .as_str()
            .unwrap()
            .contains("ran again and exited 0"),
        "{flush:#}"
    );
    let flaky = &step(&report, "flaky")["result"];
    assert_ne!(flaky["verified"], true, "{flaky:#}");
    for s in [once, flush, flaky] {
        assert!(
            !s["data"]["evidence"]
                .as_str()
                .unwrap_or("")
                .contains("0 -> 0"),
            "{s:#}"
        );
    }
    assert_eq!(report["verdict"], "failed", "{report:#}");
}

/// `demote_after` on real systemd: a restart of `broken.service`, whose
/// process exits with an error at once, does not bring it back, so
/// `restart_service`'s own verification fails. After two such runs the
/// runbook is demoted: the third run restarts nothing and says why, `check`
/// shows it, and only a person's `promote` (forced, the evidence being
/// fresh) lets the restart run again.
#[test]
fn a_restart_that_does_not_bring_its_unit_back_demotes_the_runbook_until_a_person_promotes_it() {
    let host = SystemdHost::boot("demote", 90);
    std::fs::write(
        host.config().join("runbooks/fix-broken.yaml"),
        "name: fix-broken
description: restart the broken service
hosts: [staging-web-1]
autonomy: L3
demote_after: { failures: 2, per: 1h }
tools:
  observe: [service_status]
  approve: [restart_service]
steps:
  - id: before
    call: service_status
    args: { unit: broken.service }
  - id: restart
    call: restart_service
    args: { unit: broken.service }
    reason: it is down
",
    )
    .unwrap();
    let intents = |run_id: &str| {
        host.audit()
            .iter()
            .filter(|l| {
                l["run_id"] == run_id && l["phase"] == "intent" && l["tool"] == "restart_service"
            })
            .count()
    };
    let runwarden = |args: &[&str]| {
        let mut argv = vec!["/usr/local/bin/runwarden"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["--config", "/srv/runwarden"]);
        let out = host.exec(&argv);
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let mut failed = Vec::new();
    for _ in 0..2 {
        let (code, report) = host.run("fix-broken");
        assert_eq!(
            (code, report["verdict"].as_str()),
            (1, Some("failed")),
            "{report:#}"
        );
        let restart = step(&report, "restart");
        // It ran, and did not bring the unit back.
        assert!(restart["result"].is_object(), "{restart:#}");
        assert_ne!(restart["status"], "ok", "{restart:#}");
        let id = report["run_id"].as_str().unwrap().to_string();
        assert_eq!(intents(&id), 1);
        failed.push(id);
    }
    let audit = host.audit();
    let demoted = audit
        .iter()
        .find(|l| l["phase"] == "autonomy" && l["outcome"] == "demoted")
        .expect("the second failure demoted the runbook");
    let evidence = demoted["detail"]["evidence"].as_array().unwrap();
    assert_eq!(evidence.len(), 2);
    assert_eq!(evidence[1]["run_id"], failed[1].as_str());
    assert_eq!(evidence[1]["calls"][0]["tool"], "restart_service");

    // Demoted: the look runs, the restart waits for a person, and none can
    // approve on the command line.
    let (code, report) = host.run("fix-broken");
    assert_eq!(
        (code, report["verdict"].as_str()),
        (3, Some("denied")),
        "{report:#}"
    );
    assert_eq!(step(&report, "before")["status"], "ok");
    let detail = step(&report, "restart")["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(detail.contains("demoted to L2"), "{detail}");
    assert_eq!(
        intents(report["run_id"].as_str().unwrap()),
        0,
        "nothing restarted"
    );
    let (_, check) = runwarden(&["check"]);
    assert!(check.contains("DEMOTED runbook \"fix-broken\""), "{check}");
    let (code, refused) = runwarden(&["promote", "fix-broken", "--reason", "fixed the config"]);
    assert_eq!(code, Some(1), "{refused}");
    let (code, done) = runwarden(&[
        "promote",
        "fix-broken",
        "--force",
        "--reason",
        "fixed the config",
    ]);
    assert_eq!(code, Some(0), "{done}");
    // Given back: the restart runs again.
    let (_, report) = host.run("fix-broken");
    assert_eq!(intents(report["run_id"].as_str().unwrap()), 1, "{report:#}");
}

/// `failed_units` on real systemd: the failed unit the host allows is
/// listed with its state; a failed unit the host file does not name is
/// counted and its name appears nowhere in the report or the audit log.
#[test]
fn failed_units_names_the_allowed_failures_and_only_counts_the_others() {
    let host = SystemdHost::boot("failed", 90);
    host.setup_ok(
        "printf '[Service]\\nExecStart=/bin/false\\n' >/etc/systemd/system/not-named-here.service \\
         && systemctl daemon-reload; systemctl start broken.service not-named-here.service; true",
    );
    std::fs::write(
        host.config().join("runbooks/failed.yaml"),
        "name: failed
description: which units failed
hosts: [staging-web-1]
autonomy: L3
tools:
  observe: [failed_units]
steps:
  - id: failed
    call: failed_units
",
    )
    .unwrap();
    let (code, report) = host.run("failed");
    assert_eq!(code, 0, "{report:#}");
    let data = &step(&report, "failed")["result"]["data"];
    let failed = data["failed"].as_array().unwrap();
    let broken: Vec<&Value> = failed
        .iter()
        .filter(|u| u["unit"] == "broken.service")
        .collect();
    assert_eq!(broken.len(), 1, "{data:#}");
    assert_eq!(
        (
            broken[0]["active_state"].as_str(),
            broken[0]["sub_state"].as_str()
        ),
        (Some("failed"), Some("failed")),
        "{data:#}"
    );
    assert!(data["not_allowed"].as_u64().unwrap() >= 1, "{data:#}");
    let shown = format!("{report}{:?}", host.audit());
    assert!(!shown.contains("not-named-here"), "{shown}");
}

/// The sections of `runwarden install print`: (where the file goes, its text).
fn install_sections(print: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in print.lines() {
        if let Some(path) = line.strip_prefix("### ") {
            out.push((path.to_string(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

impl SystemdHost {
    /// Test setup that must succeed.
    fn setup_ok(&self, script: &str) -> String {
        let out = self.exec(&["/bin/sh", "-c", script]);
        assert!(
            out.status.success(),
            "{script}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Install what `runwarden install print` tells an operator to, as the
    /// operator would: the account its comments describe, the agent policy,
    /// the authorized_keys line and the sudoers file (checked by visudo);
    /// then sshd with this host's own new host key. Returns the host key line.
    fn install_agent(&self, print: &str, user: &str) -> String {
        let dir = self.config().join("install");
        std::fs::create_dir_all(&dir).unwrap();
        let sections = install_sections(print);
        let section = |suffix: &str| {
            sections
                .iter()
                .find(|(p, _)| p.ends_with(suffix))
                .unwrap_or_else(|| panic!("no {suffix} in install print:\n{print}"))
                .1
                .clone()
        };
        let keys = section("authorized_keys");
        let account: Vec<&str> = keys
            .lines()
            .filter_map(|l| l.strip_prefix("#   "))
            .collect();
        assert_eq!(account.len(), 2, "{keys}");
        for cmd in account {
            self.setup_ok(cmd);
        }
        for (name, text) in [
            ("agent.yaml", section("agent.yaml")),
            ("authorized_keys", keys.clone()),
            ("sudoers", section("sudoers.d/runwarden")),
            ("runwarden.service", section("runwarden.service")),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        self.setup_ok(&format!(
            "set -e; i=/srv/runwarden/install
             install -d /etc/runwarden && install -m 0644 $i/agent.yaml /etc/runwarden/agent.yaml
             install -d -o {user} -m 0700 ~{user}/.ssh && install -o {user} -m 0600 $i/authorized_keys ~{user}/.ssh/authorized_keys
             visudo -c -q -f $i/sudoers && install -m 0440 $i/sudoers /etc/sudoers.d/runwarden
             ssh-keygen -A -q 2>/dev/null || ssh-keygen -A
             systemctl start ssh"
        ));
        self.setup_ok("cat /etc/ssh/ssh_host_ed25519_key.pub")
    }
}

static NETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A free 10.238.N.0/24 for a host of this test process.
fn next_net() -> u32 {
    10 + (std::process::id() % 100) * 2 + NETS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn shipped_runbooks_over_ssh_on_systemd_hosts_set_up_from_install_print() {
    let e = Estate::new();
    let key = e.work().join("id_ed25519");
    keygen(&key);
    let allowlists = HOST_FILE.replacen("connection: local\n", "", 1);
    let hosts: Vec<(SystemdHost, u32)> = [("fleet1", 90), ("fleet2", 3)]
        .into_iter()
        .map(|(tag, days)| {
            let n = next_net();
            (SystemdHost::boot_on(tag, days, Some(n)), n)
        })
        .collect();
    let known_hosts = |name: &str| e.work().join(format!("known_hosts-{name}"));
    for (i, (_, n)) in hosts.iter().enumerate() {
        let name = format!("staging-web-{}", i + 1);
        e.host(
            &name,
            &format!(
                "name: {name}\nconnection:\n  ssh:\n    address: 10.238.{n}.2\n    port: 22\n    user: rw-agent\n    identity: {}\n    known_hosts: {}\nsudo: true\n{allowlists}",
                key.display(),
                known_hosts(&name).display()
            ),
        );
    }
    // The runbooks come first: the sudoers file install print gives allows
    // what they can ask for, and nothing else.
    for rb in ["staging-disk-full", "worker-pool-recycle", "cert-expiry"] {
        e.shipped_runbook(rb);
    }
    e.runbook(
        "restart-nginx",
        "name: restart-nginx\ndescription: t\nhosts: [staging-web-2]\nautonomy: L3\ntools: { approve: [restart_service] }\nsteps:\n  - call: restart_service\n    args: { unit: nginx.service }\n    reason: test\n",
    );
    for (i, (h, n)) in hosts.iter().enumerate() {
        let name = format!("staging-web-{}", i + 1);
        let print = e.run(&["install", "print", "--host", &name]);
        assert!(print.status.success());
        let host_key = h.install_agent(&String::from_utf8_lossy(&print.stdout), "rw-agent");
        let fields: Vec<&str> = host_key.split_whitespace().take(2).collect();
        std::fs::write(
            known_hosts(&name),
            format!("10.238.{n}.2 {}\n", fields.join(" ")),
        )
        .unwrap();
        // The management host's unit is one systemd itself accepts.
        h.setup_ok("ln -sf /usr/local/bin/runwarden /usr/bin/runwarden && install -m 0644 /srv/runwarden/install/runwarden.service /etc/systemd/system/ && useradd --system runwarden && systemd-analyze verify /etc/systemd/system/runwarden.service");
    }
    let out = e.run(&["host", "check", "staging-web-1"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Host 1: logs fill the real /var/log tmpfs and the rotation timer is off.
    let (h1, _) = &hosts[0];
    h1.setup("systemctl stop logrotate.timer");
    // All but 1 MiB (the journal here holds more than on a host nobody logged into).
    h1.setup_ok("avail=$(df --output=avail -B1 /var/log | tail -1); yes 'GET /api/v1/items HTTP/1.1 200 12ms' | head -c $((avail - 1048576)) > /var/log/app/api.log");
    let (code, report) = e.run_json("staging-disk-full", "staging-web-1", &[]);
    assert_eq!(code, 0, "{report:#}");
    let logs = &step(&report, "logs")["result"]["data"];
    assert_eq!(logs["fstype"], "tmpfs");
    assert!(logs["use_pct"].as_u64().unwrap() >= 90, "{logs:#}");
    assert_eq!(
        step(&report, "journal")["status"],
        "ok",
        "the agent's account reads the journal"
    );
    let rotate = step(&report, "rotate");
    assert_eq!(rotate["result"]["verified"], true, "{rotate:#}");
    assert!(h1.setup("ls /var/log/app").contains("api.log.1.gz"));

    // Host 2: its certificate expires in 3 days; renewal and reload run through sudo.
    let (h2, _) = &hosts[1];
    let pid_before = h2.setup("systemctl show -P MainPID nginx");
    let workers_before = h2.setup("pgrep -P $(systemctl show -P MainPID nginx)");
    let (code, report) = e.run_json("cert-expiry", "staging-web-2", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(step(&report, "renew")["result"]["verified"], true);
    assert_eq!(step(&report, "reload")["result"]["verified"], true);
    assert_eq!(h2.setup("systemctl show -P MainPID nginx"), pid_before);
    let workers_after = h2.setup("pgrep -P $(systemctl show -P MainPID nginx)");
    assert_ne!(
        workers_before, workers_after,
        "a reload replaces the workers"
    );
    let served = h2.setup("openssl s_client -connect 127.0.0.1:443 </dev/null 2>/dev/null | openssl x509 -noout -enddate");
    let on_disk = h2.setup("openssl x509 -noout -enddate -in /etc/ssl/runwarden/web.pem");
    assert_eq!(served, on_disk);

    // A restart over SSH changes the MainPID.
    let (code, report) = e.run_json("restart-nginx", "staging-web-2", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_ne!(h2.setup("systemctl show -P MainPID nginx"), pid_before);

    // Each run used one SSH connection; the hosts kept their own audit logs.
    let accepted = h2.setup("journalctl -u ssh --no-pager | grep -c 'Accepted publickey'");
    assert_eq!(accepted.trim(), "2", "two runs on host 2");
    // Whoever copied the SSH key reaches tier-1 calls only: a tier-2 call needs
    // the runner's signed permit for exactly that call, once.
    let (h2, n2) = &hosts[1];
    let copied_key = |requests: &[serde_json::Value]| -> Vec<serde_json::Value> {
        let mut child = Command::new("/usr/bin/ssh")
            .args([
                "-i",
                key.to_str().unwrap(),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
            ])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                e.work().join("known_hosts-staging-web-2").display()
            ))
            .arg(format!("rw-agent@10.238.{n2}.2"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for r in requests {
            writeln!(stdin, "{r}").unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    use runwarden::signing::{CallId, PermitKey};
    let runner_key = PermitKey::load(&e.path().join("state/permit.key")).unwrap();
    let stranger = PermitKey::load_or_create(&e.work().join("stranger.key")).unwrap();
    let args = |reason: &str| serde_json::json!({ "unit": "nginx.service", "reason": reason });
    let request = |run: &str, reason: &str, permit: Option<runwarden::signing::SignedPermit>| {
        let mut r = serde_json::json!({ "run_id": run, "step": 1, "runbook": "restart-nginx", "tool": "restart_service", "args": args(reason) });
        if let Some(p) = permit {
            r["permit"] = serde_json::to_value(p).unwrap();
        }
        r
    };
    let sign = |k: &PermitKey, run: &str, reason: &str, expires: Option<i64>| {
        let a = args(reason);
        let call = CallId {
            run_id: run,
            step: 1,
            host: "staging-web-2",
            tool: "restart_service",
            args: &a,
        };
        match expires {
            Some(t) => k.sign_until(&call, "standing:restart-nginx", t),
            None => k.sign(&call, "standing:restart-nginx"),
        }
    };
    let pid_before = h2.setup("systemctl show -P MainPID nginx");
    let now = jiff::Timestamp::now().as_second();
    let replies = copied_key(&[
        request("x1", "attacker", None),
        request(
            "x2",
            "attacker",
            Some(sign(&stranger, "x2", "attacker", None)),
        ),
        request(
            "x3",
            "attacker",
            Some(sign(&runner_key, "x3", "another reason", None)),
        ),
        request(
            "x4",
            "attacker",
            Some(sign(&runner_key, "x4", "attacker", Some(now - 5))),
        ),
        serde_json::json!({ "run_id": "x6", "step": 1, "runbook": "r", "tool": "service_status", "args": { "unit": "nginx.service" } }),
    ]);
    let refused: Vec<String> = replies[..4]
        .iter()
        .map(|r| {
            r["refused"]
                .as_str()
                .unwrap_or_else(|| panic!("not refused: {r}"))
                .to_string()
        })
        .collect();
    for (got, want) in refused.iter().zip([
        "without the runner's signed permit",
        "signature does not verify",
        "its arguments differs",
        "expired",
    ]) {
        assert!(got.contains(want), "{got}");
    }
    assert!(
        replies[4]["result"].is_object(),
        "tier 1 still answers: {}",
        replies[4]
    );
    assert_eq!(
        h2.setup("systemctl show -P MainPID nginx"),
        pid_before,
        "nothing restarted"
    );
    // A real permit runs once; the same permit again runs nothing.
    let good = request(
        "x5",
        "attacker",
        Some(sign(&runner_key, "x5", "attacker", None)),
    );
    let replies = copied_key(&[good.clone(), good]);
    assert!(replies[0]["result"].is_object(), "{}", replies[0]);
    assert!(
        replies[1]["refused"]
            .as_str()
            .unwrap()
            .contains("already used"),
        "{}",
        replies[1]
    );
    assert_ne!(
        h2.setup("systemctl show -P MainPID nginx"),
        pid_before,
        "the signed call ran"
    );
    // The host's record names each kind: four bad permits, one reused.
    let host_audit = h2.setup_ok("cat /var/lib/runwarden/agent-audit.jsonl");
    let reasons: Vec<String> = host_audit
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| ["x1", "x2", "x3", "x4", "x5"].contains(&l["run_id"].as_str().unwrap_or("")))
        .filter_map(|l| l["detail"]["reason"].as_str().map(String::from))
        .collect();
    assert_eq!(
        reasons,
        [
            "permit_invalid",
            "permit_invalid",
            "permit_invalid",
            "permit_invalid",
            "permit_replayed"
        ],
        "{host_audit}"
    );

    for (h, _) in &hosts {
        h.setup_ok("/usr/local/bin/runwarden audit verify /var/lib/runwarden/agent-audit.jsonl");
    }
    assert!(e.run(&["audit", "verify"]).status.success());
}

/// The Debian package on a systemd host, as an operator installs and runs
/// it: `dpkg -i`, a config `check` accepts, the units started, and an L3
/// runbook that really changes this machine (restarts a unit, rotates a
/// real log) through root's agent on the socket while the daemon itself
/// runs unprivileged and hardened. The verdict is read from the journal and
/// the metrics; systemd checks the units (`verify`) and scores the daemon's
/// hardening (`security`).
#[test]
fn the_debian_package_installs_runs_hardened_and_changes_this_machine_through_its_agent() {
    let h = SystemdHost::boot("pkg", 90);
    let out = Command::new(repo().join("packaging/build-deb.sh"))
        .arg(bin())
        .arg(h.config())
        .env("DEB_COMPRESSION", "gzip")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();
    // Debian's own checker finds no error (the warnings kept are in the README).
    let lint = Command::new("/usr/bin/lintian")
        .args(["--tag-display-limit", "0"])
        .arg(&deb)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&lint.stdout).into_owned();
    assert!(!said.lines().any(|l| l.starts_with("E:")), "{said}");
    h.setup_ok(&format!("dpkg -i /srv/runwarden/{name}"));
    h.setup_ok("test -s /usr/share/man/man1/runwarden.1.gz && grep -q _runwarden /usr/share/bash-completion/completions/runwarden && test -s /usr/share/zsh/vendor-completions/_runwarden");
    // Every page the main page lists (`runwarden\-check(1)`) is installed.
    let main = h.setup_ok("zcat /usr/share/man/man1/runwarden.1.gz");
    let listed: std::collections::BTreeSet<String> = main
        .split("runwarden\\-")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split_once("(1)")?.0.replace("\\-", "-");
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c == '-')
                .then(|| format!("runwarden-{name}"))
        })
        .collect();
    assert!(listed.contains("runwarden-kill-switch"), "{listed:?}");
    for page in &listed {
        h.setup_ok(&format!("test -s /usr/share/man/man1/{page}.1.gz"));
    }
    assert!(
        main.contains("EXIT STATUS") && main.contains("FILES") && main.contains("ON\\-CALL"),
        "{main}"
    );
    assert!(
        h.setup("id -u runwarden")
            .trim()
            .parse::<u32>()
            .is_ok_and(|u| u != 0),
        "the package made the system account"
    );
    // And the observer every tier-1 process runs as, in the journal's group.
    let observer = h.setup("id runwarden-observe");
    assert!(
        observer.contains("uid=")
            && !observer.contains("uid=0(")
            && observer.contains("(systemd-journal)"),
        "{observer}"
    );
    let policy = h.setup_ok("cat /etc/runwarden/agent.yaml");
    assert!(policy.contains("permit_public_key: "), "{policy}");
    assert!(
        policy.contains("sudo: false"),
        "root's agent needs no sudo: {policy}"
    );

    // This machine's allowlists on both sides, and an L3 runbook that
    // restarts demo.service and rotates the app log.
    std::fs::write(h.config().join("demo-fix.yaml"), DEMO_FIX).unwrap();
    h.setup_ok(
        "for f in /etc/runwarden/hosts/local.yaml /etc/runwarden/agent.yaml; do \
           sed -i '/^units: \\[\\]$/d; /^logrotate_configs: \\[\\]$/d' $f && \
           printf 'units: [demo.service]\\nlogrotate_configs: [/etc/logrotate.d/app]\\n' >> $f; \
         done && \
         install -m 0640 -g runwarden /srv/runwarden/demo-fix.yaml /etc/runwarden/runbooks/ && \
         echo 'GET /health 200' > /var/log/app/api.log",
    );
    let check = h.exec(&[
        "/usr/sbin/runuser",
        "-u",
        "runwarden",
        "--",
        "/usr/bin/runwarden",
        "check",
        "--config",
        "/etc/runwarden",
    ]);
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // systemd accepts the units and scores the daemon's hardening.
    h.setup_ok("systemd-analyze verify /lib/systemd/system/runwarden.service /lib/systemd/system/runwarden-agent.socket /lib/systemd/system/runwarden-agent@.service");
    let security = h.setup("systemd-analyze security runwarden.service 2>&1 | tail -1");
    let score: f64 = security
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no score in {security:?}"));
    eprintln!(
        "systemd-analyze security runwarden.service: {}",
        security.trim()
    );
    assert!(score <= 2.5, "exposure {score}: {security}");
    // Root's agent keeps root's uid and the capabilities its tools need;
    // the rest of its sandbox shows in its own score.
    let security = h.setup("systemd-analyze security runwarden-agent@0.service 2>&1 | tail -1");
    let agent_score: f64 = security
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no score in {security:?}"));
    eprintln!(
        "systemd-analyze security runwarden-agent@.service: {}",
        security.trim()
    );
    assert!(
        agent_score <= 6.0,
        "agent exposure {agent_score}: {security}"
    );

    let pid_before = h.setup("systemctl show -P MainPID demo.service");
    h.setup_ok("systemctl enable --now runwarden-agent.socket runwarden.service");
    // Type=notify: active only once the daemon said it is ready.
    assert_eq!(
        h.setup("systemctl is-active runwarden.service").trim(),
        "active",
        "{}",
        h.setup("journalctl -u runwarden.service --no-pager | tail -20")
    );
    // Idle connections to root's agent, as many as the socket once took in
    // all: the real call below still goes through, and each idle one is
    // closed by its agent after the request timeout.
    let socket = format!("/proc/{}/root/run/runwarden-agent.sock", h.leader);
    let idle: Vec<std::os::unix::net::UnixStream> = (0..16)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    let run = h.exec(&[
        "/usr/bin/runwarden",
        "run",
        "demo-fix",
        "--host",
        "local",
        "--via-daemon",
        "http://127.0.0.1:9731",
        "--config",
        "/etc/runwarden",
    ]);
    let said = format!(
        "{}{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        h.setup("journalctl -u runwarden.service -u 'runwarden-agent@*' --no-pager | tail -40")
    );
    assert_eq!(run.status.code(), Some(0), "{said}");
    assert_ne!(
        h.setup("systemctl show -P MainPID demo.service"),
        pid_before,
        "{said}"
    );
    assert!(h.setup("ls /var/log/app").contains("api.log.1"), "{said}");
    for mut conn in idle {
        use std::io::Read;
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut said = String::new();
        conn.read_to_string(&mut said).unwrap();
        assert!(said.contains("no request within 5s"), "{said:?}");
    }
    // The daemon's lines reach the journal natively: each with its
    // priority and fields, and no timestamp of runwarden's own.
    let journal = h.setup("journalctl -u runwarden.service --no-pager -o json");
    let entries: Vec<Value> = journal
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ended = entries
        .iter()
        .find(|e| {
            e["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.starts_with("run ended"))
        })
        .unwrap_or_else(|| panic!("{journal}"));
    assert_eq!(ended["PRIORITY"], "6", "{ended:#}");
    assert_eq!(ended["RUNBOOK"], "demo-fix", "{ended:#}");
    assert!(
        ended["VERDICT"].as_str().is_some_and(|v| v.contains("ok")),
        "{ended:#}"
    );
    assert!(
        !entries.iter().any(|e| e["MESSAGE"]
            .as_str()
            .is_some_and(|m| m.starts_with("20") && m.contains("Z  INFO"))),
        "no second timestamp: {journal}"
    );
    let listening =
        h.setup("journalctl -u runwarden.service --no-pager -o cat -p info --grep 'listening on'");
    assert!(listening.contains("runwarden: listening on"), "{listening}");
    // bash's /dev/tcp: the host has no HTTP client.
    let metrics = String::from_utf8_lossy(
        &h.exec(&[
            "/bin/bash",
            "-c",
            "exec 3<>/dev/tcp/127.0.0.1/9731; printf 'GET /metrics HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3; cat <&3",
        ])
        .stdout,
    )
    .into_owned();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("runwarden_runs_finished_total{")
                && l.contains("runbook=\"demo-fix\"")
                && l.contains("verdict=\"ok\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    // On-call's kill switch typed as the README shows it, from root's home
    // and as the daemon's own user from /: it acts on /etc/runwarden, the
    // directory the daemon reads, and the daemon's gauge shows it.
    h.setup_ok("cd ~ && runwarden kill-switch engage --reason INC-123");
    let status = h.setup("cd / && runuser -u runwarden -- runwarden kill-switch status");
    assert!(
        status.contains("ENGAGED global") && status.contains("INC-123"),
        "{status}"
    );
    let gauge = || {
        String::from_utf8_lossy(
            &h.exec(&[
                "/bin/bash",
                "-c",
                "exec 3<>/dev/tcp/127.0.0.1/9731; printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3; cat <&3",
            ])
            .stdout,
        )
        .lines()
        .find(|l| l.starts_with("runwarden_kill_switch_engaged{scope=\"global\"}"))
        .map(str::to_string)
    };
    wait_for(
        "the daemon sees the switch",
        Duration::from_secs(10),
        || {
            (gauge().as_deref() == Some("runwarden_kill_switch_engaged{scope=\"global\"} 1"))
                .then_some(())
        },
    );
    // `audit verify` as the daemon's own user, who may not read the
    // system journal: it says so, rather than "no journal here".
    let out = h.exec(&[
        "/usr/sbin/runuser",
        "-u",
        "runwarden",
        "--",
        "/usr/bin/runwarden",
        "audit",
        "verify",
    ]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("cannot read the journal as runwarden"),
        "{said}"
    );
    assert!(!said.contains("no journal here"), "{said}");
    // A warning is a warning in the journal: `-p warning` finds it.
    wait_for(
        "the warning in the journal",
        Duration::from_secs(10),
        || {
            h.setup("journalctl -u runwarden.service --no-pager -o cat -p warning")
                .contains("kill switch engaged")
                .then_some(())
        },
    );
    h.setup_ok("cd ~ && runwarden kill-switch release");
    // The daemon is not root and cannot become root; the change ran in root's agent.
    let status = h.setup(
        "grep -E '^(Uid|NoNewPrivs|CapEff)' /proc/$(systemctl show -P MainPID runwarden.service)/status",
    );
    assert!(
        status.contains("NoNewPrivs:\t1") && status.contains("CapEff:\t0000000000000000"),
        "{status}"
    );
    assert!(!status.starts_with("Uid:\t0\t"), "{status}");
    let agent_audit = h.setup_ok("cat /var/lib/runwarden-agent/audit.jsonl");
    assert!(
        agent_audit.contains("restart_service") && agent_audit.contains("rotate_logs"),
        "{agent_audit}"
    );
}

const DEMO_FIX: &str = r#"name: demo-fix
description: restart the demo worker and rotate its log
hosts: [local]
autonomy: L3
tools:
  observe: [service_status]
  approve: [restart_service, rotate_logs]
steps:
  - call: restart_service
    args: { unit: demo.service }
    reason: the demo worker is stuck
  - call: rotate_logs
    args: { config: /etc/logrotate.d/app }
    reason: the app log is large
"#;

/// Build the package from the test binary into the host's shared directory,
/// as version `version` (None: Cargo.toml's); its path inside the host.
fn build_deb(h: &SystemdHost, version: Option<&str>) -> String {
    let mut cmd = Command::new(repo().join("packaging/build-deb.sh"));
    cmd.arg(bin())
        .arg(h.config())
        .env("DEB_COMPRESSION", "none");
    if let Some(v) = version {
        cmd.env("RUNWARDEN_DEB_VERSION", v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    format!(
        "/srv/runwarden/{}",
        deb.file_name().unwrap().to_str().unwrap()
    )
}

/// An upgrade an SRE can trust, in a systemd host: version N installed and
/// configured (a webhook token and approvers that belong to the daemon's
/// account, an L3 runbook, a run), then N+1 of the same code installed over
/// it. Every secret and config file keeps its owner and mode, the running
/// daemon is restarted on the new binary, the old token starts a run, and
/// the audit chain goes on and verifies. Then remove and purge: what the
/// package made is gone, the audit log stays.
#[test]
fn an_upgrade_keeps_secrets_and_the_chain_and_purge_keeps_the_audit_log() {
    let h = SystemdHost::boot("upg", 90);
    let old = build_deb(&h, None);
    let next = format!("{}+upgrade1", env!("CARGO_PKG_VERSION"));
    let new = build_deb(&h, Some(&next));
    h.setup_ok(&format!("dpkg -i {old}"));
    std::fs::write(h.config().join("demo-fix.yaml"), DEMO_FIX).unwrap();
    h.setup_ok(
        "for f in /etc/runwarden/hosts/local.yaml /etc/runwarden/agent.yaml; do \
           sed -i '/^units: \\[\\]$/d; /^logrotate_configs: \\[\\]$/d' $f && \
           printf 'units: [demo.service]\\nlogrotate_configs: [/etc/logrotate.d/app]\\n' >> $f; \
         done && \
         install -m 0640 -g runwarden /srv/runwarden/demo-fix.yaml /etc/runwarden/runbooks/ && \
         echo 'GET /health 200' > /var/log/app/api.log && \
         (umask 077 && echo upgrade-test-token-0123456789 > /etc/runwarden/webhook-token && \
          echo 'alice alice-token-0123456789abc' > /etc/runwarden/approvers) && \
         chown runwarden:runwarden /etc/runwarden/webhook-token /etc/runwarden/approvers && \
         printf 'webhook_token_file: /etc/runwarden/webhook-token\\napprovers_file: /etc/runwarden/approvers\\n' >> /etc/runwarden/runwarden.yaml && \
         systemctl enable --now runwarden-agent.socket runwarden.service",
    );
    let files = "/etc/runwarden /etc/runwarden/runwarden.yaml /etc/runwarden/hosts/local.yaml \
                 /etc/runwarden/agent.yaml /etc/runwarden/webhook-token /etc/runwarden/approvers \
                 /etc/runwarden/runbooks/demo-fix.yaml /var/lib/runwarden /var/lib/runwarden/permit.key";
    let modes = || h.setup_ok(&format!("stat -c '%n %U:%G %a' {files}"));
    // An earlier package left the agent's policy root's alone: the upgrade
    // gives it to the daemon's group to read, as this package makes it.
    h.setup_ok("chgrp root /etc/runwarden/agent.yaml && chmod 0600 /etc/runwarden/agent.yaml");
    let before = modes().replace(
        "/etc/runwarden/agent.yaml root:root 600",
        "/etc/runwarden/agent.yaml root:runwarden 640",
    );
    assert!(before.contains("agent.yaml root:runwarden 640"), "{before}");
    let run = || {
        let out = h.exec(&[
            "/usr/bin/runwarden",
            "run",
            "demo-fix",
            "--host",
            "local",
            "--via-daemon",
            "http://127.0.0.1:9731",
            "--token-file",
            "/etc/runwarden/webhook-token",
        ]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{said}");
        assert!(said.contains("verdict: ok"), "{said}");
    };
    run();
    let pid = h.setup_ok("systemctl show -P MainPID runwarden.service");
    let lines = h.setup_ok("wc -l < /var/lib/runwarden/audit.jsonl");

    h.setup_ok(&format!("dpkg -i {new}"));
    assert_eq!(h.setup_ok("dpkg-query -W -f '${Version}' runwarden"), next);
    assert_eq!(modes(), before, "the upgrade kept every owner and mode");
    wait_for("the daemon restarted", Duration::from_secs(20), || {
        let now = h.setup("systemctl show -P MainPID runwarden.service");
        (now.trim() != pid.trim()
            && now.trim() != "0"
            && h.setup("systemctl is-active runwarden.service").trim() == "active")
            .then_some(())
    });
    let exe = h.setup_ok("readlink /proc/$(systemctl show -P MainPID runwarden.service)/exe");
    assert_eq!(
        exe.trim(),
        "/usr/bin/runwarden",
        "the new binary, not a deleted one"
    );
    // The README's checks after an upgrade, as written there.
    h.setup_ok("systemctl status runwarden --no-pager >/dev/null");
    let check = h.setup_ok("sudo runuser -u runwarden -- runwarden check 2>&1");
    assert!(!check.contains("cannot be read"), "{check}");
    // The old token starts a run on the new version, and the chain goes on.
    run();
    let after: u64 = h
        .setup_ok("wc -l < /var/lib/runwarden/audit.jsonl")
        .trim()
        .parse()
        .unwrap();
    assert!(after > lines.trim().parse::<u64>().unwrap());
    let verify = h.setup_ok("runwarden audit verify");
    assert!(verify.contains("chain intact"), "{verify}");

    // Remove (with the units still running), then purge: what runs from
    // the package stops first, its own things go, the audit log stays.
    h.setup_ok("dpkg -r runwarden");
    for unit in ["runwarden.service", "runwarden-agent.socket"] {
        let state = h.setup(&format!("systemctl is-active {unit}"));
        assert_ne!(state.trim(), "active", "{unit} kept running after dpkg -r");
    }
    assert!(
        h.setup("test -e /var/lib/runwarden/permit.key && echo kept")
            .contains("kept")
    );
    h.setup_ok("dpkg --purge runwarden");
    let left =
        h.setup("ls -a /var/lib/runwarden /var/lib/runwarden-agent 2>&1; ls /etc/runwarden 2>&1");
    assert!(left.contains("audit.jsonl"), "the audit log stays: {left}");
    assert!(!left.contains("permit.key"), "{left}");
    assert!(!left.contains("agent.yaml"), "{left}");
    assert!(!left.contains("runwarden.yaml"), "conffiles purged: {left}");
    assert!(
        h.setup("runwarden audit verify /var/lib/runwarden/audit.jsonl 2>&1; test -e /usr/bin/runwarden || echo gone")
            .contains("gone")
    );
    // Installed again after the purge: the secrets that were kept are still
    // the daemon's to read, and the kept log's chain goes on.
    h.setup_ok(&format!("dpkg -i {new}"));
    let secrets = h.setup_ok(
        "stat -c '%n %U:%G %a' /etc/runwarden /etc/runwarden/webhook-token /etc/runwarden/approvers",
    );
    assert!(
        secrets.contains("/etc/runwarden root:runwarden 750")
            && secrets.contains("webhook-token runwarden:runwarden 600")
            && secrets.contains("approvers runwarden:runwarden 600"),
        "{secrets}"
    );
    h.setup_ok("runuser -u runwarden -- cat /etc/runwarden/webhook-token /etc/runwarden/approvers >/dev/null");
    let verify = h.setup_ok("runuser -u runwarden -- runwarden audit verify");
    assert!(verify.contains("chain intact"), "{verify}");
}

/// A tier-1 tool declared as a careless author might, `systemctl restart
/// nginx.service`, on real systemd: the observer (its own user, no
/// capability to act) is refused by systemd over D-Bus, and nginx keeps its
/// start time and main process. The built-in tier-1 tools still read
/// everything they read as root (the run before the restart attempt).
#[test]
fn a_tier1_systemctl_restart_is_refused_by_systemd_and_nginx_keeps_running() {
    let host = SystemdHost::boot("observe", 90);
    host.setup(
        "getent group systemd-journal >/dev/null || groupadd --system systemd-journal; \
         id runwarden-observe >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin --groups systemd-journal runwarden-observe",
    );
    let tools = host.config().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::write(
        tools.join("nginx_bounce.yaml"),
        "name: nginx_bounce\ntier: 1\ndescription: Look at nginx (says its author).\nrun: [/usr/bin/systemctl, restart, nginx.service]\n",
    )
    .unwrap();
    std::fs::write(
        host.config().join("runbooks/bounce.yaml"),
        "name: bounce\ndescription: t\nhosts: [staging-web-1]\nautonomy: L3\ntools: { observe: [service_status, read_journal, nginx_bounce] }\nsteps:\n  - call: service_status\n    args: { unit: nginx.service }\n  - call: read_journal\n    args: { unit: nginx.service, since: 1h }\n  - call: nginx_bounce\n",
    )
    .unwrap();
    let started = host.setup("systemctl show -P ActiveEnterTimestampMonotonic nginx");
    let pid = host.setup("systemctl show -P MainPID nginx");
    let (code, report) = host.run("bounce");
    assert_ne!(code, 0, "{report:#}");
    assert_eq!(report["steps"][0]["status"], "ok", "{report:#}");
    assert_eq!(report["steps"][1]["status"], "ok", "{report:#}");
    assert_eq!(report["steps"][2]["status"], "error", "{report:#}");
    let said = report["steps"][2]["result"].to_string();
    assert!(
        said.contains("Access denied") || said.contains("Interactive authentication required"),
        "{said}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        host.setup("systemctl show -P ActiveEnterTimestampMonotonic nginx"),
        started
    );
    assert_eq!(host.setup("systemctl show -P MainPID nginx"), pid);
}

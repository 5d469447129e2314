//! A tier-1 call over SSH: multiplexed, one connection per call, and Ansible.
//!
//! `sudo cargo bench --bench ssh` starts Debian's sshd in a network namespace
//! (the test estate's `tests/estate/ssh-hosts.sh`) with the forced-command
//! agent, then measures, in the same run:
//!
//! 1. `runwarden run` of a runbook of 20 `disk_usage` calls (each runs `df`
//!    and `du` on a small directory of the host) with the default one
//!    connection and agent session per run;
//! 2. the same with `multiplex: false` (a fresh SSH connection and agent per call);
//! 3. `ansible-playbook` over SSH (its own ControlPersist multiplexing and
//!    pipelining, facts off) running `df -P` on the same directory as 20
//!    `command` tasks against the same sshd, as an
//!    ordinary account on the same key (the agent's account only runs the agent).
//!
//! Per-call figures are (run time with 20 calls - run time with 1 call) / 19,
//! so process start, config load and connection set-up are not counted as
//! per-call cost for any of them. Ratios are printed; nothing is asserted.

// A measurement harness: a failed setup step should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const CALLS: usize = 20;
const ROUNDS: usize = 7;
const INDEX: &str = "249";

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(mut f: impl FnMut()) -> Duration {
    f(); // warm-up
    median(
        (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn ok(out: std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Host<'a> {
    script: std::path::PathBuf,
    dir: &'a Path,
}

impl Drop for Host<'_> {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .args(["down", "bench", INDEX, self.dir.to_str().unwrap()])
            .output();
    }
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the SSH benchmark starts sshd in a network namespace: run it as root");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = env!("CARGO_BIN_EXE_runwarden");
    let tmp = tempfile::Builder::new()
        .prefix("rw-bench-ssh-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hostdir = root.join("host");
    let key = root.join("client_key");
    ok(
        Command::new("/usr/bin/ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .output()
            .unwrap(),
        "ssh-keygen",
    );
    // A small directory: the tool's own work (df, du) stays small next to the transport's.
    let data = root.join("data");
    for i in 0..20 {
        write(&data, &format!("d{i}/file"), &"x".repeat(4096 * (i + 1)));
    }
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    write(
        &hostdir,
        "agent.yaml",
        &format!(
            "name: bench\nconnection: local\njail: {}/jail\npaths: [{}]\n",
            hostdir.display(),
            data.display()
        ),
    );
    std::fs::copy(key.with_extension("pub"), hostdir.join("client_key.pub")).unwrap();
    let script = repo.join("tests/estate/ssh-hosts.sh");
    let host = Host {
        script: script.clone(),
        dir: &hostdir,
    };
    ok(
        Command::new(&script)
            .args(["up", "bench", INDEX, hostdir.to_str().unwrap(), bin])
            .env("RW_PLAIN_USER", "rw-bench")
            .output()
            .unwrap(),
        "ssh-hosts.sh up",
    );
    let address = format!("10.239.{INDEX}.2");
    let host_key = std::fs::read_to_string(hostdir.join("ssh_host_ed25519_key.pub")).unwrap();
    let kh = root.join("known_hosts");
    let fields: Vec<&str> = host_key.split_whitespace().take(2).collect();
    std::fs::write(&kh, format!("{address} {}\n", fields.join(" "))).unwrap();

    let config = |multiplex: bool, calls: usize| {
        let dir = root.join(format!("cfg-{multiplex}-{calls}"));
        write(&dir, "kill-switch/README", "");
        write(
            &dir,
            "hosts/web.yaml",
            &format!(
                "name: web\nconnection:\n  ssh:\n    address: {address}\n    user: rw-agent\n    identity: {}\n    known_hosts: {}\n    multiplex: {multiplex}\npaths: [{}]\n",
                key.display(),
                kh.display(),
                data.display()
            ),
        );
        let mut rb = "name: look\ndescription: bench\nhosts: [web]\nautonomy: L3\ntools: { observe: [disk_usage] }\nbudget: { max_steps: 60 }\nsteps:\n".to_string();
        for _ in 0..calls {
            rb += &format!(
                "  - call: disk_usage\n    args: {{ path: {} }}\n",
                data.display()
            );
        }
        write(&dir, "runbooks/look.yaml", &rb);
        dir
    };
    let runwarden = |dir: std::path::PathBuf| {
        move || {
            ok(
                Command::new(bin)
                    .args(["run", "look", "--host", "web", "--config"])
                    .arg(&dir)
                    .output()
                    .unwrap(),
                "runwarden run",
            )
        }
    };
    let per_call = |one: Duration, many: Duration| (many.saturating_sub(one)) / (CALLS as u32 - 1);

    let mux = per_call(
        time(runwarden(config(true, 1))),
        time(runwarden(config(true, CALLS))),
    );
    let fresh = per_call(
        time(runwarden(config(false, 1))),
        time(runwarden(config(false, CALLS))),
    );
    println!("tier-1 disk_usage over SSH, per call (median of {ROUNDS} runs, (T20 - T1) / 19):");
    println!(
        "  runwarden, one connection per run : {:>8.1} ms",
        mux.as_secs_f64() * 1e3
    );
    println!(
        "  runwarden, a connection per call  : {:>8.1} ms",
        fresh.as_secs_f64() * 1e3
    );
    println!(
        "  multiplexing speed-up             : {:>8.2}x",
        fresh.as_secs_f64() / mux.as_secs_f64()
    );

    if !Path::new("/usr/bin/ansible-playbook").exists() {
        println!(
            "ansible-playbook not installed (Debian package ansible-core): comparison skipped"
        );
        drop(host);
        return;
    }
    let playbook = |calls: usize| {
        let dir = root.join(format!("ansible-{calls}"));
        write(
            &dir,
            "inventory",
            &format!(
                "web ansible_host={address} ansible_user=rw-bench ansible_ssh_private_key_file={} ansible_python_interpreter=/usr/bin/python3\n",
                key.display()
            ),
        );
        write(
            &dir,
            "ansible.cfg",
            &format!(
                "[defaults]\nhost_key_checking = True\n[ssh_connection]\nssh_args = -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile={} -o GlobalKnownHostsFile=/dev/null\npipelining = True\n",
                kh.display()
            ),
        );
        let mut pb = "- hosts: web\n  gather_facts: false\n  tasks:\n".to_string();
        for i in 0..calls {
            pb += &format!(
                "    - name: df {i}\n      command: /usr/bin/df -P {}\n      changed_when: false\n",
                data.display()
            );
        }
        write(&dir, "site.yml", &pb);
        move || {
            ok(
                Command::new("/usr/bin/ansible-playbook")
                    .args(["-i", "inventory", "site.yml"])
                    .current_dir(&dir)
                    .env("ANSIBLE_CONFIG", dir.join("ansible.cfg"))
                    .output()
                    .unwrap(),
                "ansible-playbook",
            )
        }
    };
    let ansible = per_call(time(playbook(1)), time(playbook(CALLS)));
    println!(
        "  ansible-playbook over SSH         : {:>8.1} ms",
        ansible.as_secs_f64() * 1e3
    );
    println!(
        "  runwarden (multiplexed) vs Ansible: {:>8.1}x faster per call",
        ansible.as_secs_f64() / mux.as_secs_f64()
    );
    drop(host);
}

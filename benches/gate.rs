//! The gate's own cost, and runwarden next to Ansible.
//!
//! `cargo bench --bench gate` prints two figures, each a ratio against a
//! baseline measured in the same run (never a timed assertion):
//!
//! 1. overhead: a runbook of 50 tier-1 `disk_usage` calls through the whole
//!    path (gate, audit intent fsynced, process spawn, parse, result line)
//!    against spawning the same argv directly, in process, 50 times; and
//!    against the floor of any runner that records a call durably before
//!    making it (the same spawns, each call after one appended, synced
//!    write of the bytes runwarden's audit log grows by per call), whose
//!    ratio is runwarden's own share of the cost; every tier-1 process the
//!    gate starts as the observer (its own user, Landlock's file, TCP and
//!    scope rules), and what that adds per spawn is measured on its own
//!    (`/usr/bin/true`, as the observer and not, interleaved);
//! 2. speed-up: `runwarden run` of a five-call read-only runbook against
//!    `ansible-playbook` (connection local) running the same five commands as
//!    tasks (skipped when ansible-playbook is not installed).

// A measurement harness: a failed setup step should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden::audit::AuditLog;
use runwarden::config::Config;
use runwarden::process;
use runwarden::run::{RunRequest, Runner};
use runwarden::verdict::Verdict;
use sha2::Digest as _;

const CALLS: usize = 50;
/// Rounds, each measuring every variant once, in turn: a ratio is taken
/// within a round (neighbours in time share the machine's state) and the
/// median of those is reported, so a noisy neighbour moves both sides.
const ROUNDS: usize = 31;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn main() {
    // As the runwarden binary does: escaped processes are swept after each call.
    runwarden::process::escapees::adopt_orphans();
    // Tools run at TOOL_NICE, niced by the thread that waits on them (this
    // one, once a run has started here): the baseline spawns at the same
    // niceness from the start, so both sides compete alike for the CPU.
    // SAFETY: setpriority takes plain integers; 0 means the calling thread.
    unsafe {
        nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, process::TOOL_NICE);
    }
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-")
        .tempdir_in(std::env::var("RW_BENCH_DIR").unwrap_or("/var/tmp".into()))
        .unwrap();
    let root = dir.path();
    let data = root.join("data");
    for i in 0..20 {
        write(&data, &format!("d{i}/file"), &"x".repeat(4096 * (i + 1)));
    }
    write(root, "kill-switch/README", "");
    write(
        root,
        "hosts/h.yaml",
        &format!("name: h\nconnection: local\npaths: [{}]\n", data.display()),
    );
    let mut rb = "name: fifty\ndescription: bench\nhosts: [h]\nautonomy: L3\ntools: { observe: [disk_usage] }\nbudget: { max_steps: 60 }\nsteps:\n".to_string();
    for _ in 0..CALLS {
        rb += &format!(
            "  - call: disk_usage\n    args: {{ path: {} }}\n",
            data.display()
        );
    }
    write(root, "runbooks/fifty.yaml", &rb);
    write(
        root,
        "runbooks/five.yaml",
        &format!(
            "name: five\ndescription: bench\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage, list_processes] }}\nsteps:
  - call: disk_usage
    args: {{ path: {d} }}
  - call: list_processes
    args: {{ sort: cpu }}
  - call: list_processes
    args: {{ sort: memory }}
  - call: disk_usage
    args: {{ path: {d}/d1 }}
  - call: disk_usage
    args: {{ path: {d}/d2 }}
",
            d = data.display()
        ),
    );

    let config = Arc::new(Config::load(root).expect("bench config"));
    let audit = Arc::new(AuditLog::open(&config.settings.audit_log).unwrap());
    let runner = Runner::new(config.clone(), audit);
    // As the runwarden binary builds it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let req = RunRequest::cli("fifty".into(), "h".into(), false);

    // The same argv the tool spawns, spawned directly with the same stub
    // environment, working directory and stdin: df then du, 50 times.
    let d = data.display().to_string();
    let jail = root.join("state/jail");
    std::fs::create_dir_all(&jail).unwrap();
    let spawn = |program: &str, args: &[&str]| {
        let out = Command::new(program)
            .args(args)
            .env_clear()
            .envs(runwarden::process::STUB_ENV)
            .current_dir(&jail)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success());
    };
    let spawn_call = || {
        spawn(
            "/usr/bin/df",
            &[
                "-B1",
                "--output=source,fstype,size,used,avail,pcent,target",
                "--",
                &d,
            ],
        );
        spawn("/usr/bin/du", &["-x", "-B1", "--max-depth=1", "--", &d]);
    };
    let direct = || {
        let t = Instant::now();
        for _ in 0..CALLS {
            spawn_call();
        }
        t.elapsed()
    };
    let through_gate = || {
        let t = Instant::now();
        let report = process::on_own_thread(|| rt.block_on(runner.run(&req))).unwrap();
        assert_eq!(report.verdict, Verdict::Ok);
        assert_eq!(report.steps.len(), CALLS);
        t.elapsed()
    };
    // The same two argv through runwarden's process runner alone (no gate, no audit).
    let limits = || runwarden::process::Limits {
        deadline: tokio::time::Instant::now() + Duration::from_secs(30),
        output_cap: 1 << 20,
        kill_grace: Duration::from_secs(2),
        jail: root.to_path_buf(),
        confine: runwarden::process::Confine::Jail,
        stdin: None,
        stdin_from: None,
    };
    let df_argv = runwarden::process::Argv::new(Path::new("/usr/bin/df")).args([
        "-B1",
        "--output=source,fstype,size,used,avail,pcent,target",
        "--",
        &d,
    ]);
    let du_argv = runwarden::process::Argv::new(Path::new("/usr/bin/du")).args([
        "-x",
        "-B1",
        "--max-depth=1",
        "--",
        &d,
    ]);
    let runner_only = || {
        let t = Instant::now();
        process::on_own_thread(|| {
            rt.block_on(async {
                for _ in 0..CALLS {
                    runwarden::process::run_for_bench(&df_argv, &limits())
                        .await
                        .unwrap();
                    runwarden::process::run_for_bench(&du_argv, &limits())
                        .await
                        .unwrap();
                }
            })
        });
        t.elapsed()
    };
    // The floor any runner that makes a call's record durable before the
    // call must pay: the same direct spawns, each call preceded by one
    // appended, fdatasynced write of as many bytes as runwarden's audit log
    // grows by per call, on the audit log's filesystem. Interleaved, not
    // back to back: a disk that idled through a spawn answers a sync more
    // slowly than one synced a moment ago, and the calls pay that price.
    let audit_bytes = || std::fs::metadata(&config.settings.audit_log).map_or(0, |m| m.len());
    let before = audit_bytes();
    through_gate();
    let per_call = ((audit_bytes() - before) / CALLS as u64).max(1) as usize;
    let floor = || {
        use std::io::Write;
        let path = root.join("state/fsync-probe");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let line = vec![b'x'; per_call];
        let t = Instant::now();
        for _ in 0..CALLS {
            f.write_all(&line).unwrap();
            f.sync_data().unwrap();
            spawn_call();
        }
        let took = t.elapsed();
        std::fs::remove_file(&path).unwrap();
        took
    };
    // The gate with its tier-1 processes unconfined: what Landlock costs a call.
    let unconfined = || {
        let off = &runwarden::sandbox::OFF_FOR_BENCH;
        off.store(true, std::sync::atomic::Ordering::Relaxed);
        let took = through_gate();
        off.store(false, std::sync::atomic::Ordering::Relaxed);
        took
    };
    direct();
    through_gate();
    runner_only();
    floor();
    unconfined();
    let (mut base, mut gated, mut spawned, mut floors) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ratio, mut ratio_floor, mut ratio_open) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (b, g, s, f) = (direct(), through_gate(), runner_only(), floor());
        ratio_open.push(unconfined().as_secs_f64() / b.as_secs_f64());
        ratio.push(g.as_secs_f64() / b.as_secs_f64());
        ratio_floor.push(g.as_secs_f64() / f.as_secs_f64());
        base.push(b);
        gated.push(g);
        spawned.push(s);
        floors.push(f);
    }
    let (b, g, s, f) = (median(base), median(gated), median(spawned), median(floors));
    let per = |d: Duration| ms(d) / CALLS as f64;
    println!(
        "runbook of {CALLS} tier-1 disk_usage calls (df, du), medians of {ROUNDS} rounds, audit fsync included:"
    );
    println!(
        "  spawning the same argv directly            : {:>7.1} ms ({:.2} ms/call)",
        ms(b),
        per(b)
    );
    println!(
        "  {:<43}: {:>7.1} ms ({:.2} ms/call)",
        format!("direct + a synced {per_call} B write per call"),
        ms(f),
        per(f)
    );
    println!(
        "  runwarden's process runner alone           : {:>7.1} ms ({:.2} ms/call)",
        ms(s),
        per(s)
    );
    println!(
        "  through runwarden's gate                   : {:>7.1} ms ({:.2} ms/call)",
        ms(g),
        per(g)
    );
    println!(
        "  ratio to direct spawns (target <= 1.25)    : {:>7.3}",
        median_f(ratio)
    );
    println!(
        "  the same, tier 1 without Landlock          : {:>7.3}",
        median_f(ratio_open)
    );
    println!(
        "  of which the disk's sync, floor to direct  : {:>7.3}",
        f.as_secs_f64() / b.as_secs_f64()
    );
    println!(
        "  runwarden's own share, ratio to the floor  : {:>7.3}",
        median_f(ratio_floor)
    );

    // What remains per call beyond the spawn and the sync: the two audit
    // lines a call writes (intent, result), parsed back from this very log,
    // serialised and hashed again as the writer does.
    let log = std::fs::read_to_string(&config.settings.audit_log).unwrap();
    let pair: Vec<serde_json::Value> = ["\"phase\":\"intent\"", "\"phase\":\"result\""]
        .iter()
        .map(|p| serde_json::from_str(log.lines().rev().find(|l| l.contains(p)).unwrap()).unwrap())
        .collect();
    const LINES: u32 = 20_000;
    let t = Instant::now();
    for _ in 0..LINES / 2 {
        for v in &pair {
            let bytes = serde_json::to_vec(std::hint::black_box(v)).unwrap();
            std::hint::black_box(sha2::Sha256::digest(&bytes));
        }
    }
    let two_lines = t.elapsed() / (LINES / 2);
    println!(
        "  two audit lines serialised and hashed      : {:>7.1} us/call ({:.1} % of a gated call)",
        two_lines.as_secs_f64() * 1e6,
        two_lines.as_secs_f64() / (g.as_secs_f64() / CALLS as f64) * 100.0
    );

    // What Landlock costs per spawn: `/usr/bin/true` through runwarden's
    // process runner, confined (started by the restricted spawner thread,
    // as every tier-1 process is) and not, interleaved round by round.
    const SPAWNS: u32 = 200;
    let true_argv = runwarden::process::Argv::new(Path::new("/usr/bin/true"));
    let spawns = |confine: &runwarden::process::Confine| {
        let limits = runwarden::process::Limits {
            confine: confine.clone(),
            ..limits()
        };
        let t = Instant::now();
        process::on_own_thread(|| {
            rt.block_on(async {
                for _ in 0..SPAWNS {
                    runwarden::process::run_for_bench(&true_argv, &limits)
                        .await
                        .unwrap();
                }
            })
        });
        t.elapsed() / SPAWNS
    };
    // The observer, as a built-in's tier-1 call starts it: its own user,
    // Landlock's file, TCP and scope rules (every layer this machine has;
    // `RUNWARDEN_BENCH_NO_IDENTITY=1` leaves the user out, to see its share).
    let confined = runwarden::process::Confine::observer();
    let (mut open, mut shut, mut extra) = (Vec::new(), Vec::new(), Vec::new());
    spawns(&confined);
    for _ in 0..ROUNDS {
        let (o, c) = (
            spawns(&runwarden::process::Confine::Jail),
            spawns(&confined),
        );
        extra.push(c.as_secs_f64() - o.as_secs_f64());
        open.push(o);
        shut.push(c);
    }
    let (o, c) = (median(open), median(shut));
    println!(
        "one spawn of /usr/bin/true through the process runner, medians of {ROUNDS} rounds of {SPAWNS}:"
    );
    println!(
        "  in the jail only                           : {:>7.1} us",
        o.as_secs_f64() * 1e6
    );
    println!(
        "  as the observer (tier 1, every tool call)  : {:>7.1} us",
        c.as_secs_f64() * 1e6
    );
    println!(
        "  what the observer adds per spawn (< 100)   : {:>7.1} us",
        median_f(extra) * 1e6
    );

    // Five read-only commands: `runwarden run` (whole process) vs ansible-playbook.
    if !Path::new("/usr/bin/ansible-playbook").exists() {
        println!(
            "ansible-playbook not installed (Debian package ansible-core): comparison skipped"
        );
        return;
    }
    let playbook = root.join("five.yml");
    std::fs::write(
        &playbook,
        format!(
            "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:
    - command: /usr/bin/df -B1 --output=source,fstype,size,used,avail,pcent,target -- {d}
    - command: /usr/bin/ps -e --no-headers -o pid=,ppid=,user:32=,stat=,etimes=,pcpu=,rss=,comm= --sort=-pcpu
    - command: /usr/bin/ps -e --no-headers -o pid=,ppid=,user:32=,stat=,etimes=,pcpu=,rss=,comm= --sort=-rss
    - command: /usr/bin/df -B1 --output=source,fstype,size,used,avail,pcent,target -- {d}/d1
    - command: /usr/bin/df -B1 --output=source,fstype,size,used,avail,pcent,target -- {d}/d2
"
        ),
    )
    .unwrap();
    let time = |cmd: &mut Command| {
        let t = Instant::now();
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        t.elapsed()
    };
    let rw = || {
        time(
            Command::new(env!("CARGO_BIN_EXE_runwarden"))
                .args(["run", "five", "--host", "h", "--json", "--config"])
                .arg(root),
        )
    };
    let ansible = || {
        time(
            Command::new("/usr/bin/ansible-playbook")
                .args(["-i", "localhost,"])
                .arg(&playbook)
                .env("ANSIBLE_NOCOLOR", "1")
                .env("ANSIBLE_LOCALHOST_WARNING", "false")
                .env("ANSIBLE_INVENTORY_UNPARSED_WARNING", "false"),
        )
    };
    rw();
    ansible();
    let (mut a, mut r) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        a.push(ansible());
        r.push(rw());
    }
    let (a, r) = (median(a), median(r));
    println!("five read-only commands, median of 5 (whole process, start to exit):");
    println!("  ansible-playbook (connection local) : {:>8.1} ms", ms(a));
    println!("  runwarden run                       : {:>8.1} ms", ms(r));
    println!(
        "  speed-up (target >= 50x)            : {:>8.1}x",
        a.as_secs_f64() / r.as_secs_f64()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

//! Hostile input and faults: config files built to hurt (alias bombs, deep
//! nesting, a 100 MB file, 10,000 steps, invalid UTF-8, a symlink to
//! /etc/shadow), each a clear error in bounded time and memory with nothing
//! loaded.

use std::time::{Duration, Instant};

use crate::util::*;

/// `runwarden check` on `e`: (exit code, stderr, wall time, peak RSS of the child in KiB).
fn check(e: &Estate) -> (Option<i32>, String, Duration, i64) {
    let started = Instant::now();
    let out = e.run(&["check"]);
    let took = started.elapsed();
    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
        usage.max_rss(),
    )
}

#[test]
fn hostile_config_files_are_refused_whole_in_bounded_time_and_memory() {
    let e = Estate::new();
    e.host("h", &local_host("h", "paths: [/tmp]"));
    let rb = |name: &str, body: &str| {
        e.runbook(
            name,
            &format!("name: {name}\ndescription: x\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\n{body}"),
        );
    };
    // Billion laughs where any value is accepted (tool arguments are JSON values).
    let mut laughs = "steps:\n  - call: disk_usage\n    args:\n      a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n".to_string();
    for i in 1..9 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        laughs += &format!("      a{i}: &a{i} [{refs}]\n");
    }
    rb("laughs", &laughs);
    // Nesting 100,000 deep.
    rb(
        "deep",
        &format!(
            "steps:\n  - call: disk_usage\n    args: {{ path: {}{} }}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        ),
    );
    // 10,000 steps.
    rb(
        "many",
        &"steps:\n"
            .chars()
            .chain(
                "  - call: disk_usage\n    args: { path: /tmp }\n"
                    .repeat(10_000)
                    .chars(),
            )
            .collect::<String>(),
    );
    // Invalid UTF-8 on line 2.
    std::fs::write(
        e.path().join("runbooks/utf8.yaml"),
        b"name: utf8\ndescription: \xff\xfe\n",
    )
    .unwrap();
    // 100 MB (sparse).
    let huge = std::fs::File::create(e.path().join("runbooks/huge.yaml")).unwrap();
    huge.set_len(100 << 20).unwrap();
    // A host file that is a link to /etc/shadow, and one to a file inside the directory (allowed).
    std::os::unix::fs::symlink("/etc/shadow", e.path().join("hosts/shadow.yaml")).unwrap();
    std::fs::create_dir_all(e.path().join("shared")).unwrap();
    std::fs::write(
        e.path().join("shared/inside.yaml"),
        local_host("inside", "paths: [/tmp]"),
    )
    .unwrap();
    std::os::unix::fs::symlink("../shared/inside.yaml", e.path().join("hosts/inside.yaml"))
        .unwrap();

    let (code, err, took, rss) = check(&e);
    assert_eq!(code, Some(2), "{err}");
    let root = e.path().display();
    for expected in [
        format!("{root}/runbooks/laughs.yaml:"),
        "the document is too large once its aliases are expanded".to_string(),
        format!("{root}/runbooks/deep.yaml:"),
        format!("{root}/runbooks/many.yaml:1:7: 10000 steps; a runbook has at most 1000"),
        format!("{root}/runbooks/utf8.yaml:2:14: file is not valid UTF-8"),
        format!(
            "{root}/runbooks/huge.yaml:1:1: file is 104857600 bytes; config files are limited to 4194304 bytes"
        ),
        format!(
            "{root}/hosts/shadow.yaml:1:1: is a symlink to /etc/shadow, outside the configuration directory"
        ),
        "nothing was loaded".to_string(),
    ] {
        assert!(err.contains(&expected), "missing {expected:?} in:\n{err}");
    }
    assert!(
        !err.contains("root:"),
        "nothing of /etc/shadow is quoted:\n{err}"
    );
    assert!(
        !err.contains("inside.yaml"),
        "a link inside the directory is fine:\n{err}"
    );
    assert!(!err.contains("panicked"));
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(rss < 512 * 1024, "peak RSS {rss} KiB");
}

#[test]
fn processes_that_escape_a_tools_process_group_do_not_outlive_the_call() {
    let e = Estate::new();
    let pids = e.work().join("pids");
    // A `ps` that leaves two processes behind in sessions of their own (one
    // directly, one through a double fork), holding the output pipe open.
    let ps = e.script(
        "leaky-ps",
        &format!(
            "setsid /bin/sleep 300 &\necho $! >> {p}\nsetsid /bin/sh -c '/bin/sleep 301 & echo $! >> {p}; exec /bin/sleep 302' &\nsleep 0.2\nexec /bin/ps \"$@\"",
            p = pids.display()
        ),
    );
    e.host(
        "h",
        &local_host("h", &format!("binaries:\n  ps: {}", ps.display())),
    );
    e.runbook(
        "procs",
        "name: procs\ndescription: t\nhosts: [h]\nautonomy: L3\ntools: { observe: [list_processes] }\nsteps:\n  - call: list_processes\n  - call: list_processes\n",
    );
    let started = Instant::now();
    let (code, report) = e.run_json("procs", "h", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 4, "two escapes per call");
    for pid in pids {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if alive {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(
            !alive,
            "process {pid} escaped the call and is still running"
        );
    }
}

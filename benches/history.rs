//! What history costs a command: the same commands against an empty audit
//! log and against a year of history in segments (1 GiB by default,
//! `RUNWARDEN_BENCH_HISTORY_MB` to change it), interleaved round by round so
//! both sides see the same machine.
//!
//! The history is made of real lines: one real run's lines, written by the
//! binary, repeated with the run id, time, number and chain of each copy,
//! spread over the year up to ten minutes ago, in 16 MiB segments whose
//! modification times are their last lines' times (as a writer leaves
//! them). Then three real runs end it, the last one being what `transcript`
//! reads.
//!
//! `cargo bench --bench history`

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{ms, write};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const SEGMENT: u64 = 16 << 20;

fn main() {
    let mb: u64 = std::env::var("RUNWARDEN_BENCH_HISTORY_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let rounds: usize = std::env::var("RUNWARDEN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let base = tempfile::Builder::new()
        .prefix("rw-bench-history-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let empty = base.path().join("empty");
    let full = base.path().join("full");
    for dir in [&empty, &full] {
        config(dir);
    }

    let t = Instant::now();
    let template = template(&full);
    let made = history(&full.join("state/audit.jsonl"), &template, mb << 20);
    println!(
        "history: {} MiB in {} segment(s), {} lines, made in {:.1} s",
        made.bytes >> 20,
        made.segments,
        made.lines,
        t.elapsed().as_secs_f64()
    );
    let mut recent = Vec::new();
    for dir in [&empty, &full] {
        let mut last = String::new();
        for _ in 0..3 {
            last = cli_run(dir);
        }
        recent.push(last);
    }
    let verify = Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(["audit", "verify", "--config"])
        .arg(&full)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    println!(
        "{}",
        String::from_utf8_lossy(&verify.stdout)
            .lines()
            .next()
            .unwrap_or("")
    );

    type Measure<'a> = (&'a str, Box<dyn Fn(&Path, &str) -> Duration>);
    let measures: Vec<Measure> = vec![
        (
            "runwarden run (one tier-1 call)",
            Box::new(|d, _| time(|| drop(cli_run(d)))),
        ),
        (
            "runwarden check",
            Box::new(|d, _| time(|| cmd(d, &["check"]))),
        ),
        (
            "serve: start to listening",
            Box::new(|d, _| common::start_logging(d, "warn").startup),
        ),
        (
            "transcript of the newest run",
            Box::new(|d, id| time(|| cmd(d, &["transcript", id]))),
        ),
        (
            "runs --since 1d",
            Box::new(|d, _| time(|| cmd(d, &["runs", "--since", "1d", "--limit", "100000"]))),
        ),
    ];
    let mut times = vec![(Vec::new(), Vec::new()); measures.len()];
    for _ in 0..rounds {
        for (i, (_, f)) in measures.iter().enumerate() {
            times[i].0.push(f(&empty, &recent[0]));
            times[i].1.push(f(&full, &recent[1]));
        }
    }
    println!("{rounds} rounds, interleaved; medians, and the median of the per-round ratios");
    println!(
        "{:<34} {:>12} {:>14} {:>8}",
        "command", "empty log", "with history", "ratio"
    );
    for ((name, _), (e, f)) in measures.iter().zip(times) {
        let mut ratios: Vec<f64> = e
            .iter()
            .zip(&f)
            .map(|(a, b)| b.as_secs_f64() / a.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{name:<34} {:>9.1} ms {:>11.1} ms {:>7.2}x",
            ms(median(e)),
            ms(median(f)),
            ratios[ratios.len() / 2]
        );
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// A local host and a runbook of one tier-1 call on an empty directory.
fn config(dir: &Path) {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    write(dir, "kill-switch/README", "");
    // No rotation by age while measuring: the history's newest segment may
    // be older than a week when it is small.
    write(
        dir,
        "runwarden.yaml",
        "audit_head: none\naudit_rotation:\n  max_age: never\n",
    );
    write(
        dir,
        "hosts/local.yaml",
        &format!(
            "name: local\nconnection: local\npaths: [{}]\n",
            dir.join("data").display()
        ),
    );
    write(
        dir,
        "runbooks/probe.yaml",
        &format!(
            "name: probe\ndescription: b\nhosts: [local]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nsteps:\n  - call: disk_usage\n    args: {{ path: {} }}\n",
            dir.join("data").display()
        ),
    );
}

fn cmd(dir: &Path, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(args)
        .arg("--config")
        .arg(dir)
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `runwarden run probe --host local`: the run id.
fn cli_run(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_runwarden"))
        .args(["run", "probe", "--host", "local", "--json", "--config"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["run_id"].as_str().unwrap().to_string()
}

/// One real run's lines, as the binary wrote them; the log is then removed.
fn template(dir: &Path) -> Vec<Value> {
    cli_run(dir);
    let log = dir.join("state/audit.jsonl");
    let lines = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    std::fs::remove_file(&log).unwrap();
    lines
}

struct Made {
    bytes: u64,
    segments: usize,
    lines: u64,
}

/// `total` bytes of history at `log`: copies of `template`'s run over the
/// year up to ten minutes ago, in segments as a writer closes them.
fn history(log: &Path, template: &[Value], total: u64) -> Made {
    let run_bytes: u64 = template
        .iter()
        .map(|v| v.to_string().len() as u64 + 1)
        .sum();
    let runs = (total / run_bytes).max(1);
    let end = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(10);
    let span = jiff::SignedDuration::from_hours(365 * 24);
    let step = span / i32::try_from(runs).unwrap();
    let mut w = Writer {
        log: log.to_path_buf(),
        out: None,
        first: 1,
        n: 0,
        prev: "0".repeat(64),
        bytes: 0,
        written: 0,
        segments: 0,
        last_ts: end - span,
    };
    for i in 0..runs {
        let start = end - span + step * i32::try_from(i).unwrap();
        let secs = u64::try_from(start.as_second()).unwrap();
        let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            secs,
            start.subsec_nanosecond() as u32,
        ))
        .to_string();
        for (k, line) in template.iter().enumerate() {
            let mut v = line.clone();
            v["run_id"] = json!(id);
            v["ts"] = json!((start + jiff::SignedDuration::from_millis(k as i64 * 20)).to_string());
            w.line(v);
        }
    }
    w.finish();
    Made {
        bytes: w.written,
        segments: w.segments,
        lines: w.n,
    }
}

struct Writer {
    log: PathBuf,
    out: Option<std::io::BufWriter<std::fs::File>>,
    first: u64,
    n: u64,
    prev: String,
    bytes: u64,
    written: u64,
    segments: usize,
    last_ts: jiff::Timestamp,
}

impl Writer {
    fn line(&mut self, mut v: Value) {
        if self.out.is_none() {
            self.open();
        }
        self.n += 1;
        v["n"] = json!(self.n);
        v["prev"] = json!(self.prev);
        let bytes = serde_json::to_vec(&v).unwrap();
        self.prev = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let out = self.out.as_mut().unwrap();
        out.write_all(&bytes).unwrap();
        out.write_all(b"\n").unwrap();
        self.bytes += bytes.len() as u64 + 1;
        self.written += bytes.len() as u64 + 1;
        self.last_ts = v["ts"].as_str().unwrap().parse().unwrap();
        // Closed a little before a writer would, so the current file keeps
        // room for the measured runs.
        if self.bytes >= SEGMENT - (1 << 20) {
            self.close();
        }
    }

    fn open(&mut self) {
        let path = format!("{}.{:012}", self.log.display(), self.n + 1);
        std::fs::create_dir_all(self.log.parent().unwrap()).unwrap();
        self.out = Some(std::io::BufWriter::new(
            std::fs::File::create(path).unwrap(),
        ));
        self.first = self.n + 1;
        self.bytes = 0;
        self.segments += 1;
        if self.n > 0 {
            // The line a writer starts each segment with.
            let line = json!({
                "ts": self.last_ts.to_string(), "run_id": "-", "phase": "segment",
                "runbook": "-", "runbook_version": "", "host": "-", "planner": "-",
                "detail": {
                    "previous": { "last": self.n, "head": self.prev },
                    "retired": [],
                    "carried": { "unfinished": [], "ends": [
                        { "runbook": "probe", "host": "local", "ended": self.last_ts.to_string(), "keys": [] }
                    ] },
                },
            });
            self.line(line);
        }
    }

    fn close(&mut self) {
        let mut out = self.out.take().unwrap();
        out.flush().unwrap();
        let file = out.into_inner().unwrap();
        file.set_modified(SystemTime::from(self.last_ts)).unwrap();
    }

    /// The newest segment becomes the current file.
    fn finish(&mut self) {
        if self.out.is_some() {
            self.close();
        }
        let newest = format!("{}.{:012}", self.log.display(), self.first);
        std::fs::rename(newest, &self.log).unwrap();
    }
}

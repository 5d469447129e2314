//! Helpers for the integration tests: a config directory per test, the real
//! binary, and readers for its report and audit log.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_runwarden")
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A throw-away config directory: runbooks/, hosts/, kill-switch/, state/.
pub struct Estate {
    pub dir: tempfile::TempDir,
}

impl Estate {
    pub fn new() -> Estate {
        let dir = tempfile::Builder::new()
            .prefix("rw-it-")
            .tempdir()
            .expect("tempdir");
        for d in ["runbooks", "hosts", "kill-switch", "work"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Estate { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A scratch directory for the test's own files (logs, certificates, scripts).
    pub fn work(&self) -> PathBuf {
        self.path().join("work")
    }

    pub fn host(&self, name: &str, yaml: &str) -> &Self {
        std::fs::write(self.path().join(format!("hosts/{name}.yaml")), yaml).unwrap();
        self
    }

    pub fn runbook(&self, name: &str, yaml: &str) -> &Self {
        std::fs::write(self.path().join(format!("runbooks/{name}.yaml")), yaml).unwrap();
        self
    }

    /// Copy one of the repository's shipped runbooks.
    pub fn shipped_runbook(&self, name: &str) -> &Self {
        let text = std::fs::read_to_string(repo().join(format!("runbooks/{name}.yaml"))).unwrap();
        self.runbook(name, &text)
    }

    /// An executable script in the work directory (a hostile or slow "binary" for a tool).
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.work().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args).arg("--config").arg(self.path());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("spawn runwarden")
    }

    /// `runwarden run RUNBOOK --host HOST --json [extra]`: the exit code and the report.
    pub fn run_json(&self, runbook: &str, host: &str, extra: &[&str]) -> (i32, Value) {
        let mut args = vec!["run", runbook, "--host", host, "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON report ({e}); exit {:?}\nstdout: {}\nstderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }

    pub fn audit_path(&self) -> PathBuf {
        self.path().join("state/audit.jsonl")
    }

    pub fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.audit_path())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }

    /// Audit lines of one phase.
    pub fn audit_phase(&self, phase: &str) -> Vec<Value> {
        self.audit()
            .into_iter()
            .filter(|l| l["phase"] == phase)
            .collect()
    }
}

/// The steps of a report with the given status.
pub fn steps_with(report: &Value, status: &str) -> Vec<Value> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == status)
        .cloned()
        .collect()
}

pub fn step<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no step {id} in {report:#}"))
}

/// Run a command and insist it succeeds (test setup only).
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn local_host(name: &str, extra: &str) -> String {
    format!("name: {name}\nconnection: local\n{extra}\n")
}

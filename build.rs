//! Which commit this binary was built from, for `runwarden --version`:
//! `RUNWARDEN_COMMIT` if set (a package built outside a checkout), else the
//! checkout's `git rev-parse`, else "unknown".

fn main() {
    println!("cargo:rerun-if-env-changed=RUNWARDEN_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let commit = std::env::var("RUNWARDEN_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .filter(|c| c.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RUNWARDEN_COMMIT={commit}");
}

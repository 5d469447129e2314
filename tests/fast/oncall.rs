//! On-call's commands as typed from anywhere: which configuration they act on.

use std::path::Path;
use std::process::Command;

use super::config;

fn runwarden_in(cwd: &Path, args: &[&str], env: Option<&Path>) -> (Option<i32>, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runwarden"));
    c.args(args).current_dir(cwd).env_remove("RUNWARDEN_CONFIG");
    if let Some(dir) = env {
        c.env("RUNWARDEN_CONFIG", dir);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `kill-switch engage` typed in a directory that is no configuration (an
/// empty one, `/`) refuses and writes nothing there; with RUNWARDEN_CONFIG,
/// or from a directory holding runwarden.yaml, it engages that directory's
/// switch, the one its daemon reads. (On a machine with the package's
/// /etc/runwarden, that directory is the fallback: then only `status` is
/// asked, to see that it is the one used.)
#[test]
fn the_kill_switch_acts_only_on_a_configuration_a_daemon_reads() {
    let packaged = Path::new("/etc/runwarden").is_dir();
    let empty = tempfile::tempdir().unwrap();
    for cwd in [empty.path(), Path::new("/")] {
        if packaged {
            let (_, said) = runwarden_in(cwd, &["kill-switch", "status"], None);
            assert!(said.contains("/etc/runwarden"), "{said}");
            continue;
        }
        let (code, said) =
            runwarden_in(cwd, &["kill-switch", "engage", "--reason", "INC-123"], None);
        assert_eq!(code, Some(2), "{said}");
        assert!(
            said.contains("which configuration?") && said.contains("--config DIR"),
            "{said}"
        );
        assert!(
            !cwd.join("kill-switch").exists(),
            "nothing written in {}",
            cwd.display()
        );
        for args in [
            &["run", "x", "--host", "y"][..],
            &["check"][..],
            &["serve"][..],
        ] {
            let (code, said) = runwarden_in(cwd, args, None);
            assert_eq!(code, Some(2), "{args:?}: {said}");
        }
    }
    let conf = tempfile::tempdir().unwrap();
    config(conf.path());
    let (code, said) = runwarden_in(
        empty.path(),
        &["kill-switch", "engage", "--reason", "INC-123"],
        Some(conf.path()),
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(conf.path().join("kill-switch/ENGAGED").exists());
    assert!(!empty.path().join("kill-switch").exists());
    let (code, said) = runwarden_in(conf.path(), &["kill-switch", "release"], None);
    assert_eq!(code, Some(0), "{said}");
    assert!(!conf.path().join("kill-switch/ENGAGED").exists(), "{said}");
}

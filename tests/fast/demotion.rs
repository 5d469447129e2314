//! `demote_after`: an L3 runbook whose fixes keep failing their own
//! verification loses its standing approval, on its own, until a person
//! gives it back with `runwarden promote`. The failing fix is real: the
//! host's renewal command is real openssl writing a real certificate that
//! expires sooner than the one it replaced, so `renew_certificate`'s own
//! verification (the new not_after is later than the old) fails.

use super::*;

/// Host `web` with certificate `web` (5 days left) whose renewal makes a
/// 1-day certificate; runbook `renew` (L3, demoted after 2 failed runs in an hour).
fn renewal_that_fails(dir: &Path) -> std::path::PathBuf {
    config(dir);
    let pem = dir.join("data/web.pem");
    let key = dir.join("data/web.key");
    let openssl = |days: &str| {
        let out = std::process::Command::new("/usr/bin/openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", days])
            .args(["-subj", "/CN=web.staging.test", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&pem)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    openssl("5");
    std::fs::write(
        dir.join("hosts/web.yaml"),
        format!(
            "name: web\nconnection: local\npaths: [{d}]\ncertificates:\n  web:\n    path: {p}\n    renew: [/usr/bin/openssl, req, -x509, -newkey, ec, -pkeyopt, 'ec_paramgen_curve:P-256', -nodes, -days, '1', -subj, /CN=web.staging.test, -keyout, {k}, -out, {p}]\n",
            d = dir.join("data").display(),
            p = pem.display(),
            k = key.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("runbooks/renew.yaml"),
        "name: renew\ndescription: renew the web certificate\nhosts: [web]\nautonomy: L3\n\
         demote_after: { failures: 2, per: 1h }\n\
         tools: { observe: [cert_expiry], approve: [renew_certificate] }\n\
         steps:\n  - id: look\n    call: cert_expiry\n    args: { name: web }\n\
         \x20 - id: renew\n    call: renew_certificate\n    args: { name: web }\n    reason: it expires soon\n",
    )
    .unwrap();
    // Each renewal shortens it further; put the 5-day one back before each run.
    let again = pem.with_extension("orig");
    std::fs::copy(&pem, &again).unwrap();
    again
}

/// The threads of this process whose nice value is not the process's own,
/// with their names.
fn niced_threads() -> Vec<String> {
    let nice = |stat: &str| -> Option<i32> {
        // After the command's name: state is field 3, nice field 19.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(16)?
            .parse()
            .ok()
    };
    let own = nice(&std::fs::read_to_string("/proc/self/stat").unwrap());
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            (nice(&stat) != own).then_some(stat)
        })
        .collect()
}

async fn run_renew(d: &Daemon) -> Value {
    let r = client()
        .post(d.url("/api/v1/runs"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(serde_json::json!({ "runbook": "renew", "hosts": ["web"] }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let answer: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    let run_id = answer["outcomes"][0]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no run started: {answer}"))
        .to_string();
    verdict_of(d, &run_id).await["report"].clone()
}

fn intents_of(dir: &Path, run_id: &str) -> usize {
    audit_lines(dir)
        .iter()
        .filter(|l| l["run_id"] == run_id && l["phase"] == "intent")
        .count()
}

fn step<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no step {id}: {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fix_that_keeps_failing_demotes_its_runbook_until_a_person_promotes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let orig = renewal_that_fails(dir);
    let pem = dir.join("data/web.pem");
    let cfg = dir.to_str().unwrap();
    let demoted = "runwarden_runbook_demoted{runbook=\"renew\"}";

    let d = Daemon::start(dir).await;
    assert_eq!(wait_metric(&d, demoted, |v| v == 0.0).await, 0.0);
    let mut failed = Vec::new();
    for _ in 0..2 {
        std::fs::copy(&orig, &pem).unwrap();
        let report = run_renew(&d).await;
        assert_eq!(report["verdict"], "failed", "{report:#}");
        let renew = &step(&report, "renew")["result"];
        assert_eq!(renew["verified"], false, "{renew:#}");
        failed.push(report["run_id"].as_str().unwrap().to_string());
    }
    // The renewals ran as background work; no thread of the daemon (this
    // process) was lowered with them.
    assert_eq!(niced_threads(), Vec::<String>::new());
    // The second failure demoted it: audited with the evidence, exported.
    wait_metric(&d, demoted, |v| v == 1.0).await;
    let lines = audit_lines(dir);
    let line = lines
        .iter()
        .find(|l| l["phase"] == "autonomy" && l["outcome"] == "demoted")
        .expect("a demoted line");
    assert_eq!(line["runbook"], "renew");
    let evidence = line["detail"]["evidence"].as_array().unwrap();
    let runs: Vec<&str> = evidence
        .iter()
        .map(|f| f["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(runs, failed.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(evidence[0]["calls"][0]["tool"], "renew_certificate");
    assert_eq!(evidence[0]["calls"][0]["tier"], 2);

    // The next run still looks, but its change waits for a person (and
    // nobody can approve here): nothing is renewed.
    std::fs::copy(&orig, &pem).unwrap();
    let before = std::fs::read(&pem).unwrap();
    let held = run_renew(&d).await;
    let held_id = held["run_id"].as_str().unwrap();
    assert_eq!(step(&held, "look")["status"], "ok", "{held:#}");
    let renew = step(&held, "renew");
    assert_eq!(renew["status"], "denied", "{held:#}");
    let detail = renew["detail"].as_str().unwrap();
    assert!(
        detail.contains("no_approver") && detail.contains("demoted to L2"),
        "{detail}"
    );
    assert_eq!(intents_of(dir, held_id), 1, "only the look ran");
    assert_eq!(std::fs::read(&pem).unwrap(), before, "nothing renewed");
    d.shutdown().await.unwrap();

    // It survives a restart and a reload.
    let d = Daemon::start(dir).await;
    wait_metric(&d, demoted, |v| v == 1.0).await;
    let rb = dir.join("runbooks/renew.yaml");
    let text = std::fs::read_to_string(&rb).unwrap();
    std::fs::write(&rb, format!("{text}# reloaded\n")).unwrap();
    let reloads = "runwarden_config_reloads_total{result=\"success\"}";
    wait_metric(&d, reloads, |v| v >= 1.0).await;
    let again = run_renew(&d).await;
    assert_eq!(step(&again, "renew")["status"], "denied", "{again:#}");

    // On-call sees it in check, status and promote-report.
    let said = |args: &[&str]| {
        let out = runwarden(args);
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, check) = said(&["check", "--config", cfg]);
    assert_eq!(code, Some(0), "{check}");
    assert!(check.contains("demote_after=2/1h"), "{check}");
    assert!(check.contains("DEMOTED runbook \"renew\""), "{check}");
    let (code, status) = said(&["kill-switch", "status", "--config", cfg]);
    assert_eq!(
        code,
        Some(0),
        "a demotion is not an engaged switch: {status}"
    );
    assert!(status.contains(&failed[1]), "{status}");
    let (_, report) = said(&["promote-report", "renew", "--config", cfg]);
    assert!(
        report.contains("DEMOTED") && report.contains("step 2 renew_certificate (tier 2)"),
        "{report}"
    );

    // Only a person restores it, and not while the evidence is fresh.
    let (code, refused) = said(&["promote", "renew", "--reason", "CA fixed", "--config", cfg]);
    assert_eq!(code, Some(1), "{refused}");
    assert!(refused.contains("--force"), "{refused}");
    let (code, empty) = said(&["promote", "renew", "--reason", " ", "--config", cfg]);
    assert_eq!(code, Some(2), "{empty}");
    wait_metric(&d, demoted, |v| v == 1.0).await;
    let (code, done) = said(&[
        "promote", "renew", "--force", "--reason", "CA fixed", "--config", cfg,
    ]);
    assert_eq!(code, Some(0), "{done}");
    assert!(done.contains("promoted renew"), "{done}");
    let lines = audit_lines(dir);
    let promoted = lines
        .iter()
        .find(|l| l["phase"] == "autonomy" && l["outcome"] == "promoted")
        .expect("a promoted line");
    assert_eq!(promoted["detail"]["forced"], true);
    assert_eq!(promoted["detail"]["reason"], "CA fixed");
    wait_metric(&d, demoted, |v| v == 0.0).await;
    let (code, again) = said(&["promote", "renew", "--reason", "again", "--config", cfg]);
    assert_eq!(code, Some(1), "{again}");
    assert!(again.contains("is not demoted"), "{again}");

    // The change runs again, and its failures count from zero: one more is not two.
    std::fs::copy(&orig, &pem).unwrap();
    let after = run_renew(&d).await;
    assert_eq!(intents_of(dir, after["run_id"].as_str().unwrap()), 2);
    assert_eq!(after["verdict"], "failed");
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert_eq!(metric(&d, demoted).await, Some(0.0));
    d.shutdown().await.unwrap();
}

/// `demote_after` is refused where it cannot work, at its file and line.
#[test]
fn demote_after_is_refused_where_it_cannot_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    renewal_that_fails(dir);
    let rb = dir.join("runbooks/renew.yaml");
    let good = std::fs::read_to_string(&rb).unwrap();
    for (from, to, says) in [
        (
            "failures: 2",
            "failures: 0",
            "demote_after.failures must be at least 1",
        ),
        ("per: 1h", "per: 30s", "must be between 1m and 7d"),
        ("per: 1h", "per: 8d", "must be between 1m and 7d"),
        (
            "autonomy: L3",
            "autonomy: L2",
            "only an L3 runbook holds it",
        ),
        ("failures: 2", "failure: 2", "failure"),
    ] {
        std::fs::write(&rb, good.replace(from, to)).unwrap();
        let out = runwarden(&["check", "--config", dir.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{to}: {stderr}");
        assert!(stderr.contains("renew.yaml:"), "{to}: {stderr}");
        assert!(stderr.contains(says), "{to}: {stderr}");
    }
}

/// A demotion is the audit log's record, not only its file: the file
/// removed by hand (deleted, or replaced by a dangling link) leaves the
/// runbook demoted, across a restart and a rotation of the log, and
/// `check`, `kill-switch status` and the gauge say the file is missing;
/// only a forced promotion lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_removed_by_hand_still_demotes_until_a_person_promotes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let orig = renewal_that_fails(dir);
    let pem = dir.join("data/web.pem");
    let cfg = dir.to_str().unwrap();
    let demoted = "runwarden_runbook_demoted{runbook=\"renew\"}";
    let file = dir.join("state/demoted/renew.json");
    let said = |args: &[&str]| {
        let out = runwarden(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };

    let d = Daemon::start(dir).await;
    for _ in 0..2 {
        std::fs::copy(&orig, &pem).unwrap();
        assert_eq!(run_renew(&d).await["verdict"], "failed");
    }
    wait_metric(&d, demoted, |v| v == 1.0).await;
    assert!(file.exists());
    std::fs::remove_file(&file).unwrap();
    std::fs::copy(&orig, &pem).unwrap();
    let held = run_renew(&d).await;
    let renew = step(&held, "renew");
    assert_eq!(renew["status"], "denied", "deleted by hand: {held:#}");
    assert!(
        renew["detail"].as_str().unwrap().contains("is missing"),
        "{held:#}"
    );
    d.shutdown().await.unwrap();

    // A dangling link in its place, segments of 4 KiB (the runs close
    // some), and a restart: still demoted.
    std::os::unix::fs::symlink(dir.join("state/gone.json"), &file).unwrap();
    small_segments(dir);
    let d = Daemon::start(dir).await;
    wait_metric(&d, demoted, |v| v == 1.0).await;
    std::fs::remove_file(&file).unwrap();
    for _ in 0..3 {
        std::fs::copy(&orig, &pem).unwrap();
        let again = run_renew(&d).await;
        assert_eq!(step(&again, "renew")["status"], "denied", "{again:#}");
    }
    assert!(segments(dir) >= 2, "the log rotated past its demoted line");
    assert_eq!(metric(&d, demoted).await, Some(1.0));

    // On-call is told, in check and status.
    let (_, check) = said(&["check", "--config", cfg]);
    assert!(
        check.contains("DEMOTED runbook \"renew\"")
            || check.contains("runbook \"renew\" counts as demoted"),
        "{check}"
    );
    assert!(check.contains("is missing"), "{check}");
    let (_, status) = said(&["kill-switch", "status", "--config", cfg]);
    assert!(status.contains("is missing"), "{status}");
    let (_, verify) = said(&["audit", "verify", "--config", cfg]);
    assert!(
        verify.contains("demotion record: the audit log demoted runbook \"renew\"")
            && verify.contains("is missing"),
        "{verify}"
    );

    // Only --force lifts it: there is no evidence to weigh.
    let (code, refused) = said(&["promote", "renew", "--reason", "fixed", "--config", cfg]);
    assert_eq!(code, Some(1), "{refused}");
    assert!(refused.contains("--force"), "{refused}");
    let (code, done) = said(&[
        "promote", "renew", "--force", "--reason", "fixed", "--config", cfg,
    ]);
    assert_eq!(code, Some(0), "{done}");
    wait_metric(&d, demoted, |v| v == 0.0).await;
    std::fs::copy(&orig, &pem).unwrap();
    let after = run_renew(&d).await;
    assert_eq!(
        after["mutations"], 1,
        "promoted: the renewal runs again: {after:#}"
    );
    d.shutdown().await.unwrap();
}

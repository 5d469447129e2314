//! `demote_after` across the fleet: failed runs count whichever replica ran
//! them, exactly one replica records the demotion when two reach it at
//! once, every replica's gate sees it, and a promotion through any
//! replica lifts it everywhere. The failing fix is real: each host's
//! renewal command is real openssl writing a certificate that expires
//! sooner than the one it replaced, which `renew_certificate`'s own
//! verification refuses.

use super::*;

/// Hosts `h1` and `h2`, each with a 5-day certificate whose renewal makes a
/// 1-day one, and runbook `renew` (L3, demoted after 2 failed runs in an hour).
fn failing_renewals(site: &Site) -> impl Fn(&Estate) + '_ {
    for h in ["h1", "h2"] {
        let dir = site.dir.path().join(format!("{h}-ssl"));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("/usr/bin/openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "5"])
            .args(["-subj", "/CN=web.staging.test", "-keyout"])
            .arg(dir.join("web.key"))
            .arg("-out")
            .arg(dir.join("web.pem"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    move |e: &Estate| {
        for h in ["h1", "h2"] {
            let dir = site.dir.path().join(format!("{h}-ssl"));
            e.host(
                h,
                &site.host(
                    h,
                    &format!(
                        "certificates:\n  web:\n    path: {p}\n    renew: [/usr/bin/openssl, req, -x509, -newkey, ec, -pkeyopt, 'ec_paramgen_curve:P-256', -nodes, -days, '1', -subj, /CN=web.staging.test, -keyout, {k}, -out, {p}]\n",
                        p = dir.join("web.pem").display(),
                        k = dir.join("web.key").display()
                    ),
                ),
            );
        }
        e.runbook(
            "renew",
            "name: renew\ndescription: t\nhosts: [h1, h2]\nautonomy: L3\n\
             demote_after: { failures: 2, per: 1h }\n\
             tools: { observe: [cert_expiry], approve: [renew_certificate] }\n\
             steps:\n  - id: renew\n    call: renew_certificate\n    args: { name: web }\n    reason: it expires soon\n",
        );
    }
}

fn demoted_gauge(r: &Replica) -> Option<f64> {
    let (_, text) = http(&r.addr, "GET", "/metrics", "")?;
    text.lines()
        .find(|l| l.starts_with("runwarden_runbook_demoted{runbook=\"renew\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn lines_of(fleet: &[Replica], outcome: &str) -> Vec<Value> {
    all_lines(fleet)
        .into_iter()
        .filter(|l| l["phase"] == "autonomy" && l["outcome"] == outcome)
        .collect()
}

#[test]
fn failures_on_two_replicas_demote_a_runbook_on_all_three_and_one_promotion_lifts_it() {
    let pg = Pg::start();
    let site = Site::new();
    let setup = failing_renewals(&site);
    let fleet = fleet(&pg, 3, LONG, "", &setup);
    // `a` and `b` each fail once, at the same moment: two failures reach
    // the rule, and exactly one of them records the demotion.
    assert_eq!(fleet[0].start_runs("renew", &["h1"]), ["started"]);
    assert_eq!(fleet[1].start_runs("renew", &["h2"]), ["started"]);
    let verdicts = wait_verdicts(&fleet, 2, Duration::from_secs(60));
    assert!(
        verdicts.iter().all(|v| v["outcome"] == "failed"),
        "{verdicts:#?}"
    );
    let demoted = wait_for("a demoted line", Duration::from_secs(10), || {
        let l = lines_of(&fleet, "demoted");
        (!l.is_empty()).then_some(l)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines_of(&fleet, "demoted").len(), 1, "{demoted:#?}");
    let evidence = demoted[0]["detail"]["evidence"].as_array().unwrap();
    let mut hosts: Vec<&str> = evidence
        .iter()
        .map(|f| f["host"].as_str().unwrap())
        .collect();
    hosts.sort();
    assert_eq!(hosts, ["h1", "h2"], "failures of both replicas count");

    // Every replica exports it, `c` (which ran nothing) included.
    for r in &fleet {
        wait_for("the demotion exported", Duration::from_secs(15), || {
            (demoted_gauge(r) == Some(1.0)).then_some(())
        });
    }
    // `c`'s gate holds the change: nobody can approve, nothing is renewed.
    let before = std::fs::read(site.dir.path().join("h1-ssl/web.pem")).unwrap();
    assert_eq!(fleet[2].start_runs("renew", &["h1"]), ["started"]);
    settled(&fleet[2]);
    let denied: Vec<Value> = fleet[2].e.audit_phase("denied");
    let reason = denied.last().expect("a denied line")["detail"].to_string();
    assert!(
        reason.contains("no_approver") && reason.contains("demoted to L2"),
        "{reason}"
    );
    assert_eq!(
        std::fs::read(site.dir.path().join("h1-ssl/web.pem")).unwrap(),
        before
    );
    // A person's `runwarden run` on `a` sees the fleet's record too.
    let (code, report) = fleet[0].e.run_json("renew", "h2", &[]);
    assert_eq!(report["verdict"], "denied", "{report:#}");
    assert_eq!(code, 3);
    // `kill-switch status` on `c` shows it; a promotion there lifts it on all three.
    let out = fleet[2].e.run(&["kill-switch", "status"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("DEMOTED runbook \"renew\""), "{status}");
    let refused = fleet[2]
        .e
        .run(&["promote", "renew", "--reason", "CA fixed"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"));
    let done = fleet[2]
        .e
        .run(&["promote", "renew", "--force", "--reason", "CA fixed"]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(String::from_utf8_lossy(&done.stdout).contains("on every replica"));
    assert_eq!(
        fleet[2].e.audit_phase("autonomy").len(),
        1,
        "the promoted line"
    );
    for r in &fleet {
        wait_for("the promotion exported", Duration::from_secs(15), || {
            (demoted_gauge(r) == Some(0.0)).then_some(())
        });
    }
    // `a`'s gate permits the change again at once.
    let intents = fleet[0].e.audit_phase("intent").len();
    assert_eq!(fleet[0].start_runs("renew", &["h1"]), ["started"]);
    settled(&fleet[0]);
    assert_eq!(fleet[0].e.audit_phase("intent").len(), intents + 1);
}

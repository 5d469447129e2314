//! The kill switch over HTTP across three replicas: a principal engages it
//! through one, and every replica's admission refuses at once; another
//! principal releases it through a third, and the fleet runs again. Who
//! engaged it is the token's principal, on every replica's view of it.

use super::*;

const ONCALL: &str = "oncall-token-0123456789abcdef";
const LEAD: &str = "lead-token-0123456789abcdef";

/// `oncall` may stop everything and read; `lead` may release.
fn principals(e: &Estate) {
    write_secret(
        &e.path().join("principals.yaml"),
        &format!(
            "principals:\n  oncall:\n    tokens: [{{ id: oncall-phone, sha256: {} }}]\n    scopes:\n      kill:engage: {{}}\n      run:read: {{}}\n  lead:\n    tokens: [{{ id: lead-1, sha256: {} }}]\n    scopes:\n      kill:release: {{}}\n",
            sha256_hex(ONCALL),
            sha256_hex(LEAD)
        ),
    );
}

fn call(r: &Replica, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    let auth = format!("Authorization: Bearer {token}");
    let (status, text) =
        http_with(&r.addr, method, path, body, &[&auth]).expect("the replica answers");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[test]
fn the_kill_switch_engaged_over_http_through_one_replica_stops_all_three() {
    let pg = Pg::start();
    let site = Site::new();
    let fleet = fleet(&pg, 3, LONG, "principals_file: principals.yaml\n", &|e| {
        for h in ["h1", "h2", "h3"] {
            e.host(h, &site.host(h, ""));
        }
        e.runbook("rot", &rot_runbook(&site, "h1, h2, h3", 0));
        principals(e);
    });
    let engage = json!({ "reason": "INC-42 from the phone", "for": "2h" }).to_string();
    // Engaging is not releasing, and releasing is not engaging.
    let (status, answer) = call(&fleet[0], "POST", "/api/v1/kill-switch", LEAD, &engage);
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = call(&fleet[1], "POST", "/api/v1/kill-switch", ONCALL, &engage);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["reach"], "fleet", "{answer}");
    assert!(answer["until"].is_string(), "{answer}");
    // At once, on a replica that may not have heard: admission refuses.
    let (status, answer) = fleet[2].post("/api/v1/alerts", &notification(&["h1"]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcomes"][0]["result"], "kill_switch", "{answer}");
    // Every replica says who stopped it, and no file was written.
    for r in &fleet {
        let (status, answer) = call(r, "GET", "/api/v1/kill-switch", ONCALL, "");
        assert_eq!(status, 200, "{answer}");
        let first = &answer["engaged"][0];
        assert_eq!(first["scope"], "fleet:global", "{answer}");
        let detail = first["detail"].as_str().unwrap();
        assert!(
            detail.contains("oncall (token oncall-phone)") && detail.contains("INC-42"),
            "{detail}"
        );
        assert!(!r.e.path().join("kill-switch/ENGAGED").exists());
    }
    let (status, answer) = call(&fleet[0], "DELETE", "/api/v1/kill-switch", ONCALL, "");
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = call(&fleet[2], "DELETE", "/api/v1/kill-switch", LEAD, "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["was_engaged"], true, "{answer}");
    assert_eq!(answer["still_engaged"], json!([]), "{answer}");
    let answer = wait_for(
        "the fleet runs again",
        Duration::from_secs(10),
        || match fleet[0].post("/api/v1/alerts", &notification(&["h2"])) {
            (200, a) if a["outcomes"][0]["result"] == "started" => Some(a),
            (200, a) if a["outcomes"][0]["result"] == "kill_switch" => None,
            (status, a) => panic!("{status}: {a}"),
        },
    );
    assert_eq!(answer["outcomes"][0]["result"], "started", "{answer}");
    // Each replica audited the decisions taken through it.
    let decided = |r: &Replica| -> Vec<(String, String, String)> {
        r.e.audit_phase("access")
            .iter()
            .map(|l| {
                (
                    l["detail"]["principal"].as_str().unwrap().to_string(),
                    l["detail"]["scope"].as_str().unwrap().to_string(),
                    l["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let own = |p: &str, s: &str, o: &str| (p.to_string(), s.to_string(), o.to_string());
    assert_eq!(
        decided(&fleet[0]),
        [
            own("lead", "kill:engage", "refused"),
            own("oncall", "kill:release", "refused")
        ]
    );
    assert_eq!(
        decided(&fleet[1]),
        [own("oncall", "kill:engage", "allowed")]
    );
    assert_eq!(decided(&fleet[2]), [own("lead", "kill:release", "allowed")]);
}

//! Slack across three replicas: Slack may deliver one click to any of
//! them, and a retry to another. The same signed click sent to all three
//! at once makes exactly one decision; the replica whose run waits goes
//! on, and rewrites the one message it posted.

use super::*;
use crate::chat::{SECRET, SlackDouble, click, now, send_at, slack_settings};

#[test]
fn one_click_delivered_to_three_replicas_is_one_decision() {
    let pg = Pg::start();
    let site = Site::new();
    let slack = SlackDouble::start();
    let fleet = fleet(&pg, 3, LONG, "principals_file: principals.yaml\n", &|e| {
        e.host("h1", &site.host("h1", ""));
        e.runbook(
            "l2",
            &rot_runbook(&site, "h1", 0)
                .replace("name: rot", "name: l2")
                .replace("autonomy: L3", "autonomy: L2"),
        );
        write_secret(
            &e.path().join("principals.yaml"),
            &format!(
                "principals:\n  carol:\n    tokens: [{{ id: carol-1, sha256: {} }}]\n    chat: [\"slack:T0RUNWARD/UCAROL\"]\n    scopes:\n      approve: {{}}\n",
                sha256_hex("carol-token-0123456789abcdef")
            ),
        );
        let settings = e.path().join("runwarden.yaml");
        let text = std::fs::read_to_string(&settings).unwrap();
        std::fs::write(&settings, format!("{text}{}", slack_settings(e, &slack))).unwrap();
    });
    assert_eq!(fleet[0].start_runs("l2", &["h1"]), ["started"]);
    let carol = "Authorization: Bearer carol-token-0123456789abcdef";
    let request = wait_for("the pending request", Duration::from_secs(15), || {
        let (_, body) = http_with(&fleet[2].addr, "GET", "/api/v1/approvals", "", &[carol])?;
        let list: Value = serde_json::from_str(&body).ok()?;
        list["approvals"]
            .as_array()?
            .iter()
            .find(|r| r["state"] == "pending")
            .cloned()
    });
    let id = request["id"].as_str().unwrap().to_string();
    assert_eq!(slack.wait("/api/chat.postMessage", 1).len(), 1);
    let value = format!("{id} {}", request["digest"].as_str().unwrap());
    let body = click(&slack, "UCAROL", "runwarden_approve", &value);
    let at = now();
    let answers: Vec<u16> = std::thread::scope(|s| {
        let sent: Vec<_> = fleet
            .iter()
            .map(|r| s.spawn(|| send_at(&r.addr, SECRET, at, &body).0))
            .collect();
        sent.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(answers, [200, 200, 200]);
    slack.wait("/actions/reply", 3);
    let mut replies = slack.replies();
    replies.sort();
    assert_eq!(
        replies[0],
        format!("approval request {id} was already decided: nothing was decided")
    );
    assert_eq!(replies[1], replies[0]);
    assert_eq!(replies[2], format!("approved {id}"), "{replies:?}");
    let v = wait_for("the waiting run's verdict", Duration::from_secs(10), || {
        fleet[0].verdicts().into_iter().next()
    });
    assert_eq!(v["outcome"], "ok", "{v:#}");
    assert_eq!(site.rotations("h1").len(), 1, "one call, once");
    let updated = slack.wait("/api/chat.update", 1);
    assert!(
        updated[0]
            .body
            .to_string()
            .contains("approved by carol via Slack"),
        "{:#}",
        updated[0].body
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(slack.heard("/api/chat.update").len(), 1, "rewritten once");
    assert_eq!(slack.heard("/api/chat.postMessage").len(), 1, "posted once");
    let allowed: usize = fleet
        .iter()
        .map(|r| {
            r.e.audit_phase("access")
                .iter()
                .filter(|l| l["detail"]["via"] == "slack" && l["outcome"] == "allowed")
                .count()
        })
        .sum();
    assert_eq!(allowed, 3, "each replica audited the click it took");
}

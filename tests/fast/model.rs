//! A model's words are not evidence: a model-planned run ends `ok` only
//! with a successful call and an answer that claims no change the run's
//! record lacks; otherwise it is `inconclusive` (exit 8), and every
//! checkable claim of the answer is marked in the report, the transcript,
//! the history and the API. The model is a scripted server on loopback;
//! two of its answers are those a real small model gave (see
//! `tests/fixtures/model-answers`).

use super::*;

#[path = "../support/model_server.rs"]
mod model_server;
use model_server::{ModelServer, answer, call};

/// The fast tier's config with a model-planned runbook `look` (disk_usage
/// on the data directory) and the scripted model.
fn model_config(dir: &Path, server: &ModelServer) {
    config(dir);
    std::fs::write(
        dir.join("runwarden.yaml"),
        format!(
            "audit_head: none\nmodel:\n  endpoint: {}\n  name: scripted-14b\n  timeout: 5s\n  retries: 0\n",
            server.url
        ),
    )
    .unwrap();
    std::fs::write(dir.join("data/app.log"), "x".repeat(4096)).unwrap();
    std::fs::write(
        dir.join("runbooks/look.yaml"),
        "name: look\ndescription: why is the data directory filling\nhosts: [web-01]\nautonomy: L3\nplanner: model\ntools: { observe: [disk_usage], approve: [] }\nagent:\n  goal: Find out what fills the data directory.\n",
    )
    .unwrap();
}

fn recorded(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/model-answers/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// What `runwarden ARGS --config DIR` printed on stdout.
fn said(dir: &Path, args: &[&str]) -> String {
    let mut argv: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    argv.extend(["--config".as_ref(), dir.as_os_str()]);
    String::from_utf8_lossy(&runwarden(&argv).stdout).into_owned()
}

/// The answers a real 1.5B model gave without making any call: the run is
/// `inconclusive` (exit 8), never `ok`; the report's account of what
/// changed comes from the record (nothing), and every figure, name,
/// change and suggestion of the answer is marked unsupported, in the
/// report, the transcript, `audit show` and `runs`.
#[test]
fn a_model_that_made_no_call_is_inconclusive_and_every_invented_claim_marked() {
    for fixture in ["qwen-1.5b-disk-1.txt", "qwen-1.5b-disk-2.txt"] {
        let text = recorded(fixture);
        let server = ModelServer::start(move |_, _| answer(&text));
        let dir = tempfile::tempdir().unwrap();
        model_config(dir.path(), &server);
        let (code, report) = run_json_on(dir.path(), "look", "web-01");
        assert_eq!(code, Some(8), "{fixture}: {report:#}");
        assert_eq!(report["verdict"], "inconclusive");
        assert!(
            report["verdict_detail"]
                .as_str()
                .unwrap()
                .contains("made no successful call"),
            "{report:#}"
        );
        let claims = report["claims"].as_array().expect("claims");
        assert!(claims.len() >= 3, "{claims:#?}");
        assert!(
            claims.iter().all(|c| c["supported"] == false),
            "{claims:#?}"
        );
        assert!(
            claims
                .iter()
                .any(|c| c["change"] == true
                    && c["why"].as_str().unwrap().contains("restart_service")),
            "{claims:#?}"
        );
        // Read back: the person's report, the transcript, the history.
        let text = said(dir.path(), &["run", "look", "--host", "web-01"]);
        assert!(
            text.contains("changed (the run's record): nothing; no tier-2 call ran"),
            "{text}"
        );
        assert!(text.contains("unsupported: \""), "{text}");
        assert!(text.contains("verdict: inconclusive"), "{text}");
        let run_id = report["run_id"].as_str().unwrap();
        let transcript = said(dir.path(), &["transcript", run_id]);
        assert!(
            transcript.contains("the model's account, held to the run's record")
                && transcript.contains("unsupported: "),
            "{transcript}"
        );
        let show = said(dir.path(), &["audit", "show", run_id]);
        assert!(show.contains("claim UNSUPPORTED: "), "{show}");
        let runs: Value = serde_json::from_str(&said(dir.path(), &["runs", "--json"])).unwrap();
        let listed = runs
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == run_id)
            .unwrap()
            .clone();
        assert_eq!(listed["status"], "inconclusive");
        assert_eq!(listed["claims"].as_array().unwrap().len(), claims.len());
    }
}

/// A model that measured and then said what it measured: `ok`, its claims
/// supported. The same model claiming a restart it never made, after its
/// real call: `inconclusive`, the restart marked. A suggestion naming a
/// unit the run never saw is labelled the model's and marked.
#[test]
fn an_answer_is_held_to_the_record_of_the_calls_the_run_made() {
    let data = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let path = data.clone();
    let truthful = move |n: usize, req: &Value| match n {
        0 => call(
            "disk_usage",
            serde_json::json!({ "path": path.lock().unwrap().clone() }),
        ),
        _ => {
            let result = model_server::results(req)[0].clone();
            answer(&format!(
                "The data directory is {}% full; its largest entry is {}.",
                result["use_pct"],
                result["largest"][0]["path"].as_str().unwrap_or("?")
            ))
        }
    };
    let server = ModelServer::start(truthful.clone());
    let dir = tempfile::tempdir().unwrap();
    model_config(dir.path(), &server);
    *data.lock().unwrap() = dir.path().join("data").display().to_string();
    let (code, report) = run_json_on(dir.path(), "look", "web-01");
    assert_eq!(code, Some(0), "{report:#}");
    let claims = report["claims"].as_array().unwrap();
    assert!(
        !claims.is_empty() && claims.iter().all(|c| c["supported"] == true),
        "{claims:#?}"
    );

    let liar = move |n: usize, req: &Value| match n {
        0 => truthful(0, req),
        _ => answer(
            "I restarted the `nginx.service` unit and the disk is fine now.\nSUGGEST: systemctl restart httpd.service",
        ),
    };
    let server = ModelServer::start(liar);
    let dir = tempfile::tempdir().unwrap();
    model_config(dir.path(), &server);
    *data.lock().unwrap() = dir.path().join("data").display().to_string();
    let (code, report) = run_json_on(dir.path(), "look", "web-01");
    assert_eq!(code, Some(8), "{report:#}");
    assert!(
        report["verdict_detail"]
            .as_str()
            .unwrap()
            .contains("claims a change the run's record lacks"),
        "{report:#}"
    );
    let claims = report["claims"].as_array().unwrap();
    let suggestion = claims.iter().find(|c| c["suggestion"] == true).unwrap();
    assert_eq!(suggestion["supported"], false, "{claims:#?}");
    assert!(
        suggestion["why"]
            .as_str()
            .unwrap()
            .contains("httpd.service")
    );
    let text = said(dir.path(), &["run", "look", "--host", "web-01"]);
    assert!(
        text.contains("suggested by the model (its own, unverified; tier 3, not run): systemctl restart httpd.service [unsupported:"),
        "{text}"
    );
}

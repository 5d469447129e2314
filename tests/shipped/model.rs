//! Model-planned runs of the shipped binary, against a scripted
//! OpenAI-compatible server on loopback (a real HTTP server and the real
//! wire format; the "model" is a function of the request it receives):
//! each verdict a model run can end in, with its exit code, its verdict
//! line in the audit log and a chain that verifies; an unsupported claim
//! marked in the report a person reads; an answer cut at `max_tokens`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::model_server::*;
use crate::util::*;

/// Host `h` that may look at a directory of its own, runbook `m` planned
/// by the model at `server` (budget as given), and the directory.
fn estate(server: &ModelServer, budget: &str, model_extra: &str) -> (Estate, String) {
    let e = Estate::new();
    let data = e.work().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("app.log"), vec![b'x'; 64 << 10]).unwrap();
    let data = data.display().to_string();
    e.host("h", &local_host("h", &format!("paths: [{data}]")));
    e.runbook(
        "m",
        &format!(
            "name: m\ndescription: is the data directory filling up\nhosts: [h]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nbudget: {budget}\nplanner: model\nagent:\n  goal: Find out whether {data} is filling up and say what you found.\n"
        ),
    );
    std::fs::write(
        e.path().join("runwarden.yaml"),
        server.settings(model_extra),
    )
    .unwrap();
    (e, data)
}

/// `run m --host h --json` (or the person's plain report): exit code and output.
fn run(e: &Estate, json: bool) -> (i32, String) {
    let mut args = vec!["run", "m", "--host", "h"];
    if json {
        args.push("--json");
    }
    let out = e
        .cmd(&args)
        .env("RUNWARDEN_MODEL_KEY", "sk-shipped-test")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

const BUDGET: &str = "{ max_steps: 6, max_mutations: 1, max_duration: 1m }";

fn look(data: &str) -> Turn {
    call("disk_usage", json!({ "path": data }))
}

/// Each verdict of a model run, as the shipped binary reaches it: its
/// exit code, its report, its verdict line, and the chain.
#[test]
fn a_model_run_ends_in_each_verdict_with_its_exit_code() {
    type Script = Box<dyn Fn(usize, &Value, &str) -> Turn + Send + Sync>;
    let cases: Vec<(&str, &str, i32, Script)> = vec![
        (
            "ok",
            BUDGET,
            0,
            Box::new(|n, _, data| match n {
                0 => look(data),
                _ => answer(&format!(
                    "I measured {data}: it holds app.log and is not filling up."
                )),
            }),
        ),
        (
            "inconclusive",
            BUDGET,
            8,
            Box::new(|_, _, _| answer("I restarted nginx.service and the disk is at 40%.")),
        ),
        (
            "step_limit",
            "{ max_steps: 2, max_mutations: 1, max_duration: 1m }",
            4,
            Box::new(|_, _, data| look(data)),
        ),
        (
            "denied",
            BUDGET,
            3,
            Box::new(|n, _, data| match n {
                0 => call(
                    "restart_service",
                    json!({ "unit": "nginx.service", "reason": "the log says so" }),
                ),
                1 => look(data),
                _ => answer("The restart was refused."),
            }),
        ),
        (
            "budget_exhausted",
            "{ max_steps: 6, max_mutations: 1, max_duration: 3s }",
            5,
            Box::new(|_, _, _| Turn::Sleep(Duration::from_secs(8), Box::new(answer("late")))),
        ),
    ];
    for (verdict, budget, code, script) in cases {
        let data_for_script = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let seen = data_for_script.clone();
        let server = ModelServer::start(move |n, req| script(n, req, &seen.lock().unwrap()));
        let (e, data) = estate(&server, budget, "");
        *data_for_script.lock().unwrap() = data.clone();
        let (exit, text) = run(&e, true);
        let report: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{verdict}: no report (exit {exit}): {text}"));
        assert_eq!(report["verdict"], verdict, "{report:#}");
        assert_eq!(exit, code, "{verdict}: {report:#}");
        let lines = e.audit_phase("verdict");
        assert_eq!(lines.len(), 1, "{verdict}: one verdict line");
        assert_eq!(lines[0]["outcome"], verdict);
        let verify = e.run(&["audit", "verify"]);
        assert!(verify.status.success(), "{verdict}");
        if verdict == "ok" {
            let claims = report["claims"].as_array().expect("its account is checked");
            assert!(
                !claims.is_empty() && claims.iter().all(|c| c["supported"] == true),
                "{report:#}"
            );
        }
        if verdict == "inconclusive" {
            let claims = report["claims"].as_array().unwrap();
            assert!(
                claims
                    .iter()
                    .any(|c| c["change"] == true && c["supported"] == false),
                "{report:#}"
            );
        }
    }
}

/// A figure the run's record does not hold is marked in the report a
/// person reads, and in `--json`; the calls that ran keep the run `ok`.
#[test]
fn an_unsupported_claim_is_marked_in_the_report() {
    let server = ModelServer::start(|n, req| match n {
        0 => {
            let task = req["messages"][1]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let data = task
                .split_whitespace()
                .find(|w| w.starts_with('/') && w.ends_with("/data"))
                .unwrap_or("/nowhere")
                .to_string();
            call("disk_usage", json!({ "path": data }))
        }
        _ => answer("The directory holds 734 GiB of old logs."),
    });
    let (e, _) = estate(&server, BUDGET, "");
    let (exit, text) = run(&e, false);
    assert_eq!(exit, 0, "{text}");
    assert!(
        text.contains("unsupported: \"The directory holds 734 GiB of old logs\""),
        "{text}"
    );
    let (_, json) = run(&e, true);
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["claims"][0]["supported"], false, "{report:#}");
}

/// `model.max_tokens` is sent with every request, and an answer the
/// endpoint cut there is a step without a call: audited, in the report,
/// and the model is asked again; the run goes on to its verdict.
#[test]
fn an_answer_cut_at_max_tokens_is_a_step_without_a_call() {
    let server = ModelServer::start(|n, req| {
        let data = req["messages"][1]["content"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .find(|w| w.starts_with('/') && w.ends_with("/data"))
            .unwrap_or("/nowhere")
            .to_string();
        match n {
            0 => Turn::Reply(json!({
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": "Let me think about this very carefully, step by step, and",
                  "tool_calls": [{ "id": "c1", "type": "function", "function": { "name": "disk_usage", "arguments": "{\"pa" } }] },
                  "finish_reason": "length" }],
                "usage": { "prompt_tokens": 900, "completion_tokens": 64 }
            })),
            1 => call("disk_usage", json!({ "path": data })),
            _ => answer(&format!("{data} holds app.log; it is not filling up.")),
        }
    });
    let (e, _) = estate(&server, BUDGET, "  max_tokens: 64\n");
    let (exit, text) = run(&e, true);
    let report: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(exit, 0, "{report:#}");
    let requests = server.requests();
    assert!(
        requests.iter().all(|(_, body)| body["max_tokens"] == 64),
        "{requests:?}"
    );
    let cut = step(&report, "m1_cut_off");
    assert_eq!(cut["status"], "error");
    assert!(
        cut["detail"].as_str().unwrap().contains("max_tokens (64)"),
        "{cut:#}"
    );
    let asked_again = requests[1].1["messages"].to_string();
    assert!(asked_again.contains("cut off"), "{asked_again}");
    let turns = e.audit_phase("model");
    assert_eq!(turns[0]["detail"]["cut_off_at"], 64, "{turns:#?}");
    assert_eq!(report["steps"].as_array().unwrap().len(), 2, "{report:#}");
}

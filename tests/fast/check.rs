//! `check` refuses what cannot work, where it is written: a fleet budget
//! that cannot hold, shared state that cannot be reached.

use super::*;

/// A `fleet_budget` that cannot hold is refused where it is written.
#[test]
fn a_fleet_budget_that_cannot_hold_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    for (yaml, says) in [
        (
            "fleet_budget: { max_mutations: 3, per: 0s }\n",
            "fleet_budget.per must be longer than zero",
        ),
        (
            "fleet_budget: { max_mutations: 3, per: 40d }\n",
            "fleet_budget.per must be at most 31d",
        ),
        (
            "fleet_budget: { max_mutations: 200000, per: 1h }\n",
            "fleet_budget.max_mutations must be at most 100000",
        ),
        (
            "fleet_budget: { max_mutation: 3, per: 1h }\n",
            "max_mutation",
        ),
        ("fleet_budget: { per: 1h }\n", "max_mutations"),
    ] {
        std::fs::write(dir.path().join("runwarden.yaml"), yaml).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {stderr}");
        assert!(stderr.contains("runwarden.yaml:1:"), "{yaml}: {stderr}");
        assert!(stderr.contains(says), "{yaml}: {stderr}");
    }
    std::fs::write(
        dir.path().join("runwarden.yaml"),
        "fleet_budget: { max_mutations: 20, per: 1h }\n",
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("fleet budget: 20 tier-2 calls per 1h across every run"),
        "{said}"
    );
    let out = runwarden(&["check", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["fleet_budget"],
        serde_json::json!({ "max_mutations": 20, "per_seconds": 3600 })
    );
}

#[test]
fn shared_state_that_cannot_work_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    for (yaml, at, says) in [
        (
            "state:\n  postgres:\n    url_file: pg-url\n    lease: 1s\n",
            "runwarden.yaml:4:",
            "state.postgres.lease must be between 3s and 10m",
        ),
        (
            "state:\n  postgres:\n    url_file: pg-url\n    lease: 1h\n",
            "runwarden.yaml:4:",
            "state.postgres.lease must be between 3s and 10m",
        ),
        (
            "state:\n  postgres:\n    lease: 15s\n",
            "runwarden.yaml:",
            "url_file",
        ),
        ("state:\n  postgre: {}\n", "runwarden.yaml:2:", "postgre"),
        ("replica: Web_A\n", "runwarden.yaml:1:", "replica \"Web_A\""),
    ] {
        std::fs::write(dir.path().join("runwarden.yaml"), yaml).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {stderr}");
        assert!(
            stderr.contains(at) && stderr.contains(says),
            "{yaml}: {stderr}"
        );
    }
    // A good one: shown by check; db status names what is missing.
    std::fs::write(
        dir.path().join("runwarden.yaml"),
        "state:\n  postgres:\n    url_file: pg-url\nreplica: web-a\n",
    )
    .unwrap();
    let out = runwarden(&["check", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"]["store"], "postgres", "{v:#}");
    assert_eq!(v["state"]["replica"], "web-a");
    assert_eq!(v["state"]["lease_seconds"], 15.0);
    let out = runwarden(&["db", "status", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("pg-url") && stderr.contains("mode 0600"),
        "{stderr}"
    );
    // Without `state:` there is no database to migrate, and it says so.
    std::fs::write(dir.path().join("runwarden.yaml"), "").unwrap();
    let out = runwarden(&["db", "migrate", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sets no `state: postgres:`"), "{stderr}");
}

/// A runbook's guardrails are in `check`'s line for it: its `max_runs` and
/// an `on_resolved` that keeps requests waiting; a bad `on_resolved` is
/// refused at its line.
#[test]
fn check_shows_a_runbooks_cap_and_what_a_resolved_alert_does() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let rb = dir.path().join("runbooks/disk.yaml");
    let text = std::fs::read_to_string(&rb).unwrap();
    std::fs::write(
        &rb,
        format!("{text}max_runs: {{ count: 3, per: 6h }}\non_resolved: ignore\n"),
    )
    .unwrap();
    let out = runwarden_ok(&[
        "check".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    let line = out
        .lines()
        .find(|l| l.starts_with("runbook disk"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("max_runs=3/6h"), "{line}");
    assert!(line.contains("on_resolved=ignore"), "{line}");
    std::fs::write(&rb, format!("{text}on_resolved: withdraw\n")).unwrap();
    let bad = runwarden(&[
        "check".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
    ]);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{said}");
    assert!(
        said.contains("disk.yaml:") && said.contains("on_resolved \"withdraw\" is not one of"),
        "{said}"
    );
}

/// A key written twice in one mapping is named with both lines, in
/// runwarden's words, not the YAML crate's advice about its own options;
/// in settings, a host, a runbook, and nested.
#[test]
fn a_key_written_twice_is_named_with_both_lines() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let settings = std::fs::read_to_string(dir.path().join("runwarden.yaml")).unwrap();
    let runbook = std::fs::read_to_string(dir.path().join("runbooks/disk.yaml")).unwrap();
    for (file, text, says) in [
        (
            "runwarden.yaml",
            format!("{settings}audit_head: none\n"),
            "runwarden.yaml:4:1: duplicate key audit_head (first at line 3)",
        ),
        (
            "hosts/web-01.yaml",
            "name: web-01\nconnection: local\nname: web-02\n".to_string(),
            "web-01.yaml:3:1: duplicate key name (first at line 1)",
        ),
        (
            "runbooks/disk.yaml",
            runbook.replace(
                "  observe: [disk_usage]\n",
                "  observe: [disk_usage]\n  observe: [disk_usage]\n",
            ),
            "disk.yaml:11:3: duplicate key observe (first at line 10)",
        ),
    ] {
        let before = std::fs::read_to_string(dir.path().join(file)).unwrap();
        std::fs::write(dir.path().join(file), &text).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(stderr.contains(says), "{file}: {stderr}");
        assert!(!stderr.contains("DuplicateKeyPolicy"), "{file}: {stderr}");
        std::fs::write(dir.path().join(file), before).unwrap();
    }
}

/// A `model:` section in runwarden.yaml never turns a runbook with steps
/// over to a model: it runs its steps (no request reaches the endpoint)
/// until the runbook says `planner: model`; `check` shows each planner.
#[test]
fn a_configured_model_plans_only_the_runbooks_that_say_so() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    // An endpoint that would answer nothing: a run that asked it would end broken.
    let settings = std::fs::read_to_string(dir.path().join("runwarden.yaml")).unwrap();
    std::fs::write(
        dir.path().join("runwarden.yaml"),
        format!("{settings}model:\n  endpoint: http://127.0.0.1:9/v1\n  name: m\n  retries: 0\n"),
    )
    .unwrap();
    let runbook = dir.path().join("runbooks/disk.yaml");
    let steps = std::fs::read_to_string(&runbook).unwrap();
    std::fs::write(
        &runbook,
        format!("{steps}agent:\n  goal: Measure the data directory.\n"),
    )
    .unwrap();
    let (code, report) = run_json_on(dir.path(), "disk", "web-01");
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["planner"], "steps", "{report:#}");
    let check = runwarden(&["check", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["runbooks"][0]["planner"], "steps", "{v}");
    // Said so: the model plans (and, unreachable, the run is broken).
    std::fs::write(
        &runbook,
        format!("{steps}planner: model\nagent:\n  goal: Measure the data directory.\n"),
    )
    .unwrap();
    let check = runwarden(&["check", "--json", "--config", cfg]);
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["runbooks"][0]["planner"], "model", "{v}");
    let (code, report) = run_json_on(dir.path(), "disk", "web-01");
    assert_eq!(code, Some(6), "{report:#}");
    assert_eq!(report["planner"], "model", "{report:#}");
    // What cannot work is refused where it is written.
    for (text, says) in [
        (format!("{steps}planner: model\n"), "no `agent:` goal"),
        (
            format!("{steps}planner: modle\nagent:\n  goal: g\n"),
            "is not `steps`, `model` or `mcp`",
        ),
        (
            format!("{steps}agent:\n  goal: g\n  after_steps: true\n"),
            "say `planner: model`",
        ),
    ] {
        std::fs::write(&runbook, text).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("disk.yaml:") && stderr.contains(says),
            "{says}: {stderr}"
        );
    }
}

/// A runbook an outside agent plans over MCP (`planner: mcp`) needs no
/// steps and no model; only an agent's session starts it, so steps, a
/// schedule or an alert that would start it are refused where written, and
/// `runwarden run` says how to connect one.
#[test]
fn a_runbook_an_agent_plans_has_no_steps_and_only_a_session_starts_it() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let runbook = dir.path().join("runbooks/agent.yaml");
    let scope = "name: agent\ndescription: d\nhosts: [web-01]\nautonomy: L3\ntools: { observe: [disk_usage] }\nplanner: mcp\n";
    std::fs::write(&runbook, scope).unwrap();
    let check = runwarden(&["check", "--json", "--config", cfg]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let v: Value = serde_json::from_slice(&check.stdout).unwrap();
    let agent = v["runbooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "agent")
        .unwrap();
    assert_eq!(agent["planner"], "mcp", "{v}");
    let out = runwarden(&["run", "agent", "--host", "web-01", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("runwarden mcp agent --host web-01"),
        "{stderr}"
    );
    for (more, says) in [
        (
            "steps:\n  - call: disk_usage\n    args: { path: / }\n",
            "they would never run",
        ),
        ("schedule: \"@daily\"\n", "has `schedule:`"),
        (
            "on_alert:\n  matchers: ['alertname=\"X\"']\n  host_label: instance\n",
            "has `on_alert:`",
        ),
    ] {
        std::fs::write(&runbook, format!("{scope}{more}")).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("agent.yaml:") && stderr.contains(says),
            "{says}: {stderr}"
        );
    }
}

/// Without a system journal, the default sends no audit heads (none can
/// fail, so the shipped head alert stays quiet) and says nothing; an
/// explicit `audit_head: journal` there is a warning that says what to change.
#[test]
fn audit_heads_default_to_the_journal_only_where_there_is_one() {
    let journal = Path::new("/run/systemd/journal/socket").exists();
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let settings = std::fs::read_to_string(dir.path().join("runwarden.yaml")).unwrap();
    for (yaml, warns) in [
        (settings.replace("audit_head: none\n", ""), false),
        (
            settings.replace("audit_head: none\n", "audit_head: journal\n"),
            !journal,
        ),
    ] {
        std::fs::write(dir.path().join("runwarden.yaml"), &yaml).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert_eq!(
            stderr.contains("no system journal"),
            warns,
            "{yaml}: {stderr}"
        );
        if warns {
            assert!(stderr.contains("audit_head: none"), "{stderr}");
        }
    }
}

/// Every literal argument of every step is checked against every host the
/// runbook names, with the step's place: a path outside a host's `paths`
/// fails `check` (exit 2), not the run the gate denies; a templated
/// argument is known only at run time.
#[test]
fn check_tests_each_literal_argument_against_each_host() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let runbook = dir.path().join("runbooks/disk.yaml");
    let text = std::fs::read_to_string(&runbook).unwrap();
    let data = dir.path().join("data").display().to_string();
    let out = runwarden(&["check", "--config", cfg]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("would be denied"));
    std::fs::write(
        &runbook,
        text.replace(&format!("path: {data}"), "path: /etc"),
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a problem: {stderr}");
    assert!(
        stderr.contains("the gate would deny on every run"),
        "{stderr}"
    );
    for host in ["web-01", "web-02"] {
        assert!(
            stderr.contains(&format!(
                "disk.yaml:12:5: step data (disk_usage) would be denied on host \"{host}\""
            )),
            "{host}: {stderr}"
        );
    }
    let json = runwarden(&["check", "--json", "--config", cfg]);
    assert_eq!(json.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v:#}");
    assert_eq!(v["problems"].as_array().unwrap().len(), 2, "{v:#}");
    assert_eq!(
        (
            v["problems"][0]["line"].as_u64(),
            v["problems"][0]["column"].as_u64()
        ),
        (Some(12), Some(5))
    );
    std::fs::write(
        &runbook,
        text.replace(
            &format!("path: {data}"),
            "path: \"{{ alert.labels.mountpoint }}\"",
        ),
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("would be denied"));
}

/// `done_when` that cannot work is refused where it is written: no
/// Prometheus to ask, no alert to start the run, a schedule (whose runs
/// have no alert), a wait as long as the run, a label that is not one.
#[test]
fn a_done_when_that_cannot_work_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let cfg = dir.path().to_str().unwrap();
    let runbook = |extra: &str, done_when: &str| {
        format!(
            "name: queue\ndescription: t\nhosts: [web-01]\nautonomy: L3\n{extra}tools: {{ observe: [disk_usage] }}\nbudget: {{ max_duration: 10m }}\ndone_when:\n  alert_clears: {done_when}\nsteps:\n  - call: disk_usage\n    args: {{ path: {} }}\n",
            dir.path().join("data").display()
        )
    };
    let on_alert = "on_alert: { matchers: ['alertname=\"Deep\"'], host_label: instance }\n";
    let settings = "listen: 127.0.0.1:0\nwebhook_token_file: token\naudit_head: none\n";
    let with_prometheus = format!("{settings}prometheus: {{ url: 'http://127.0.0.1:9' }}\n");
    for (yaml, runbook_yaml, line, says) in [
        (
            settings.to_string(),
            runbook(on_alert, "{ within: 5m }"),
            "queue.yaml:9:",
            "needs `prometheus:",
        ),
        (
            with_prometheus.clone(),
            runbook("", "{ within: 5m }"),
            "queue.yaml:8:",
            "needs on_alert",
        ),
        (
            with_prometheus.clone(),
            runbook(
                &format!("{on_alert}schedule: '0 3 * * *'\n"),
                "{ within: 5m }",
            ),
            "queue.yaml:6:",
            "has no schedule",
        ),
        (
            with_prometheus.clone(),
            runbook(on_alert, "{ within: 10m }"),
            "queue.yaml:9:",
            "not shorter than budget.max_duration 10m",
        ),
        (
            with_prometheus.clone(),
            runbook(on_alert, "{ within: 5m, ignore_labels: [alertname] }"),
            "queue.yaml:9:",
            "not a label a fix can change",
        ),
        (
            format!("{settings}prometheus: {{ url: 'ftp://x' }}\n"),
            runbook(on_alert, "{ within: 5m }"),
            "runwarden.yaml:4:",
            "is not an http(s) URL",
        ),
    ] {
        std::fs::write(dir.path().join("runwarden.yaml"), &yaml).unwrap();
        std::fs::write(dir.path().join("runbooks/queue.yaml"), &runbook_yaml).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{runbook_yaml}: {stderr}");
        assert!(stderr.contains(line), "{line} in {stderr}");
        assert!(stderr.contains(says), "{says} in {stderr}");
    }
    // Right, and with no Prometheus listening: check says so, and passes.
    std::fs::write(dir.path().join("runwarden.yaml"), &with_prometheus).unwrap();
    std::fs::write(
        dir.path().join("runbooks/queue.yaml"),
        runbook(on_alert, "{ within: 5m }"),
    )
    .unwrap();
    let out = runwarden(&["check", "--config", cfg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("could not be reached"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done_when=alert_clears/5m"), "{stdout}");
    assert!(
        stdout.contains("prometheus at http://127.0.0.1:9/"),
        "{stdout}"
    );
}

//! Tools declared in YAML: refused where they are written, listed beside
//! the built-ins, and run through the same gate (scope, allowlists,
//! approval, the audit line naming the declaration), tier 1 unable to write.
//! The application CLI is a script written for these tests that keeps a
//! cache on disk.

use super::*;

/// The application's own CLI: `appctl cache (flush|stats) --app A --dir=D [--keep N]`.
const APPCTL: &str = r#"#!/bin/sh
set -eu
cmd=$1 sub=$2; shift 2
app= dir= keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --app) app=$2; shift 2;;
    --dir=*) dir=${1#--dir=}; shift;;
    --keep) keep=$2; shift 2;;
    *) echo "appctl: unknown option $1" >&2; exit 2;;
  esac
done
[ "$cmd" = cache ] || exit 2
d=$dir/$app
case $sub in
  flush) ls -1t "$d" | tail -n +$((keep+1)) | while read -r f; do rm -f "$d/$f"; done; echo "flushed $app";;
  break) echo "entries: 999";;
  stats) [ -e "$d/.broken" ] && { echo "entries: 999"; exit 0; }; echo "entries: $(ls -1 "$d" | wc -l)";;
  *) exit 2;;
esac
"#;

/// A config with host `me` (paths: `data/`, `allow: { apps: [shop] }`), the
/// application's CLI in `bin/`, five cache entries, and the tools and
/// runbook given.
fn estate(tools: &[(&str, String)], runbook: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in [
        "hosts",
        "runbooks",
        "tools",
        "kill-switch",
        "bin",
        "data/cache/shop",
    ] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("runwarden.yaml"), "audit_head: none\n").unwrap();
    std::fs::write(
        d.join("hosts/me.yaml"),
        format!(
            "name: me\nconnection: local\npaths: [{}]\nallow: {{ apps: [shop] }}\n",
            d.join("data").display()
        ),
    )
    .unwrap();
    let appctl = d.join("bin/appctl");
    std::fs::write(&appctl, APPCTL).unwrap();
    std::fs::set_permissions(&appctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    for i in 1..=5 {
        std::fs::write(d.join(format!("data/cache/shop/e{i}")), "x").unwrap();
    }
    for (name, yaml) in tools {
        std::fs::write(
            d.join(format!("tools/{name}.yaml")),
            yaml.replace("BIN", &d.join("bin").display().to_string()),
        )
        .unwrap();
    }
    std::fs::write(
        d.join("runbooks/rb.yaml"),
        runbook.replace("DATA", &d.join("data").display().to_string()),
    )
    .unwrap();
    dir
}

/// The flush tool, as `tools/app_cache_flush.yaml` ships it, on `bin/appctl`.
fn flush_tool(verify_sub: &str, undo: bool) -> String {
    let mut t = format!(
        "name: app_cache_flush\ntier: 2\ndescription: Flush the cache.\nverb: flushed\nargs:\n  app: {{ type: allowlist, list: apps }}\n  dir: {{ type: path }}\n  keep: {{ type: integer, min: 0, max: 100 }}\n\
         run: [BIN/appctl, cache, flush, --app, \"{{{{ app }}}}\", \"--dir={{{{ dir }}}}\", --keep, \"{{{{ keep }}}}\"]\n\
         verify:\n  run: [BIN/appctl, cache, {verify_sub}, --app, \"{{{{ app }}}}\", \"--dir={{{{ dir }}}}\"]\n  expect_stdout: '^entries: {{{{ keep }}}}$'\n  within: 500ms\n"
    );
    if undo {
        t +=
            "undo:\n  run: [BIN/appctl, cache, stats, --app, \"{{ app }}\", \"--dir={{ dir }}\"]\n";
    }
    t
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("data/cache/shop"))
        .unwrap()
        .filter(|e| {
            !e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count()
}

/// `check` of a config whose one tool file `t` is `yaml` (and no runbook):
/// exit 2, saying `says` at `at`.
fn refused(yaml: &str, at: &str, says: &str) {
    let dir = estate(&[("t", yaml.to_string())], "");
    std::fs::remove_file(dir.path().join("runbooks/rb.yaml")).unwrap();
    let out = runwarden(&["check", "--config", dir.path().to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{yaml}\n{said}");
    assert!(said.contains(at), "{yaml}\n{said}");
    assert!(said.contains(says), "{yaml}\n{said}");
}

/// Every mistake of a declaration is `tools/FILE.yaml:LINE:COL: message`
/// (with a did-you-mean where one fits), exit 2, and nothing is loaded; a
/// runbook naming a tool no file declares keeps its own error.
#[test]
fn a_declaration_that_cannot_work_is_refused_where_it_is_written() {
    let ok = "name: t\ntier: 1\ndescription: d\nargs:\n  dir: { type: path }\nrun: [/usr/bin/ls, \"{{ dir }}\"]\n";
    for (yaml, at, says) in [
        (
            ok.replace("run:", "runn:"),
            "t.yaml:6:",
            "unknown field `runn` (did you mean \"run\"?)",
        ),
        (
            ok.replace("/usr/bin/ls", "ls"),
            "t.yaml:6:",
            "must be an absolute path",
        ),
        // The absolute path the system has it at, suggested.
        (
            ok.replace("/usr/bin/ls", "ls"),
            "t.yaml:6:",
            "written out (never a template, never found on PATH): write /usr/bin/ls",
        ),
        (
            ok.replace("/usr/bin/ls", "no-such-program-here"),
            "t.yaml:6:",
            "never found on PATH)\n",
        ),
        (
            ok.replace("{{ dir }}", "{{ dri }}"),
            "t.yaml:6:",
            "names no declared argument (did you mean \"dir\"?)",
        ),
        (
            ok.replace("{{ dir }}", "{{ dir | upper }}"),
            "t.yaml:6:",
            "is not a declared argument's name",
        ),
        (
            ok.replace("tier: 1", "tier: 2"),
            "t.yaml:2:",
            "needs `verify:`",
        ),
        (ok.replace("tier: 1", "tier: 3"), "t.yaml:2:", "tier 3"),
        (
            ok.replace("name: t", "name: disk_usage"),
            "t.yaml:1:",
            "is a built-in tool's name",
        ),
        (
            ok.replace("type: path", "type: pth"),
            "t.yaml:5:",
            "(did you mean \"path\"?)",
        ),
        (
            ok.replace("{ type: path }", "{ type: string, allow: [leading_dahs] }"),
            "t.yaml:5:",
            "(did you mean \"leading_dash\"?)",
        ),
        (
            ok.replace("[/usr/bin/ls,", "[/usr/bin/socat, -,"),
            "t.yaml:6:",
            "quote it",
        ),
    ] {
        refused(&yaml, &format!("tools/{at}"), says);
    }
    // A runbook naming a tool no file declares: the runbook's own error.
    let dir = estate(
        &[],
        "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [list_cach] }\n",
    );
    let out = runwarden(&["check", "--config", dir.path().to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("rb.yaml:5:") && said.contains("unknown tool \"list_cach\""),
        "{said}"
    );
}

/// `capture:` and the comparisons of `verify:` that cannot work are
/// refused where they are written.
#[test]
fn a_capture_that_cannot_work_is_refused_where_it_is_written() {
    let base = "name: t\ntier: 2\ndescription: d\nargs:\n  dir: { type: path }\nrun: [/usr/bin/touch, \"{{ dir }}\"]\nverify:\n  run: [/usr/bin/ls, \"{{ dir }}\"]\n";
    let capture = "capture:\n  run: [/usr/bin/pgrep, -o, sleep]\n  values: '^(?P<pid>\\d+)$'\n";
    for (yaml, says) in [
        (format!("{base}  expect_changed: pid\n"), "add `capture:`"),
        (
            format!("{base}  expect_changed: pids\n{capture}"),
            "pids is not a value of capture (its pattern's named groups: pid)",
        ),
        (
            format!("{base}  expect_stdout: 'x {{{{ before.ppid }}}}'\n{capture}"),
            "ppid is not a value of capture",
        ),
        (
            format!("{base}capture:\n  run: [/usr/bin/pgrep, -o, sleep]\n  values: '\\d+'\n"),
            "names each value it reads as a group",
        ),
        (
            format!(
                "{}{capture}",
                base.replace("\"{{ dir }}\"]\nverify", "\"{{ before.pid }}\"]\nverify")
            ),
            "is verify's",
        ),
        (
            format!("name: t\ntier: 1\ndescription: d\nrun: [/usr/bin/ls]\n{capture}"),
            "`capture:` is for tier-2 tools",
        ),
    ] {
        refused(&yaml, "tools/t.yaml:", says);
    }
    let ok =
        format!("{base}  expect_changed: pid\n  expect_stdout: '{{{{ before.pid }}}}'\n{capture}");
    let dir = estate(&[("t", ok)], "");
    std::fs::remove_file(dir.path().join("runbooks/rb.yaml")).unwrap();
    let out = runwarden(&["check", "--config", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One broken tool file is one error, its own: a runbook that lists and
/// calls the tool gets no "unknown tool" besides (whether the file does
/// not parse or does not validate).
#[test]
fn a_broken_tool_file_is_said_once_without_a_cascade_into_its_runbooks() {
    let ok = "name: look\ntier: 1\ndescription: d\nargs:\n  dir: { type: path }\nrun: [/usr/bin/ls, \"{{ dir }}\"]\n";
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [look] }\nsteps:\n  - call: look\n    args: { dir: /tmp }\n";
    for (broken, says) in [
        (ok.replace("/usr/bin/ls", "ls"), "write /usr/bin/ls"),
        (ok.replace("args:", "args: [oops"), "look.yaml:"),
    ] {
        let dir = estate(&[("look", broken.clone())], runbook);
        let out = runwarden(&["check", "--config", dir.path().to_str().unwrap()]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(said.contains(says), "{said}");
        assert!(!said.contains("unknown tool"), "no cascade: {said}");
        assert!(
            !said.contains("rb.yaml"),
            "the runbook is not at fault: {said}"
        );
    }
}

/// A declared tier-1 tool's output is in the report and the transcript:
/// its first 20 lines, and where the rest is.
#[test]
fn a_declared_tools_output_is_shown_bounded_in_the_report_and_the_transcript() {
    let tool = "name: count\ntier: 1\ndescription: Count to n.\nargs:\n  n: { type: integer, min: 1, max: 100 }\nrun: [/usr/bin/seq, \"{{ n }}\"]\n".to_string();
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [count] }\nsteps:\n  - id: look\n    call: count\n    args: { n: 30 }\n";
    let dir = estate(&[("count", tool)], runbook);
    let cfg = dir.path().to_str().unwrap();
    let out = runwarden(&["run", "rb", "--host", "me", "--config", cfg]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    for text in [report.to_string(), {
        let run_id = report.split_whitespace().nth(1).unwrap().to_string();
        let t = runwarden(&["transcript", &run_id, "--config", cfg]);
        String::from_utf8_lossy(&t.stdout).into_owned()
    }] {
        assert!(text.contains("output (20 of 30 lines;"), "{text}");
        assert!(text.contains("| 1\n") && text.contains("| 20\n"), "{text}");
        assert!(!text.contains("| 21\n"), "{text}");
    }
}

/// `output: json`: the tool's stdout, parsed, is its result's `output`,
/// with a step's later templates and `when` able to read it.
#[test]
fn a_json_tools_output_is_parsed_into_its_result() {
    let tool = "name: lag\ntier: 1\ndescription: Replication lag as JSON.\nrun: [/usr/bin/printf, '{\"lag\": {\"seconds\": 7}, \"ok\": [1, 2]}']\noutput: json\n".to_string();
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [lag] }\nsteps:\n  - id: look\n    call: lag\n";
    let dir = estate(&[("lag", tool)], runbook);
    let cfg = dir.path().to_str().unwrap();
    let out = runwarden(&["run", "rb", "--host", "me", "--json", "--config", cfg]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let output = &report["steps"][0]["result"]["data"]["output"];
    assert_eq!(output["lag"]["seconds"], 7, "{report:#}");
    assert_eq!(output["ok"], serde_json::json!([1, 2]), "{report:#}");
}

/// `tools --json --host H` gives each schema as a model and an agent get it
/// on that host: an allowlist argument lists the host's values, a path the
/// directories it must be under; without `--host`, the schemas say neither.
#[test]
fn tools_for_a_host_list_the_values_its_allowlists_allow() {
    let pick = "name: pick\ntier: 1\ndescription: d\nargs:\n  app: { type: allowlist, list: apps }\n  dir: { type: path }\nrun: [/usr/bin/ls, \"{{ dir }}\"]\n".to_string();
    let dir = estate(&[("pick", pick)], "");
    let cfg = dir.path().to_str().unwrap();
    let listed = |extra: &[&str]| -> Vec<Value> {
        let mut args = vec!["tools", "--json", "--config", cfg];
        args.extend_from_slice(extra);
        let out = runwarden(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let find = |tools: &[Value], name: &str| -> Value {
        tools.iter().find(|t| t["name"] == name).unwrap()["parameters"].clone()
    };
    let on_me = listed(&["--host", "me"]);
    let pick = find(&on_me, "pick");
    assert_eq!(
        pick["properties"]["app"]["enum"],
        serde_json::json!(["shop"]),
        "{pick:#}"
    );
    let data = dir.path().join("data").display().to_string();
    let under = pick["properties"]["dir"]["description"].as_str().unwrap();
    assert!(under.contains(&format!("under {data}")), "{under}");
    let disk = find(&on_me, "disk_usage");
    let under = disk["properties"]["path"]["description"].as_str().unwrap();
    assert!(under.contains(&format!("under {data}")), "{under}");
    // The host allows no unit: the schema says so, and a caller cannot guess one.
    let status = find(&on_me, "service_status");
    assert_eq!(
        status["properties"]["unit"]["enum"],
        serde_json::json!([]),
        "{status:#}"
    );
    let anywhere = listed(&[]);
    assert!(
        find(&anywhere, "pick")["properties"]["app"]
            .get("enum")
            .is_none()
    );
    let out = runwarden(&["tools", "--json", "--host", "nope", "--config", cfg]);
    assert_eq!(out.status.code(), Some(2));
}

/// One tool file, hosts that differ: `{{ host.NAME }}` takes each host's
/// own `vars:` value; a host of the runbook without it fails `check` at
/// its own file; a var of the wrong shape is refused where it is written;
/// `install print` writes the vars into the agent's policy.
#[test]
fn a_tool_file_takes_each_hosts_own_vars() {
    let tool = "name: greet\ntier: 1\ndescription: d\nargs:\n  n: { type: integer, min: 1, max: 5 }\nrun: [/usr/bin/echo, \"{{ host.greeting }}\", \"{{ n }}\"]\n".to_string();
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [greet] }\nsteps:\n  - id: hi\n    call: greet\n    args: { n: 2 }\n";
    let dir = estate(&[("greet", tool)], runbook);
    let cfg = dir.path().to_str().unwrap();
    let host_file = dir.path().join("hosts/me.yaml");
    let plain = std::fs::read_to_string(&host_file).unwrap();
    // No vars.greeting: the host file is told what to add.
    let out = runwarden(&["check", "--config", cfg]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(
            "me.yaml:1:1: no vars.greeting: tool greet (of runbook rb) uses {{ host.greeting }}"
        ),
        "{said}"
    );
    for (vars, says) in [
        ("vars: { greeting: { string: -rf } }", "not start with `-`"),
        ("vars: { greeting: { path: rel/x } }", "must be absolute"),
        (
            "vars: { greeting: { string: a, integer: 1 } }",
            "exactly one of",
        ),
        ("vars: { Greeting: { string: a } }", "a var's name is"),
    ] {
        std::fs::write(&host_file, format!("{plain}{vars}\n")).unwrap();
        let out = runwarden(&["check", "--config", cfg]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{vars}: {said}");
        assert!(
            said.contains("me.yaml:") && said.contains(says),
            "{vars}: {said}"
        );
    }
    std::fs::write(
        &host_file,
        format!("{plain}vars: {{ greeting: {{ string: hello-me }} }}\n"),
    )
    .unwrap();
    let out = runwarden(&["run", "rb", "--host", "me", "--json", "--config", cfg]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "ok", "{report:#}");
    let stdout = report["steps"][0]["result"]["data"]["stdout"]
        .as_str()
        .unwrap();
    assert_eq!(stdout.trim(), "hello-me 2", "{report:#}");
    let policy = runwarden(&["install", "print", "--host", "me", "--config", cfg]);
    let printed = String::from_utf8_lossy(&policy.stdout);
    assert!(
        printed.contains("vars:\n  greeting: { string: \"hello-me\" }\n"),
        "{printed}"
    );
}

/// A host var that goes into a tool's stdin holds no `;` (a newline is
/// refused for every var): haproxy, like most admin sockets, reads a second
/// command after either. `check` says so at the host's file; the same
/// value in an argv is a plain word; and a run on a file edited past
/// `check` refuses the call rather than send it.
#[test]
fn a_host_var_in_stdin_is_never_a_second_command() {
    let tool = "name: say\ntier: 1\ndescription: d\nrun: [/usr/bin/cat]\nstdin: \"show {{ host.backend }}\\n\"\n".to_string();
    let argv =
        "name: word\ntier: 1\ndescription: d\nrun: [/usr/bin/echo, \"{{ host.backend }}\"]\n"
            .to_string();
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [say] }\nsteps:\n  - id: hi\n    call: say\n";
    let dir = estate(&[("say", tool), ("word", argv)], runbook);
    let cfg = dir.path().to_str().unwrap();
    let host_file = dir.path().join("hosts/me.yaml");
    let plain = std::fs::read_to_string(&host_file).unwrap();
    let with = |v: &str| {
        std::fs::write(
            &host_file,
            format!("{plain}vars: {{ backend: {{ string: {v:?} }} }}\n"),
        )
        .unwrap();
    };
    for bad in ["web; shutdown sessions", ";", "a;"] {
        with(bad);
        let out = runwarden(&["check", "--config", cfg]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {said}");
        assert!(
            said.contains("me.yaml") && said.contains("vars.backend") && said.contains("stdin"),
            "{bad}: {said}"
        );
    }
    with("web\nshutdown sessions");
    let out = runwarden(&["check", "--config", cfg]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("control"));
    // In an argv a `;` is only a character: the runbook that uses `word`
    // alone passes.
    let only_argv = runbook
        .replace("observe: [say]", "observe: [word]")
        .replace("call: say", "call: word");
    std::fs::write(dir.path().join("runbooks/rb.yaml"), only_argv).unwrap();
    with("web;x");
    let out = runwarden(&["check", "--config", cfg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(dir.path().join("runbooks/rb.yaml"), runbook).unwrap();
    with("web-01");
    let out = runwarden(&["run", "rb", "--host", "me", "--json", "--config", cfg]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "ok", "{report:#}");
    assert_eq!(
        report["steps"][0]["result"]["data"]["stdout"]
            .as_str()
            .unwrap()
            .trim(),
        "show web-01"
    );
}

/// `runwarden tools` lists the declared tools beside the built-ins, with
/// the file that declares them and the schema made from the declaration.
#[test]
fn tools_lists_declared_tools_with_their_file_and_schema() {
    let dir = estate(&[("app_cache_flush", flush_tool("stats", false))], "");
    let out = runwarden(&["tools", "--json", "--config", dir.path().to_str().unwrap()]);
    let tools: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let flush = tools
        .iter()
        .find(|t| t["name"] == "app_cache_flush")
        .expect("listed");
    assert_eq!(flush["source"], "declared");
    assert_eq!(flush["tier"], 2);
    assert_eq!(flush["verb"], "flushed");
    assert!(
        flush["file"]
            .as_str()
            .unwrap()
            .ends_with("tools/app_cache_flush.yaml")
    );
    let schema = &flush["parameters"];
    assert_eq!(schema["properties"]["keep"]["maximum"], 100, "{schema:#}");
    assert_eq!(
        schema["required"],
        serde_json::json!(["app", "dir", "keep", "reason"])
    );
    assert_eq!(schema["additionalProperties"], false);
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == "disk_usage" && t["source"] == "builtin")
    );
}

/// A tier-2 declared tool runs with the runbook's standing approval,
/// verifies itself, and its audit line names the declaration's sha256; a
/// value outside the host's list, a smuggled flag and a path escape by
/// concatenation are refused by the gate and nothing runs.
#[test]
fn a_declared_change_runs_under_the_gate_and_refusals_run_nothing() {
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { approve: [app_cache_flush] }\n\
        steps:\n  - call: app_cache_flush\n    args: { app: shop, dir: DATA/cache, keep: 2 }\n    reason: stale entries\n";
    let dir = estate(&[("app_cache_flush", flush_tool("stats", false))], runbook);
    let (code, report) = run_json_on(dir.path(), "rb", "me");
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["steps"][0]["result"]["verified"], true, "{report:#}");
    assert_eq!(entries(dir.path()), 2);
    let sha = {
        use sha2::Digest;
        let bytes = std::fs::read(dir.path().join("tools/app_cache_flush.yaml")).unwrap();
        format!("{:x}", sha2::Sha256::digest(bytes))
    };
    let audit = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    let intent: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["phase"] == "intent")
        .unwrap();
    assert_eq!(intent["declaration"], sha.as_str(), "{intent:#}");
    assert_eq!(intent["tier"], 2);

    // Refusals: each a denied step, nothing run, the cache as it was.
    for (args, says) in [
        (
            "{ app: admin, dir: DATA/cache, keep: 0 }",
            "is not allowed on host",
        ),
        (
            "{ app: shop, dir: DATA/cache, keep: \"-1\" }",
            "starts with '-'",
        ),
        (
            "{ app: \"--help\", dir: DATA/cache, keep: 0 }",
            "starts with '-'",
        ),
        ("{ app: shop, dir: DATA/../.., keep: 0 }", "'..'"),
        (
            "{ app: shop, dir: /etc, keep: 0 }",
            "is not allowed by the host's paths",
        ),
        (
            "{ app: shop, dir: DATA/cache, keep: 0, extra: x }",
            "unknown field `extra`",
        ),
    ] {
        let rb = runbook.replace("{ app: shop, dir: DATA/cache, keep: 2 }", args);
        std::fs::write(
            dir.path().join("runbooks/rb.yaml"),
            rb.replace("DATA", &dir.path().join("data").display().to_string()),
        )
        .unwrap();
        let out = runwarden(&[
            "run",
            "rb",
            "--host",
            "me",
            "--json",
            "--config",
            dir.path().to_str().unwrap(),
        ]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_ne!(out.status.code(), Some(0), "{args}: {said}");
        assert!(said.contains(says), "{args}: {said}");
        assert_eq!(entries(dir.path()), 2, "{args}: nothing ran");
    }
}

/// An element that puts a path together with other text is resolved again
/// as a whole: `{{ dir }}/../x` is refused even where `dir` alone is
/// allowed, and a file to be made under an allowed path is allowed.
#[test]
fn a_path_put_together_with_other_text_is_resolved_again() {
    let tool = |suffix: &str| {
        format!(
            "name: peek\ntier: 1\ndescription: d\nargs:\n  dir: {{ type: path }}\nrun: [/usr/bin/ls, \"{{{{ dir }}}}{suffix}\"]\n"
        )
    };
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { observe: [peek] }\n\
        steps:\n  - call: peek\n    args: { dir: DATA/cache }\n";
    let dir = estate(&[("peek", tool("/../../../../../etc"))], runbook);
    let (code, report) = run_json_on(dir.path(), "rb", "me");
    assert_eq!(code, Some(3), "{report:#}");
    assert!(
        report["steps"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("puts a path together with other text"),
        "{report:#}"
    );
    let dir = estate(&[("peek", tool("/shop"))], runbook);
    let (code, report) = run_json_on(dir.path(), "rb", "me");
    assert_eq!(code, Some(0), "{report:#}");
    assert!(
        report["steps"][0]["result"]["data"]["stdout"]
            .as_str()
            .unwrap()
            .contains("e1")
    );
}

/// A tier-1 declared tool whose argv writes fails with EACCES and the file
/// is not there (Landlock), though its argv is within every allowlist; the
/// same command declared tier 2 makes it.
#[test]
fn a_tier_one_declared_tool_that_writes_cannot() {
    assert!(
        runwarden::sandbox::status().enforced(),
        "this kernel enforces Landlock"
    );
    let tool = |tier: u8| {
        let mut t = format!(
            "name: plant\ntier: {tier}\ndescription: d\nargs:\n  dir: {{ type: path }}\nrun: [/usr/bin/touch, \"{{{{ dir }}}}/planted\"]\n"
        );
        if tier == 2 {
            t += "verify:\n  run: [/usr/bin/ls, \"{{ dir }}/planted\"]\n";
        }
        t
    };
    let runbook = |list: &str, reason: &str| {
        format!(
            "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: {{ {list}: [plant] }}\n\
             steps:\n  - call: plant\n    args: {{ dir: DATA/cache }}\n{reason}"
        )
    };
    let dir = estate(&[("plant", tool(1))], &runbook("observe", ""));
    let (code, report) = run_json_on(dir.path(), "rb", "me");
    assert_eq!(code, Some(1), "{report:#}");
    let error = report["steps"][0]["result"]["error"].as_str().unwrap();
    assert!(error.contains("Permission denied"), "{report:#}");
    assert!(!dir.path().join("data/cache/planted").exists());

    let dir = estate(
        &[("plant", tool(2))],
        &runbook("approve", "    reason: r\n"),
    );
    let (code, report) = run_json_on(dir.path(), "rb", "me");
    assert_eq!(code, Some(0), "{report:#}");
    assert!(dir.path().join("data/cache/planted").exists());
}

/// A change whose probe does not show it took is not verified, its undo
/// runs, and the report says so; the run fails.
#[test]
fn a_change_that_does_not_verify_is_undone_and_fails() {
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { approve: [app_cache_flush] }\n\
        steps:\n  - call: app_cache_flush\n    args: { app: shop, dir: DATA/cache, keep: 2 }\n    reason: stale entries\n";
    let dir = estate(&[("app_cache_flush", flush_tool("break", true))], runbook);
    let (code, report) = run_json_on(dir.path(), "rb", "me");
    assert_eq!(code, Some(1), "{report:#}");
    let result = &report["steps"][0]["result"];
    assert_eq!(result["verified"], false, "{report:#}");
    assert_eq!(result["data"]["undo"]["ok"], true, "{report:#}");
    assert!(
        result["data"]["evidence"]
            .as_str()
            .unwrap()
            .contains("verify failed"),
        "{report:#}"
    );
}

/// Through the host's agent a declared change runs only as the host's own
/// copy of its declaration says, and only when that is the declaration the
/// runner checked it against: `install print` gives the host the very
/// file, the signed permit names its sha256, and a host whose copy differs
/// refuses, naming both hashes, with nothing run.
#[test]
fn the_hosts_agent_runs_a_declared_tool_only_from_the_same_declaration() {
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\ntools: { approve: [app_cache_flush] }\n\
        steps:\n  - call: app_cache_flush\n    args: { app: shop, dir: DATA/cache, keep: 2 }\n    reason: stale entries\n";
    let dir = estate(&[("app_cache_flush", flush_tool("stats", false))], runbook);
    let d = dir.path();
    let socket = d.join("agent.sock");
    let host = std::fs::read_to_string(d.join("hosts/me.yaml"))
        .unwrap()
        .replace(
            "connection: local",
            &format!("connection:\n  agent: {}", socket.display()),
        );
    std::fs::write(d.join("hosts/me.yaml"), host).unwrap();
    let printed = install_print(d);
    // The host's files, as install print gives them.
    let side = d.join("host-side");
    std::fs::create_dir_all(side.join("tools")).unwrap();
    let section = |name: &str| {
        printed
            .split("### ")
            .find(|s| s.starts_with(name))
            .and_then(|s| s.split_once('\n'))
            .map(|(_, body)| body.to_string())
            .unwrap_or_else(|| panic!("no {name} in {printed}"))
    };
    let policy = section("/etc/runwarden/agent.yaml").replace(
        "jail: /var/lib/runwarden-agent/jail",
        &format!("jail: {}", side.join("jail").display()),
    );
    assert!(policy.contains("allow:\n  apps: [\"shop\"]"), "{policy}");
    std::fs::write(side.join("agent.yaml"), policy).unwrap();
    let file = section("/etc/runwarden/tools/app_cache_flush.yaml");
    assert_eq!(
        file,
        std::fs::read_to_string(d.join("tools/app_cache_flush.yaml")).unwrap(),
        "the very file"
    );
    std::fs::write(side.join("tools/app_cache_flush.yaml"), &file).unwrap();
    agent_listener(
        &socket,
        &side.join("agent.yaml"),
        &side.join("agent-audit.jsonl"),
    );
    let (code, report) = run_json_on(d, "rb", "me");
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(entries(d), 2);

    // The host's copy changes (one comment): refused, both hashes named.
    for i in 1..=5 {
        std::fs::write(d.join(format!("data/cache/shop/n{i}")), "x").unwrap();
    }
    std::fs::write(
        side.join("tools/app_cache_flush.yaml"),
        format!("# edited on the host\n{file}"),
    )
    .unwrap();
    let (code, report) = run_json_on(d, "rb", "me");
    assert_eq!(code, Some(1), "{report:#}");
    let error = report["steps"][0]["result"]["error"].as_str().unwrap();
    let sha = |bytes: &[u8]| {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(bytes))
    };
    let theirs = sha(&std::fs::read(side.join("tools/app_cache_flush.yaml")).unwrap());
    assert!(
        error.contains(&sha(file.as_bytes())) && error.contains(&theirs),
        "{error}"
    );
    assert_eq!(entries(d), 7, "nothing ran");
}

/// For a managed host, `install print`'s sudoers file lists every command a
/// declared change can run as root without a wildcard, each built from the
/// declaration and the host's lists; a tool whose argv takes a free value
/// is not listed and the file says why.
#[test]
fn install_print_lists_a_declared_changes_commands_without_wildcards() {
    let listable = "name: switch_mode\ntier: 2\ndescription: d\nargs:\n  app: { type: allowlist, list: apps }\n  mode: { type: enum, values: [soft, hard] }\n\
        run: [/usr/local/bin/appctl, mode, \"{{ app }}\", \"{{ mode }}\"]\nverify:\n  run: [/usr/local/bin/appctl, show, \"{{ app }}\"]\n";
    let runbook = "name: rb\ndescription: d\nhosts: [me]\nautonomy: L3\nagent: { goal: g }\nplanner: model\ntools: { approve: [switch_mode, app_cache_flush] }\n";
    let dir = estate(
        &[
            ("switch_mode", listable.to_string()),
            ("app_cache_flush", flush_tool("stats", false)),
        ],
        runbook,
    );
    let d = dir.path();
    std::fs::write(
        d.join("runwarden.yaml"),
        "audit_head: none\nmodel: { endpoint: \"http://127.0.0.1:9/v1\", name: m }\n",
    )
    .unwrap();
    let host = std::fs::read_to_string(d.join("hosts/me.yaml")).unwrap().replace(
        "connection: local",
        "connection:\n  ssh: { address: 10.0.0.9, user: runwarden, identity: /nonexistent/id, known_hosts: /nonexistent/kh }\nsudo: true",
    );
    std::fs::write(d.join("hosts/me.yaml"), host).unwrap();
    let printed = install_print(d);
    let sudoers = printed
        .split("### /etc/sudoers.d/runwarden\n")
        .nth(1)
        .unwrap()
        .split("### ")
        .next()
        .unwrap();
    for line in [
        "/usr/local/bin/appctl mode shop soft",
        "/usr/local/bin/appctl mode shop hard",
    ] {
        assert!(sudoers.contains(line), "{sudoers}");
    }
    assert!(!sudoers.contains('*'), "no wildcard: {sudoers}");
    assert!(
        sudoers.contains("app_cache_flush is not listed: its argv takes dir (a path)"),
        "{sudoers}"
    );
}

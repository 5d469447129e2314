//! What the gate costs an agent over MCP.
//!
//! `cargo bench --bench mcp` times one tier-1 `disk_usage` call, round trip
//! from an MCP client, through `runwarden mcp` (a session's run: the gate,
//! the intent line synced before the spawn, the confined processes, the
//! result line) against the same argv through a minimal MCP server built
//! with the same SDK that only spawns it (no gate, no audit). Both servers
//! run at once and are called in turn, call by call, so neighbours in time
//! share the machine. Three runs; each prints p50 and p99 of both and their
//! ratios, and the floor: the same bare server with one synced write per
//! call, as any runner that records a call durably before making it pays.
//! Ratios are the result, never a timed assertion.
//!
//! The bare server is this very program, started again with
//! `RUNWARDEN_BENCH_BARE=ARGV_JSON` (`SYNC=PATH` adds the synced write).

// A measurement harness: a failed setup step should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, ServerConfig, Tool};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

const CALLS: usize = 300;
const RUNS: usize = 3;
const WARM: usize = 10;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Ok(argv) = std::env::var("RUNWARDEN_BENCH_BARE") {
        let argv: Vec<Vec<String>> = serde_json::from_str(&argv).unwrap();
        let sync = std::env::var("SYNC").ok();
        rt.block_on(serve_bare(argv, sync));
        return;
    }
    rt.block_on(bench());
}

/// The baseline: one tool whose call spawns the argv runwarden's call
/// spawned, nothing else.
struct Bare {
    argv: Vec<Vec<String>>,
    sync: Option<std::sync::Mutex<std::fs::File>>,
}

impl ServerHandler for Bare {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            rmcp::model::ServerCapabilities::builder()
                .enable_tools()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, ErrorData> {
        let schema = json!({ "type": "object", "properties": { "path": { "type": "string" } } });
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        Ok(rmcp::model::ListToolsResult::with_all_items(vec![
            Tool::new("disk_usage", "df and du", std::sync::Arc::new(schema)),
        ]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        if let Some(f) = &self.sync {
            use std::io::Write;
            let f = f.lock().unwrap();
            (&*f).write_all(&[b'x'; 1200]).unwrap();
            f.sync_data().unwrap();
        }
        let mut out = String::new();
        for argv in &self.argv {
            let o = tokio::process::Command::new(&argv[0])
                .args(&argv[1..])
                .output()
                .await
                .unwrap();
            assert!(o.status.success(), "{argv:?}: {o:?}");
            out.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(out)]).into())
    }
}

async fn serve_bare(argv: Vec<Vec<String>>, sync: Option<String>) {
    let sync = sync.map(|p| {
        std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap(),
        )
    });
    let service = Bare { argv, sync }
        .serve(rmcp::transport::stdio())
        .await
        .unwrap();
    let _ = service.waiting().await;
}

/// A client of the server `cmd` starts, on its stdin and stdout; the
/// server goes when the client does.
struct Client {
    service: RunningService<RoleClient, ()>,
    server: tokio::process::Child,
}

async fn connect(mut cmd: tokio::process::Command) -> Client {
    let mut server = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let io = (server.stdout.take().unwrap(), server.stdin.take().unwrap());
    Client {
        service: ().serve(io).await.unwrap(),
        server,
    }
}

impl Client {
    /// End the session, and let the server finish (runwarden writes the
    /// run's verdict line).
    async fn close(mut self) {
        self.service.cancel().await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.server.wait()).await;
    }
}

async fn call(c: &Client, path: &str) -> Duration {
    let mut args = serde_json::Map::new();
    args.insert("path".into(), json!(path));
    let t = Instant::now();
    let r = c
        .service
        .call_tool(CallToolRequestParams::new("disk_usage").with_arguments(args))
        .await
        .unwrap();
    let took = t.elapsed();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    took
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A config directory: host `local` that may look at `data/`, and runbook
/// `look` planned over MCP with room for every call of a run.
fn config(root: &Path) -> String {
    let data = root.join("data");
    std::fs::create_dir_all(data.join("a")).unwrap();
    std::fs::write(data.join("a/file"), vec![0u8; 64 << 10]).unwrap();
    for d in ["hosts", "runbooks", "kill-switch"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("runwarden.yaml"), "audit_head: none\n").unwrap();
    std::fs::write(
        root.join("hosts/local.yaml"),
        format!(
            "name: local\nconnection: local\npaths: [{}]\n",
            data.display()
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("runbooks/look.yaml"),
        format!(
            "name: look\ndescription: Look.\nhosts: [local]\nautonomy: L3\ntools: {{ observe: [disk_usage] }}\nplanner: mcp\nbudget: {{ max_steps: {}, max_mutations: 0, max_duration: 30m }}\n",
            CALLS + WARM + 5
        ),
    )
    .unwrap();
    data.display().to_string()
}

async fn bench() {
    let dir = tempfile::Builder::new()
        .prefix("rw-bench-mcp-")
        .tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into()))
        .unwrap();
    let root = dir.path();
    let path = config(root);
    let runwarden = || {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_runwarden"));
        c.args(["mcp", "look", "--host", "local", "--config"])
            .arg(root)
            .stderr(std::process::Stdio::null());
        c
    };
    // The argv runwarden spawns for the call, from its own result line.
    {
        let rw = connect(runwarden()).await;
        call(&rw, &path).await;
        rw.close().await;
    }
    let audit = std::fs::read_to_string(root.join("state/audit.jsonl")).unwrap();
    // runwarden measures the directory it opened (no link swapped in
    // between), through its descriptor's /proc path: the bare server names
    // the directory itself.
    let argv: Vec<Vec<String>> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["phase"] == "result")
        .map(|l| serde_json::from_value(l["detail"]["argv"].clone()).unwrap())
        .unwrap();
    let argv: Vec<Vec<String>> = argv
        .into_iter()
        .map(|a| {
            a.into_iter()
                .map(|x| match x.starts_with("/proc/") {
                    true => path.clone(),
                    false => x,
                })
                .collect()
        })
        .collect();
    let argv = json!(argv);
    let bare = |sync: Option<&Path>| {
        let mut c = tokio::process::Command::new(std::env::current_exe().unwrap());
        c.env("RUNWARDEN_BENCH_BARE", argv.to_string());
        if let Some(p) = sync {
            c.env("SYNC", p);
        }
        c
    };
    println!(
        "one tier-1 disk_usage call (argv {argv}) round trip from an MCP client over stdio, {CALLS} calls a run, called in turn:"
    );
    println!(
        "run | bare p50 ms | bare+sync p50 | runwarden p50 | p50 ratio (target <= 1.2) | to the floor | bare p99 | runwarden p99 | p99 ratio"
    );
    for run in 1..=RUNS {
        let rw = connect(runwarden()).await;
        let b = connect(bare(None)).await;
        let f = connect(bare(Some(&root.join("state/sync-probe")))).await;
        for _ in 0..WARM {
            call(&rw, &path).await;
            call(&b, &path).await;
            call(&f, &path).await;
        }
        let (mut rws, mut bs, mut fs) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..CALLS {
            bs.push(call(&b, &path).await);
            rws.push(call(&rw, &path).await);
            fs.push(call(&f, &path).await);
        }
        for c in [rw, b, f] {
            c.close().await;
        }
        let (b50, r50, f50) = (pct(&mut bs, 0.5), pct(&mut rws, 0.5), pct(&mut fs, 0.5));
        let (b99, r99) = (pct(&mut bs, 0.99), pct(&mut rws, 0.99));
        println!(
            "{run} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.3}",
            ms(b50),
            ms(f50),
            ms(r50),
            r50.as_secs_f64() / b50.as_secs_f64(),
            r50.as_secs_f64() / f50.as_secs_f64(),
            ms(b99),
            ms(r99),
            r99.as_secs_f64() / b99.as_secs_f64(),
        );
    }
}

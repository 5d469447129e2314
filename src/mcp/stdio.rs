//! `runwarden mcp RUNBOOK --host HOST`: one MCP session on stdin and
//! stdout, one run in this process. Log lines go to stderr; stdout is the
//! protocol's alone.

use std::sync::Arc;

use rmcp::ServiceExt;

use super::{NoRun, Server, Session, Started, Starter};
use crate::report::RunReport;
use crate::run::Runner;

/// Serve one session of `runbook` on `host` until the client goes away;
/// the run's report, once it has ended (`None`: no call was ever asked
/// for and no run started, or it could not start: `Err` says why).
pub(crate) async fn serve(
    runner: Runner,
    runbook: &str,
    host: &str,
) -> Result<Option<RunReport>, NoRun> {
    let shown = crate::tools::args::shown;
    let rb = runner
        .config
        .runbooks
        .get(runbook)
        .cloned()
        .ok_or_else(|| NoRun::NoRunbook(shown(runbook)))?;
    if !rb.allows_host(host) {
        return Err(NoRun::NotItsHost {
            runbook: rb.name.clone(),
            host: shown(host),
        });
    }
    let host = runner
        .config
        .hosts
        .get(host)
        .cloned()
        .ok_or_else(|| NoRun::NoHost(shown(host)))?;
    let runner = Arc::new(runner);
    let starter: Starter = Arc::new(move |req| {
        let runner = runner.clone();
        Box::pin(async move {
            let run_id = uuid::Uuid::now_v7().to_string();
            let id = run_id.clone();
            let run = tokio::spawn(async move { runner.run_as(&req, id, None).await });
            let ended = Box::pin(async move {
                match run.await {
                    Ok(Ok(report)) => Ok(report),
                    Ok(Err(e)) => Err(NoRun::NoReport(e.to_string())),
                    Err(e) => Err(NoRun::NoReport(format!("the run's task failed: {e}"))),
                }
            });
            Ok(Started { run_id, ended })
        })
    });
    let session = Arc::new(Session::new(rb, host, starter));
    let service = Server(session.clone())
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| NoRun::NotOpened(e.to_string()))?;
    let _ = service.waiting().await;
    Ok(session.close().await)
}

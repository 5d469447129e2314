//! `runwarden mcp RUNBOOK --host HOST`: one MCP session on stdin and
//! stdout, one run in this process. Log lines go to stderr; stdout is the
//! protocol's alone.

use std::sync::Arc;

use rmcp::ServiceExt;

use super::{Server, Session, Started, Starter};
use crate::report::RunReport;
use crate::run::Runner;

/// Serve one session of `runbook` on `host` until the client goes away;
/// the run's report, once it has ended (`None`: no call was ever asked
/// for and no run started, or it could not start: `Err` says why).
pub(crate) async fn serve(
    runner: Runner,
    runbook: &str,
    host: &str,
) -> Result<Option<RunReport>, String> {
    let rb = runner
        .config
        .runbooks
        .get(runbook)
        .cloned()
        .ok_or_else(|| format!("no runbook named \"{runbook}\" (runwarden check lists them)"))?;
    if !rb.allows_host(host) {
        return Err(format!(
            "runbook \"{runbook}\" does not name host \"{host}\"; nothing was served"
        ));
    }
    let host = runner
        .config
        .hosts
        .get(host)
        .cloned()
        .ok_or_else(|| format!("no host named \"{host}\" in hosts/"))?;
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
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(format!("the run's task failed: {e}")),
                }
            });
            Ok(Started { run_id, ended })
        })
    });
    let session = Arc::new(Session::new(rb, host, starter));
    let service = Server(session.clone())
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP session did not open: {e}"))?;
    let _ = service.waiting().await;
    Ok(session.close().await)
}

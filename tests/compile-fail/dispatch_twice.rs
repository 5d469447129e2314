// One intent line, one dispatch: the ticket is spent by the first.
use runwarden::{audit::AuditTicket, audit::RunInfo, config::Host, executor::Executor};

async fn twice(exec: &Executor, ticket: AuditTicket, run: &RunInfo, host: &Host) {
    let deadline = tokio::time::Instant::now();
    let _ = exec.dispatch(ticket, run, host, deadline).await;
    let _ = exec.dispatch(ticket, run, host, deadline).await;
}

fn main() {}

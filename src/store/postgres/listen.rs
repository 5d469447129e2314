//! Keeping each replica's view of the fleet's switch and demotions
//! current: LISTEN on a connection of its own, and a re-read every few
//! seconds.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{AsyncMessage, Client};

use super::{DEMOTION_CHANNEL, KILL_SWITCH_CHANNEL, Postgres, QUEUE_CHANNEL};
use crate::store::StoreError;

impl Postgres {
    /// Keep [`Postgres::switch`] current: LISTEN on its own connection,
    /// re-read the table on every notification and every few seconds (a
    /// notification sent while the connection was down is not lost), and
    /// connect again after a failure. Ends when `stop` turns true.
    pub(crate) async fn listen(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.listen_once(&mut stop).await {
                tracing::warn!(
                    "the fleet's kill switch cannot be heard ({e}); retrying in 1s (calls are still fenced against the database)"
                );
            }
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn listen_once(
        self: &Arc<Self>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        let unreachable =
            |e: tokio_postgres::Error| StoreError::Unreachable(crate::error_chain(&e));
        let (client, mut connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(unreachable)?;
        let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let queue = self.clone();
        let driver = tokio::spawn(async move {
            while let Some(Ok(m)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match m {
                    AsyncMessage::Notification(n) if n.channel() == QUEUE_CHANNEL => {
                        queue.queue_ready.notify_one();
                    }
                    AsyncMessage::Notification(_) if tx.send(()).is_err() => break,
                    _ => {}
                }
            }
        });
        let _stop_driver = AbortOnDrop(driver);
        client
            .batch_execute(&format!(
                "LISTEN {KILL_SWITCH_CHANNEL}; LISTEN {QUEUE_CHANNEL}; LISTEN {DEMOTION_CHANNEL}"
            ))
            .await
            .map_err(unreachable)?;
        loop {
            let engaged = switches_on(&client).await.map_err(unreachable)?;
            self.switch.set_untils(
                engaged
                    .iter()
                    .filter_map(|(scope, _, until)| Some((scope.clone(), (*until)?)))
                    .collect(),
            );
            self.switch.set(
                engaged
                    .into_iter()
                    .map(|(scope, detail, _)| (scope, detail))
                    .collect(),
            );
            self.demoted
                .set(demotions_on(&client).await.map_err(unreachable)?);
            tokio::select! {
                n = heard.recv() => if n.is_none() {
                    return Err(StoreError::Unreachable("the listening connection closed".into()));
                },
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = stop.changed() => return Ok(()),
            }
        }
    }
}

/// The fleet's engaged switches: scope, what a person reads, and when a
/// timed one ends (Unix seconds). One whose time has come is not engaged,
/// though its row stays until a replica removes it.
pub(super) async fn switches_on(
    c: &Client,
) -> Result<Vec<(String, String, Option<f64>)>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT scope, format('engaged for the fleet by %s at %s: %s%s', engaged_by, engaged_at, reason,
                    CASE WHEN until IS NULL THEN '' ELSE format('; until %s (%s left)', until,
                         date_trunc('second', until - clock_timestamp())) END),
                    extract(epoch FROM until)::float8
             FROM runwarden_kill_switch WHERE until IS NULL OR until > clock_timestamp() ORDER BY scope",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// The fleet's demotions. A row that does not read as one still demotes
/// (fail closed), with what is known of it.
pub(super) async fn demotions_on(
    c: &Client,
) -> Result<Vec<crate::gate::demotion::Demotion>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT runbook, demotion::text FROM runwarden_demotions ORDER BY runbook",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let runbook: String = r.get(0);
            serde_json::from_str(r.get::<_, &str>(1)).unwrap_or_else(|e| {
                crate::gate::demotion::Demotion::unreadable(
                    &runbook,
                    format!("a row of runwarden_demotions that does not read ({e})"),
                )
            })
        })
        .collect())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

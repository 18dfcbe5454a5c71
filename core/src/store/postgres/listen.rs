//! The `LISTEN` connection of one process: it wakes the scheduler when any replica
//! arms a timer (`NOTIFY` in the ingest transaction, so only committed timers wake
//! anyone). A dropped connection is reconnected with backoff, and the scheduler is
//! woken once after each reconnect, since notifications sent meanwhile are gone; the
//! scheduler's poll stays the safety net either way.

use std::sync::Arc;
use std::time::Duration;

use lull_port::retry::Backoff;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The listening task; stopped when the store that started it is dropped.
pub(super) struct Listener {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reconnecting after the LISTEN connection ended: the project's one retry policy.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

impl Listener {
    /// Listen on `channel` and wake `armed` for every notification.
    pub(super) fn start(
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        channel: &'static str,
        armed: Arc<Notify>,
    ) -> Self {
        let task = tokio::spawn(async move {
            let mut failures = 0;
            loop {
                match listen(&config, tls.clone(), channel, &armed).await {
                    Ok(()) => {
                        tracing::warn!("the database closed the LISTEN connection; reconnecting")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the LISTEN connection failed; reconnecting")
                    }
                }
                failures += 1;
                tokio::time::sleep(RECONNECT.delay(failures)).await;
            }
        });
        Self { task }
    }
}

/// One LISTEN session: returns when the connection ends.
async fn listen(
    config: &tokio_postgres::Config,
    tls: MakeRustlsConnect,
    channel: &str,
    armed: &Notify,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tls).await?;
    let mut messages = std::pin::pin!(futures_util::stream::poll_fn(move |cx| {
        connection.poll_message(cx)
    }));
    let statement = format!("LISTEN {channel}");
    let subscribe = client.batch_execute(&statement);
    let mut subscribe = std::pin::pin!(subscribe);
    let mut subscribed = false;
    loop {
        tokio::select! {
            done = &mut subscribe, if !subscribed => {
                done?;
                subscribed = true;
                // Timers armed while no connection listened: look once.
                armed.notify_one();
            }
            message = futures_util::StreamExt::next(&mut messages) => match message {
                Some(Ok(AsyncMessage::Notification(_))) => armed.notify_one(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
        }
    }
}

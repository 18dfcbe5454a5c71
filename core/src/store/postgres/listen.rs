//! The `LISTEN` connection of one process: it wakes the scheduler when any replica
//! arms a timer earlier than every other future timer of a platform this process
//! serves (`NOTIFY` in the ingest transaction, so only committed timers wake anyone;
//! the payload names the platform). A dropped connection is reconnected with backoff,
//! and the scheduler is woken once after each reconnect, since notifications sent
//! meanwhile are gone; the scheduler's poll stays the safety net either way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::domain::Platform;

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

/// The platforms this process serves, as the scheduler last asked for their due work
/// (a bit per [`Platform::ALL`] entry): an announcement for another platform does not
/// wake it. Empty before its first look: then every announcement wakes it.
#[derive(Debug, Default)]
pub(super) struct Served(AtomicU8);

impl Served {
    /// Remember the platforms of a due-work query.
    pub(super) fn set(&self, platforms: &[Platform]) {
        let bits = platforms.iter().fold(0u8, |bits, p| bits | bit(*p));
        self.0.store(bits, Ordering::Relaxed);
    }

    /// Whether an announcement with this payload concerns this process (a payload
    /// that names no platform, from an older lull, does).
    fn wakes(&self, payload: &str) -> bool {
        let served = self.0.load(Ordering::Relaxed);
        match payload.parse::<Platform>() {
            Ok(platform) => served == 0 || served & bit(platform) != 0,
            Err(_) => true,
        }
    }
}

fn bit(platform: Platform) -> u8 {
    let index = Platform::ALL
        .iter()
        .position(|p| *p == platform)
        .unwrap_or(0);
    1 << index
}

/// Reconnecting after the LISTEN connection ended: the project's one retry policy.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

impl Listener {
    /// Listen on `channel` and wake `armed` for every notification of a platform
    /// `served` names.
    pub(super) fn start(
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        channel: &'static str,
        armed: Arc<Notify>,
        served: Arc<Served>,
    ) -> Self {
        let task = tokio::spawn(async move {
            let mut failures = 0;
            loop {
                match listen(&config, tls.clone(), channel, &armed, &served).await {
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
    served: &Served,
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
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if served.wakes(n.payload()) {
                        armed.notify_one();
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_wakes_only_a_process_serving_its_platform() {
        let served = Served::default();
        // Before the first look, everything wakes it.
        assert!(served.wakes("telegram"));
        served.set(&[Platform::Http, Platform::Discord]);
        assert!(served.wakes("http"));
        assert!(served.wakes("discord"));
        assert!(!served.wakes("telegram"));
        assert!(!served.wakes("console"));
        // An older lull's announcement without a platform wakes everyone.
        assert!(served.wakes(""));
    }
}

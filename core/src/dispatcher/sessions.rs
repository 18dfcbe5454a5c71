//! Platform sessions: electing the one process that holds a platform connection, and
//! handing the adapter one session at a time.
//!
//! Telegram allows one long-poller per bot token (a second gets 409 Conflict) and
//! Discord delivers each event to every connected session, so with several processes
//! on one database exactly one holds the platform's *poller lease* (the same
//! compare-and-swap row with expiry as conversation leases) and the others stand by,
//! retrying the claim, and take over within the lease TTL when the holder dies. This
//! loop exists once, here; adapters only run sessions.

use std::sync::Arc;

use lull_port::{AdapterState, Backoff, Health, Inbound, SessionEnd};
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use super::lease_keeper::{LeaseKeeper, claim};
use crate::domain::{LeaseKey, Platform};

/// Pauses between failed sessions of one platform.
const SESSION_BACKOFF: Backoff = Backoff::new(
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(30),
);

/// Why a platform's connection stopped for good.
#[derive(Debug, thiserror::Error)]
#[error("the {platform} adapter stopped: {reason}")]
pub struct SessionsEnded {
    pub platform: Platform,
    pub reason: String,
}

/// Hold `inbound`'s platform connection whenever this process wins its poller lease,
/// one session at a time, until `shutdown`: standing by while another process holds
/// it, handing it over at once on shutdown or after a failed session (and trying again
/// after a backoff), and returning an error when a session says trying again cannot
/// help (a rejected token).
pub(super) async fn serve(
    dispatcher: &Arc<Dispatcher>,
    inbound: Arc<dyn Inbound>,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), SessionsEnded> {
    let platform = inbound.platform();
    health.set(platform, AdapterState::Starting);
    let mut failures = 0;
    loop {
        let Some(keeper) = elect(dispatcher, platform, &health, &shutdown).await else {
            return Ok(());
        };
        let session = keeper.session(platform, &shutdown, &health);
        let end = inbound.session(dispatcher.as_ref(), &session).await;
        match end {
            SessionEnd::Shutdown => {
                keeper.release(None, dispatcher.clock.now()).await;
                tracing::info!(%platform, "left the platform connection");
                return Ok(());
            }
            SessionEnd::LeaseLost => {
                tracing::warn!(%platform, "the platform lease was lost; disconnected, standing by");
                health.set(platform, AdapterState::Standby);
            }
            SessionEnd::Fatal(reason) => {
                keeper.release(None, dispatcher.clock.now()).await;
                health.set(platform, AdapterState::Down(reason.clone()));
                return Err(SessionsEnded { platform, reason });
            }
            SessionEnd::Failed { reason, connected } => {
                // Hand the connection to another process while this one waits.
                keeper.release(None, dispatcher.clock.now()).await;
                if connected {
                    failures = 0;
                }
                failures += 1;
                let wait = SESSION_BACKOFF.delay(failures);
                tracing::warn!(%platform, reason, retry_in_ms = wait.as_millis() as u64, "platform session failed");
                health.set(platform, AdapterState::Down(reason));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.cancelled() => return Ok(()),
                }
            }
        }
    }
}

/// Wait until this process holds `platform`'s poller lease, retrying every renewal
/// interval; while another process holds it, `health` shows this one standing by.
/// `None` if `shutdown` fired first.
async fn elect(
    dispatcher: &Dispatcher,
    platform: Platform,
    health: &Health,
    shutdown: &CancellationToken,
) -> Option<LeaseKeeper> {
    let key = LeaseKey::Poller(platform);
    let mut announced = false;
    loop {
        match claim(dispatcher, key.clone()).await {
            Ok(Some(keeper)) => {
                tracing::info!(%platform, token = keeper.lease().token.0, "this process now holds the platform connection");
                return Some(keeper);
            }
            Ok(None) => {
                health.set(platform, AdapterState::Standby);
                if !announced {
                    tracing::info!(%platform, "another process holds the platform connection; standing by");
                    announced = true;
                }
            }
            Err(e) => tracing::warn!(%platform, error = %e, "could not claim the poller lease"),
        }
        tokio::select! {
            () = tokio::time::sleep(dispatcher.settings.lease.renew_every()) => {}
            () = shutdown.cancelled() => return None,
        }
    }
}

//! Electing the one process that holds a platform connection.
//!
//! Telegram allows one long-poller per bot token (a second gets 409 Conflict) and
//! Discord delivers each event to every connected session, so with several processes
//! on one database exactly one holds the platform's *poller lease* (the same
//! compare-and-swap row with expiry as conversation leases) and the others stand by,
//! retrying the claim, and take over within the lease TTL when the holder dies.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Dispatcher, LeaseKeeper};
use crate::domain::{LeaseKey, Platform};
use crate::health::{AdapterState, Health};

impl Dispatcher {
    /// Wait until this process holds `platform`'s poller lease, retrying every renewal
    /// interval; while another process holds it, `health` shows this one as standing
    /// by. The returned keeper renews the lease; its `lost()` fires if it is lost, and
    /// `release()` hands it over at once on shutdown. `None` if `shutdown` fired first.
    pub async fn elect_poller(
        self: &Arc<Self>,
        platform: Platform,
        health: &Health,
        shutdown: &CancellationToken,
    ) -> Option<LeaseKeeper> {
        let key = LeaseKey::Poller(platform);
        let mut announced = false;
        loop {
            match self.claim(key.clone()).await {
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
                () = tokio::time::sleep(self.settings.lease.renew_every()) => {}
                () = shutdown.cancelled() => return None,
            }
        }
    }
}

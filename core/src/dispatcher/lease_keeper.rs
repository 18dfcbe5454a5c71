//! Holding a conversation lease for as long as the work it protects.
//!
//! The keeper renews the lease every renewal interval in the background. If a
//! renewal finds the lease gone (expired or taken over), the keeper reports it lost
//! and the round abandons its work: a reply generated without the lease must not be
//! committed or delivered.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::clock::Clock;
use crate::domain::Timestamp;
use crate::domain::{Lease, LeaseKey};
use crate::store::{PartSent, Store, StoreError};
use crate::timing::LeaseTiming;

/// Claim `key` for this process by compare-and-swap and keep it renewed until the
/// keeper is released or dropped. `Ok(None)`: another process holds it.
pub(super) async fn claim(
    dispatcher: &Dispatcher,
    key: LeaseKey,
) -> Result<Option<LeaseKeeper>, StoreError> {
    let timing = dispatcher.settings.lease;
    let claimed_at = dispatcher.clock.now();
    let lease = dispatcher
        .store
        .claim_lease(&key, &dispatcher.holder, timing.ttl(), claimed_at)
        .await?;
    Ok(lease.map(|lease| LeaseKeeper::keep(dispatcher, lease, claimed_at)))
}

/// A claimed lease, renewed in the background until released or dropped.
pub(super) struct LeaseKeeper {
    /// The latest renewed lease. A std mutex: held only to copy or replace a value,
    /// never across an await.
    lease: Arc<Mutex<Lease>>,
    /// Until when this process may act under the lease, on its own clock: the local
    /// time just before the claim (or the last renewal) was sent, plus the TTL. Never
    /// the database's `expires_at`, which is on the database's clock (PostgreSQL) and
    /// would be off by the skew between the hosts; this bound is on the safe side of
    /// the database's expiry whatever the skew, since it starts before the database
    /// started the lease. A platform session ends its requests before it.
    valid_until: Arc<AtomicI64>,
    lost: CancellationToken,
    renewer: JoinHandle<()>,
    store: Arc<dyn Store>,
}

impl LeaseKeeper {
    /// Keep a lease this process just claimed renewed until it is released or dropped;
    /// `claimed_at`: this process's time just before it sent the claim.
    pub(super) fn keep(
        dispatcher: &Dispatcher,
        lease: Lease,
        claimed_at: Timestamp,
    ) -> LeaseKeeper {
        LeaseKeeper::start(
            dispatcher.store.clone(),
            dispatcher.clock.clone(),
            lease,
            claimed_at,
            dispatcher.settings.lease,
        )
    }

    fn start(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        lease: Lease,
        claimed_at: Timestamp,
        timing: LeaseTiming,
    ) -> Self {
        let valid_until = Arc::new(AtomicI64::new(claimed_at.plus(timing.ttl()).0));
        let shared = Arc::new(Mutex::new(lease));
        let lost = CancellationToken::new();
        let renewer = tokio::spawn(renew(
            store.clone(),
            clock,
            shared.clone(),
            valid_until.clone(),
            timing,
            lost.clone(),
        ));
        Self {
            lease: shared,
            valid_until,
            lost,
            renewer,
            store,
        }
    }

    /// A platform session under this lease: it ends when the lease is lost or
    /// `shutdown` fires, and knows when the lease would expire. Also returns its
    /// hand-over switch: cancelling it ends the session as if the lease were lost,
    /// while the lease itself stays good to release.
    pub(crate) fn session(
        &self,
        platform: lull_port::Platform,
        shard: lull_port::Shard,
        shutdown: &CancellationToken,
        health: &lull_port::Health,
    ) -> (lull_port::Session, CancellationToken) {
        let handover = self.lost.child_token();
        let session = lull_port::Session::new(
            platform,
            shard,
            handover.clone(),
            shutdown.clone(),
            self.valid_until.clone(),
            health.clone(),
        );
        (session, handover)
    }

    /// The lease as last renewed: what writes under it must present.
    pub(super) fn lease(&self) -> Lease {
        self.lease.lock().expect("lease mutex poisoned").clone()
    }

    /// Completes when the lease is found lost.
    pub(super) async fn lost(&self) {
        self.lost.cancelled().await
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Mark the lease lost (a fenced write was refused).
    pub(super) fn mark_lost(&self) {
        self.lost.cancel();
    }

    /// Stop renewing and give the lease back, so another process can claim the
    /// conversation at once instead of after the TTL; `last_sent`, the last part
    /// delivered under it, is recorded in the same write (even if the lease was lost:
    /// a delivered part is a fact).
    pub(super) async fn release(self, last_sent: Option<PartSent>, now: Timestamp) {
        self.renewer.abort();
        let lease = self.lease();
        let released = if self.is_lost() {
            match last_sent {
                Some(sent) => {
                    self.store
                        .mark_sent(sent.outbox, sent.parts_sent, sent.done, now)
                        .await
                }
                None => return,
            }
        } else {
            self.store.release_lease(&lease, last_sent, now).await
        };
        if let Err(e) = released {
            // Harmless for the lease: it expires on its own.
            tracing::warn!(lease = %lease.key, error = %e, "could not release a lease; it will expire");
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

async fn renew(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    shared: Arc<Mutex<Lease>>,
    valid_until: Arc<AtomicI64>,
    timing: LeaseTiming,
    lost: CancellationToken,
) {
    let mut wait = timing.renew_every();
    loop {
        tokio::time::sleep(wait).await;
        let current = shared.lock().expect("lease mutex poisoned").clone();
        let now = clock.now();
        match store.renew_lease(&current, timing.ttl(), now).await {
            Ok(renewed) => {
                // Valid from before the renewal was sent: on the safe side of the
                // database's new expiry.
                valid_until.store(now.plus(timing.ttl()).0, Ordering::SeqCst);
                *shared.lock().expect("lease mutex poisoned") = renewed;
                wait = timing.renew_every();
            }
            Err(StoreError::LeaseLost(key)) => {
                tracing::warn!(lease = %key, token = %current.token, "lease lost; abandoning the work it protected");
                lost.cancel();
                return;
            }
            Err(e) => {
                // The database hiccuped; the lease is still ours until it expires, as
                // this process's own clock counts it.
                let until = Timestamp(valid_until.load(Ordering::SeqCst));
                if clock.now() >= until {
                    tracing::warn!(lease = %current.key, error = %e, "could not renew a lease before it expired");
                    lost.cancel();
                    return;
                }
                tracing::debug!(lease = %current.key, error = %e, "lease renewal failed; retrying");
                // Retry no later than the expiry, so the work it covers (a send, a
                // generation) stops when the lease ends, not a retry interval after.
                wait = (timing.renew_every() / 4).min(clock.now().until(until));
            }
        }
    }
}

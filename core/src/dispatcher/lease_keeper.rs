//! Holding a conversation lease for as long as the work it protects.
//!
//! The keeper renews the lease every renewal interval in the background. If a
//! renewal finds the lease gone (expired or taken over), or does not come back before
//! the lease's local validity ends (a database that hangs, a socket gone silent), the
//! keeper reports it lost and the round abandons its work: a reply generated without
//! the lease must not be committed or delivered, and a send must not outlive it.
//!
//! # No send outlives its lease
//! The validity is counted on this process's clock from just before the claim (or
//! renewal) was sent, so it ends no later than the database's expiry, which is what a
//! successor's claim waits for. [`LeaseKeeper::lost`] fires at that moment at the
//! latest, whether or not a renewal call returned; sends, waits, drafts and
//! generations race it. A send does not start with less than a renewal interval of
//! validity left ([`LeaseKeeper::ready_to_send`]): with renewals working the validity
//! never falls that low, so a send that would start then waits for a renewal.
//!
//! # A delivered part is a fact
//! [`LeaseKeeper::release_recording`] records the last delivered part with the
//! release, and retries until that is written, renewing the lease meanwhile: a
//! successor never reads a delivered part as unsent because one write failed. (The
//! bound: a database unreachable for longer than the lease's TTL lets a successor
//! claim the moment it is back; the retries are short so the holder is first.)

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::clock::Clock;
use crate::domain::Timestamp;
use crate::domain::{Lease, LeaseKey};
use crate::store::{LeaseClaim, LeaseRelease, LeaseRenewal, PartSent, Store, StoreError};
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
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &dispatcher.holder,
            ttl: timing.ttl(),
            now: claimed_at,
        })
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
    /// Notified after every successful renewal (a send waiting for validity wakes).
    renewed: Arc<Notify>,
    renewer: JoinHandle<()>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    timing: LeaseTiming,
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
        let renewed = Arc::new(Notify::new());
        let renewer = tokio::spawn(renew(
            Renewal {
                store: store.clone(),
                clock: clock.clone(),
                shared: shared.clone(),
                valid_until: valid_until.clone(),
                timing,
                lost: lost.clone(),
                renewed: renewed.clone(),
            },
            !crate::switches::unbounded_sends(),
        ));
        Self {
            lease: shared,
            valid_until,
            lost,
            renewed,
            renewer,
            store,
            clock,
            timing,
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

    /// Give the lease back (a lease that protected no delivery): see
    /// [`LeaseKeeper::release_recording`].
    pub(super) async fn release(self) {
        self.release_recording(None, &CancellationToken::new())
            .await
    }

    /// How long this process may still act under the lease, on its own clock.
    pub(super) fn remaining(&self) -> std::time::Duration {
        self.clock
            .now()
            .until(Timestamp(self.valid_until.load(Ordering::SeqCst)))
    }

    /// Completes when a send may start: the lease has at least a renewal interval of
    /// validity left (renewals working keep it above that). While it has less (renewals
    /// failing), waits for a renewal; `false` if the lease is lost first.
    pub(super) async fn ready_to_send(&self) -> bool {
        if crate::switches::unbounded_sends() {
            return !self.is_lost();
        }
        let margin = self.timing.renew_every();
        loop {
            let renewed = self.renewed.notified();
            if self.is_lost() {
                return false;
            }
            let remaining = self.remaining();
            if remaining >= margin {
                return true;
            }
            tokio::select! {
                () = renewed => {}
                () = self.lost() => return false,
                // The renewer marks the lease lost when validity ends; this only
                // bounds the wait should a renewal be in flight then.
                () = tokio::time::sleep(remaining) => {}
            }
        }
    }

    /// Give the lease back, so another process can claim the conversation at once
    /// instead of after the TTL, recording `last_sent` (the last part delivered under
    /// it) in the same write, even if the lease was lost meanwhile: a delivered part
    /// is a fact. With a part to record, the write is retried until it is written, the
    /// lease renewed meanwhile; after the hard stop (`stop`) a few more attempts are
    /// made, then it is given up and said in the log. Without one, a release that keeps
    /// failing is harmless (the lease expires on its own) and is retried briefly.
    pub(super) async fn release_recording(
        self,
        last_sent: Option<PartSent>,
        stop: &CancellationToken,
    ) {
        if last_sent.is_none() && self.is_lost() {
            self.renewer.abort();
            return;
        }
        let single = last_sent.is_some() && crate::switches::defer_marks();
        let mut failures = 0;
        loop {
            let lease = self.lease();
            let Err(e) = self
                .store
                .release_lease(LeaseRelease {
                    lease: &lease,
                    last_sent,
                    now: self.clock.now(),
                })
                .await
            else {
                break;
            };
            failures += 1;
            let give_up = match last_sent {
                _ if single => true,
                Some(_) => stop.is_cancelled() && failures >= FACT_ATTEMPTS_AFTER_STOP,
                None => failures >= RELEASE_ATTEMPTS,
            };
            if give_up {
                match last_sent {
                    Some(sent) => {
                        tracing::error!(lease = %lease.key, outbox = %sent.outbox, parts = sent.parts_sent, error = %e, "could not record a delivered part; it may be delivered again")
                    }
                    None => {
                        tracing::warn!(lease = %lease.key, error = %e, "could not release a lease; it will expire")
                    }
                }
                break;
            }
            if loud(failures) {
                tracing::warn!(lease = %lease.key, error = %e, failures, "could not release a lease; retrying");
            }
            tokio::time::sleep(FACT_BACKOFF.delay(failures)).await;
        }
        self.renewer.abort();
    }
}

/// Whether the `failures`th failed attempt to write a fact is said at WARN: the first,
/// then every hundredth (a database that stays down is retried every 200 ms).
pub(super) fn loud(failures: u32) -> bool {
    failures % 100 == 1
}

/// Attempts to release a lease that records no part before leaving it to expire.
const RELEASE_ATTEMPTS: u32 = 3;
/// Attempts, after the hard stop of shutdown, to record a delivered part.
pub(super) const FACT_ATTEMPTS_AFTER_STOP: u32 = 3;
/// Between attempts to write a fact (a sent-mark, a release carrying one): short, so
/// that when the database is back the mark is written before a successor, polling for
/// work, can read the part as unsent.
pub(super) const FACT_BACKOFF: lull_port::retry::Backoff = lull_port::retry::Backoff::new(
    std::time::Duration::from_millis(25),
    std::time::Duration::from_millis(200),
);

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// What the renewer task works with.
struct Renewal {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    shared: Arc<Mutex<Lease>>,
    valid_until: Arc<AtomicI64>,
    timing: LeaseTiming,
    lost: CancellationToken,
    renewed: Arc<Notify>,
}

impl Renewal {
    fn until(&self) -> Timestamp {
        Timestamp(self.valid_until.load(Ordering::SeqCst))
    }

    fn give_up(&self, key: &LeaseKey, why: &str) {
        tracing::warn!(lease = %key, "{why}; abandoning the work it protected");
        self.lost.cancel();
    }
}

/// Renew every renewal interval; the lease is lost when a renewal is refused, or
/// (`bounded`) when its local validity ends before a renewal came back, whether or not
/// the call returned. `bounded` is off only in the counter-test.
async fn renew(r: Renewal, bounded: bool) {
    let mut wait = r.timing.renew_every();
    loop {
        // Never sleep past the validity: the lease is lost then, not at the next try.
        let left = r.clock.now().until(r.until());
        if bounded && left.is_zero() {
            let key = r.shared.lock().expect("lease mutex poisoned").key.clone();
            return r.give_up(&key, "could not renew a lease before it expired");
        }
        tokio::time::sleep(if bounded { wait.min(left) } else { wait }).await;
        let current = r.shared.lock().expect("lease mutex poisoned").clone();
        let now = r.clock.now();
        let left = now.until(r.until());
        if bounded && left.is_zero() {
            return r.give_up(&current.key, "could not renew a lease before it expired");
        }
        let renewing = r.store.renew_lease(LeaseRenewal {
            lease: &current,
            ttl: r.timing.ttl(),
            now,
        });
        let renewed = if bounded {
            match tokio::time::timeout(left, renewing).await {
                Ok(renewed) => renewed,
                Err(_) => {
                    return r.give_up(
                        &current.key,
                        "a lease renewal did not answer before the lease expired",
                    );
                }
            }
        } else {
            renewing.await
        };
        match renewed {
            Ok(renewed) => {
                // Valid from before the renewal was sent: on the safe side of the
                // database's new expiry.
                r.valid_until
                    .store(now.plus(r.timing.ttl()).0, Ordering::SeqCst);
                *r.shared.lock().expect("lease mutex poisoned") = renewed;
                r.renewed.notify_waiters();
                wait = r.timing.renew_every();
            }
            Err(StoreError::LeaseLost(key)) => {
                tracing::warn!(lease = %key, token = %current.token, "lease lost; abandoning the work it protected");
                r.lost.cancel();
                return;
            }
            Err(e) => {
                // The database hiccuped; the lease is still ours until it expires, as
                // this process's own clock counts it.
                let until = r.until();
                if r.clock.now() >= until {
                    tracing::warn!(lease = %current.key, error = %e, "could not renew a lease before it expired");
                    r.lost.cancel();
                    return;
                }
                tracing::debug!(lease = %current.key, error = %e, "lease renewal failed; retrying");
                // Retry no later than the expiry, so the work it covers (a send, a
                // generation) stops when the lease ends, not a retry interval after.
                wait = (r.timing.renew_every() / 4).min(r.clock.now().until(until));
            }
        }
    }
}

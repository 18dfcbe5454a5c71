//! The leases area of the contract: the compare-and-swap with an expiry.

use async_trait::async_trait;

use crate::domain::{HolderId, Lease, LeaseKey, OutboxId, Timestamp};
use crate::store::StoreError;
/// The last part a round delivered, recorded in the transaction that releases the
/// round's lease (one write instead of two). A fact, not a decision: it is recorded
/// even when the lease was lost meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSent {
    pub outbox: OutboxId,
    /// Parts delivered so far.
    pub parts_sent: u32,
    /// Whether that was the row's last part.
    pub done: bool,
}

/// A claim of the lease `key` for `holder`, for `ttl` from `now`
/// ([`LeaseStore::claim_lease`]).
#[derive(Debug, Clone, Copy)]
pub struct LeaseClaim<'a> {
    pub key: &'a LeaseKey,
    pub holder: &'a HolderId,
    pub ttl: std::time::Duration,
    pub now: Timestamp,
}

/// A renewal of `lease` for `ttl` from `now` ([`LeaseStore::renew_lease`]).
#[derive(Debug, Clone, Copy)]
pub struct LeaseRenewal<'a> {
    pub lease: &'a Lease,
    pub ttl: std::time::Duration,
    pub now: Timestamp,
}

/// The end of a holding ([`LeaseStore::release_lease`]): `lease` given back, and the
/// last part its holder delivered recorded with it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRelease<'a> {
    pub lease: &'a Lease,
    pub last_sent: Option<PartSent>,
    pub now: Timestamp,
}

/// Leases: the compare-and-swap with an expiry that makes one process the holder of a
/// conversation (or a platform poller).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Claim a lease by compare-and-swap: succeeds only if the lease is free or
    /// expired, and then bumps the fencing token. `None`: someone else holds it.
    async fn claim_lease(&self, claim: LeaseClaim<'_>) -> Result<Option<Lease>, StoreError>;

    /// Extend a lease this process holds. `Err(LeaseLost)` if it expired or was taken.
    async fn renew_lease(&self, renewal: LeaseRenewal<'_>) -> Result<Lease, StoreError>;

    /// Give a lease back so another process can claim it at once, and record
    /// `last_sent` (the last part the holder delivered) in the same transaction. A
    /// lease already lost is left alone; `last_sent` is recorded all the same.
    async fn release_lease(&self, release: LeaseRelease<'_>) -> Result<(), StoreError>;
}

//! The leases area on SQLite: the compare-and-swap with an expiry.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::outbox::mark_part_sent;
use super::sql::Context;
use crate::domain::{HolderId, Lease, LeaseKey, LeaseToken, Timestamp};
use crate::store::lease_rows::LeaseRow;
use crate::store::{LeaseClaim, LeaseRelease, LeaseRenewal};
use crate::store::{LeaseStore, StoreError};

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim_lease(&self, asked: LeaseClaim<'_>) -> Result<Option<Lease>, StoreError> {
        let key = asked.key.clone();
        let holder = asked.holder.clone();
        let row = self.lease_rows.row(&key, &holder);
        self.write("claiming a lease", move |tx| {
            claim(tx, key, holder, &row, asked.ttl, asked.now)
        })
        .await
    }

    async fn renew_lease(&self, asked: LeaseRenewal<'_>) -> Result<Lease, StoreError> {
        let mut lease = asked.lease.clone();
        let expires_at = asked.now.plus(asked.ttl);
        #[cfg(feature = "test-switches")]
        if self.faults.renewals_frozen() {
            // A frozen process: it believes it renewed; the database never heard of it.
            lease.expires_at = expires_at;
            return Ok(lease);
        }
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("renewing a lease", move |tx| {
            // Exclusive: only the live holder with this fencing token extends the lease.
            let changed = tx
                .prepare_cached(
                    "UPDATE leases SET expires_at = ?4
                     WHERE resource = ?1 AND holder = ?2 AND token = ?3 AND expires_at > ?5",
                )
                .ctx("preparing a statement")?
                .execute(params![
                    row.resource,
                    lease.holder.as_str(),
                    lease.token.0,
                    expires_at.0,
                    asked.now.0
                ])
                .ctx("renewing a lease")?;
            if changed == 0 {
                return Err(StoreError::LeaseLost(lease.key.clone()));
            }
            lease.expires_at = expires_at;
            Ok(lease)
        })
        .await
    }

    async fn release_lease(&self, giving_back: LeaseRelease<'_>) -> Result<(), StoreError> {
        let lease = giving_back.lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("releasing a lease", move |tx| {
            if let Some(sent) = giving_back.last_sent {
                mark_part_sent(tx, sent, giving_back.now)?;
            }
            // Only our own claim is released: a lease taken over since stays with its holder.
            tx.prepare_cached(
                "UPDATE leases SET holder = NULL WHERE resource = ?1 AND holder = ?2 AND token = ?3",
            )
            .ctx("preparing a statement")?
            .execute(params![row.resource, lease.holder.as_str(), lease.token.0])
            .ctx("releasing a lease")?;
            Ok(())
        })
        .await
    }
}

/// Exclusive: a write under a lease needs the live holder with the current token in
/// the lease's row (`resource`).
pub(super) fn ensure_lease(
    tx: &Connection,
    lease: &Lease,
    resource: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let ours: bool = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM leases
                 WHERE resource = ?1 AND holder = ?2 AND token = ?3 AND expires_at > ?4)",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![resource, lease.holder.as_str(), lease.token.0, now.0],
            |r| r.get(0),
        )
        .ctx("checking the lease")?;
    if ours {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(lease.key.clone()))
    }
}

/// The compare-and-swap claim of `row`: succeeds only if the lease is free or expired,
/// and then bumps the fencing token.
pub(super) fn claim(
    tx: &Connection,
    key: LeaseKey,
    holder: HolderId,
    row: &LeaseRow,
    ttl: Duration,
    now: Timestamp,
) -> Result<Option<Lease>, StoreError> {
    tx.prepare_cached(
        "INSERT INTO leases (resource, conversation_id) VALUES (?1, ?2)
         ON CONFLICT (resource) DO NOTHING",
    )
    .ctx("preparing a statement")?
    .execute(params![row.resource, row.conversation])
    .ctx("creating a lease")?;
    let expires_at = now.plus(ttl);
    // Exclusive: claim only a free or expired lease (compare-and-swap); every claim
    // bumps the fencing token.
    let token: Option<i64> = tx
        .prepare_cached(
            "UPDATE leases SET holder = ?2, token = token + 1, expires_at = ?3
             WHERE resource = ?1 AND (holder IS NULL OR expires_at <= ?4)
             RETURNING token",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![row.resource, holder.as_str(), expires_at.0, now.0],
            |r| r.get(0),
        )
        .optional()
        .ctx("claiming a lease")?;
    Ok(token.map(|token| Lease {
        key,
        holder,
        token: LeaseToken(token),
        expires_at,
    }))
}

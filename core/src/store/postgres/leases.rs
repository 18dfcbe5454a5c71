//! The leases area on PostgreSQL: the compare-and-swap with an expiry.

use std::time::Duration;

use async_trait::async_trait;

use super::PostgresStore;
use super::clock::Now;
use super::outbox::mark_part_sent;
use super::sql::{Tx, execute, query_opt};
use crate::domain::{HolderId, Lease, LeaseKey, LeaseToken, Timestamp};
use crate::store::faults::Operation;
use crate::store::lease_rows::LeaseRow;
use crate::store::{LeaseStore, PartSent, StoreError};

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn claim_lease(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Lease>, StoreError> {
        let row = self.row(key, holder);
        transaction!(self, Operation::Other, "claiming a lease", |tx| async {
            let now = self.now(&tx, now).await?;
            claim(&tx, key.clone(), holder.clone(), &row, ttl, now).await
        }
        .await)
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        #[cfg(feature = "test-switches")]
        if self.faults.renewals_frozen() {
            // A frozen process: it believes it renewed; the database never heard of it.
            let mut lease = lease.clone();
            lease.expires_at = now.plus(ttl);
            return Ok(lease);
        }
        let row = self.row(&lease.key, &lease.holder);
        let ttl = crate::domain::millis(ttl);
        transaction!(self, Operation::Other, "renewing a lease", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                // Exclusive: only the live holder with this fencing token extends the
                // lease, on the database's clock.
                let renewed = query_opt(
                    &tx,
                    concat!(
                        "WITH clock AS (SELECT COALESCE($5::int8, ", db_now!(), ") AS t)
                         UPDATE leases SET expires_at = (SELECT t FROM clock) + $4
                         WHERE resource = $1 AND holder = $2 AND token = $3 AND expires_at > (SELECT t FROM clock)
                         RETURNING expires_at"
                    ),
                    &[&row.resource, &lease.holder.as_str(), &lease.token.0, &ttl, &now.fixed],
                    "renewing a lease",
                )
                .await?;
                match renewed {
                    Some(r) => Ok(Lease {
                        expires_at: Timestamp(r.get(0)),
                        ..lease.clone()
                    }),
                    None => Err(StoreError::LeaseLost(lease.key.clone())),
                }
            }
            .await
        })
    }

    async fn release_lease(
        &self,
        lease: &Lease,
        last_sent: Option<PartSent>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        transaction!(self, Operation::Other, "releasing a lease", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                if let Some(sent) = last_sent {
                    mark_part_sent(&tx, sent, now.db).await?;
                }
                // Only our own claim is released: a lease taken over since stays with its holder.
                execute(
                    &tx,
                    "UPDATE leases SET holder = NULL WHERE resource = $1 AND holder = $2 AND token = $3",
                    &[&row.resource, &lease.holder.as_str(), &lease.token.0],
                    "releasing a lease",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }
}

/// Exclusive: a write under a lease needs the live holder with the current token in
/// the lease's row, checked on the database's clock; the row stays locked until the
/// transaction ends, so no claim takes the lease over before this write commits.
pub(super) async fn ensure_lease(
    tx: &Tx<'_>,
    lease: &Lease,
    row: &LeaseRow,
    now: Now,
) -> Result<(), StoreError> {
    // Fencing: holder, token and expiry, locked for the rest of the transaction.
    let ours = query_opt(
        tx,
        concat!(
            "SELECT 1 FROM leases WHERE resource = $1 AND holder = $2 AND token = $3
               AND expires_at > COALESCE($4::int8, ",
            db_now!(),
            ") FOR UPDATE"
        ),
        &[
            &row.resource,
            &lease.holder.as_str(),
            &lease.token.0,
            &now.fixed,
        ],
        "checking the lease",
    )
    .await?;
    match ours {
        Some(_) => Ok(()),
        None => Err(StoreError::LeaseLost(lease.key.clone())),
    }
}

/// The compare-and-swap claim of `row`, on the database's clock: succeeds only if the
/// lease is free or expired, and then bumps the fencing token.
pub(super) async fn claim(
    tx: &Tx<'_>,
    key: LeaseKey,
    holder: HolderId,
    row: &LeaseRow,
    ttl: Duration,
    now: Now,
) -> Result<Option<Lease>, StoreError> {
    execute(
        tx,
        "INSERT INTO leases (resource, conversation_id) VALUES ($1, $2) ON CONFLICT (resource) DO NOTHING",
        &[&row.resource, &row.conversation],
        "creating a lease",
    )
    .await?;
    let ttl = crate::domain::millis(ttl);
    // Exclusive: claim only a free or expired lease (compare-and-swap); every claim
    // bumps the fencing token. After waiting for a concurrent claim, PostgreSQL
    // re-checks this condition on the row that claim left.
    let claimed = query_opt(
        tx,
        concat!(
            "WITH clock AS (SELECT COALESCE($4::int8, ", db_now!(), ") AS t)
             UPDATE leases SET holder = $2, token = token + 1, expires_at = (SELECT t FROM clock) + $3
             WHERE resource = $1 AND (holder IS NULL OR expires_at <= (SELECT t FROM clock))
             RETURNING token, expires_at"
        ),
        &[&row.resource, &holder.as_str(), &ttl, &now.fixed],
        "claiming a lease",
    )
    .await?;
    Ok(claimed.map(|r| Lease {
        key,
        holder,
        token: LeaseToken(r.get(0)),
        expires_at: Timestamp(r.get(1)),
    }))
}

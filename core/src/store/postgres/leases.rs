//! The leases area on PostgreSQL: the compare-and-swap with an expiry.

use std::time::Duration;

use async_trait::async_trait;

use super::PostgresStore;
use super::clock::Now;
use super::sql::{Tx, execute, query_opt};
use crate::domain::{HolderId, Lease, LeaseKey, LeaseToken, Timestamp};
use crate::store::faults::Operation;
use crate::store::lease_rows::LeaseRow;
use crate::store::{LeaseClaim, LeaseRelease, LeaseRenewal};
use crate::store::{LeaseStore, StoreError};

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn claim_lease(&self, asked: LeaseClaim<'_>) -> Result<Option<Lease>, StoreError> {
        let row = self.row(asked.key, asked.holder);
        let fixed = self.fixed_now(asked.now);
        // One round trip: the claim is one statement.
        statement!(self, Operation::Other, "claiming a lease", |client| async {
            let claimed = claim(
                client,
                asked.key.clone(),
                asked.holder.clone(),
                &row,
                asked.ttl,
                fixed,
            )
            .await?;
            Ok(claimed.map(|(lease, _)| lease))
        }
        .await)
    }

    async fn renew_lease(&self, asked: LeaseRenewal<'_>) -> Result<Lease, StoreError> {
        #[cfg(feature = "test-switches")]
        if self.faults.renewals_frozen() {
            // A frozen process: it believes it renewed; the database never heard of it.
            let mut lease = asked.lease.clone();
            lease.expires_at = asked.now.plus(asked.ttl);
            return Ok(lease);
        }
        let lease = asked.lease;
        let row = self.row(&lease.key, &lease.holder);
        let ttl = crate::domain::millis(asked.ttl);
        let fixed = self.fixed_now(asked.now);
        // One round trip: the renewal is one statement on the database's clock.
        statement!(self, Operation::Other, "renewing a lease", |client| {
            async {
                // Exclusive: only the live holder with this fencing token extends the
                // lease, on the database's clock.
                let renewed = query_opt(
                    client,
                    concat!(
                        "WITH clock AS (SELECT COALESCE($5::int8, ", db_now!(), ") AS t)
                         UPDATE leases SET expires_at = (SELECT t FROM clock) + $4
                         WHERE resource = $1 AND holder = $2 AND token = $3 AND expires_at > (SELECT t FROM clock)
                         RETURNING expires_at"
                    ),
                    &[&row.resource, &lease.holder.as_str(), &lease.token.0, &ttl, &fixed],
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

    async fn release_lease(&self, giving_back: LeaseRelease<'_>) -> Result<(), StoreError> {
        let row = self.row(&giving_back.lease.key, &giving_back.lease.holder);
        let fixed = self.fixed_now(giving_back.now);
        let (outbox, parts, done) = match giving_back.last_sent {
            Some(sent) => (Some(sent.outbox.0), sent.parts_sent as i32, sent.done),
            None => (None, 0, false),
        };
        // One round trip: the last sent-mark and the release are one statement, so one
        // transaction, as when they were two statements of one.
        statement!(self, Operation::Other, "releasing a lease", |client| {
            async {
            execute(
                client,
                concat!(
                    // Delivered is a fact: the sent-mark of the last part delivered
                    // (never fenced, never backwards), when there is one.
                    "WITH sent AS (
                         UPDATE outbox SET
                             parts_sent = GREATEST(parts_sent, $5),
                             sent_at = CASE WHEN $6 AND sent_at IS NULL
                                            THEN COALESCE($7::int8, ", db_now!(), ") ELSE sent_at END
                         WHERE id = $4
                         RETURNING id)
                     ",
                    // Only our own claim is released: a lease taken over since stays
                    // with its holder.
                    "UPDATE leases SET holder = NULL WHERE resource = $1 AND holder = $2 AND token = $3"
                ),
                &[
                    &row.resource,
                    &giving_back.lease.holder.as_str(),
                    &giving_back.lease.token.0,
                    &outbox,
                    &parts,
                    &done,
                    &fixed,
                ],
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
        ENSURE_LEASE,
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

impl PostgresStore {
    /// The start of every write under a conversation's lease, in one round trip: the
    /// transaction's clock, the lease row checked and locked ([`ensure_lease`]'s
    /// fencing), then the conversation row locked `FOR UPDATE`, in that order (the
    /// one lock order: lease, conversation); the conversation's version. The three
    /// are prepared first and sent together (pipelined), and the server runs them in
    /// the order sent.
    pub(super) async fn fence(
        &self,
        tx: &Tx<'_>,
        lease: &Lease,
        row: &LeaseRow,
        conversation: crate::domain::ConversationId,
        caller: Timestamp,
    ) -> Result<(Now, i64), StoreError> {
        use super::sql::Context as _;
        use futures_util::future::{TryFutureExt, try_join3};

        let context = "checking the lease";
        let fixed = self.fixed_now(caller);
        let clock = tx
            .prepare_cached(concat!("SELECT COALESCE($1::int8, ", db_now!(), ")"))
            .await
            .ctx(context)?;
        let fencing = tx.prepare_cached(ENSURE_LEASE).await.ctx(context)?;
        let locking = tx
            .prepare_cached("SELECT version FROM conversations WHERE id = $1 FOR UPDATE")
            .await
            .ctx(context)?;
        let (clock, ours, version) = try_join3(
            tx.query_one(&clock, &[&fixed]),
            tx.query_opt(
                &fencing,
                &[
                    &row.resource,
                    &lease.holder.as_str(),
                    &lease.token.0,
                    &fixed,
                ],
            ),
            tx.query_opt(&locking, &[&conversation.0]),
        )
        .map_err(|e| super::sql::classify(context, &e))
        .await?;
        let now = self.now_read(Timestamp(clock.get(0)), caller);
        // Fencing: holder, token and expiry, locked for the rest of the transaction.
        if ours.is_none() {
            return Err(StoreError::LeaseLost(lease.key.clone()));
        }
        let version = version
            .map(|r| r.get(0))
            .ok_or(StoreError::NoConversation(conversation))?;
        Ok((now, version))
    }
}

/// The fencing check of [`ensure_lease`]: $1 resource, $2 holder, $3 token, $4 the
/// caller's clock when it drives time.
const ENSURE_LEASE: &str = concat!(
    "SELECT 1 FROM leases WHERE resource = $1 AND holder = $2 AND token = $3
       AND expires_at > COALESCE($4::int8, ",
    db_now!(),
    ") FOR UPDATE"
);

/// The compare-and-swap claim of `row`, on the database's clock: succeeds only if the
/// lease is free or expired (or has no row yet), and then bumps the fencing token.
/// One statement: with the lease, the time it was claimed at, on the clock used
/// (`fixed`, or the database's).
pub(super) async fn claim<C: deadpool_postgres::GenericClient>(
    client: &C,
    key: LeaseKey,
    holder: HolderId,
    row: &LeaseRow,
    ttl: Duration,
    fixed: Option<i64>,
) -> Result<Option<(Lease, Timestamp)>, StoreError> {
    let ttl = crate::domain::millis(ttl);
    // Exclusive: claim only a free or expired lease (compare-and-swap); every claim
    // bumps the fencing token. A claim that meets a concurrent one waits for it and
    // then decides on the row it left (ON CONFLICT DO UPDATE reads the latest row,
    // whatever the statement's snapshot), so two claimers never both win.
    let claimed = query_opt(
        client,
        concat!(
            "INSERT INTO leases AS l (resource, conversation_id, holder, token, expires_at)
             VALUES ($1, $5, $2, 1, COALESCE($4::int8, ",
            db_now!(),
            ") + $3)
             ON CONFLICT (resource) DO UPDATE
                 SET holder = excluded.holder, token = l.token + 1, expires_at = excluded.expires_at
                 WHERE l.holder IS NULL OR l.expires_at <= excluded.expires_at - $3
             RETURNING l.token, l.expires_at, l.expires_at - $3"
        ),
        &[
            &row.resource,
            &holder.as_str(),
            &ttl,
            &fixed,
            &row.conversation,
        ],
        "claiming a lease",
    )
    .await?;
    Ok(claimed.map(|r| {
        let lease = Lease {
            key,
            holder,
            token: LeaseToken(r.get(0)),
            expires_at: Timestamp(r.get(1)),
        };
        (lease, Timestamp(r.get(2)))
    }))
}

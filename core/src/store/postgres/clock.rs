//! The clock translation: a transaction's `now` on the database's clock (or the
//! caller's, when the caller drives time), and times moved between the two timelines.

use super::PostgresStore;
use super::sql::{Tx, query_one};
use crate::domain::Timestamp;
use crate::store::rules::StoredAt;
use crate::store::{OutboxRow, StoreError};

/// The database's clock in milliseconds since the Unix epoch, as SQL.
macro_rules! db_now {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::int8"
    };
}

/// Whose clock decides deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    /// Production: the database's clock, the one clock every replica shares.
    Database,
    /// Tests that drive time: the `now` each call is given.
    Caller,
}

/// The current time of one transaction, and how to move times between the caller's
/// timeline and the database's.
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    /// The time deadlines are stored and compared in.
    pub(super) db: Timestamp,
    /// The database's clock minus the caller's (0 when the caller is the clock).
    pub(super) offset: i64,
    /// The caller's `now` when the caller is the clock: what the lease statements
    /// compare with instead of `clock_timestamp()`.
    pub(super) fixed: Option<i64>,
}

impl Now {
    /// A time of the caller's (a retry deadline) on the database's timeline.
    pub(super) fn to_db(self, t: Timestamp) -> Timestamp {
        Timestamp(t.0.saturating_add(self.offset))
    }

    /// When a row stored in this transaction was stored, as the caller is told.
    pub(super) fn stored(self) -> StoredAt {
        StoredAt {
            created_at: self.to_caller(self.db),
            stored_at: self.db,
        }
    }

    /// A time of the database's (a timer's due time) on the caller's timeline.
    pub(super) fn to_caller(self, t: Timestamp) -> Timestamp {
        Timestamp(t.0.saturating_sub(self.offset))
    }
}

/// Outbox rows handed to the caller carry their creation time on its timeline (the
/// base of its delivery deadline, counted on its own clock). `stored_at` stays as
/// stored: it names the row, and this transaction's offset would move it.
pub(super) fn on_caller_timeline(rows: &mut [OutboxRow], now: Now) {
    for row in rows {
        row.created_at = now.to_caller(row.created_at);
    }
}

impl PostgresStore {
    /// What a one-statement call passes as its clock (`p_now`, or `COALESCE($n::int8,
    /// db_now!())`): the caller's `now` when the caller drives time, else `NULL`, and
    /// the statement reads the database's clock itself.
    pub(super) fn fixed_now(&self, caller: Timestamp) -> Option<i64> {
        match self.time {
            TimeSource::Caller => Some(caller.0),
            TimeSource::Database => None,
        }
    }

    /// The [`Now`] of a one-statement call that returned the time it used (`used`, on
    /// the database's timeline): the same translation [`PostgresStore::now`] gives a
    /// transaction, without a round trip of its own.
    pub(super) fn now_read(&self, used: Timestamp, caller: Timestamp) -> Now {
        match self.time {
            TimeSource::Caller => Now {
                db: caller,
                offset: 0,
                fixed: Some(caller.0),
            },
            TimeSource::Database => Now {
                db: used,
                offset: used.0 - caller.0,
                fixed: None,
            },
        }
    }

    /// The current time of the transaction `tx`: the database's clock, or the
    /// caller's `caller` when the caller drives time.
    pub(super) async fn now(&self, tx: &Tx<'_>, caller: Timestamp) -> Result<Now, StoreError> {
        match self.time {
            TimeSource::Caller => Ok(Now {
                db: caller,
                offset: 0,
                fixed: Some(caller.0),
            }),
            TimeSource::Database => {
                let db: i64 = query_one(
                    tx,
                    concat!("SELECT ", db_now!()),
                    &[],
                    "reading the database's clock",
                )
                .await?
                .get(0);
                Ok(Now {
                    db: Timestamp(db),
                    offset: db - caller.0,
                    fixed: None,
                })
            }
        }
    }
}

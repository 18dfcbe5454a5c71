//! The status area of the contract: what the operator's status page shows, read as
//! aggregates over indexed ranges (live leases, the last day of the outbox, the last
//! thirty days of replies), never a walk over every conversation or message.

use async_trait::async_trait;

#[cfg(doc)]
use crate::domain::ConversationId;
use crate::domain::Timestamp;
use crate::store::StoreError;

/// One hour, in milliseconds: the width of a bucket of [`StoreStatus::replies_per_hour`].
pub const HOUR_MS: i64 = 3_600_000;
/// One day, in milliseconds: the width of a bucket of [`StoreStatus::tokens_per_day`]
/// (UTC days).
pub const DAY_MS: i64 = 86_400_000;
/// Hours in [`StoreStatus::replies_per_hour`].
pub const HOURS: usize = 24;
/// Days in [`StoreStatus::tokens_per_day`].
pub const DAYS: usize = 30;

/// A lease on a platform connection or a replica slot, live at the time of the read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionLease {
    /// The lease row's name: `poller/telegram`, `poller/discord/shard-1`,
    /// `replica/discord/0`.
    pub resource: String,
    pub holder: String,
    /// Milliseconds since the Unix epoch, on the caller's timeline.
    pub expires_at: i64,
}

/// A process holding at least one live lease, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LiveHolder {
    pub holder: String,
    /// Conversations it is answering now (live conversation leases).
    pub conversations: u64,
    /// Platform connections and replica slots it holds ([`ConnectionLease::resource`]).
    pub connections: Vec<String>,
}

/// Counts over the last hour and the last 24 hours before the read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Recent {
    pub hour: u64,
    pub day: u64,
}

/// Tokens the model spent on one UTC day, by the replies committed that day.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DayTokens {
    /// `2026-12-01`.
    pub day: String,
    pub tokens: u64,
}

/// A conversation by the tokens its replies spent today (UTC): ids only, no text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConversationTokens {
    /// The conversation's row id ([`ConversationId`]).
    pub conversation: i64,
    pub platform: String,
    /// The platform's id of the chat.
    pub key: String,
    pub tokens: u64,
    pub replies: u64,
}

/// What the database knows of the whole deployment at one moment, as the status page
/// shows it. Every count is of rows in the store, so it covers every replica.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStatus {
    /// Conversations with messages waiting for a reply (a timer armed).
    pub pending: u64,
    /// Conversations being answered now: a live conversation lease.
    pub answering: u64,
    /// Pending conversations held by a limit (a rate hold or a spent budget) now.
    pub held: u64,
    /// Pending conversations whose last generation failed and that wait to try again.
    pub retrying: u64,
    /// Every process holding a live lease, by holder id.
    pub holders: Vec<LiveHolder>,
    /// Live leases of platform connections and replica slots, by resource.
    pub connections: Vec<ConnectionLease>,
    /// Replies delivered (marked sent).
    pub sent: Recent,
    /// Replies given up after their delivery kept failing.
    pub failed: Recent,
    /// Replies the model generated (committed with a model time).
    pub generated: Recent,
    /// Model failures the users were told of (one "model down" notice per failing batch).
    pub model_failures: Recent,
    /// Replies delivered per hour, oldest first; the last is the hour ending at the read.
    pub replies_per_hour: Vec<u64>,
    /// Tokens per UTC day, oldest first; the last is today.
    pub tokens_per_day: Vec<DayTokens>,
    /// Today's (UTC) most expensive conversations, most tokens first (ties by id).
    pub top_conversations: Vec<ConversationTokens>,
}

/// The rows a backend reads for [`StatusStore::status`], before they are put together
/// the same way for both ([`StatusRows::assemble`]). Times on the caller's timeline.
#[derive(Debug, Default)]
pub(crate) struct StatusRows {
    pub(crate) pending: u64,
    pub(crate) held: u64,
    pub(crate) retrying: u64,
    /// Live leases: resource, holder, expiry, whether it is a conversation's.
    pub(crate) leases: Vec<(String, String, Timestamp, bool)>,
    /// (hour bucket, replies sent) over the last 24 hours: bucket 0 is the oldest.
    pub(crate) sent: Vec<(i64, u64)>,
    /// (hour bucket, replies failed).
    pub(crate) failed: Vec<(i64, u64)>,
    /// (hour bucket, replies generated, model-down notices).
    pub(crate) created: Vec<(i64, u64, u64)>,
    /// (UTC epoch day, tokens).
    pub(crate) tokens: Vec<(i64, u64)>,
    pub(crate) top: Vec<ConversationTokens>,
}

/// The bounds of a status read, in the store's time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusBounds {
    /// Rows after this (exclusive) fall in the last 24 hours.
    pub(crate) day_ago: i64,
    /// The first millisecond of the oldest of the [`DAYS`] UTC days.
    pub(crate) first_day: i64,
    /// The first millisecond of today (UTC).
    pub(crate) today: i64,
}

impl StatusBounds {
    pub(crate) fn at(now: Timestamp) -> Self {
        let today = now.0.div_euclid(DAY_MS) * DAY_MS;
        StatusBounds {
            day_ago: now.0 - HOURS as i64 * HOUR_MS,
            first_day: today - (DAYS as i64 - 1) * DAY_MS,
            today,
        }
    }
}

/// The SQL expression of a time column's hour bucket: `(column - day_ago - 1) / 3600000`
/// with `day_ago` bound at `$n` (0 for the oldest hour; both backends divide integers).
macro_rules! hour_bucket {
    ($column:literal, $param:literal) => {
        concat!("(", $column, " - ", $param, " - 1) / 3600000")
    };
}
pub(crate) use hour_bucket;

impl StatusRows {
    /// The status as the page shows it, the same for every backend.
    pub(crate) fn assemble(self, now: Timestamp) -> StoreStatus {
        let bounds = StatusBounds::at(now);
        let hourly = |rows: &[(i64, u64)]| {
            let mut hours = vec![0u64; HOURS];
            for &(bucket, n) in rows {
                hours[bucket.clamp(0, HOURS as i64 - 1) as usize] += n;
            }
            hours
        };
        let recent = |hours: &[u64]| Recent {
            hour: hours.last().copied().unwrap_or(0),
            day: hours.iter().sum(),
        };
        let sent = hourly(&self.sent);
        let failed = hourly(&self.failed);
        let generated = hourly(
            &self
                .created
                .iter()
                .map(|&(b, g, _)| (b, g))
                .collect::<Vec<_>>(),
        );
        let model_failures = hourly(
            &self
                .created
                .iter()
                .map(|&(b, _, f)| (b, f))
                .collect::<Vec<_>>(),
        );
        let mut holders: std::collections::BTreeMap<String, LiveHolder> = Default::default();
        let mut connections = Vec::new();
        let mut answering = 0;
        for (resource, holder, expires_at, conversation) in self.leases {
            let entry = holders.entry(holder.clone()).or_insert_with(|| LiveHolder {
                holder: holder.clone(),
                conversations: 0,
                connections: Vec::new(),
            });
            if conversation {
                answering += 1;
                entry.conversations += 1;
            } else {
                entry.connections.push(resource.clone());
                connections.push(ConnectionLease {
                    resource,
                    holder,
                    expires_at: expires_at.0,
                });
            }
        }
        for holder in holders.values_mut() {
            holder.connections.sort();
        }
        connections.sort_by(|a, b| a.resource.cmp(&b.resource));
        let first_epoch_day = bounds.first_day / DAY_MS;
        let tokens_per_day = (0..DAYS as i64)
            .map(|i| {
                let day = first_epoch_day + i;
                DayTokens {
                    day: utc_day(day),
                    tokens: self
                        .tokens
                        .iter()
                        .filter(|&&(d, _)| d == day)
                        .map(|&(_, t)| t)
                        .sum(),
                }
            })
            .collect();
        StoreStatus {
            pending: self.pending,
            answering,
            held: self.held,
            retrying: self.retrying,
            holders: holders.into_values().collect(),
            connections,
            sent: recent(&sent),
            failed: recent(&failed),
            generated: recent(&generated),
            model_failures: recent(&model_failures),
            replies_per_hour: sent,
            tokens_per_day,
            top_conversations: self.top,
        }
    }
}

/// A UTC day since the Unix epoch, as `2026-12-01`.
fn utc_day(epoch_day: i64) -> String {
    jiff::Timestamp::from_millisecond(epoch_day * DAY_MS)
        .map(|t| t.strftime("%Y-%m-%d").to_string())
        .unwrap_or_else(|_| format!("day {epoch_day}"))
}

/// Status: the operator's read-only view of the whole deployment.
#[async_trait]
pub trait StatusStore: Send + Sync + 'static {
    /// What the database knows at `now` ([`StoreStatus`]), with at most `top`
    /// conversations in [`StoreStatus::top_conversations`]. Read-only and a few short
    /// statements, each a seek or a range scan on an index (live leases, timers held or
    /// retrying, the outbox of the last day and of the last thirty days): it takes no
    /// write lock and costs the same whatever the number of conversations and messages
    /// older than thirty days, so a round never waits for it.
    async fn status(&self, now: Timestamp, top: usize) -> Result<StoreStatus, StoreError>;
}

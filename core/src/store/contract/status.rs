//! The status area of the contract: what the operator's status page shows, read as
//! aggregates over indexed ranges (live leases, the last day of the outbox, thirty days
//! of the bot's token totals), never a walk over every conversation or message.
//!
//! Tokens are the wallet's totals (`token_usage`), the one count `/usage`, the budgets
//! and `lull_daily_tokens_used` read too: every model call is in it, a stopped or
//! dropped generation's as much as a delivered reply's, on days as the deployment's
//! time zone (`LULL_TIMEZONE`) names them.

use async_trait::async_trait;

use crate::domain::{ConversationId, Timestamp};
use crate::store::StoreError;

/// One hour, in milliseconds: the width of a bucket of [`StoreStatus::replies_per_hour`].
pub const HOUR_MS: i64 = 3_600_000;
/// One day, in milliseconds.
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

/// Tokens the model spent on one day (the deployment's time zone): the bot's total,
/// as `/usage` counts it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DayTokens {
    /// `2026-12-01`.
    pub day: String,
    pub tokens: u64,
    /// What they cost at `LULL_PRICES` (dollars in the JSON of `/api/status`).
    pub cost: crate::money::Usd,
}

/// A conversation by the tokens it spent today (its wallet total, as `/usage` shows an
/// admin), with the replies it got since today began: ids only, no text.
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
    /// Tokens and dollars per day, oldest first; the last is today.
    pub tokens_per_day: Vec<DayTokens>,
    /// Dollars the whole bot spent in the month of the last day so far (its
    /// `month:bot` total, what `LULL_MONTHLY_USD` counts against).
    pub month_cost: crate::money::Usd,
    /// Today's (UTC) most expensive conversations, most tokens first (ties by id).
    pub top_conversations: Vec<ConversationTokens>,
}

/// The bot's spend as both backends read it: (day, tokens, nano-dollars) of the asked
/// days that have any, and the month's nano-dollars so far.
pub(crate) type SpendRows = (Vec<(String, u64, u64)>, u64);

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
    /// (day, tokens, nano-dollars) of the bot's total, for the asked days that have any.
    pub(crate) tokens: Vec<(String, u64, u64)>,
    /// Nano-dollars of the bot's month so far (the month of the last asked day).
    pub(crate) month_cost: u64,
    pub(crate) top: Vec<ConversationTokens>,
}

/// What [`StatusStore::status`] is asked: the moment, how many top conversations, and
/// the days to show tokens for as the deployment's time zone names them (oldest first;
/// the last is today), with when today began there.
#[derive(Debug, Clone)]
pub struct StatusQuery {
    pub now: Timestamp,
    pub top: usize,
    pub days: Vec<String>,
    pub today_since: Timestamp,
}

/// The bot's token totals of `days` (`token_usage`, scope `bot`), a range of the
/// primary key: the first and last day of the range.
pub(crate) fn token_days(days: &[String]) -> (String, String) {
    (
        days.first().cloned().unwrap_or_default(),
        days.last().cloned().unwrap_or_default(),
    )
}

/// The month of the last of `days` (`2026-12`): the key of the bot's month row.
pub(crate) fn month_of(days: &[String]) -> String {
    days.last()
        .and_then(|d| d.get(..7))
        .unwrap_or_default()
        .to_owned()
}

/// The conversation a `conversation:PLATFORM:KEY` budget scope names.
pub(crate) fn scope_conversation(scope: &str) -> Option<(&str, &str)> {
    scope.strip_prefix("conversation:")?.split_once(':')
}

/// The bounds of a status read, in the store's time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusBounds {
    /// Rows after this (exclusive) fall in the last 24 hours.
    pub(crate) day_ago: i64,
}

impl StatusBounds {
    pub(crate) fn at(now: Timestamp) -> Self {
        StatusBounds {
            day_ago: now.0 - HOURS as i64 * HOUR_MS,
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
    /// The status as the page shows it, the same for every backend: `days` as asked.
    pub(crate) fn assemble(self, days: &[String]) -> StoreStatus {
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
        let tokens_per_day = days
            .iter()
            .map(|day| {
                let of_day = self.tokens.iter().filter(|(d, _, _)| d == day);
                DayTokens {
                    day: day.clone(),
                    tokens: of_day.clone().map(|&(_, t, _)| t).sum(),
                    cost: crate::money::Usd(of_day.map(|&(_, _, c)| c).sum()),
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
            month_cost: crate::money::Usd(self.month_cost),
            top_conversations: self.top,
        }
    }
}

/// Status: the operator's read-only view of the whole deployment.
#[async_trait]
pub trait StatusStore: Send + Sync + 'static {
    /// What the database knows at `asked.now` ([`StoreStatus`]), with at most
    /// `asked.top` conversations in [`StoreStatus::top_conversations`] and the tokens of
    /// `asked.days`. Read-only and a few short statements, each a seek or a range scan on
    /// an index (live leases, timers held or retrying, the outbox of the last day, the
    /// token totals of the asked days): it takes no write lock and costs the same
    /// whatever the number of conversations and messages, so a round never waits for it.
    async fn status(&self, asked: StatusQuery) -> Result<StoreStatus, StoreError>;

    /// The chats the operator's console lists (`/chats`), at most `limit`, the most
    /// recently written to first (chats with no message last), or only `only`: what
    /// the chat commands change, and whether each waits for or is being answered at
    /// `now`. Read-only; one pass over the conversations (a console's page, not a
    /// round's path).
    async fn chats(
        &self,
        only: Option<ConversationId>,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ChatRow>, StoreError>;

    /// The people who spent on `day` (the budgets' day), most tokens first, at most
    /// `limit`: their wallet totals (the console's people page). A seek on the day's
    /// index.
    async fn people_usage(&self, day: &str, limit: usize) -> Result<Vec<PersonUsage>, StoreError>;
}

/// What one person spent on a day, as the wallet counts it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PersonUsage {
    /// `platform:user_id`, as `LULL_ALLOWED_USERS` and `/allow` name them.
    pub user: String,
    pub tokens: u64,
    pub cost: crate::money::Usd,
}

/// People's totals from their `user:PLATFORM:ID` scopes' rows (scope, tokens,
/// nano-dollars), in order.
pub(crate) fn people_of(rows: Vec<(String, i64, i64)>) -> Vec<PersonUsage> {
    rows.into_iter()
        .filter_map(|(scope, tokens, cost)| {
            Some(PersonUsage {
                user: scope.strip_prefix("user:")?.to_owned(),
                tokens: tokens.max(0) as u64,
                cost: crate::money::Usd(cost.max(0) as u64),
            })
        })
        .collect()
}

/// A chat as the operator's console shows it: its choices (what `/model`, `/persona`
/// and `/prompt` set) and its state; never a message's text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChatRow {
    /// The conversation's row id ([`ConversationId`]), as `/chats/{id}` names it.
    pub id: i64,
    pub platform: String,
    /// The platform's id of the chat.
    pub key: String,
    /// Its name as its platform last showed it (`None`: never told).
    pub title: Option<String>,
    pub is_group: bool,
    pub model: Option<String>,
    pub persona: Option<String>,
    pub prompt: Option<String>,
    /// When its newest message arrived, on the caller's timeline (`None`: none yet).
    pub last_message_at: Option<i64>,
    /// Messages wait for a reply (a timer is armed).
    pub waiting: bool,
    /// A process is answering it now (a live conversation lease).
    pub answering: bool,
}

//! The status area on SQLite: the operator's view, read on a pooled reader connection
//! (never the writer, so a round's write never queues behind it).

use async_trait::async_trait;

use crate::store::{PersonUsage, people_of};
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::sql::Context;
use crate::domain::ConversationId;
use crate::domain::Timestamp;
use crate::store::contract::status::{
    StatusBounds, StatusRows, hour_bucket, month_of, scope_conversation, token_days,
};
use crate::store::{
    ChatRow, ConversationTokens, StatusQuery, StatusStore, StoreError, StoreStatus,
};

/// Live leases (index `leases_held`).
pub(super) const LIVE_LEASES_SQL: &str =
    "SELECT resource, holder, expires_at, conversation_id IS NOT NULL FROM leases
     WHERE holder IS NOT NULL AND expires_at > ?1";
/// Timers a limit holds now (index `timers_held`).
pub(super) const HELD_SQL: &str = "SELECT COUNT(*) FROM timers WHERE held_until > ?1";
/// Timers backing off after a failed generation (index `timers_retrying`).
pub(super) const RETRYING_SQL: &str = "SELECT COUNT(*) FROM timers WHERE attempts > 0";
/// Replies sent per hour of the last day (index `outbox_sent`).
pub(super) const SENT_SQL: &str = concat!(
    "SELECT ",
    hour_bucket!("sent_at", "?1"),
    ", COUNT(*) FROM outbox WHERE sent_at IS NOT NULL AND sent_at > ?1 AND kind = 'reply' GROUP BY 1"
);
/// Replies given up per hour of the last day (index `outbox_failed`).
pub(super) const FAILED_SQL: &str = concat!(
    "SELECT ",
    hour_bucket!("failed_at", "?1"),
    ", COUNT(*) FROM outbox WHERE failed_at IS NOT NULL AND failed_at > ?1 AND kind = 'reply' GROUP BY 1"
);
/// Replies generated and model-down notices per hour of the last day (index
/// `outbox_created`).
pub(super) const CREATED_SQL: &str = concat!(
    "SELECT ",
    hour_bucket!("created_at", "?1"),
    ", SUM(CASE WHEN kind = 'reply' AND llm_ms IS NOT NULL THEN 1 ELSE 0 END),
       SUM(CASE WHEN kind = 'notice' AND dedupe_key LIKE 'model-down/%' THEN 1 ELSE 0 END)
     FROM outbox WHERE created_at > ?1 GROUP BY 1"
);
/// The bot's token totals of a range of days (the primary key of `token_usage`).
pub(super) const TOKENS_SQL: &str =
    "SELECT day, tokens, cost FROM token_usage WHERE scope = 'bot' AND day >= ?1 AND day <= ?2";
/// The bot's dollars of a month so far (its `month:bot` row, by primary key).
pub(super) const MONTH_COST_SQL: &str =
    "SELECT COALESCE(MAX(cost), 0) FROM token_usage WHERE scope = 'month:bot' AND day = ?1";
/// Today's most expensive conversations by their budget scope (index
/// `token_usage_by_day`: one day's scopes, most tokens first).
pub(super) const TOP_SQL: &str = "SELECT scope, tokens FROM token_usage
     WHERE day = ?1 AND scope LIKE 'conversation:%' AND tokens > 0
     ORDER BY tokens DESC, scope LIMIT ?2";
/// A top conversation's row and the replies it got since today began (index
/// `outbox_history`: that conversation's replies).
pub(super) const TOP_ROW_SQL: &str = "SELECT c.id,
         (SELECT COUNT(*) FROM outbox o WHERE o.conversation_id = c.id AND o.kind = 'reply'
                                          AND o.created_at >= ?3)
     FROM conversations c WHERE c.platform = ?1 AND c.key = ?2";

/// The console's chats (`StatusStore::chats`): settings, newest message, state.
macro_rules! chats_select {
    () => {
        "SELECT c.id, c.platform, c.key, c.is_group, s.model, s.persona, s.prompt,
            (SELECT MAX(m.received_at) FROM messages m WHERE m.conversation_id = c.id) AS last_at,
            EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id),
            EXISTS (SELECT 1 FROM leases l WHERE l.conversation_id = c.id
                    AND l.holder IS NOT NULL AND l.expires_at > ?1),
            c.title
         FROM conversations c LEFT JOIN conversation_settings s ON s.conversation_id = c.id"
    };
}

/// Every chat, the most recently written to first (one pass over the conversations).
pub(super) const CHATS_SQL: &str = concat!(
    chats_select!(),
    " ORDER BY last_at IS NULL, last_at DESC, c.id DESC LIMIT ?2"
);

/// One chat, by its primary key (a console change looks its chat up so).
pub(super) const CHAT_SQL: &str = concat!(chats_select!(), " WHERE c.id = ?2");

/// A day's people by tokens (index `token_usage_by_day`).
pub(super) const PEOPLE_SQL: &str = "SELECT scope, tokens, cost FROM token_usage
     WHERE day = ?1 AND scope LIKE 'user:%' AND tokens > 0
     ORDER BY tokens DESC, scope LIMIT ?2";

#[async_trait]
impl StatusStore for SqliteStore {
    async fn people_usage(&self, day: &str, limit: usize) -> Result<Vec<PersonUsage>, StoreError> {
        let day = day.to_owned();
        self.with_conn(move |conn| {
            let rows: Vec<(String, i64, i64)> = conn
                .prepare_cached(PEOPLE_SQL)
                .ctx("reading the people's use")?
                .query_map(params![day, limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .ctx("reading the people's use")?
                .collect::<Result<_, _>>()
                .ctx("reading the people's use")?;
            Ok(people_of(rows))
        })
        .await
    }

    async fn chats(
        &self,
        only: Option<ConversationId>,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ChatRow>, StoreError> {
        let (sql, second) = match only {
            Some(chat) => (CHAT_SQL, chat.0),
            None => (CHATS_SQL, limit as i64),
        };
        self.with_conn(move |conn| {
            conn.prepare_cached(sql)
                .ctx("reading the chats")?
                .query_map(params![now.0, second], |r| {
                    Ok(ChatRow {
                        id: r.get(0)?,
                        platform: r.get(1)?,
                        key: r.get(2)?,
                        is_group: r.get(3)?,
                        model: r.get(4)?,
                        persona: r.get(5)?,
                        prompt: r.get(6)?,
                        last_message_at: r.get(7)?,
                        waiting: r.get(8)?,
                        answering: r.get(9)?,
                        title: r.get(10)?,
                    })
                })
                .ctx("reading the chats")?
                .collect::<Result<_, _>>()
                .ctx("reading the chats")
        })
        .await
    }

    async fn status(&self, asked: StatusQuery) -> Result<StoreStatus, StoreError> {
        self.with_conn(move |conn| {
            // One read transaction: every count is of the same snapshot.
            let tx = conn.transaction().ctx("starting a status read")?;
            let rows = read_status(&tx, &asked)?;
            tx.finish().ctx("ending a status read")?;
            Ok(rows.assemble(&asked.days))
        })
        .await
    }
}

fn read_status(conn: &Connection, asked: &StatusQuery) -> Result<StatusRows, StoreError> {
    let now = asked.now;
    let bounds = StatusBounds::at(now);
    let count = |sql: &str, args: &[&dyn rusqlite::ToSql], context: &'static str| {
        conn.prepare_cached(sql)
            .ctx(context)?
            .query_row(args, |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .ctx(context)
    };
    let pairs =
        |sql: &str, at: i64, context: &'static str| -> Result<Vec<(i64, u64)>, StoreError> {
            conn.prepare_cached(sql)
                .ctx(context)?
                .query_map([at], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
                })
                .ctx(context)?
                .collect::<Result<_, _>>()
                .ctx(context)
        };
    let leases = conn
        .prepare_cached(LIVE_LEASES_SQL)
        .ctx("reading live leases")?
        .query_map([now.0], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                Timestamp(r.get(2)?),
                r.get::<_, bool>(3)?,
            ))
        })
        .ctx("reading live leases")?
        .collect::<Result<_, _>>()
        .ctx("reading live leases")?;
    let created = conn
        .prepare_cached(CREATED_SQL)
        .ctx("counting generated replies")?
        .query_map([bounds.day_ago], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?.max(0) as u64,
                r.get::<_, i64>(2)?.max(0) as u64,
            ))
        })
        .ctx("counting generated replies")?
        .collect::<Result<_, _>>()
        .ctx("counting generated replies")?;
    let top = read_top(conn, asked)?;
    let (tokens, month_cost) = read_spend(conn, asked)?;
    Ok(StatusRows {
        // Kept by triggers on timers: one row, whatever the number of conversations.
        pending: count(
            "SELECT pending FROM stats WHERE id = 1",
            &[],
            "counting pending conversations",
        )?,
        held: count(HELD_SQL, &[&now.0], "counting held conversations")?,
        retrying: count(RETRYING_SQL, &[], "counting retrying conversations")?,
        leases,
        sent: pairs(SENT_SQL, bounds.day_ago, "counting sent replies")?,
        failed: pairs(FAILED_SQL, bounds.day_ago, "counting failed replies")?,
        created,
        tokens,
        month_cost,
        top,
    })
}

/// The bot's spend: its tokens and dollars on each asked day, and its month so far
/// (both by `token_usage`'s primary key).
fn read_spend(
    conn: &Connection,
    asked: &StatusQuery,
) -> Result<crate::store::contract::status::SpendRows, StoreError> {
    let (first, last) = token_days(&asked.days);
    let tokens = conn
        .prepare_cached(TOKENS_SQL)
        .ctx("counting tokens per day")?
        .query_map(params![first, last], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?.max(0) as u64,
                r.get::<_, i64>(2)?.max(0) as u64,
            ))
        })
        .ctx("counting tokens per day")?
        .collect::<Result<_, _>>()
        .ctx("counting tokens per day")?;
    let month_cost = conn
        .prepare_cached(MONTH_COST_SQL)
        .ctx("counting the month's cost")?
        .query_row([month_of(&asked.days)], |r| r.get::<_, i64>(0))
        .ctx("counting the month's cost")?
        .max(0) as u64;
    Ok((tokens, month_cost))
}

/// Today's most expensive conversations: their budget scopes' totals, then each one's
/// row and replies (at most `asked.top` seeks).
fn read_top(conn: &Connection, asked: &StatusQuery) -> Result<Vec<ConversationTokens>, StoreError> {
    let context = "reading today's top conversations";
    let today = asked.days.last().cloned().unwrap_or_default();
    let scopes: Vec<(String, u64)> = conn
        .prepare_cached(TOP_SQL)
        .ctx(context)?
        .query_map(params![today, asked.top as i64], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
        })
        .ctx(context)?
        .collect::<Result<_, _>>()
        .ctx(context)?;
    let mut top = Vec::with_capacity(scopes.len());
    for (scope, tokens) in scopes {
        let Some((platform, key)) = scope_conversation(&scope) else {
            continue;
        };
        let row: Option<(i64, i64)> = conn
            .prepare_cached(TOP_ROW_SQL)
            .ctx(context)?
            .query_row(params![platform, key, asked.today_since.0], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .ctx(context)?;
        if let Some((conversation, replies)) = row {
            top.push(ConversationTokens {
                conversation,
                platform: platform.to_owned(),
                key: key.to_owned(),
                tokens,
                replies: replies.max(0) as u64,
            });
        }
    }
    Ok(top)
}

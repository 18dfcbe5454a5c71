//! The status area on SQLite: the operator's view, read on a pooled reader connection
//! (never the writer, so a round's write never queues behind it).

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::SqliteStore;
use super::sql::Context;
use crate::domain::Timestamp;
use crate::store::contract::status::{StatusBounds, StatusRows, hour_bucket};
use crate::store::{ConversationTokens, StatusStore, StoreError, StoreStatus};

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
/// Tokens per UTC day of the last thirty (index `outbox_created`).
pub(super) const TOKENS_SQL: &str = "SELECT created_at / 86400000,
         SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0))
     FROM outbox WHERE created_at >= ?1 AND kind = 'reply' GROUP BY 1";
/// Today's most expensive conversations (index `outbox_created`, named: the planner
/// would rather walk the whole outbox in conversation order to group it without a sort).
pub(super) const TOP_SQL: &str =
    "SELECT t.conversation_id, c.platform, c.key, t.tokens, t.replies FROM (
         SELECT conversation_id,
                SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)) AS tokens,
                COUNT(*) AS replies
         FROM outbox INDEXED BY outbox_created
         WHERE created_at >= ?1 AND kind = 'reply' GROUP BY conversation_id) t
     JOIN conversations c ON c.id = t.conversation_id
     WHERE t.tokens > 0
     ORDER BY t.tokens DESC, t.conversation_id LIMIT ?2";

#[async_trait]
impl StatusStore for SqliteStore {
    async fn status(&self, now: Timestamp, top: usize) -> Result<StoreStatus, StoreError> {
        self.with_conn(move |conn| {
            // One read transaction: every count is of the same snapshot.
            let tx = conn.transaction().ctx("starting a status read")?;
            let rows = read_status(&tx, now, top)?;
            tx.finish().ctx("ending a status read")?;
            Ok(rows.assemble(now))
        })
        .await
    }
}

fn read_status(conn: &Connection, now: Timestamp, top: usize) -> Result<StatusRows, StoreError> {
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
    let top = conn
        .prepare_cached(TOP_SQL)
        .ctx("reading today's top conversations")?
        .query_map(params![bounds.today, top as i64], |r| {
            Ok(ConversationTokens {
                conversation: r.get(0)?,
                platform: r.get(1)?,
                key: r.get(2)?,
                tokens: r.get::<_, i64>(3)?.max(0) as u64,
                replies: r.get::<_, i64>(4)?.max(0) as u64,
            })
        })
        .ctx("reading today's top conversations")?
        .collect::<Result<_, _>>()
        .ctx("reading today's top conversations")?;
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
        tokens: pairs(TOKENS_SQL, bounds.first_day, "counting tokens per day")?
            .into_iter()
            .collect(),
        top,
    })
}

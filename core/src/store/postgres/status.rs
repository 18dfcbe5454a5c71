//! The status area on PostgreSQL: the operator's view in one read-only transaction.
//! Times are compared on the database's timeline and lease expiries handed back on the
//! caller's (`clock.rs`).

use async_trait::async_trait;

use crate::store::{PersonUsage, people_of};

use super::PostgresStore;
use super::sql::{Tx, query, query_one, query_opt};
use crate::domain::ConversationId;
use crate::domain::Timestamp;
use crate::store::contract::status::{
    StatusBounds, StatusRows, hour_bucket, month_of, scope_conversation, token_days,
};
use crate::store::faults::Operation;
use crate::store::{
    ChatRow, ConversationTokens, StatusQuery, StatusStore, StoreError, StoreStatus,
};

/// The console's chats (`StatusStore::chats`): settings, newest message, state.
macro_rules! chats_select {
    () => {
        "SELECT c.id, c.platform, c.key, c.is_group, s.model, s.persona, s.prompt,
            (SELECT MAX(m.received_at) FROM messages m WHERE m.conversation_id = c.id) AS last_at,
            EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id),
            EXISTS (SELECT 1 FROM leases l WHERE l.conversation_id = c.id
                    AND l.holder IS NOT NULL AND l.expires_at > $1),
            c.title
         FROM conversations c LEFT JOIN conversation_settings s ON s.conversation_id = c.id"
    };
}

/// Every chat, the most recently written to first (one pass over the conversations).
const CHATS_SQL: &str = concat!(
    chats_select!(),
    " ORDER BY last_at DESC NULLS LAST, c.id DESC LIMIT $2"
);

/// One chat, by its primary key (a console change looks its chat up so).
const CHAT_SQL: &str = concat!(chats_select!(), " WHERE c.id = $2");

#[async_trait]
impl StatusStore for PostgresStore {
    async fn people_usage(&self, day: &str, limit: usize) -> Result<Vec<PersonUsage>, StoreError> {
        transaction!(self, Operation::Read, "reading the people's use", |tx| {
            async {
                let rows = query(
                    &tx,
                    "SELECT scope, tokens, cost FROM token_usage
                 WHERE day = $1 AND scope LIKE 'user:%' AND tokens > 0
                 ORDER BY tokens DESC, scope LIMIT $2",
                    &[&day, &(limit as i64)],
                    "reading the people's use",
                )
                .await?;
                Ok(people_of(
                    rows.into_iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2)))
                        .collect(),
                ))
            }
            .await
        })
    }

    async fn chats(
        &self,
        only: Option<ConversationId>,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ChatRow>, StoreError> {
        transaction!(self, Operation::Read, "reading the chats", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                // One chat by its primary key, or every chat in one pass.
                let (sql, second) = match only {
                    Some(chat) => (CHAT_SQL, chat.0),
                    None => (CHATS_SQL, limit as i64),
                };
                let rows = query(&tx, sql, &[&now.db.0, &second], "reading the chats").await?;
                Ok(rows
                    .into_iter()
                    .map(|r| ChatRow {
                        id: r.get(0),
                        platform: r.get(1),
                        key: r.get(2),
                        is_group: r.get(3),
                        model: r.get(4),
                        persona: r.get(5),
                        prompt: r.get(6),
                        last_message_at: r
                            .get::<_, Option<i64>>(7)
                            .map(|at| now.to_caller(Timestamp(at)).0),
                        waiting: r.get(8),
                        answering: r.get(9),
                        title: r.get(10),
                    })
                    .collect())
            }
            .await
        })
    }

    async fn status(&self, asked: StatusQuery) -> Result<StoreStatus, StoreError> {
        transaction!(self, Operation::Read, "reading the status", |tx| {
            async {
            let now = self.now(&tx, asked.now).await?;
            let bounds = StatusBounds::at(now.db);
            let count = |row: tokio_postgres::Row| row.get::<_, i64>(0).max(0) as u64;
            let pairs = |rows: Vec<tokio_postgres::Row>| -> Vec<(i64, u64)> {
                rows.into_iter()
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1).max(0) as u64))
                    .collect()
            };
            // Kept by triggers on timers: sixteen rows, whatever the number of conversations.
            let pending = count(
                query_one(
                    &tx,
                    "SELECT COALESCE(SUM(pending), 0)::int8 FROM pending_shards",
                    &[],
                    "counting pending conversations",
                )
                .await?,
            );
            // Index timers_held, index timers_retrying.
            let held = count(
                query_one(
                    &tx,
                    "SELECT COUNT(*) FROM timers WHERE held_until > $1",
                    &[&now.db.0],
                    "counting held conversations",
                )
                .await?,
            );
            let retrying = count(
                query_one(
                    &tx,
                    "SELECT COUNT(*) FROM timers WHERE attempts > 0",
                    &[],
                    "counting retrying conversations",
                )
                .await?,
            );
            // Index leases_held: the live leases only.
            let leases = query(
                &tx,
                "SELECT resource, holder, expires_at, conversation_id IS NOT NULL FROM leases
                 WHERE holder IS NOT NULL AND expires_at > $1",
                &[&now.db.0],
                "reading live leases",
            )
            .await?
            .into_iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    now.to_caller(Timestamp(r.get(2))),
                    r.get::<_, bool>(3),
                )
            })
            .collect();
            // Index outbox_sent, outbox_failed, outbox_created: the last day of rows.
            let sent = pairs(
                query(
                    &tx,
                    concat!(
                        "SELECT ",
                        hour_bucket!("sent_at", "$1"),
                        ", COUNT(*) FROM outbox WHERE sent_at IS NOT NULL AND sent_at > $1 AND kind = 'reply' GROUP BY 1"
                    ),
                    &[&bounds.day_ago],
                    "counting sent replies",
                )
                .await?,
            );
            let failed = pairs(
                query(
                    &tx,
                    concat!(
                        "SELECT ",
                        hour_bucket!("failed_at", "$1"),
                        ", COUNT(*) FROM outbox WHERE failed_at IS NOT NULL AND failed_at > $1 AND kind = 'reply' GROUP BY 1"
                    ),
                    &[&bounds.day_ago],
                    "counting failed replies",
                )
                .await?,
            );
            let created = query(
                &tx,
                concat!(
                    "SELECT ",
                    hour_bucket!("created_at", "$1"),
                    ", COUNT(*) FILTER (WHERE kind = 'reply' AND llm_ms IS NOT NULL),
                       COUNT(*) FILTER (WHERE kind = 'notice' AND dedupe_key LIKE 'model-down/%')
                     FROM outbox WHERE created_at > $1 GROUP BY 1"
                ),
                &[&bounds.day_ago],
                "counting generated replies",
            )
            .await?
            .into_iter()
            .map(|r| {
                (
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1).max(0) as u64,
                    r.get::<_, i64>(2).max(0) as u64,
                )
            })
            .collect();
            let (tokens, month_cost) = read_spend(&tx, &asked).await?;
            let top = read_top(&tx, &asked, now.to_db(asked.today_since)).await?;
            Ok(StatusRows {
                pending,
                held,
                retrying,
                leases,
                sent,
                failed,
                created,
                tokens,
                month_cost,
                top,
            }
            .assemble(&asked.days))
        }
        .await
        })
    }
}

/// The bot's spend: its tokens and dollars on each asked day (the primary key of
/// `token_usage`), and its month so far (its month row, by primary key).
async fn read_spend(
    tx: &Tx<'_>,
    asked: &StatusQuery,
) -> Result<crate::store::contract::status::SpendRows, StoreError> {
    let (first, last) = token_days(&asked.days);
    let tokens = query(
        tx,
        "SELECT day, tokens, cost FROM token_usage WHERE scope = 'bot' AND day >= $1 AND day <= $2",
        &[&first, &last],
        "counting tokens per day",
    )
    .await?
    .into_iter()
    .map(|r| {
        (
            r.get::<_, String>(0),
            r.get::<_, i64>(1).max(0) as u64,
            r.get::<_, i64>(2).max(0) as u64,
        )
    })
    .collect();
    let month_cost = query_one(
        tx,
        "SELECT COALESCE(MAX(cost), 0)::int8 FROM token_usage WHERE scope = 'month:bot' AND day = $1",
        &[&month_of(&asked.days)],
        "counting the month's cost",
    )
    .await?
    .get::<_, i64>(0)
    .max(0) as u64;
    Ok((tokens, month_cost))
}

/// Today's most expensive conversations: their budget scopes' totals (index
/// `token_usage_by_day`), then each one's row and the replies it got since
/// `since` (index `outbox_history`), at most `asked.top` seeks.
async fn read_top(
    tx: &Tx<'_>,
    asked: &StatusQuery,
    since: Timestamp,
) -> Result<Vec<ConversationTokens>, StoreError> {
    let context = "reading today's top conversations";
    let today = asked.days.last().cloned().unwrap_or_default();
    let scopes = query(
        tx,
        "SELECT scope, tokens FROM token_usage
         WHERE day = $1 AND scope LIKE 'conversation:%' AND tokens > 0
         ORDER BY tokens DESC, scope LIMIT $2",
        &[&today, &(asked.top as i64)],
        context,
    )
    .await?;
    let mut top = Vec::with_capacity(scopes.len());
    for row in scopes {
        let scope: String = row.get(0);
        let tokens = row.get::<_, i64>(1).max(0) as u64;
        let Some((platform, key)) = scope_conversation(&scope) else {
            continue;
        };
        let found = query_opt(
            tx,
            "SELECT c.id,
                 (SELECT COUNT(*) FROM outbox o WHERE o.conversation_id = c.id AND o.kind = 'reply'
                                                  AND o.created_at >= $3)
             FROM conversations c WHERE c.platform = $1 AND c.key = $2",
            &[&platform, &key, &since.0],
            context,
        )
        .await?;
        if let Some(found) = found {
            top.push(ConversationTokens {
                conversation: found.get(0),
                platform: platform.to_owned(),
                key: key.to_owned(),
                tokens,
                replies: found.get::<_, i64>(1).max(0) as u64,
            });
        }
    }
    Ok(top)
}

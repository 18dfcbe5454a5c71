//! The status area on PostgreSQL: the operator's view in one read-only transaction.
//! Times are compared on the database's timeline and lease expiries handed back on the
//! caller's (`clock.rs`).

use async_trait::async_trait;

use super::PostgresStore;
use super::sql::{query, query_one};
use crate::domain::Timestamp;
use crate::store::contract::status::{StatusBounds, StatusRows, hour_bucket};
use crate::store::faults::Operation;
use crate::store::{ConversationTokens, StatusStore, StoreError, StoreStatus};

#[async_trait]
impl StatusStore for PostgresStore {
    async fn status(&self, now: Timestamp, top: usize) -> Result<StoreStatus, StoreError> {
        let top = top as i64;
        transaction!(self, Operation::Read, "reading the status", |tx| {
            async {
            let now = self.now(&tx, now).await?;
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
            // Index outbox_created: thirty days of rows.
            let tokens = pairs(
                query(
                    &tx,
                    "SELECT created_at / 86400000,
                         SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0))::int8
                     FROM outbox WHERE created_at >= $1 AND kind = 'reply' GROUP BY 1",
                    &[&bounds.first_day],
                    "counting tokens per day",
                )
                .await?,
            );
            let top = query(
                &tx,
                "SELECT t.conversation_id, c.platform, c.key, t.tokens, t.replies FROM (
                     SELECT conversation_id,
                            SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0))::int8 AS tokens,
                            COUNT(*) AS replies
                     FROM outbox WHERE created_at >= $1 AND kind = 'reply' GROUP BY conversation_id) t
                 JOIN conversations c ON c.id = t.conversation_id
                 WHERE t.tokens > 0
                 ORDER BY t.tokens DESC, t.conversation_id LIMIT $2",
                &[&bounds.today, &top],
                "reading today's top conversations",
            )
            .await?
            .into_iter()
            .map(|r| ConversationTokens {
                conversation: r.get(0),
                platform: r.get(1),
                key: r.get(2),
                tokens: r.get::<_, i64>(3).max(0) as u64,
                replies: r.get::<_, i64>(4).max(0) as u64,
            })
            .collect();
            Ok(StatusRows {
                pending,
                held,
                retrying,
                leases,
                sent,
                failed,
                created,
                tokens,
                top,
            }
            .assemble(now.db))
        }
        .await
        })
    }
}

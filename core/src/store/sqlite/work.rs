//! The work area on SQLite: due work, settled conversations, the gauge, health.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::sql::Context;
use super::sql::placeholders;
use crate::domain::{ConversationId, ConversationRef, Timestamp};
use crate::store::rules::DueScan;
use crate::store::{DueWork, StoreError, WorkQuery, WorkStore};

#[async_trait]
impl WorkStore for SqliteStore {
    async fn due_work(&self, query: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError> {
        if query.platforms.is_empty() {
            return Ok(DueWork::default());
        }
        let names: Vec<&'static str> = query.platforms.iter().map(|p| p.as_str()).collect();
        let holder = query.holder.as_str().to_owned();
        let handoff = crate::domain::millis(query.handoff);
        let limit = query.limit as i64;
        self.with_conn(move |conn| {
            // Every part is a range scan or a seek on an index over what is due by now
            // (work ready or in progress), never a walk over every conversation or
            // future timer, so a pass costs the same whatever the database holds.
            // Parameters: ?1 now, ?2 (unused), ?3 this holder, ?4 hand-off, ?5… platforms.
            let list = placeholders(5, names.len());
            // Due by now (index timers_due; index outbox_due for outbox heads, rows
            // with no undelivered row before them: delivery keeps outbox order). Work
            // armed or owned by another process is due here a hand-off later: that
            // process is woken in-process, this one takes over only if it does not.
            let candidates = due_candidates_sql(&list);
            let future = next_deadline_sql(&list);
            let mut values: Vec<rusqlite::types::Value> =
                vec![now.0.into(), 0i64.into(), holder.into(), handoff.into()];
            values.extend(
                names
                    .iter()
                    .map(|n| rusqlite::types::Value::from(n.to_string())),
            );
            let mut scan = DueScan::new(now.0);
            {
                let mut stmt = conn.prepare_cached(&candidates).ctx("finding due work")?;
                let mut rows = stmt
                    .query(rusqlite::params_from_iter(values.iter()))
                    .ctx("finding due work")?;
                while let Some(row) = rows.next().ctx("finding due work")? {
                    let conversation = ConversationId(row.get(0).ctx("finding due work")?);
                    let at: i64 = row.get(1).ctx("finding due work")?;
                    let holder: Option<String> = row.get(2).ctx("finding due work")?;
                    let expires_at: Option<i64> = row.get(3).ctx("finding due work")?;
                    scan.candidate(conversation, at, holder.is_some(), expires_at);
                }
            }
            let mut stmt = conn
                .prepare_cached(&future)
                .ctx("finding the next deadline")?;
            if let Some(at) = stmt
                .query_row(rusqlite::params_from_iter(values.iter()), |r| {
                    r.get::<_, Option<i64>>(0)
                })
                .ctx("finding the next deadline")?
            {
                scan.sooner(at);
            }
            let (ready, next_at) = scan.finish(limit as usize);
            Ok(DueWork {
                ready,
                next_at: next_at.map(Timestamp),
            })
        })
        .await
    }

    async fn is_settled(&self, conversation: &ConversationRef) -> Result<Option<bool>, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            conn.prepare_cached(
                "SELECT c.version = c.answered_version
                        AND NOT EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id)
                        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.conversation_id = c.id
                                        AND o.sent_at IS NULL AND o.failed_at IS NULL)
                 FROM conversations c WHERE c.platform = ?1 AND c.key = ?2",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![conversation.platform.as_str(), conversation.key],
                |r| r.get(0),
            )
            .optional()
            .ctx("checking whether a conversation is settled")
        })
        .await
    }

    async fn awaits_reply(&self, conversation: &ConversationRef) -> Result<bool, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            conn.prepare_cached(
                "SELECT c.version <> c.answered_version
                        OR EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id)
                 FROM conversations c WHERE c.platform = ?1 AND c.key = ?2",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![conversation.platform.as_str(), conversation.key],
                |r| r.get(0),
            )
            .optional()
            .map(|waits| waits.unwrap_or(false))
            .ctx("checking whether a conversation waits for a reply")
        })
        .await
    }

    async fn pending_conversations(&self) -> Result<u64, StoreError> {
        self.with_conn(|conn| {
            // Kept by triggers on timers: one row, whatever the number of conversations.
            conn.prepare_cached("SELECT pending FROM stats WHERE id = 1")
                .ctx("preparing a statement")?
                .query_row([], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .ctx("counting pending conversations")
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // A read that reaches the file's tables, not just the connection.
        self.with_conn(|conn| {
            conn.prepare_cached(
                "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM conversations LIMIT 1))
                      + (SELECT COUNT(*) FROM (SELECT 1 FROM timers LIMIT 1))",
            )
            .ctx("preparing a statement")?
            .query_row([], |r| r.get::<_, i64>(0))
            .map(drop)
            .ctx("reading the database")
        })
        .await?;
        self.condition.check()
    }

    async fn checkpoint(&self) -> Result<(), StoreError> {
        // Through the writer's queue: after every write queued before it.
        self.writer.checkpoint().await
    }
}

/// Conversations with work due by `?1` (timers due, outbox heads due), with their
/// lease; `list`: the platform placeholders. Every part is a range scan or a seek
/// over what is due (index `timers_due`; index `outbox_due` walked first, then the
/// conversation by its key: `INDEXED BY` and `CROSS JOIN` fix that order, which the
/// planner, without statistics, would otherwise turn into a walk over every
/// conversation of the platform), so a pass costs the same whatever the database holds.
pub(super) fn due_candidates_sql(list: &str) -> String {
    format!(
        "SELECT g.conversation_id, g.at, l.holder, l.expires_at FROM (
             SELECT conversation_id, MIN(at) AS at FROM (
                 SELECT conversation_id,
                        due_at + CASE WHEN armed_by = ?3 THEN 0 ELSE ?4 END AS at
                 FROM timers WHERE platform IN ({list}) AND due_at <= ?1
                 UNION ALL
                 SELECT o.conversation_id,
                        o.next_attempt_at + CASE WHEN o.owner = ?3 THEN 0 ELSE ?4 END
                 FROM outbox o INDEXED BY outbox_due CROSS JOIN conversations c ON c.id = o.conversation_id
                 WHERE o.sent_at IS NULL AND o.failed_at IS NULL
                   AND o.next_attempt_at <= ?1 AND c.platform IN ({list})
                   AND NOT EXISTS (SELECT 1 FROM outbox p
                                   WHERE p.conversation_id = o.conversation_id
                                     AND p.id < o.id
                                     AND p.sent_at IS NULL AND p.failed_at IS NULL))
             GROUP BY conversation_id) g
         LEFT JOIN leases l ON l.conversation_id = g.conversation_id"
    )
}

/// The earliest future timer and outbox retry: one index seek each.
pub(super) fn next_deadline_sql(list: &str) -> String {
    format!(
        "SELECT MIN(at) FROM (
             SELECT MIN(due_at) AS at FROM timers
             WHERE platform IN ({list}) AND due_at > ?1
             UNION ALL
             SELECT MIN(next_attempt_at) FROM outbox
             WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at > ?1)"
    )
}

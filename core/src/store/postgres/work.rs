//! The work area on PostgreSQL: due work, settled conversations, the gauge, health.

use std::sync::Arc;

use async_trait::async_trait;

use super::PostgresStore;
use super::sql::{query, query_one, query_opt};
use crate::domain::{ConversationId, ConversationRef, Timestamp};
use crate::store::faults::Operation;
use crate::store::rules::DueScan;
use crate::store::{DueWork, StoreError, WorkQuery, WorkStore};

#[async_trait]
impl WorkStore for PostgresStore {
    async fn due_work(&self, work: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError> {
        if work.platforms.is_empty() {
            return Ok(DueWork::default());
        }
        self.served.set(&work.platforms);
        // What the benchmark divides by the messages ingested: flat in the number of
        // replicas when announcements do not fan out.
        metrics::counter!(crate::metrics::DUE_WORK_QUERIES).increment(1);
        let names: Vec<&str> = work.platforms.iter().map(|p| p.as_str()).collect();
        let handoff = crate::domain::millis(work.handoff);
        transaction!(self, Operation::Read, "finding due work", |tx| async {
            let now = self.now(&tx, now).await?;
            // Every part is a range scan or a seek on an index over what is due by now,
            // never a walk over every conversation or future timer. Work armed or owned
            // by another process is due here a hand-off later (its owner is woken
            // in-process). $1 now, $2 this holder, $3 hand-off, $4 platforms.
            let candidates = query(
                &tx,
                "SELECT g.conversation_id, g.at, l.holder, l.expires_at FROM (
                     SELECT conversation_id, MIN(at) AS at FROM (
                         SELECT conversation_id,
                                due_at + CASE WHEN armed_by = $2 THEN 0 ELSE $3::int8 END AS at
                         FROM timers WHERE platform = ANY($4) AND due_at <= $1
                         UNION ALL
                         SELECT o.conversation_id,
                                o.next_attempt_at + CASE WHEN o.owner = $2 THEN 0 ELSE $3::int8 END
                         FROM outbox o JOIN conversations c ON c.id = o.conversation_id
                         WHERE o.sent_at IS NULL AND o.failed_at IS NULL
                           AND o.next_attempt_at <= $1 AND c.platform = ANY($4)
                           AND NOT EXISTS (SELECT 1 FROM outbox p
                                           WHERE p.conversation_id = o.conversation_id
                                             AND p.id < o.id
                                             AND p.sent_at IS NULL AND p.failed_at IS NULL)) d
                     GROUP BY conversation_id) g
                 LEFT JOIN leases l ON l.conversation_id = g.conversation_id",
                &[&now.db.0, &work.holder.as_str(), &handoff, &names],
                "finding due work",
            )
            .await?;
            let mut scan = DueScan::new(now.db.0);
            for row in candidates {
                let conversation = ConversationId(row.get(0));
                let at: i64 = row.get(1);
                let holder: Option<String> = row.get(2);
                let expires_at: Option<i64> = row.get(3);
                scan.candidate(conversation, at, holder.is_some(), expires_at);
            }
            // The earliest future timer (one index seek per platform: a seek cannot
            // span several platforms of the (platform, due_at) index) and outbox
            // retry (one seek).
            let future = query_one(
                &tx,
                "SELECT LEAST(
                     (SELECT MIN(t.due_at) FROM unnest($2::text[]) AS p (platform)
                      CROSS JOIN LATERAL (SELECT due_at FROM timers
                                          WHERE platform = p.platform AND due_at > $1
                                          ORDER BY due_at LIMIT 1) t),
                     (SELECT MIN(next_attempt_at) FROM outbox
                      WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at > $1))",
                &[&now.db.0, &names],
                "finding the next deadline",
            )
            .await?;
            if let Some(at) = future.get::<_, Option<i64>>(0) {
                scan.sooner(at);
            }
            let (ready, next_at) = scan.finish(work.limit);
            Ok(DueWork {
                ready,
                // On the caller's timeline: when its scheduler should look again.
                next_at: next_at.map(|at| now.to_caller(Timestamp(at))),
            })
        }
        .await)
    }

    async fn is_settled(&self, conversation: &ConversationRef) -> Result<Option<bool>, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "checking whether a conversation is settled",
            |tx| async {
                let row = query_opt(
                    &tx,
                    "SELECT c.version = c.answered_version
                        AND NOT EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id)
                        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.conversation_id = c.id
                                        AND o.sent_at IS NULL AND o.failed_at IS NULL)
                 FROM conversations c WHERE c.platform = $1 AND c.key = $2",
                    &[&conversation.platform.as_str(), &conversation.key],
                    "checking whether a conversation is settled",
                )
                .await?;
                Ok(row.map(|r| r.get(0)))
            }
            .await
        )
    }

    async fn awaits_reply(&self, conversation: &ConversationRef) -> Result<bool, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "checking whether a conversation waits for a reply",
            |tx| async {
                let row = query_opt(
                    &tx,
                    "SELECT c.version <> c.answered_version
                        OR EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id)
                 FROM conversations c WHERE c.platform = $1 AND c.key = $2",
                    &[&conversation.platform.as_str(), &conversation.key],
                    "checking whether a conversation waits for a reply",
                )
                .await?;
                Ok(row.is_some_and(|r| r.get(0)))
            }
            .await
        )
    }

    async fn pending_conversations(&self) -> Result<u64, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "counting pending conversations",
            |tx| async {
                // Kept by triggers on timers: sixteen rows, whatever the number of conversations.
                let row = query_one(
                    &tx,
                    "SELECT COALESCE(SUM(pending), 0)::int8 FROM pending_shards",
                    &[],
                    "counting pending conversations",
                )
                .await?;
                Ok(row.get::<_, i64>(0).max(0) as u64)
            }
            .await
        )
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // A read that reaches the tables, not just the connection.
        transaction!(self, Operation::Read, "reading the database", |tx| async {
            query(
                &tx,
                "SELECT 1 FROM conversations LIMIT 1",
                &[],
                "reading the database",
            )
            .await?;
            Ok(())
        }
        .await)?;
        self.condition.check()
    }

    fn wake_ups(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.armed.clone())
    }
}

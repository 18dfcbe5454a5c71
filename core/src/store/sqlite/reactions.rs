//! The reactions area on SQLite: one ack reaction per pending burst.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::sql::Context;
use crate::store::{AckOf, AcksCovered};
use crate::store::{ReactionStore, StoreError};

#[async_trait]
impl ReactionStore for SqliteStore {
    async fn claim_ack(&self, asked: AckOf<'_>) -> Result<bool, StoreError> {
        let message_id = asked.message_id.to_owned();
        self.write("claiming an ack reaction", move |tx| {
            // Once per burst: unique on (conversation, answered_version), and only for
            // a message still pending.
            let claimed = tx
                .prepare_cached(
                    "INSERT INTO acks (conversation_id, burst, platform_message_id)
                     SELECT c.id, c.answered_version, ?2 FROM conversations c
                     WHERE c.id = ?1 AND EXISTS (
                         SELECT 1 FROM messages m
                         WHERE m.conversation_id = c.id AND m.platform_message_id = ?2
                           AND m.version > c.answered_version)
                     ON CONFLICT (conversation_id, burst) DO NOTHING",
                )
                .ctx("preparing a statement")?
                .execute(params![asked.conversation.0, message_id])
                .ctx("claiming an ack reaction")?;
            Ok(claimed == 1)
        })
        .await
    }

    async fn ack_open(&self, asked: AckOf<'_>) -> Result<bool, StoreError> {
        let message_id = asked.message_id.to_owned();
        self.with_conn(move |conn| {
            conn.prepare_cached(
                "SELECT 1 FROM acks WHERE conversation_id = ?1 AND platform_message_id = ?2",
            )
            .ctx("preparing a statement")?
            .query_row(params![asked.conversation.0, message_id], |_| Ok(()))
            .optional()
            .map(|found| found.is_some())
            .ctx("reading an ack reaction")
        })
        .await
    }

    async fn take_acks(&self, taking: AcksCovered<'_>) -> Result<Vec<String>, StoreError> {
        let covers = taking.covers.to_vec();
        self.write("taking ack reactions", move |tx| {
            let mut taken = Vec::new();
            let mut take = tx
                .prepare_cached(
                    "DELETE FROM acks WHERE conversation_id = ?1 AND platform_message_id = ?2
                     RETURNING platform_message_id",
                )
                .ctx("preparing a statement")?;
            for message_id in covers {
                // Cleared once: the row goes to the one caller that deletes it.
                if let Some(id) = take
                    .query_row(params![taking.conversation.0, message_id], |r| r.get(0))
                    .optional()
                    .ctx("taking an ack reaction")?
                {
                    taken.push(id);
                }
            }
            Ok(taken)
        })
        .await
    }
}

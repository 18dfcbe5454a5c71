//! The overheard area on PostgreSQL: group context, bounded per conversation.

use async_trait::async_trait;

use super::PostgresStore;
use super::messages::upsert_conversation;
use super::sql::{execute, query};
use crate::domain::Said;
use crate::store::faults::Operation;
use crate::store::{OverheardQuery, Overhearing};
use crate::store::{OverheardStore, StoreError};

#[async_trait]
impl OverheardStore for PostgresStore {
    async fn overhear(&self, heard: Overhearing) -> Result<bool, StoreError> {
        transaction!(
            self,
            Operation::Other,
            "keeping an overheard message",
            |tx| {
                async {
                let now = self.now(&tx, heard.now).await?;
                let id = upsert_conversation(&tx, &heard.message.conversation, true, now.db).await?;
                let kept = execute(
                    &tx,
                    "INSERT INTO overheard (conversation_id, platform_message_id, author, text, received_at, user_id)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (conversation_id, platform_message_id) DO NOTHING",
                    &[&id.0, &heard.message.message_id, &heard.message.author, &heard.message.text, &now.db.0, &heard.message.user_id],
                    "keeping an overheard message",
                )
                .await?;
                execute(
                    &tx,
                    "DELETE FROM overheard WHERE conversation_id = $1 AND id NOT IN (
                         SELECT id FROM overheard WHERE conversation_id = $1 ORDER BY id DESC LIMIT $2)",
                    &[&id.0, &(heard.keep as i64)],
                    "trimming overheard messages",
                )
                .await?;
                Ok(kept == 1)
            }
            .await
            }
        )
    }

    async fn overheard(&self, asked: OverheardQuery) -> Result<Vec<Said>, StoreError> {
        transaction!(self, Operation::Read, "reading overheard messages", |tx| {
            async {
                let rows = query(
                    &tx,
                    "SELECT author, text FROM (
                         SELECT id, author, text FROM overheard WHERE conversation_id = $1
                         ORDER BY id DESC LIMIT $2) newest
                     ORDER BY id",
                    &[&asked.conversation.0, &(asked.limit as i64)],
                    "reading overheard messages",
                )
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| Said::new(r.get::<_, String>(0), r.get::<_, String>(1)))
                    .collect())
            }
            .await
        })
    }
}

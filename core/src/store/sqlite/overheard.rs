//! The overheard area on SQLite: group context, bounded per conversation.

use async_trait::async_trait;
use rusqlite::params;

use super::SqliteStore;
use super::messages::upsert_conversation;
use super::sql::Context;
use crate::domain::Said;
use crate::store::{OverheardQuery, Overhearing};
use crate::store::{OverheardStore, StoreError};

#[async_trait]
impl OverheardStore for SqliteStore {
    async fn overhear(&self, heard: Overhearing) -> Result<bool, StoreError> {
        self.write("keeping an overheard message", move |tx| {
            let id = upsert_conversation(tx, &heard.message.conversation, true, heard.now)?;
            let kept = tx
                .prepare_cached(
                    "INSERT INTO overheard (conversation_id, platform_message_id, author, text, received_at, user_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (conversation_id, platform_message_id) DO NOTHING",
                )
                .ctx("preparing a statement")?
                .execute(params![id.0, heard.message.message_id, heard.message.author, heard.message.text, heard.now.0, heard.message.user_id])
                .ctx("keeping an overheard message")?;
            tx.prepare_cached(
                "DELETE FROM overheard WHERE conversation_id = ?1 AND id NOT IN (
                     SELECT id FROM overheard WHERE conversation_id = ?1 ORDER BY id DESC LIMIT ?2)",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, heard.keep as i64])
            .ctx("trimming overheard messages")?;
            Ok(kept == 1)
        })
        .await
    }

    async fn overheard(&self, asked: OverheardQuery) -> Result<Vec<Said>, StoreError> {
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT author, text FROM (
                         SELECT id, author, text FROM overheard WHERE conversation_id = ?1
                         ORDER BY id DESC LIMIT ?2)
                     ORDER BY id",
                )
                .ctx("preparing a statement")?;
            stmt.query_map(params![asked.conversation.0, asked.limit as i64], |r| {
                Ok(Said::new(r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .ctx("reading overheard messages")?
            .collect::<Result<Vec<_>, _>>()
            .ctx("reading overheard messages")
        })
        .await
    }
}

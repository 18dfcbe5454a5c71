//! The threads area on SQLite: the threads lull opened.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::sql::Context;
use crate::domain::{ConversationRef, Timestamp};
use crate::store::{StoreError, ThreadStore};

#[async_trait]
impl ThreadStore for SqliteStore {
    async fn remember_thread(
        &self,
        conversation: &ConversationRef,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let conversation = conversation.clone();
        self.write("remembering a thread", move |tx| {
            tx.prepare_cached(
                "INSERT INTO threads (platform, key, opened_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (platform, key) DO NOTHING",
            )
            .ctx("preparing a statement")?
            .execute(params![
                conversation.platform.as_str(),
                conversation.key,
                now.0
            ])
            .ctx("remembering a thread")?;
            Ok(())
        })
        .await
    }

    async fn is_thread(&self, conversation: &ConversationRef) -> Result<bool, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            conn.prepare_cached("SELECT 1 FROM threads WHERE platform = ?1 AND key = ?2")
                .ctx("preparing a statement")?
                .query_row(
                    params![conversation.platform.as_str(), conversation.key],
                    |_| Ok(()),
                )
                .optional()
                .map(|found| found.is_some())
                .ctx("reading a thread")
        })
        .await
    }
}

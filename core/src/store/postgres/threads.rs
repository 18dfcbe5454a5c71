//! The threads area on PostgreSQL: the threads lull opened.

use async_trait::async_trait;

use super::PostgresStore;
use super::sql::{execute, query};
use crate::domain::{ConversationRef, Timestamp};
use crate::store::faults::Operation;
use crate::store::{StoreError, ThreadStore};

#[async_trait]
impl ThreadStore for PostgresStore {
    async fn remember_thread(
        &self,
        conversation: &ConversationRef,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "remembering a thread", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                execute(
                    &tx,
                    "INSERT INTO threads (platform, key, opened_at) VALUES ($1, $2, $3)
                     ON CONFLICT (platform, key) DO NOTHING",
                    &[
                        &conversation.platform.as_str(),
                        &conversation.key,
                        &now.db.0,
                    ],
                    "remembering a thread",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }

    async fn is_thread(&self, conversation: &ConversationRef) -> Result<bool, StoreError> {
        transaction!(self, Operation::Read, "reading a thread", |tx| {
            async {
                let rows = query(
                    &tx,
                    "SELECT 1 FROM threads WHERE platform = $1 AND key = $2",
                    &[&conversation.platform.as_str(), &conversation.key],
                    "reading a thread",
                )
                .await?;
                Ok(!rows.is_empty())
            }
            .await
        })
    }
}

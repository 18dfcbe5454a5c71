//! The reactions area on PostgreSQL: one ack reaction per pending burst.
//!
//! Each call is one statement, its own transaction: one round trip. A claim is made
//! for every message stored while its reply waits (on platforms with reactions), so
//! BEGIN and COMMIT around it would triple what a message costs beside its ingest.

use async_trait::async_trait;

use super::PostgresStore;
use super::sql::{execute, query};
use crate::store::faults::Operation;
use crate::store::{AckOf, AcksCovered};
use crate::store::{ReactionStore, StoreError};

/// Once per burst: unique on (conversation, answered_version), and only for a message
/// still pending; a concurrent claim of the same burst waits for this one's commit
/// and then inserts nothing.
const CLAIM_ACK: &str = "INSERT INTO acks (conversation_id, burst, platform_message_id)
     SELECT c.id, c.answered_version, $2::text FROM conversations c
     WHERE c.id = $1 AND EXISTS (
         SELECT 1 FROM messages m
         WHERE m.conversation_id = c.id AND m.platform_message_id = $2::text
           AND m.version > c.answered_version)
     ON CONFLICT (conversation_id, burst) DO NOTHING";

#[async_trait]
impl ReactionStore for PostgresStore {
    async fn claim_ack(&self, asked: AckOf<'_>) -> Result<bool, StoreError> {
        statement!(
            self,
            Operation::Other,
            "claiming an ack reaction",
            |client| {
                async {
                    let claimed = execute(
                        client,
                        CLAIM_ACK,
                        &[&asked.conversation.0, &asked.message_id],
                        "claiming an ack reaction",
                    )
                    .await?;
                    Ok(claimed == 1)
                }
                .await
            }
        )
    }

    async fn ack_open(&self, asked: AckOf<'_>) -> Result<bool, StoreError> {
        statement!(self, Operation::Read, "reading an ack reaction", |client| {
            async {
                let rows = query(
                    client,
                    "SELECT 1 FROM acks WHERE conversation_id = $1 AND platform_message_id = $2",
                    &[&asked.conversation.0, &asked.message_id],
                    "reading an ack reaction",
                )
                .await?;
                Ok(!rows.is_empty())
            }
            .await
        })
    }

    async fn take_acks(&self, taking: AcksCovered<'_>) -> Result<Vec<String>, StoreError> {
        let covers = taking.covers.to_vec();
        statement!(self, Operation::Other, "taking ack reactions", |client| {
            async {
                // Cleared once: each row goes to the one caller that deletes it.
                let rows = query(
                    client,
                    "DELETE FROM acks WHERE conversation_id = $1 AND platform_message_id = ANY($2)
                     RETURNING platform_message_id",
                    &[&taking.conversation.0, &covers],
                    "taking ack reactions",
                )
                .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            }
            .await
        })
    }
}

//! The settings area on PostgreSQL: a conversation's own choices and `/stop`. Each
//! write first locks the conversation row (the upsert), where ingest and the final
//! check of every replica queue too, so the read of the current value and the version
//! bump are never interleaved with another writer of the conversation.

use async_trait::async_trait;

use super::PostgresStore;
use super::messages::upsert_conversation;
use super::sql::{execute, query, query_one, query_opt};
use crate::domain::{ConversationId, ConversationRef, Version};
use crate::store::faults::Operation;
use crate::store::{
    COMMAND_CLAIM_DAYS, ConversationSettings, RetryOutcome, SettingOutcome, SettingStore, Stopped,
    StoreError,
};
use crate::store::{CommandClaim, IdleForget, RetryRequest, SettingChange, Stop};

#[async_trait]
impl SettingStore for PostgresStore {
    async fn conversation_settings(
        &self,
        conversation: &ConversationRef,
    ) -> Result<ConversationSettings, StoreError> {
        transaction!(self, Operation::Read, "reading the settings", |tx| async {
            let row = query_opt(
                &tx,
                "SELECT s.model, s.persona, s.prompt FROM conversation_settings s
                 JOIN conversations c ON c.id = s.conversation_id
                 WHERE c.platform = $1 AND c.key = $2",
                &[&conversation.platform.as_str(), &conversation.key],
                "reading the settings",
            )
            .await?;
            Ok(row
                .map(|r| ConversationSettings {
                    model: r.get(0),
                    persona: r.get(1),
                    prompt: r.get(2),
                })
                .unwrap_or_default())
        }
        .await)
    }

    async fn change_setting(
        &self,
        change: SettingChange<'_>,
    ) -> Result<SettingOutcome, StoreError> {
        let column = change.setting.column();
        let read = format!("SELECT {column} FROM conversation_settings WHERE conversation_id = $1");
        let write = format!(
            "INSERT INTO conversation_settings (conversation_id, {column}, updated_at)
             VALUES ($1, $2, $3)
             ON CONFLICT (conversation_id) DO UPDATE
             SET {column} = excluded.{column}, updated_at = excluded.updated_at"
        );
        transaction!(self, Operation::Other, "changing a setting", |tx| async {
            let now = self.now(&tx, change.now).await?;
            // Locks the conversation row: a second change of it waits here, so the
            // value read next is the one in force.
            let id = upsert_conversation(&tx, change.conversation, change.is_group, now.db).await?;
            let current: Option<String> = query_opt(&tx, &read, &[&id.0], "reading a setting")
                .await?
                .and_then(|r| r.get(0));
            if current.as_deref() == change.value {
                return Ok(SettingOutcome::Unchanged);
            }
            execute(
                &tx,
                &write,
                &[&id.0, &change.value, &now.db.0],
                "storing a setting",
            )
            .await?;
            let version = super::messages::control_moved(&tx, id, false).await?;
            Ok(SettingOutcome::Changed {
                conversation: id,
                version,
            })
        }
        .await)
    }

    async fn stop_conversation(&self, stop: Stop<'_>) -> Result<Stopped, StoreError> {
        transaction!(self, Operation::Other, "stopping a conversation", |tx| {
            async {
                let now = self.now(&tx, stop.now).await?;
                // Locks the conversation row (ingest and the final check queue there too).
                let id = upsert_conversation(&tx, stop.conversation, stop.is_group, now.db).await?;
                let row = query_one(
                    &tx,
                    "SELECT version + $2, answered_version FROM conversations WHERE id = $1",
                    &[&id.0, &super::messages::step()],
                    "reading the version",
                )
                .await?;
                let (version, answered): (i64, i64) = (row.get(0), row.get(1));
                // No reply to a closed message: it takes the new version, past every v0
                // collected before, so even a commit the cap forces covers none of them.
                let rows = query(
                    &tx,
                    "UPDATE messages SET version = $2 WHERE conversation_id = $1 AND version > $3
                     RETURNING id, platform_message_id",
                    &[&id.0, &version, &answered],
                    "closing pending messages",
                )
                .await?;
                let batch = rows.iter().map(|r| r.get::<_, i64>(0)).min();
                let closed = rows.iter().map(|r| r.get(1)).collect();
                // Fresh: the version moves (a generation in flight is stale) and the closed
                // messages are answered by nothing.
                execute(
                    &tx,
                    "UPDATE conversations SET version = $2, answered_version = $2 WHERE id = $1",
                    &[&id.0, &version],
                    "stopping a conversation",
                )
                .await?;
                execute(
                    &tx,
                    "DELETE FROM timers WHERE conversation_id = $1",
                    &[&id.0],
                    "deleting the timer",
                )
                .await?;
                Ok(Stopped {
                    conversation: id,
                    version: Version(version),
                    closed,
                    batch,
                })
            }
            .await
        })
    }

    async fn retry_last_reply(&self, retry: RetryRequest<'_>) -> Result<RetryOutcome, StoreError> {
        transaction!(
            self,
            Operation::Other,
            "answering the last batch again",
            |tx| {
                async {
            let now = self.now(&tx, retry.now).await?;
            // Locks the conversation row (ingest and the final check queue there too).
            let id = upsert_conversation(&tx, retry.conversation, retry.is_group, now.db).await?;
            let row = query_one(
                &tx,
                "SELECT version, answered_version, context_version FROM conversations WHERE id = $1",
                &[&id.0],
                "reading the version",
            )
            .await?;
            let (version, answered, context): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
            if version > answered {
                return Ok(RetryOutcome::Busy);
            }
            let last = query_opt(
                &tx,
                "SELECT id, sent_at IS NOT NULL FROM outbox
                 WHERE conversation_id = $1 AND kind = 'reply' AND failed_at IS NULL AND version > $2
                 ORDER BY id DESC LIMIT 1",
                &[&id.0, &context],
                "finding the last reply",
            )
            .await?;
            let Some(last) = last else {
                return Ok(RetryOutcome::Nothing);
            };
            let (reply, sent): (i64, bool) = (last.get(0), last.get(1));
            if !sent {
                return Ok(RetryOutcome::Busy);
            }
            let new = version + 1;
            // No duplicate: the old reply stops covering the messages the new one will.
            let messages = execute(
                &tx,
                "UPDATE messages SET version = $2
                 WHERE id IN (SELECT message_id FROM reply_covers WHERE outbox_id = $1)",
                &[&reply, &new],
                "making the last batch pending again",
            )
            .await?;
            execute(
                &tx,
                "DELETE FROM reply_covers WHERE outbox_id = $1",
                &[&reply],
                "retracting the last reply",
            )
            .await?;
            execute(
                &tx,
                "UPDATE conversations SET version = $2 WHERE id = $1",
                &[&id.0, &new],
                "bumping the version",
            )
            .await?;
            // No loss: the messages pending again have their timer, due now (not before
            // a limit's hold ends).
            execute(
                &tx,
                "INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
                 VALUES ($1, $2, $3, $4, $3, $5)
                 ON CONFLICT (conversation_id) DO UPDATE SET
                     due_at = GREATEST(excluded.due_at, timers.held_until),
                     armed_version = excluded.armed_version, armed_at = excluded.armed_at,
                     armed_by = excluded.armed_by, attempts = 0, retry_at = 0",
                &[&id.0, &retry.conversation.platform.as_str(), &now.db.0, &new, &retry.holder.as_str()],
                "arming the timer",
            )
            .await?;
            Ok(RetryOutcome::Retried {
                conversation: id,
                version: Version(new),
                messages,
            })
        }
        .await
            }
        )
    }

    async fn claim_command(&self, asked: CommandClaim<'_>) -> Result<bool, StoreError> {
        transaction!(self, Operation::Other, "claiming a command", |tx| async {
            let now = self.now(&tx, asked.now).await?;
            let expired = now.db.0 - COMMAND_CLAIM_DAYS * 86_400_000;
            execute(
                &tx,
                "DELETE FROM command_claims WHERE claimed_at < $1",
                &[&expired],
                "deleting old command claims",
            )
            .await?;
            // The primary key decides: one row per command message, one first caller
            // (a concurrent second waits on the first's row and then inserts nothing).
            let claimed = execute(
                &tx,
                "INSERT INTO command_claims (platform, key, message_id, claimed_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[
                    &asked.conversation.platform.as_str(),
                    &asked.conversation.key,
                    &asked.message_id,
                    &now.db.0,
                ],
                "claiming a command",
            )
            .await?;
            Ok(claimed > 0)
        }
        .await)
    }

    async fn release_command(
        &self,
        conversation: &ConversationRef,
        message_id: &str,
    ) -> Result<(), StoreError> {
        transaction!(
            self,
            Operation::Other,
            "giving back a command's claim",
            |tx| async {
                execute(
                &tx,
                "DELETE FROM command_claims WHERE platform = $1 AND key = $2 AND message_id = $3",
                &[&conversation.platform.as_str(), &conversation.key, &message_id],
                "giving back a command's claim",
            )
            .await?;
                Ok(())
            }
            .await
        )
    }

    async fn forget_if_idle(&self, forget: IdleForget<'_>) -> Result<bool, StoreError> {
        let idle = crate::domain::millis(forget.idle);
        transaction!(self, Operation::Other, "forgetting an idle context", |tx| {
            async {
            let now = self.now(&tx, forget.now).await?;
            let before = now.db.0 - idle;
            // The last message by the index (conversation, version): a seek, not a scan.
            let n = execute(
                &tx,
                "UPDATE conversations SET context_version = version
                 WHERE platform = $1 AND key = $2 AND context_version < version
                   AND (SELECT received_at FROM messages m WHERE m.conversation_id = conversations.id
                        ORDER BY m.version DESC LIMIT 1) <= $3",
                &[&forget.conversation.platform.as_str(), &forget.conversation.key, &before],
                "forgetting an idle context",
            )
            .await?;
            if n > 0 {
                execute(
                    &tx,
                    "DELETE FROM overheard WHERE received_at <= $3
                       AND conversation_id = (SELECT id FROM conversations WHERE platform = $1 AND key = $2)",
                    &[&forget.conversation.platform.as_str(), &forget.conversation.key, &before],
                    "forgetting old group context",
                )
                .await?;
            }
            Ok(n > 0)
        }
        .await
        })
    }

    async fn note_chat_title(
        &self,
        conversation: ConversationId,
        title: &str,
    ) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "noting a chat's title", |tx| {
            async {
                execute(
                    &tx,
                    "UPDATE conversations SET title = $2 WHERE id = $1 AND title IS DISTINCT FROM $2",
                    &[&conversation.0, &title],
                    "noting a chat's title",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }
}

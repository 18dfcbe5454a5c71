//! The settings area on SQLite: a conversation's own choices and `/stop`. Every write
//! goes through the one writer (`BEGIN IMMEDIATE`), so it is serialized with ingest
//! and the final check of every process on the file.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::messages::upsert_conversation;
use super::sql::Context;
use crate::domain::{ConversationId, ConversationRef, Version};
use crate::store::{
    COMMAND_CLAIM_DAYS, ConversationSettings, RetryOutcome, SettingOutcome, SettingStore, Stopped,
    StoreError,
};
use crate::store::{CommandClaim, IdleForget, RetryRequest, SettingChange, Stop};

#[async_trait]
impl SettingStore for SqliteStore {
    async fn conversation_settings(
        &self,
        conversation: &ConversationRef,
    ) -> Result<ConversationSettings, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| read_settings(conn, &conversation))
            .await
    }

    async fn change_setting(
        &self,
        change: SettingChange<'_>,
    ) -> Result<SettingOutcome, StoreError> {
        let conversation = change.conversation.clone();
        let value = change.value.map(str::to_owned);
        let column = change.setting.column();
        self.write("changing a setting", move |tx| {
            let id = upsert_conversation(tx, &conversation, change.is_group, change.now)?;
            let current: Option<String> = tx
                .prepare_cached(&format!(
                    "SELECT {column} FROM conversation_settings WHERE conversation_id = ?1"
                ))
                .ctx("preparing a statement")?
                .query_row([id.0], |r| r.get(0))
                .optional()
                .ctx("reading a setting")?
                .flatten();
            if current == value {
                return Ok(SettingOutcome::Unchanged);
            }
            tx.prepare_cached(&format!(
                "INSERT INTO conversation_settings (conversation_id, {column}, updated_at)
                 VALUES (?1, ?2, ?3)
                 ON CONFLICT (conversation_id) DO UPDATE
                 SET {column} = excluded.{column}, updated_at = excluded.updated_at"
            ))
            .ctx("preparing a statement")?
            .execute(params![id.0, value, change.now.0])
            .ctx("storing a setting")?;
            let version = super::messages::control_moved(tx, id, false)?;
            Ok(SettingOutcome::Changed {
                conversation: id,
                version,
            })
        })
        .await
    }

    async fn stop_conversation(&self, stop: Stop<'_>) -> Result<Stopped, StoreError> {
        let conversation = stop.conversation.clone();
        self.write("stopping a conversation", move |tx| {
            let id = upsert_conversation(tx, &conversation, stop.is_group, stop.now)?;
            let (version, answered): (i64, i64) = tx
                .prepare_cached(
                    "SELECT version + ?2, answered_version FROM conversations WHERE id = ?1",
                )
                .ctx("preparing a statement")?
                .query_row([id.0, super::messages::step()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .ctx("reading the version")?;
            // No reply to a closed message: it takes the new version, past every v0
            // collected before, so even a commit the cap forces covers none of them.
            let rows = tx
                .prepare_cached(
                    "UPDATE messages SET version = ?2 WHERE conversation_id = ?1 AND version > ?3
                     RETURNING id, platform_message_id",
                )
                .ctx("preparing a statement")?
                .query_map(params![id.0, version, answered], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .ctx("closing pending messages")?
                .collect::<Result<Vec<_>, _>>()
                .ctx("closing pending messages")?;
            let batch = rows.iter().map(|(row, _)| *row).min();
            let closed = rows.into_iter().map(|(_, id)| id).collect();
            // Fresh: the version moves (a generation in flight is stale) and the closed
            // messages are answered by nothing.
            tx.prepare_cached(
                "UPDATE conversations SET version = ?2, answered_version = ?2 WHERE id = ?1",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, version])
            .ctx("stopping a conversation")?;
            tx.prepare_cached("DELETE FROM timers WHERE conversation_id = ?1")
                .ctx("preparing a statement")?
                .execute([id.0])
                .ctx("deleting the timer")?;
            Ok(Stopped {
                conversation: id,
                version: Version(version),
                closed,
                batch,
            })
        })
        .await
    }

    async fn retry_last_reply(&self, retry: RetryRequest<'_>) -> Result<RetryOutcome, StoreError> {
        let conversation = retry.conversation.clone();
        let holder = retry.holder.clone();
        self.write("answering the last batch again", move |tx| {
            let id = upsert_conversation(tx, &conversation, retry.is_group, retry.now)?;
            let (version, answered, context): (i64, i64, i64) = tx
                .prepare_cached(
                    "SELECT version, answered_version, context_version FROM conversations WHERE id = ?1",
                )
                .ctx("preparing a statement")?
                .query_row([id.0], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .ctx("reading the version")?;
            if version > answered {
                return Ok(RetryOutcome::Busy);
            }
            let last: Option<(i64, bool)> = tx
                .prepare_cached(
                    "SELECT id, sent_at IS NOT NULL FROM outbox
                     WHERE conversation_id = ?1 AND kind = 'reply' AND failed_at IS NULL AND version > ?2
                     ORDER BY id DESC LIMIT 1",
                )
                .ctx("preparing a statement")?
                .query_row(params![id.0, context], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .ctx("finding the last reply")?;
            let Some((reply, sent)) = last else {
                return Ok(RetryOutcome::Nothing);
            };
            if !sent {
                return Ok(RetryOutcome::Busy);
            }
            let new = version + 1;
            // No duplicate: the old reply stops covering the messages the new one will.
            let messages = tx
                .prepare_cached(
                    "UPDATE messages SET version = ?2
                     WHERE id IN (SELECT message_id FROM reply_covers WHERE outbox_id = ?1)",
                )
                .ctx("preparing a statement")?
                .execute(params![reply, new])
                .ctx("making the last batch pending again")?;
            tx.prepare_cached("DELETE FROM reply_covers WHERE outbox_id = ?1")
                .ctx("preparing a statement")?
                .execute([reply])
                .ctx("retracting the last reply")?;
            tx.prepare_cached("UPDATE conversations SET version = ?2 WHERE id = ?1")
                .ctx("preparing a statement")?
                .execute(params![id.0, new])
                .ctx("bumping the version")?;
            // No loss: the messages pending again have their timer, due now (not before
            // a limit's hold ends).
            tx.prepare_cached(
                "INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
                 VALUES (?1, ?2, ?3, ?4, ?3, ?5)
                 ON CONFLICT (conversation_id) DO UPDATE SET
                     due_at = MAX(excluded.due_at, timers.held_until),
                     armed_version = excluded.armed_version, armed_at = excluded.armed_at,
                     armed_by = excluded.armed_by, attempts = 0, retry_at = 0",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, conversation.platform.as_str(), retry.now.0, new, holder.as_str()])
            .ctx("arming the timer")?;
            Ok(RetryOutcome::Retried {
                conversation: id,
                version: Version(new),
                messages: messages as u64,
            })
        })
        .await
    }

    async fn claim_command(&self, asked: CommandClaim<'_>) -> Result<bool, StoreError> {
        let conversation = asked.conversation.clone();
        let message_id = asked.message_id.to_owned();
        let expired = asked.now.0 - COMMAND_CLAIM_DAYS * 86_400_000;
        self.write("claiming a command", move |tx| {
            tx.prepare_cached("DELETE FROM command_claims WHERE claimed_at < ?1")
                .ctx("preparing a statement")?
                .execute([expired])
                .ctx("deleting old command claims")?;
            // The primary key decides: one row per command message, one first caller.
            tx.prepare_cached(
                "INSERT INTO command_claims (platform, key, message_id, claimed_at)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            )
            .ctx("preparing a statement")?
            .execute(params![
                conversation.platform.as_str(),
                conversation.key,
                message_id,
                asked.now.0
            ])
            .map(|n| n > 0)
            .ctx("claiming a command")
        })
        .await
    }

    async fn release_command(
        &self,
        conversation: &ConversationRef,
        message_id: &str,
    ) -> Result<(), StoreError> {
        let conversation = conversation.clone();
        let message_id = message_id.to_owned();
        self.write("giving back a command's claim", move |tx| {
            tx.prepare_cached(
                "DELETE FROM command_claims WHERE platform = ?1 AND key = ?2 AND message_id = ?3",
            )
            .ctx("preparing a statement")?
            .execute(params![
                conversation.platform.as_str(),
                conversation.key,
                message_id
            ])
            .ctx("giving back a command's claim")?;
            Ok(())
        })
        .await
    }

    async fn forget_if_idle(&self, forget: IdleForget<'_>) -> Result<bool, StoreError> {
        let conversation = forget.conversation.clone();
        let before = forget.now.0 - crate::domain::millis(forget.idle);
        self.write("forgetting an idle context", move |tx| {
            // The last message by the index (conversation, version): a seek, not a scan.
            let reset = tx.prepare_cached(
                "UPDATE conversations SET context_version = version
                 WHERE platform = ?1 AND key = ?2 AND context_version < version
                   AND (SELECT received_at FROM messages m WHERE m.conversation_id = conversations.id
                        ORDER BY m.version DESC LIMIT 1) <= ?3",
            )
            .ctx("preparing a statement")?
            .execute(params![conversation.platform.as_str(), conversation.key, before])
            .ctx("forgetting an idle context")?;
            if reset > 0 {
                tx.prepare_cached(
                    "DELETE FROM overheard WHERE received_at <= ?3
                       AND conversation_id = (SELECT id FROM conversations WHERE platform = ?1 AND key = ?2)",
                )
                .ctx("preparing a statement")?
                .execute(params![conversation.platform.as_str(), conversation.key, before])
                .ctx("forgetting old group context")?;
            }
            Ok(reset > 0)
        })
        .await
    }

    async fn note_chat_title(
        &self,
        conversation: ConversationId,
        title: &str,
    ) -> Result<(), StoreError> {
        let title = title.to_owned();
        self.write("noting a chat's title", move |tx| {
            tx.prepare_cached(
                "UPDATE conversations SET title = ?2 WHERE id = ?1 AND title IS NOT ?2",
            )
            .ctx("preparing a statement")?
            .execute(params![conversation.0, title])
            .ctx("noting a chat's title")?;
            Ok(())
        })
        .await
    }
}

fn read_settings(
    conn: &Connection,
    conversation: &ConversationRef,
) -> Result<ConversationSettings, StoreError> {
    conn.prepare_cached(
        "SELECT s.model, s.persona, s.prompt FROM conversation_settings s
         JOIN conversations c ON c.id = s.conversation_id
         WHERE c.platform = ?1 AND c.key = ?2",
    )
    .ctx("preparing a statement")?
    .query_row(
        params![conversation.platform.as_str(), conversation.key],
        |r| {
            Ok(ConversationSettings {
                model: r.get(0)?,
                persona: r.get(1)?,
                prompt: r.get(2)?,
            })
        },
    )
    .optional()
    .map(Option::unwrap_or_default)
    .ctx("reading the settings")
}

//! The messages area on SQLite: ingest, edits, a fresh context, catch-up reads.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::sql::Context;
use crate::domain::{ConversationId, ConversationRef, HolderId, Timestamp, Version};
use crate::rhythm::{Cue, Waits};
use crate::store::faults::Operation;
use crate::store::rules::Arming;
use crate::store::{ContextReset, ContextWasReset, RecentQuery, StoredBy};
use crate::store::{
    IngestOutcome, MessageEdit, MessageStore, NewMessage, RecentConversation, StoreError,
};

#[async_trait]
impl MessageStore for SqliteStore {
    async fn ingest(
        &self,
        message: NewMessage,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        let holder = holder.clone();
        let policy = self.timers;
        self.write_as(Operation::Intake, "storing a message", move |tx| {
            store_message(tx, &message, (&holder, policy), now)
        })
        .await
    }

    async fn edit(&self, edit: MessageEdit, by: StoredBy<'_>) -> Result<IngestOutcome, StoreError> {
        let holder = by.holder.clone();
        let policy = self.timers;
        self.write_as(Operation::Intake, "editing a message", move |tx| {
            let found: Option<(i64, i64)> = tx
                .prepare_cached(
                    "SELECT id, answered_version FROM conversations WHERE platform = ?1 AND key = ?2",
                )
                .ctx("preparing a statement")?
                .query_row(
                    params![edit.conversation.platform.as_str(), edit.conversation.key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .ctx("finding a conversation")?;
            let Some((id, answered)) = found else {
                return Ok(IngestOutcome::EditIgnored);
            };
            let changed = tx
                .prepare_cached(
                    "UPDATE messages
                     SET text = ?1, version = (SELECT version + 1 FROM conversations WHERE id = ?2)
                     WHERE conversation_id = ?2 AND platform_message_id = ?3
                       AND version > ?4 AND text <> ?1",
                )
                .ctx("preparing a statement")?
                .execute(params![edit.text, id, edit.message_id, answered])
                .ctx("editing a message")?;
            if changed == 0 {
                return Ok(IngestOutcome::EditIgnored);
            }
            tx.prepare_cached(
                "INSERT INTO edits (message_id, user_id, platform, edited_at)
                 SELECT id, user_id, ?3, ?4 FROM messages WHERE conversation_id = ?1 AND platform_message_id = ?2",
            )
            .ctx("preparing a statement")?
            .execute(params![id, edit.message_id, edit.conversation.platform.as_str(), by.now.0])
            .ctx("recording an edit")?;
            let conversation = ConversationId(id);
            let cue = Cue::of(&edit.text, 0);
            let platform = edit.conversation.platform;
            let arming = Arming { conversation, platform, policy, cue, holder: &holder, now: by.now };
            let (version, due_at) = bump_and_arm(tx, arming)?;
            Ok(IngestOutcome::Stored {
                conversation,
                version,
                due_at,
            })
        })
        .await
    }

    async fn reset_context(&self, reset: ContextReset<'_>) -> Result<ContextWasReset, StoreError> {
        let conversation = reset.conversation.clone();
        let holder = reset.holder.clone();
        self.write("resetting the context", move |tx| {
            let id = upsert_conversation(tx, &conversation, reset.is_group, reset.now)?;
            // History offers replies after the version the reset found; the version
            // moves past it (fresh: a reply in flight, written from the forgotten
            // history, is stale), and the pending messages move with it.
            let version = control_moved(tx, id, true)?;
            tx.prepare_cached("DELETE FROM overheard WHERE conversation_id = ?1")
                .ctx("preparing a statement")?
                .execute([id.0])
                .ctx("forgetting overheard messages")?;
            // /reset unsticks: pending messages are tried again now, without the
            // backoff, but not before a limit's hold ends (limits: not a way around them).
            tx.prepare_cached(
                "UPDATE timers SET attempts = 0, retry_at = 0, armed_by = ?3,
                     due_at = MAX(CASE WHEN due_at > ?2 THEN ?2 ELSE due_at END, held_until)
                 WHERE conversation_id = ?1",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, reset.now.0, holder.as_str()])
            .ctx("clearing the failure backoff")?;
            Ok(ContextWasReset {
                conversation: id,
                version,
            })
        })
        .await
    }

    async fn recent_conversations(
        &self,
        asked: RecentQuery,
    ) -> Result<Vec<RecentConversation>, StoreError> {
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT c.key, c.is_group, m.platform_message_id
                     FROM conversations c
                     JOIN messages m ON m.id = (SELECT MAX(id) FROM messages WHERE conversation_id = c.id)
                     WHERE c.platform = ?1 AND m.received_at >= ?2
                     ORDER BY m.received_at DESC, m.id DESC
                     LIMIT ?3",
                )
                .ctx("finding recent conversations")?;
            stmt.query_map(params![asked.platform.as_str(), asked.since.0, asked.limit as i64], |r| {
                Ok(RecentConversation {
                    conversation: ConversationRef::new(asked.platform, r.get::<_, String>(0)?),
                    is_group: r.get(1)?,
                    last_message_id: r.get(2)?,
                })
            })
            .ctx("finding recent conversations")?
            .collect::<Result<Vec<_>, _>>()
            .ctx("finding recent conversations")
        })
        .await
    }
}

/// Store `message` and, unless it is a redelivery, bump its conversation's version and
/// arm its timer: the whole ingest transaction, for ingest and for a task's occurrence
/// (`jobs`). Must run in a write transaction.
pub(super) fn store_message(
    tx: &Connection,
    message: &NewMessage,
    (holder, policy): (&HolderId, crate::timing::TimerPolicy),
    now: Timestamp,
) -> Result<IngestOutcome, StoreError> {
    let conversation = upsert_conversation(tx, &message.conversation, message.is_group, now)?;
    // No duplicate: a redelivered platform message is stored once.
    let inserted = tx
        .prepare_cached(
            "INSERT INTO messages
                 (conversation_id, platform_message_id, user_id, author, text, version, received_at, media)
             SELECT ?1, ?2, ?3, ?4, ?5, version + 1, ?6, ?7 FROM conversations WHERE id = ?1
             ON CONFLICT (conversation_id, platform_message_id) DO NOTHING",
        )
        .ctx("preparing a statement")?
        .execute(params![
            conversation.0,
            message.message_id,
            message.user_id,
            message.author,
            message.text,
            now.0,
            crate::store::encode_media(&message.media),
        ])
        .ctx("storing a message")?;
    if inserted == 0 {
        return Ok(IngestOutcome::Duplicate { conversation });
    }
    let cue = Cue::of(&message.text, message.media.len());
    let platform = message.conversation.platform;
    let arming = Arming {
        conversation,
        platform,
        policy,
        cue,
        holder,
        now,
    };
    let (version, due_at) = bump_and_arm(tx, arming)?;
    Ok(IngestOutcome::Stored {
        conversation,
        version,
        due_at,
    })
}

/// Find or create a conversation row; returns its id. A conversation seen once as a
/// group stays a group: no platform turns a group into a private chat, so an update
/// that does not say (a command, a notice) can never make one private.
pub(super) fn upsert_conversation(
    tx: &Connection,
    conversation: &ConversationRef,
    is_group: bool,
    now: Timestamp,
) -> Result<ConversationId, StoreError> {
    tx.prepare_cached(
        "INSERT INTO conversations (platform, key, is_group, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (platform, key) DO UPDATE SET is_group = conversations.is_group OR excluded.is_group
         RETURNING id",
    )
    .ctx("preparing a statement")?
    .query_row(
        params![conversation.platform.as_str(), conversation.key, is_group, now.0],
        |r| r.get(0),
    )
    .map(ConversationId)
    .ctx("finding a conversation")
}

/// Bump the version of a conversation that just got a message (or an edit) and arm
/// its timer, with the wait its rhythm and the message's `cue` call for. Must run in
/// the transaction that stored the message.
fn bump_and_arm(tx: &Connection, arming: Arming<'_>) -> Result<(Version, Timestamp), StoreError> {
    // Version counter: bumped in the same transaction that stores the message.
    // The rhythm's stored waits come back with it (no statement of their own).
    let (version, answered, waits): (i64, i64, Option<Waits>) = tx
        .prepare_cached(
            "UPDATE conversations SET version = version + 1 WHERE id = ?1
             RETURNING version, answered_version, rhythm_first_ms, rhythm_burst_ms",
        )
        .ctx("preparing a statement")?
        .query_row([arming.conversation.0], |r| {
            let waits = match (r.get(2)?, r.get(3)?) {
                (Some(first_ms), Some(burst_ms)) => Some(Waits { first_ms, burst_ms }),
                _ => None,
            };
            Ok((r.get(0)?, r.get(1)?, waits))
        })
        .ctx("bumping the version")?;
    let due_at = arming.due_at(waits, pending_after(tx, arming.conversation, answered)?);
    // Capped debounce: every message re-arms the timer, never past the cap, and never
    // sooner than a failed generation's backoff (`retry_at`) or a limit's hold
    // (`held_until`).
    let due_at: i64 = tx
        .prepare_cached(
            "INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (conversation_id) DO UPDATE SET
                 due_at = MAX(excluded.due_at, timers.retry_at, timers.held_until),
                 armed_version = excluded.armed_version,
                 armed_at = excluded.armed_at,
                 armed_by = excluded.armed_by
             RETURNING due_at",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![
                arming.conversation.0,
                arming.platform.as_str(),
                due_at.0,
                version,
                arming.now.0,
                arming.holder.as_str()
            ],
            |r| r.get(0),
        )
        .ctx("arming the timer")?;
    let due_at = Timestamp(due_at);
    Ok((Version(version), due_at))
}

/// How many messages are pending after `answered` and when the oldest arrived.
pub(super) fn pending_after(
    tx: &Connection,
    conversation: ConversationId,
    answered: i64,
) -> Result<(u32, Option<Timestamp>), StoreError> {
    tx.prepare_cached(
        "SELECT COUNT(*), MIN(received_at) FROM messages
         WHERE conversation_id = ?1 AND version > ?2",
    )
    .ctx("preparing a statement")?
    .query_row(params![conversation.0, answered], |r| {
        Ok((
            r.get::<_, i64>(0)? as u32,
            r.get::<_, Option<i64>>(1)?.map(Timestamp),
        ))
    })
    .ctx("counting pending messages")
}

/// A control (a setting, `/new`) moves the conversation's version, as a message does,
/// and the pending messages with it ([`fence_pending`]); `forget_context`: history
/// starts after the version found (`/new`). With nothing pending the conversation stays
/// settled. Returns the new version. Must run in the control's transaction.
pub(super) fn control_moved(
    tx: &Connection,
    id: ConversationId,
    forget_context: bool,
) -> Result<Version, StoreError> {
    // Fresh: a generation collected before the control fails its final check.
    let version = tx
        .prepare_cached(
            "UPDATE conversations SET version = version + ?2,
                 context_version = CASE WHEN ?3 THEN version ELSE context_version END,
                 answered_version = CASE WHEN answered_version = version
                                         THEN version + ?2 ELSE answered_version END
             WHERE id = ?1 RETURNING version",
        )
        .ctx("preparing a statement")?
        .query_row(params![id.0, step(), forget_context], |r| r.get(0))
        .map(Version)
        .ctx("moving the version")?;
    fence_pending(tx, id)?;
    Ok(version)
}

/// After a control moved the version (a setting, `/new`): the pending messages take
/// the new version, as an edit would give them, so a round that collected them before
/// the control covers none of them, even in a commit the cap forces (it covers only
/// messages unchanged since `v0`). They stay pending: the next round answers them
/// under the new setting or context. Must run in the transaction that moved the
/// version, after it.
fn fence_pending(tx: &Connection, id: ConversationId) -> Result<(), StoreError> {
    if step() == 0 {
        return Ok(());
    }
    // Fresh: no reply written before a control covers a message after it.
    tx.prepare_cached(
        "UPDATE messages SET version = (SELECT version FROM conversations WHERE id = ?1)
         WHERE conversation_id = ?1
           AND version > (SELECT answered_version FROM conversations WHERE id = ?1)",
    )
    .ctx("preparing a statement")?
    .execute([id.0])
    .ctx("fencing pending messages")?;
    Ok(())
}

/// How far a change of a setting or `/stop` moves the version: 1 (0 only with the
/// counter-test's switch, which leaves a generation in flight unfenced).
pub(super) fn step() -> i64 {
    if crate::switches::unfenced_controls() {
        0
    } else {
        1
    }
}

//! The messages area on PostgreSQL: ingest, edits, a fresh context, catch-up reads.

use async_trait::async_trait;

use super::clock::TimeSource;
use super::ingest::Call;
use super::sql::{Tx, execute, query, query_one, query_opt};
use super::{CHANNEL, PostgresStore};
use crate::clock::{Clock, SystemClock};
use crate::domain::{ConversationId, ConversationRef, HolderId, Timestamp, Version};
use crate::rhythm::{Cue, Waits};
use crate::store::faults::Operation;
use crate::store::rules::Arming;
use crate::store::{ContextReset, ContextWasReset, RecentQuery, StoredBy};
use crate::store::{
    IngestOutcome, MessageEdit, MessageStore, NewMessage, RecentConversation, StoreError,
};

#[async_trait]
impl MessageStore for PostgresStore {
    async fn ingest(
        &self,
        message: NewMessage,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        let policy = self.timers;
        // The range this message's wait is picked in; the function picks it from the
        // conversation's stored waits (`rhythm::Waits::pick`, in SQL).
        let (wait_min, wait_max) = policy.wait_range(Cue::of(&message.text, message.media.len()));
        // One round trip: the whole transaction is `lull_ingest` (schema V14), which keeps
        // the invariants of the multi-statement ingest it replaced, in the same lock
        // order (the conversation row first); under load, with the messages that wait
        // with it (`ingest.rs`).
        let call = Call {
            platform: message.conversation.platform.as_str(),
            media: crate::store::encode_media(&message.media),
            key: message.conversation.key,
            is_group: message.is_group,
            message_id: message.message_id,
            user_id: message.user_id,
            author: message.author,
            text: message.text,
            holder: holder.as_str().to_owned(),
            fixed: self.fixed_now(now),
            wait_min: crate::domain::millis(wait_min),
            wait_max: crate::domain::millis(wait_max),
        };
        let answer = self.ingest_call(call).await?;
        let conversation = ConversationId(answer.conversation);
        let now = self.now_read(answer.now, now);
        Ok(match answer.stored {
            Some((version, due_at)) => IngestOutcome::Stored {
                conversation,
                version: Version(version),
                due_at: now.to_caller(Timestamp(due_at)),
            },
            // No duplicate: a redelivered platform message is stored once.
            None => IngestOutcome::Duplicate { conversation },
        })
    }

    async fn edit(&self, edit: MessageEdit, by: StoredBy<'_>) -> Result<IngestOutcome, StoreError> {
        let policy = self.timers;
        transaction!(self, Operation::Intake, "editing a message", |tx| {
            async {
                let now = self.now(&tx, by.now).await?;
                let found = query_opt(
                    &tx,
                    "SELECT id, answered_version FROM conversations WHERE platform = $1 AND key = $2 FOR UPDATE",
                    &[&edit.conversation.platform.as_str(), &edit.conversation.key],
                    "finding a conversation",
                )
                .await?;
                let Some(found) = found else {
                    return Ok(IngestOutcome::EditIgnored);
                };
                let (id, answered): (i64, i64) = (found.get(0), found.get(1));
                let changed = execute(
                    &tx,
                    "UPDATE messages
                     SET text = $1, version = (SELECT version + 1 FROM conversations WHERE id = $2)
                     WHERE conversation_id = $2 AND platform_message_id = $3 AND version > $4 AND text <> $1",
                    &[&edit.text, &id, &edit.message_id, &answered],
                    "editing a message",
                )
                .await?;
                if changed == 0 {
                    return Ok(IngestOutcome::EditIgnored);
                }
                execute(
                    &tx,
                    "INSERT INTO edits (message_id, user_id, platform, edited_at)
                     SELECT id, user_id, $3, $4 FROM messages WHERE conversation_id = $1 AND platform_message_id = $2",
                    &[&id, &edit.message_id, &edit.conversation.platform.as_str(), &now.db.0],
                    "recording an edit",
                )
                .await?;
                let conversation = ConversationId(id);
                let cue = Cue::of(&edit.text, 0);
                let platform = edit.conversation.platform;
                let arming = Arming { conversation, platform, policy, cue, holder: by.holder, now: now.db };
                let (version, due_at) = bump_and_arm(&tx, arming).await?;
                Ok(IngestOutcome::Stored {
                    conversation,
                    version,
                    due_at: now.to_caller(due_at),
                })
            }
            .await
        })
    }

    async fn reset_context(&self, reset: ContextReset<'_>) -> Result<ContextWasReset, StoreError> {
        transaction!(self, Operation::Other, "resetting the context", |tx| {
            async {
                let now = self.now(&tx, reset.now).await?;
                let id =
                    upsert_conversation(&tx, reset.conversation, reset.is_group, now.db).await?;
                // History offers replies after the version the reset found; the version
                // moves past it (fresh: a reply in flight, written from the forgotten
                // history, is stale), and the pending messages move with it.
                let version = control_moved(&tx, id, true).await?;
                execute(
                    &tx,
                    "DELETE FROM overheard WHERE conversation_id = $1",
                    &[&id.0],
                    "forgetting overheard messages",
                )
                .await?;
                // /reset unsticks: pending messages are tried again now, without the
                // failure backoff, but never sooner than a limit's hold (`held_until`).
                execute(
                    &tx,
                    "UPDATE timers SET attempts = 0, retry_at = 0, armed_by = $3,
                     due_at = GREATEST(LEAST(due_at, $2), held_until)
                 WHERE conversation_id = $1",
                    &[&id.0, &now.db.0, &reset.holder.as_str()],
                    "clearing the failure backoff",
                )
                .await?;
                Ok(ContextWasReset {
                    conversation: id,
                    version,
                })
            }
            .await
        })
    }

    async fn recent_conversations(
        &self,
        asked: RecentQuery,
    ) -> Result<Vec<RecentConversation>, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "finding recent conversations",
            |tx| {
                async {
                    let now = self.now(&tx, SystemClock.now()).await?;
                    let since = match self.time {
                        TimeSource::Database => now.to_db(asked.since),
                        TimeSource::Caller => asked.since,
                    };
                    let rows = query(
                        &tx,
                        "SELECT c.key, c.is_group, m.platform_message_id
                         FROM conversations c
                         JOIN messages m ON m.id = (SELECT MAX(id) FROM messages WHERE conversation_id = c.id)
                         WHERE c.platform = $1 AND m.received_at >= $2
                         ORDER BY m.received_at DESC, m.id DESC
                         LIMIT $3",
                        &[&asked.platform.as_str(), &since.0, &(asked.limit as i64)],
                        "finding recent conversations",
                    )
                    .await?;
                    Ok(rows
                        .into_iter()
                        .map(|r| RecentConversation {
                            conversation: ConversationRef::new(asked.platform, r.get::<_, String>(0)),
                            is_group: r.get(1),
                            last_message_id: r.get(2),
                        })
                        .collect())
                }
                .await
            }
        )
    }
}

/// Find or create a conversation row and lock it for the rest of the transaction
/// (the upsert's `DO UPDATE` locks the row): every writer of a conversation queues
/// here. A group stays a group.
pub(super) async fn upsert_conversation(
    tx: &Tx<'_>,
    conversation: &ConversationRef,
    is_group: bool,
    now: Timestamp,
) -> Result<ConversationId, StoreError> {
    let row = query_one(
        tx,
        "INSERT INTO conversations (platform, key, is_group, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (platform, key) DO UPDATE SET is_group = conversations.is_group OR excluded.is_group
         RETURNING id",
        &[&conversation.platform.as_str(), &conversation.key, &is_group, &now.0],
        "finding a conversation",
    )
    .await?;
    Ok(ConversationId(row.get(0)))
}

/// How many messages are pending after `answered` and when the oldest arrived.
pub(super) async fn pending_after(
    tx: &Tx<'_>,
    conversation: ConversationId,
    answered: i64,
) -> Result<(u32, Option<Timestamp>), StoreError> {
    let row = query_one(
        tx,
        "SELECT COUNT(*), MIN(received_at) FROM messages WHERE conversation_id = $1 AND version > $2",
        &[&conversation.0, &answered],
        "counting pending messages",
    )
    .await?;
    Ok((
        row.get::<_, i64>(0) as u32,
        row.get::<_, Option<i64>>(1).map(Timestamp),
    ))
}

/// Bump the version of a conversation whose message was just edited, arm its timer
/// with the wait its rhythm and the edit's `cue` call for, and announce it when it is
/// due before every other future timer of its platform.
/// Must run in the transaction that stored the message, with the conversation row
/// locked.
async fn bump_and_arm(tx: &Tx<'_>, arming: Arming<'_>) -> Result<(Version, Timestamp), StoreError> {
    // Version counter: bumped in the same transaction that stores the message; the
    // rhythm comes back with it (no statement of its own).
    let row = query_one(
        tx,
        "UPDATE conversations SET version = version + 1 WHERE id = $1
         RETURNING version, answered_version, rhythm_first_ms, rhythm_burst_ms",
        &[&arming.conversation.0],
        "bumping the version",
    )
    .await?;
    let (version, answered): (i64, i64) = (row.get(0), row.get(1));
    let waits = match (row.get::<_, Option<i64>>(2), row.get::<_, Option<i64>>(3)) {
        (Some(first), Some(burst)) => Some(Waits {
            first_ms: first.clamp(0, u32::MAX.into()) as u32,
            burst_ms: burst.clamp(0, u32::MAX.into()) as u32,
        }),
        _ => None,
    };
    let pending = pending_after(tx, arming.conversation, answered).await?;
    let due_at = arming.due_at(waits, pending);
    // Capped debounce: every message re-arms the timer, never past the cap, and never
    // sooner than a failed generation's backoff (`retry_at`) or a limit's hold
    // (`held_until`). The rule's places: see `TimerPolicy::due_after`. With it, what the replicas
    // already look at: the platform's earliest future timer, read (in the statement's
    // snapshot) before this one moves.
    let row = query_one(
        tx,
        "WITH known AS (
             SELECT due_at FROM timers WHERE platform = $2 AND due_at > $5 ORDER BY due_at LIMIT 1)
         INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (conversation_id) DO UPDATE SET
             due_at = GREATEST(excluded.due_at, timers.retry_at, timers.held_until),
             armed_version = excluded.armed_version,
             armed_at = excluded.armed_at,
             armed_by = excluded.armed_by
         RETURNING due_at, (SELECT due_at FROM known)",
        &[
            &arming.conversation.0,
            &arming.platform.as_str(),
            &due_at.0,
            &version,
            &arming.now.0,
            &arming.holder.as_str(),
        ],
        "arming the timer",
    )
    .await?;
    let (due_at, known): (i64, Option<i64>) = (row.get(0), row.get(1));
    // Wake-ups, as `lull_ingest` sends them: sent at commit (only a timer that exists
    // wakes other replicas), and only for a timer due before every one the replicas
    // already wake for.
    if known.is_none_or(|known| due_at < known) {
        query(
            tx,
            "SELECT pg_notify($1, $2)",
            &[&CHANNEL, &arming.platform.as_str()],
            "announcing the timer",
        )
        .await?;
    }
    Ok((Version(version), Timestamp(due_at)))
}

/// Lock a conversation row for the rest of the transaction (after its lease row, in
/// the one lock order), returning its version.
pub(super) async fn lock_conversation(
    tx: &Tx<'_>,
    conversation: ConversationId,
) -> Result<i64, StoreError> {
    let row = query_opt(
        tx,
        "SELECT version FROM conversations WHERE id = $1 FOR UPDATE",
        &[&conversation.0],
        "reading the version",
    )
    .await?;
    row.map(|r| r.get(0))
        .ok_or(StoreError::NoConversation(conversation))
}

/// A control (a setting, `/new`) moves the conversation's version, as a message does,
/// and the pending messages with it ([`fence_pending`]); `forget_context`: history
/// starts after the version found (`/new`). With nothing pending the conversation stays
/// settled. Returns the new version. Must run in the control's transaction, under the
/// conversation row's lock.
pub(super) async fn control_moved(
    tx: &Tx<'_>,
    id: ConversationId,
    forget_context: bool,
) -> Result<Version, StoreError> {
    // Fresh: a generation collected before the control fails its final check.
    let row = query_one(
        tx,
        "UPDATE conversations SET version = version + $2,
             context_version = CASE WHEN $3 THEN version ELSE context_version END,
             answered_version = CASE WHEN answered_version = version
                                     THEN version + $2 ELSE answered_version END
         WHERE id = $1 RETURNING version",
        &[&id.0, &step(), &forget_context],
        "moving the version",
    )
    .await?;
    fence_pending(tx, id).await?;
    Ok(Version(row.get(0)))
}

/// After a control moved the version (a setting, `/new`): the pending messages take
/// the new version, as an edit would give them, so a round that collected them before
/// the control covers none of them, even in a commit the cap forces (it covers only
/// messages unchanged since `v0`). They stay pending: the next round answers them
/// under the new setting or context. Must run in the transaction that moved the
/// version (the conversation row locked), after it.
async fn fence_pending(tx: &Tx<'_>, id: ConversationId) -> Result<(), StoreError> {
    if step() == 0 {
        return Ok(());
    }
    // Fresh: no reply written before a control covers a message after it.
    execute(
        tx,
        "UPDATE messages m SET version = c.version FROM conversations c
         WHERE c.id = $1 AND m.conversation_id = $1 AND m.version > c.answered_version",
        &[&id.0],
        "fencing pending messages",
    )
    .await?;
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

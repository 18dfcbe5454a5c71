//! The rhythm area on SQLite: learned in the commit's transaction, read back.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::sql::Context;
use crate::domain::{ConversationId, Timestamp};
use crate::rhythm::Rhythm;
use crate::store::Typing;
use crate::store::{RhythmStore, StoreError};
use crate::timing::TimerPolicy;

#[async_trait]
impl RhythmStore for SqliteStore {
    async fn rhythm(&self, conversation: ConversationId) -> Result<Rhythm, StoreError> {
        self.with_conn(move |conn| read(conn, conversation)).await
    }

    async fn extend_timer(&self, typing: Typing<'_>) -> Result<Option<Timestamp>, StoreError> {
        let (conversation, user_id) = (typing.conversation.clone(), typing.user_id.to_owned());
        let max_wait = self.timers.max_wait().as_millis() as i64;
        let until = typing.now.plus(typing.hold).0;
        self.write("extending a timer", move |tx| {
            // Capped debounce: a typing author holds the timer, never past the oldest
            // pending message + max_wait, never sooner than it was due.
            tx.prepare_cached(
                "UPDATE timers SET due_at = MAX(due_at, MIN(?4,
                     (SELECT MIN(m.received_at) FROM messages m JOIN conversations c ON c.id = m.conversation_id
                      WHERE c.id = timers.conversation_id AND m.version > c.answered_version) + ?5))
                 WHERE conversation_id = (SELECT id FROM conversations WHERE platform = ?1 AND key = ?2)
                   AND EXISTS (SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                               WHERE c.id = timers.conversation_id AND m.version > c.answered_version
                                 AND m.user_id = ?3)
                 RETURNING due_at",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![conversation.platform.as_str(), conversation.key, user_id, until, max_wait],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .ctx("extending a timer")
            .map(|due| due.map(Timestamp))
        })
        .await
    }
}

fn read(tx: &Connection, conversation: ConversationId) -> Result<Rhythm, StoreError> {
    tx.prepare_cached(
        "SELECT rhythm_bursts, rhythm_gap_ms, rhythm_multi, rhythm_last_at
         FROM conversations WHERE id = ?1",
    )
    .ctx("preparing a statement")?
    .query_row([conversation.0], |r| {
        Ok(Rhythm {
            bursts: r.get(0)?,
            gap_ms: r.get(1)?,
            multi_permille: r.get(2)?,
            last_at: r.get::<_, Option<i64>>(3)?.map(Timestamp),
        })
    })
    .optional()
    .ctx("reading the rhythm")
    .map(Option::unwrap_or_default)
}

/// Learn from a burst just answered: `received`, the arrival times of the messages
/// the committed reply covers. Must run in the commit's transaction.
pub(super) fn learn(
    tx: &Connection,
    conversation: ConversationId,
    received: &[Timestamp],
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    let rhythm = read(tx, conversation)?.learn(received, policy.debounce());
    let waits = policy.waits_of(&rhythm);
    tx.prepare_cached(
        "UPDATE conversations SET rhythm_bursts = ?2, rhythm_gap_ms = ?3, rhythm_multi = ?4,
             rhythm_last_at = ?5, rhythm_first_ms = ?6, rhythm_burst_ms = ?7
         WHERE id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![
        conversation.0,
        rhythm.bursts,
        rhythm.gap_ms,
        rhythm.multi_permille,
        rhythm.last_at.map(|t| t.0),
        waits.map(|w| w.first_ms),
        waits.map(|w| w.burst_ms)
    ])
    .ctx("learning the rhythm")?;
    Ok(())
}

//! The rhythm area on PostgreSQL: learned in the commit's transaction (with the
//! conversation row already locked), read back. Times are on the database's timeline,
//! as the messages' arrival times it learns from.

use async_trait::async_trait;

use super::PostgresStore;
use super::sql::{Tx, execute, query_opt};
use crate::domain::{ConversationId, Timestamp};
use crate::rhythm::Rhythm;
use crate::store::Typing;
use crate::store::faults::Operation;
use crate::store::{RhythmStore, StoreError};
use crate::timing::TimerPolicy;

#[async_trait]
impl RhythmStore for PostgresStore {
    async fn rhythm(&self, conversation: ConversationId) -> Result<Rhythm, StoreError> {
        transaction!(self, Operation::Read, "reading the rhythm", |tx| {
            async { read(&tx, conversation).await }.await
        })
    }

    async fn extend_timer(&self, typing: Typing<'_>) -> Result<Option<Timestamp>, StoreError> {
        let max_wait = self.timers.max_wait().as_millis() as i64;
        transaction!(self, Operation::Other, "extending a timer", |tx| {
            async {
                let now = self.now(&tx, typing.now).await?;
                let until = now.db.plus(typing.hold).0;
                // Capped debounce: a typing author holds the timer, never past the
                // oldest pending message + max_wait, never sooner than it was due.
                let row = query_opt(
                    &tx,
                    "UPDATE timers SET due_at = GREATEST(due_at, LEAST($4::int8,
                         (SELECT MIN(m.received_at) FROM messages m JOIN conversations c ON c.id = m.conversation_id
                          WHERE c.id = timers.conversation_id AND m.version > c.answered_version) + $5::int8))
                     WHERE conversation_id = (SELECT id FROM conversations WHERE platform = $1 AND key = $2)
                       AND EXISTS (SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                   WHERE c.id = timers.conversation_id AND m.version > c.answered_version
                                     AND m.user_id = $3)
                     RETURNING due_at",
                    &[&typing.conversation.platform.as_str(), &typing.conversation.key, &typing.user_id, &until, &max_wait],
                    "extending a timer",
                )
                .await?;
                Ok(row.map(|r| now.to_caller(Timestamp(r.get(0)))))
            }
            .await
        })
    }
}

/// A stored count as the summary holds it (never negative, at most `u32::MAX`).
fn count(n: i64) -> u32 {
    n.clamp(0, u32::MAX as i64) as u32
}

async fn read(tx: &Tx<'_>, conversation: ConversationId) -> Result<Rhythm, StoreError> {
    let row = query_opt(
        tx,
        "SELECT rhythm_bursts, rhythm_gap_ms, rhythm_multi, rhythm_last_at
         FROM conversations WHERE id = $1",
        &[&conversation.0],
        "reading the rhythm",
    )
    .await?;
    Ok(row
        .map(|r| Rhythm {
            bursts: count(r.get(0)),
            gap_ms: count(r.get(1)),
            multi_permille: count(r.get(2)),
            last_at: r.get::<_, Option<i64>>(3).map(Timestamp),
        })
        .unwrap_or_default())
}

/// Learn from a burst just answered: `received`, the arrival times (database
/// timeline) of the messages the committed reply covers. Must run in the commit's
/// transaction, after the conversation row was locked.
pub(super) async fn learn(
    tx: &Tx<'_>,
    conversation: ConversationId,
    received: &[Timestamp],
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    let rhythm = read(tx, conversation)
        .await?
        .learn(received, policy.debounce());
    let waits = policy.waits_of(&rhythm);
    execute(
        tx,
        "UPDATE conversations SET rhythm_bursts = $2, rhythm_gap_ms = $3, rhythm_multi = $4,
             rhythm_last_at = $5, rhythm_first_ms = $6, rhythm_burst_ms = $7
         WHERE id = $1",
        &[
            &conversation.0,
            &(rhythm.bursts as i64),
            &(rhythm.gap_ms as i64),
            &(rhythm.multi_permille as i64),
            &rhythm.last_at.map(|t| t.0),
            &waits.map(|w| i64::from(w.first_ms)),
            &waits.map(|w| i64::from(w.burst_ms)),
        ],
        "learning the rhythm",
    )
    .await?;
    Ok(())
}

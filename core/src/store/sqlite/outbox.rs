//! The outbox area on SQLite: rows owed, and the facts of their delivery.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::messages::upsert_conversation;
use super::sql::Context;
use super::{SqliteStore, stored_at};
use crate::domain::{ConversationId, ConversationRef, OutboxId, Timestamp};
use crate::store::rules;
use crate::store::{ConversationAt, Enqueue, OutboxDeferral, OutboxFailure};
use crate::store::{OutboxKind, OutboxRow, OutboxStore, PartSent, StoreError};

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn enqueue_notice(&self, queue: Enqueue<'_>) -> Result<Option<OutboxRow>, StoreError> {
        let holder = queue.holder.clone();
        self.write("queueing a notice", move |tx| {
            insert_notice(tx, &queue.notice, &holder, queue.now)
        })
        .await
    }

    async fn due_outbox(&self, at: ConversationAt) -> Result<Vec<OutboxRow>, StoreError> {
        self.with_conn(move |conn| Ok(read_owed(conn, at.conversation, at.now)?.rows))
            .await
    }

    async fn mark_sent(&self, sent: PartSent, now: Timestamp) -> Result<(), StoreError> {
        self.write("marking a reply sent", move |tx| {
            mark_part_sent(tx, sent, now)
        })
        .await
    }

    async fn defer_outbox(&self, deferral: OutboxDeferral<'_>) -> Result<(), StoreError> {
        // One host, one clock: `retry_at` is already on the timeline deadlines are
        // compared on.
        let error = deferral.error.to_owned();
        self.write("deferring a delivery", move |tx| {
            tx.prepare_cached(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?2, error = ?3
                 WHERE id = ?1 AND sent_at IS NULL AND failed_at IS NULL",
            )
            .ctx("preparing a statement")?
            .execute(params![deferral.id.0, deferral.retry_at.0, error])
            .ctx("deferring a delivery")?;
            Ok(())
        })
        .await
    }

    async fn fail_outbox(&self, failure: OutboxFailure<'_>) -> Result<(), StoreError> {
        let error = failure.error.to_owned();
        self.write("giving up a delivery", move |tx| {
            tx.prepare_cached(
                "UPDATE outbox SET attempts = attempts + 1, failed_at = ?2, error = ?3
                 WHERE id = ?1 AND sent_at IS NULL AND failed_at IS NULL",
            )
            .ctx("preparing a statement")?
            .execute(params![failure.id.0, failure.now.0, error])
            .ctx("giving up a delivery")?;
            Ok(())
        })
        .await
    }
}

/// Record that the first `parts_sent` parts of a row were delivered (and, when
/// `done`, that it is sent). A fact, not a decision: never fenced, never backwards.
pub(super) fn mark_part_sent(
    tx: &Connection,
    sent: PartSent,
    now: Timestamp,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "UPDATE outbox SET
             parts_sent = CASE WHEN parts_sent < ?2 THEN ?2 ELSE parts_sent END,
             sent_at = CASE WHEN ?3 AND sent_at IS NULL THEN ?4 ELSE sent_at END
         WHERE id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![sent.outbox.0, sent.parts_sent, sent.done, now.0])
    .ctx("marking a reply sent")?;
    Ok(())
}

/// What a conversation's outbox owes now.
pub(super) struct Owed {
    /// Undelivered rows that are due, oldest first.
    pub(super) rows: Vec<OutboxRow>,
    /// An undelivered row behind them waits for its retry.
    pub(super) held_back: bool,
}

/// One conversation's undelivered outbox rows in outbox order: a search of index
/// `outbox_undelivered` (conversation, id; only undelivered rows) for this
/// conversation, then its conversation row by key. Not `outbox_due`: that index
/// orders every conversation's undelivered rows by due time, so reading one
/// conversation through it walks all of them (the due-work query wants it, a claim
/// does not). `INDEXED BY` and `CROSS JOIN` fix that plan (a test checks it).
pub(super) const READ_OWED_SQL: &str =
    "SELECT o.id, c.platform, c.key, o.kind, o.text, o.reply_to, o.parts_sent,
            o.attempts, o.next_attempt_at, o.created_at, o.quick_replies
     FROM outbox o INDEXED BY outbox_undelivered CROSS JOIN conversations c ON c.id = o.conversation_id
     WHERE o.conversation_id = ?1 AND o.sent_at IS NULL AND o.failed_at IS NULL
     ORDER BY o.id";

/// A conversation's undelivered outbox rows that are due, oldest first, read on
/// `conn`. Delivery keeps the outbox order: a row waiting for its retry holds back the
/// rows behind it.
pub(super) fn read_owed(
    conn: &Connection,
    conversation: ConversationId,
    now: Timestamp,
) -> Result<Owed, StoreError> {
    let mut rows = Vec::new();
    let mut held_back = false;
    let mut stmt = conn
        .prepare_cached(READ_OWED_SQL)
        .ctx("reading the outbox")?;
    let mut query = stmt.query([conversation.0]).ctx("reading the outbox")?;
    while let Some(r) = query.next().ctx("reading the outbox")? {
        // Delivery keeps the outbox order: a row waiting for its retry holds
        // back the rows behind it.
        let next_attempt_at: i64 = r.get(8).ctx("reading the outbox")?;
        if next_attempt_at > now.0 {
            held_back = true;
            break;
        }
        let platform: String = r.get(1).ctx("reading the outbox")?;
        let kind: String = r.get(3).ctx("reading the outbox")?;
        rows.push(OutboxRow {
            id: OutboxId(r.get(0).ctx("reading the outbox")?),
            conversation: ConversationRef::new(
                platform.parse().map_err(StoreError::Corrupt)?,
                r.get::<_, String>(2).ctx("reading the outbox")?,
            ),
            kind: if kind == "reply" {
                OutboxKind::Reply
            } else {
                OutboxKind::Notice
            },
            text: r.get(4).ctx("reading the outbox")?,
            reply_to: r.get(5).ctx("reading the outbox")?,
            covers: Vec::new(),
            quick_replies: rules::decode_quick_replies(
                r.get::<_, Option<String>>(10)
                    .ctx("reading the outbox")?
                    .as_deref(),
            )?,
            parts_sent: r.get(6).ctx("reading the outbox")?,
            attempts: r.get(7).ctx("reading the outbox")?,
            created_at: Timestamp(r.get(9).ctx("reading the outbox")?),
            // One host, one clock: the stored time is the caller's.
            stored_at: Timestamp(r.get(9).ctx("reading the outbox")?),
        });
    }
    drop(query);
    let mut covers = conn
        .prepare_cached(
            "SELECT m.platform_message_id FROM reply_covers rc
             JOIN messages m ON m.id = rc.message_id
             WHERE rc.outbox_id = ?1 ORDER BY m.id",
        )
        .ctx("reading covered messages")?;
    for row in &mut rows {
        row.covers = covers
            .query_map([row.id.0], |r| r.get(0))
            .ctx("reading covered messages")?
            .collect::<Result<Vec<String>, _>>()
            .ctx("reading covered messages")?;
    }
    Ok(Owed { rows, held_back })
}

/// Queue `notice` (at most one per dedupe key): the row, if it was queued now. For
/// notices at ingest and a reminder's occurrence (`jobs`). Must run in a write
/// transaction.
pub(super) fn insert_notice(
    tx: &rusqlite::Connection,
    notice: &crate::store::NewNotice,
    holder: &crate::domain::HolderId,
    now: Timestamp,
) -> Result<Option<OutboxRow>, StoreError> {
    let conversation = upsert_conversation(tx, &notice.conversation, notice.is_group, now)?;
    // At most one notice per dedupe key.
    let id: Option<i64> = tx
        .prepare_cached(
            "INSERT INTO outbox (conversation_id, kind, text, reply_to, quick_replies, dedupe_key, owner, created_at, next_attempt_at)
             VALUES (?1, 'notice', ?2, ?3, ?7, ?4, ?5, ?6, ?6)
             ON CONFLICT (dedupe_key) DO NOTHING
             RETURNING id",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![
                conversation.0,
                notice.text,
                notice.reply_to,
                notice.dedupe_key,
                holder.as_str(),
                now.0,
                rules::encode_quick_replies(&notice.quick_replies),
            ],
            |r| r.get(0),
        )
        .optional()
        .ctx("queueing a notice")?;
    Ok(id.map(|id| {
        let at = stored_at(now);
        let notice = notice.clone();
        rules::notice_row(
            id,
            notice.conversation,
            notice.text,
            notice.reply_to,
            Vec::new(),
            notice.quick_replies,
            at,
        )
    }))
}

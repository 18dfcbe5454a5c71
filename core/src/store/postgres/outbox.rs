//! The outbox area on PostgreSQL: rows owed, and the facts of their delivery.

use async_trait::async_trait;

use super::PostgresStore;
use super::clock::on_caller_timeline;
use super::messages::upsert_conversation;
use super::sql::{Tx, execute, query, query_opt};
use crate::domain::{ConversationId, ConversationRef, OutboxId, Timestamp};
use crate::store::faults::Operation;
use crate::store::rules;
use crate::store::{ConversationAt, Enqueue, OutboxDeferral, OutboxFailure};
use crate::store::{OutboxKind, OutboxRow, OutboxStore, PartSent, StoreError};

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn enqueue_notice(&self, queue: Enqueue<'_>) -> Result<Option<OutboxRow>, StoreError> {
        transaction!(self, Operation::Other, "queueing a notice", |tx| {
            async {
                let now = self.now(&tx, queue.now).await?;
                insert_notice(&tx, &queue.notice, queue.holder, now).await
            }
            .await
        })
    }

    async fn due_outbox(&self, at: ConversationAt) -> Result<Vec<OutboxRow>, StoreError> {
        transaction!(self, Operation::Read, "reading the outbox", |tx| async {
            let now = self.now(&tx, at.now).await?;
            let mut owed = read_owed(&tx, at.conversation, now.db).await?.0;
            on_caller_timeline(&mut owed, now);
            Ok(owed)
        }
        .await)
    }

    async fn mark_sent(&self, sent: PartSent, now: Timestamp) -> Result<(), StoreError> {
        let fixed = self.fixed_now(now);
        // One round trip: the mark is one statement, on the database's clock.
        statement!(self, Operation::Other, "marking a reply sent", |client| {
            async { mark_part_sent(client, sent, fixed).await }.await
        })
    }

    async fn defer_outbox(&self, deferral: OutboxDeferral<'_>) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "deferring a delivery", |tx| async {
            // The caller's deadline, moved onto the database's timeline by the
            // offset of the caller's `now` (none when the caller is the clock).
            let now = self.now(&tx, deferral.now).await?;
            let retry_at = now.to_db(deferral.retry_at);
            execute(
                &tx,
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = $2, error = $3
                 WHERE id = $1 AND sent_at IS NULL AND failed_at IS NULL",
                &[&deferral.id.0, &retry_at.0, &deferral.error],
                "deferring a delivery",
            )
            .await?;
            Ok(())
        }
        .await)
    }

    async fn fail_outbox(&self, failure: OutboxFailure<'_>) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "giving up a delivery", |tx| async {
            let now = self.now(&tx, failure.now).await?;
            execute(
                &tx,
                "UPDATE outbox SET attempts = attempts + 1, failed_at = $2, error = $3
                 WHERE id = $1 AND sent_at IS NULL AND failed_at IS NULL",
                &[&failure.id.0, &now.db.0, &failure.error],
                "giving up a delivery",
            )
            .await?;
            Ok(())
        }
        .await)
    }
}

/// Record that the first `parts_sent` parts of a row were delivered (and, when
/// `done`, that it is sent, at `fixed` or the database's clock). A fact, not a
/// decision: never fenced, never backwards.
async fn mark_part_sent(
    client: &deadpool_postgres::Object,
    sent: PartSent,
    fixed: Option<i64>,
) -> Result<(), StoreError> {
    execute(
        client,
        concat!(
            "UPDATE outbox SET
                 parts_sent = GREATEST(parts_sent, $2),
                 sent_at = CASE WHEN $3 AND sent_at IS NULL THEN COALESCE($4::int8, ",
            db_now!(),
            ") ELSE sent_at END
             WHERE id = $1"
        ),
        &[
            &sent.outbox.0,
            &(sent.parts_sent as i32),
            &sent.done,
            &fixed,
        ],
        "marking a reply sent",
    )
    .await?;
    Ok(())
}

/// A conversation's undelivered outbox rows, oldest first, each with the platform ids
/// of the messages it covers: one statement ($1: the conversation).
pub(super) const OWED: &str = "SELECT o.id, c.platform, c.key, o.kind, o.text, o.reply_to, o.parts_sent,
        o.attempts, o.next_attempt_at, o.created_at, o.quick_replies,
        ARRAY(SELECT m.platform_message_id FROM reply_covers rc JOIN messages m ON m.id = rc.message_id
              WHERE rc.outbox_id = o.id ORDER BY m.id)
 FROM outbox o JOIN conversations c ON c.id = o.conversation_id
 WHERE o.conversation_id = $1 AND o.sent_at IS NULL AND o.failed_at IS NULL
 ORDER BY o.id";

/// A conversation's undelivered outbox rows that are due, oldest first, and whether a
/// row behind them waits for its retry (delivery keeps the outbox order).
pub(super) async fn read_owed(
    tx: &Tx<'_>,
    conversation: ConversationId,
    now: Timestamp,
) -> Result<(Vec<OutboxRow>, bool), StoreError> {
    let found = query(tx, OWED, &[&conversation.0], "reading the outbox").await?;
    owed_rows(found, now)
}

/// The rows of [`OWED`] due by `now`, and whether a row behind them waits for its
/// retry.
pub(super) fn owed_rows(
    found: Vec<tokio_postgres::Row>,
    now: Timestamp,
) -> Result<(Vec<OutboxRow>, bool), StoreError> {
    let mut rows = Vec::new();
    let mut held_back = false;
    for r in found {
        // Delivery keeps the outbox order: a row waiting for its retry holds back the
        // rows behind it.
        if r.get::<_, i64>(8) > now.0 {
            held_back = true;
            break;
        }
        let platform: String = r.get(1);
        rows.push(OutboxRow {
            id: OutboxId(r.get(0)),
            conversation: ConversationRef::new(
                platform.parse().map_err(StoreError::Corrupt)?,
                r.get::<_, String>(2),
            ),
            kind: if r.get::<_, &str>(3) == "reply" {
                OutboxKind::Reply
            } else {
                OutboxKind::Notice
            },
            text: r.get(4),
            reply_to: r.get(5),
            covers: r.get(11),
            quick_replies: rules::decode_quick_replies(r.get(10))?,
            parts_sent: r.get::<_, i32>(6) as u32,
            attempts: r.get::<_, i32>(7) as u32,
            created_at: Timestamp(r.get(9)),
            stored_at: Timestamp(r.get(9)),
        });
    }
    Ok((rows, held_back))
}

/// Queue `notice` (at most one per dedupe key): the row, if it was queued now. For
/// notices at ingest and a reminder's occurrence (`jobs`). Must run in a transaction.
pub(super) async fn insert_notice(
    tx: &Tx<'_>,
    notice: &crate::store::NewNotice,
    holder: &crate::domain::HolderId,
    now: super::clock::Now,
) -> Result<Option<OutboxRow>, StoreError> {
    let conversation =
        upsert_conversation(tx, &notice.conversation, notice.is_group, now.db).await?;
    // At most one notice per dedupe key.
    let id = query_opt(
        tx,
        "INSERT INTO outbox (conversation_id, kind, text, reply_to, quick_replies, dedupe_key, owner, created_at, next_attempt_at)
         VALUES ($1, 'notice', $2, $3, $7, $4, $5, $6, $6)
         ON CONFLICT (dedupe_key) DO NOTHING
         RETURNING id",
        &[&conversation.0, &notice.text, &notice.reply_to, &notice.dedupe_key, &holder.as_str(), &now.db.0, &rules::encode_quick_replies(&notice.quick_replies)],
        "queueing a notice",
    )
    .await?;
    Ok(id.map(|r| {
        let notice = notice.clone();
        rules::notice_row(
            r.get(0),
            notice.conversation,
            notice.text,
            notice.reply_to,
            Vec::new(),
            notice.quick_replies,
            now.stored(),
        )
    }))
}

//! The summaries area on SQLite: one derived row per conversation, replaced only by a
//! summary that covers more; retention's batches of tombstones.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::leases::ensure_lease;
use super::sql::Context;
use crate::domain::{ConversationId, ConversationRef, Lease, Timestamp};
use crate::store::summary_rows::{self as rows, CoverableRow, SUMMARY_COLUMNS};
use crate::store::{
    Expired, Expiry, NewSummary, StoreError, Summary, SummaryPicture, SummaryStore, SummaryStored,
};

#[async_trait]
impl SummaryStore for SqliteStore {
    async fn summary_picture(
        &self,
        conversation: ConversationId,
        limit: usize,
    ) -> Result<SummaryPicture, StoreError> {
        self.with_conn(move |conn| {
            // One read snapshot (WAL): the context, the summary and the exchanges agree.
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)
                .ctx("reading a summary's picture")?;
            let context_version = context_of(&tx, conversation)?;
            let previous = current(&tx, conversation, context_version)?;
            let after = previous.as_ref().map_or(0, |s| s.through_reply);
            let exchanges = coverable(&tx, conversation, context_version, after, limit)?;
            Ok(SummaryPicture {
                context_version,
                previous,
                exchanges,
            })
        })
        .await
    }

    async fn store_summary(
        &self,
        lease: &Lease,
        summary: &NewSummary,
        now: Timestamp,
    ) -> Result<SummaryStored, StoreError> {
        let lease = lease.clone();
        let summary = summary.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("storing a summary", move |tx| {
            if crate::switches::summary_write_back() {
                return write_back(tx, &summary, now);
            }
            // Under a lease that expires: a maker that lost it stores nothing.
            match ensure_lease(tx, &lease, &row.resource, now) {
                Ok(()) => {}
                Err(StoreError::LeaseLost(_)) => return Ok(SummaryStored::Fenced),
                Err(e) => return Err(e),
            }
            if fenced_by_an_erase(tx, &summary)? {
                return Ok(SummaryStored::Fenced);
            }
            let context_version = context_of(tx, summary.conversation)?;
            let stored: Option<(i64, i64)> = tx
                .prepare_cached(
                    "SELECT context_version, through_reply FROM summaries WHERE conversation_id = ?1",
                )
                .ctx("preparing a statement")?
                .query_row([summary.conversation.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .ctx("reading the stored summary")?;
            if let Some(verdict) = rows::verdict(&summary, context_version, stored) {
                return Ok(verdict);
            }
            upsert(tx, &summary, now)?;
            Ok(SummaryStored::Stored)
        })
        .await
    }

    async fn summary(&self, conversation: &ConversationRef) -> Result<Option<Summary>, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            let columns = SUMMARY_COLUMNS.replace(", ", ", s.");
            conn.prepare_cached(&format!(
                "SELECT s.{columns} FROM summaries s JOIN conversations c ON c.id = s.conversation_id
                 WHERE c.platform = ?1 AND c.key = ?2 AND s.context_version = c.context_version"
            ))
            .ctx("preparing a statement")?
            .query_row(
                params![conversation.platform.as_str(), conversation.key],
                summary_row,
            )
            .optional()
            .ctx("reading a summary")
        })
        .await
    }

    async fn expire_texts(&self, expiry: Expiry<'_>) -> Result<Expired, StoreError> {
        let lease = expiry.lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let (before, batch, now) = (expiry.before.0, i64::from(expiry.batch), expiry.now);
        self.write("removing old texts", move |tx| {
            // One process at a time, and none after its lease ended.
            ensure_lease(tx, &lease, &row.resource, now)?;
            // Retention: answered messages only (a pending one is never touched); the
            // row stays, so covers and counters do.
            let messages = tx
                .prepare_cached(
                    "UPDATE messages SET text = '', transcript = NULL, media = NULL, erased_at = ?3
                     WHERE id IN (
                         SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE m.erased_at IS NULL AND m.received_at < ?1
                           AND m.version <= c.answered_version
                         ORDER BY m.received_at LIMIT ?2)",
                )
                .ctx("preparing a statement")?
                .execute(params![before, batch, now.0])
                .ctx("removing old message texts")?;
            // Delivered rows only: an undelivered row keeps every word it owes.
            let replies = tx
                .prepare_cached(
                    "UPDATE outbox SET text = '', erased_at = ?3
                     WHERE id IN (
                         SELECT id FROM outbox
                         WHERE erased_at IS NULL AND sent_at IS NOT NULL AND sent_at < ?1
                         ORDER BY sent_at LIMIT ?2)",
                )
                .ctx("preparing a statement")?
                .execute(params![before, batch, now.0])
                .ctx("removing old reply texts")?;
            let overheard = tx
                .prepare_cached(
                    "DELETE FROM overheard WHERE id IN (
                         SELECT id FROM overheard WHERE received_at < ?1 ORDER BY received_at LIMIT ?2)",
                )
                .ctx("preparing a statement")?
                .execute(params![before, batch])
                .ctx("removing old group context")?;
            Ok(Expired {
                messages: messages as u64,
                replies: replies as u64,
                overheard: overheard as u64,
            })
        })
        .await
    }
}

/// Whether a `/forgetme` came after `summary`'s picture was read (its newest message
/// at or below the fence the erase left for the conversation).
fn fenced_by_an_erase(tx: &Connection, summary: &NewSummary) -> Result<bool, StoreError> {
    if crate::switches::unfenced_memory() {
        return Ok(false);
    }
    tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM memory_fences
           WHERE kind = 'summary' AND owner = ?1 AND through_message >= ?2)",
    )
    .ctx("preparing a statement")?
    .query_row(
        params![
            summary.conversation.0.to_string(),
            summary.picture_newest_message
        ],
        |r| r.get(0),
    )
    .ctx("reading the summary fences")
}

/// The conversation's context version (its last `/new`).
fn context_of(tx: &Connection, conversation: ConversationId) -> Result<i64, StoreError> {
    tx.prepare_cached("SELECT context_version FROM conversations WHERE id = ?1")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| r.get(0))
        .optional()
        .ctx("reading a conversation")?
        .ok_or(StoreError::NoConversation(conversation))
}

/// The conversation's summary of its context `context_version`, if one is stored.
pub(super) fn current(
    tx: &Connection,
    conversation: ConversationId,
    context_version: i64,
) -> Result<Option<Summary>, StoreError> {
    tx.prepare_cached(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries WHERE conversation_id = ?1 AND context_version = ?2"
    ))
    .ctx("preparing a statement")?
    .query_row(params![conversation.0, context_version], summary_row)
    .optional()
    .ctx("reading the summary")
}

/// A summary from its columns ([`SUMMARY_COLUMNS`]).
fn summary_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Summary> {
    Ok(rows::summary(
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

/// At most `limit` exchanges after the reply `after`, since the context, oldest first.
fn coverable(
    tx: &Connection,
    conversation: ConversationId,
    context_version: i64,
    after: i64,
    limit: usize,
) -> Result<Vec<crate::store::CoverableExchange>, StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT o.id, o.text, m.id, m.received_at, m.author, m.text, m.transcript
             FROM (SELECT id, text FROM outbox
                   WHERE conversation_id = ?1 AND kind = 'reply' AND failed_at IS NULL AND version > ?2
                     AND id > ?3 AND erased_at IS NULL
                   ORDER BY id LIMIT ?4) o
             JOIN reply_covers rc ON rc.outbox_id = o.id
             JOIN messages m ON m.id = rc.message_id
             ORDER BY o.id, m.id",
        )
        .ctx("reading a summary's picture")?;
    let read = stmt
        .query_map(
            params![conversation.0, context_version, after, limit as i64],
            |r| {
                Ok(CoverableRow {
                    reply: r.get(0)?,
                    reply_text: r.get(1)?,
                    message: r.get(2)?,
                    received_at: r.get(3)?,
                    author: r.get(4)?,
                    text: r.get(5)?,
                    transcript: r.get(6)?,
                })
            },
        )
        .ctx("reading a summary's picture")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading a summary's picture")?;
    Ok(rows::coverable(read))
}

/// Replace the conversation's summary row with `summary`.
fn upsert(tx: &Connection, summary: &NewSummary, now: Timestamp) -> Result<(), StoreError> {
    let usage = summary.usage;
    tx.prepare_cached(
        "INSERT INTO summaries (conversation_id, context_version, through_reply, through_message,
                                through_at, messages, text, model, prompt_tokens, completion_tokens, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (conversation_id) DO UPDATE SET
             context_version = excluded.context_version, through_reply = excluded.through_reply,
             through_message = excluded.through_message, through_at = excluded.through_at,
             messages = excluded.messages, text = excluded.text, model = excluded.model,
             prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens,
             created_at = excluded.created_at",
    )
    .ctx("preparing a statement")?
    .execute(params![
        summary.conversation.0,
        summary.context_version,
        summary.through_reply,
        summary.through_message,
        summary.through_at.0,
        summary.messages as i64,
        summary.text,
        summary.model,
        usage.map(|u| u.prompt as i64),
        usage.map(|u| u.completion as i64),
        now.0,
    ])
    .ctx("storing a summary")?;
    Ok(())
}

/// The counter-test's store (`LULL_TEST_SUMMARY_WRITE_BACK`): the peers' trimmed
/// history saved over the full one — the summary replaces the row whoever holds the
/// lease and whatever it covers, and the texts it covers and every text after its
/// picture are removed.
fn write_back(
    tx: &Connection,
    summary: &NewSummary,
    now: Timestamp,
) -> Result<SummaryStored, StoreError> {
    upsert(tx, summary, now)?;
    tx.execute(
        "UPDATE messages SET text = '', transcript = NULL
         WHERE conversation_id = ?1 AND (id <= ?2 OR id > ?3)",
        params![
            summary.conversation.0,
            summary.through_message,
            summary.picture_newest_message
        ],
    )
    .ctx("writing the history back")?;
    Ok(SummaryStored::Stored)
}

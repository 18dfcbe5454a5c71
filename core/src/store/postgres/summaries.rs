//! The summaries area on PostgreSQL: one derived row per conversation, replaced only
//! by a summary that covers more (the upsert's own condition, so two stores never
//! both win); retention's batches of tombstones.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use super::leases::ensure_lease;
use super::memories::{fence_key, lock_fences};
use super::sql::{Tx, execute, query, query_one, query_opt};
use crate::domain::{ConversationId, ConversationRef, Lease, Timestamp};
use crate::store::faults::Operation;
use crate::store::summary_rows::{self as rows, CoverableRow, SUMMARY_COLUMNS};
use crate::store::{
    Expired, Expiry, NewSummary, StoreError, Summary, SummaryPicture, SummaryStore, SummaryStored,
};

#[async_trait]
impl SummaryStore for PostgresStore {
    async fn summary_picture(
        &self,
        conversation: ConversationId,
        limit: usize,
    ) -> Result<SummaryPicture, StoreError> {
        transaction!(self, Operation::Read, "reading a summary's picture", |tx| {
            async {
                // The conversation row first, shared: no `/new` commits while the rest
                // is read, so the context, the summary and the exchanges agree.
                let context_version = context_of(&tx, conversation, " FOR SHARE").await?;
                let previous = current(&tx, conversation, context_version).await?;
                let after = previous.as_ref().map_or(0, |s| s.through_reply);
                let found = query(
                    &tx,
                    "SELECT o.id, o.text, m.id, m.received_at, m.author, m.text, m.transcript
                     FROM (SELECT id, text FROM outbox
                           WHERE conversation_id = $1 AND kind = 'reply' AND failed_at IS NULL
                             AND version > $2 AND id > $3 AND erased_at IS NULL
                           ORDER BY id LIMIT $4) o
                     JOIN reply_covers rc ON rc.outbox_id = o.id
                     JOIN messages m ON m.id = rc.message_id
                     ORDER BY o.id, m.id",
                    &[&conversation.0, &context_version, &after, &(limit as i64)],
                    "reading a summary's picture",
                )
                .await?;
                let exchanges = rows::coverable(found.iter().map(|r| CoverableRow {
                    reply: r.get(0),
                    reply_text: r.get(1),
                    message: r.get(2),
                    received_at: r.get(3),
                    author: r.get(4),
                    text: r.get(5),
                    transcript: r.get(6),
                }));
                Ok(SummaryPicture {
                    context_version,
                    previous,
                    exchanges,
                })
            }
            .await
        })
    }

    async fn store_summary(
        &self,
        lease: &Lease,
        summary: &NewSummary,
        now: Timestamp,
    ) -> Result<SummaryStored, StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        transaction!(self, Operation::Other, "storing a summary", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                if crate::switches::summary_write_back() {
                    return write_back(&tx, summary, now.db).await;
                }
                // Under a lease that expires: a maker that lost it stores nothing. The
                // lease row stays locked to the end, so makers queue here.
                match ensure_lease(&tx, lease, &row, now).await {
                    Ok(()) => {}
                    Err(StoreError::LeaseLost(_)) => return Ok(SummaryStored::Fenced),
                    Err(e) => return Err(e),
                }
                if fenced_by_an_erase(&tx, summary).await? {
                    return Ok(SummaryStored::Fenced);
                }
                let context_version = context_of(&tx, summary.conversation, "").await?;
                if let Some(verdict) = rows::verdict(summary, context_version, None) {
                    return Ok(verdict);
                }
                // Only if it covers more: the upsert's own condition decides.
                let stored = upsert(&tx, summary, now.db).await?;
                Ok(if stored {
                    SummaryStored::Stored
                } else {
                    SummaryStored::Superseded
                })
            }
            .await
        })
    }

    async fn summary(&self, conversation: &ConversationRef) -> Result<Option<Summary>, StoreError> {
        let columns = SUMMARY_COLUMNS.replace(", ", ", s.");
        let sql = format!(
            "SELECT s.{columns} FROM summaries s JOIN conversations c ON c.id = s.conversation_id
             WHERE c.platform = $1 AND c.key = $2 AND s.context_version = c.context_version"
        );
        transaction!(self, Operation::Read, "reading a summary", |tx| {
            async {
                Ok(query_opt(
                    &tx,
                    &sql,
                    &[&conversation.platform.as_str(), &conversation.key],
                    "reading a summary",
                )
                .await?
                .map(|r| summary_row(&r)))
            }
            .await
        })
    }

    async fn expire_texts(&self, expiry: Expiry<'_>) -> Result<Expired, StoreError> {
        let row = self.row(&expiry.lease.key, &expiry.lease.holder);
        let batch = i64::from(expiry.batch);
        transaction!(self, Operation::Other, "removing old texts", |tx| {
            async {
                let now = self.now(&tx, expiry.now).await?;
                // One process at a time, and none after its lease ended.
                ensure_lease(&tx, expiry.lease, &row, now).await?;
                let before = now.to_db(expiry.before).0;
                // Retention: answered messages only (a pending one is never touched;
                // the conversation's answered version read in the same statement, and
                // a message edited since is pending again). Rows stay: covers and
                // counters do. SKIP LOCKED: a message an ingest or commit holds is
                // left for the next batch rather than waited for.
                let messages = execute(
                    &tx,
                    "UPDATE messages SET text = '', transcript = NULL, media = NULL, erased_at = $3
                     WHERE id IN (
                         SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE m.erased_at IS NULL AND m.received_at < $1
                           AND m.version <= c.answered_version
                         ORDER BY m.received_at LIMIT $2
                         FOR UPDATE OF m SKIP LOCKED)",
                    &[&before, &batch, &now.db.0],
                    "removing old message texts",
                )
                .await?;
                // Delivered rows only: an undelivered row keeps every word it owes.
                let replies = execute(
                    &tx,
                    "UPDATE outbox SET text = '', erased_at = $3
                     WHERE id IN (
                         SELECT id FROM outbox
                         WHERE erased_at IS NULL AND sent_at IS NOT NULL AND sent_at < $1
                         ORDER BY sent_at LIMIT $2
                         FOR UPDATE SKIP LOCKED)",
                    &[&before, &batch, &now.db.0],
                    "removing old reply texts",
                )
                .await?;
                let overheard = execute(
                    &tx,
                    "DELETE FROM overheard WHERE id IN (
                         SELECT id FROM overheard WHERE received_at < $1
                         ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
                    &[&before, &batch],
                    "removing old group context",
                )
                .await?;
                Ok(Expired {
                    messages,
                    replies,
                    overheard,
                })
            }
            .await
        })
    }
}

/// Whether a `/forgetme` came after `summary`'s picture was read (its newest message
/// at or below the fence the erase left for the conversation). The fence's advisory
/// lock is taken shared first, so an erase and this store never interleave.
async fn fenced_by_an_erase(tx: &Tx<'_>, summary: &NewSummary) -> Result<bool, StoreError> {
    if crate::switches::unfenced_memory() {
        return Ok(false);
    }
    let chat = summary.conversation.0.to_string();
    let platform: String = query_one(
        tx,
        "SELECT platform FROM conversations WHERE id = $1",
        &[&summary.conversation.0],
        "reading a conversation",
    )
    .await?
    .get(0);
    let platform: lull_port::Platform = platform.parse().map_err(StoreError::Corrupt)?;
    lock_fences(tx, vec![fence_key(platform, "summary", &chat)], true).await?;
    Ok(query_one(
        tx,
        "SELECT EXISTS (SELECT 1 FROM memory_fences
           WHERE kind = 'summary' AND owner = $1 AND through_message >= $2)",
        &[&chat, &summary.picture_newest_message],
        "reading the summary fences",
    )
    .await?
    .get(0))
}

/// The conversation's context version (its last `/new`), read with `lock`.
async fn context_of(
    tx: &Tx<'_>,
    conversation: ConversationId,
    lock: &'static str,
) -> Result<i64, StoreError> {
    let sql = format!("SELECT context_version FROM conversations WHERE id = $1{lock}");
    query_opt(tx, &sql, &[&conversation.0], "reading a conversation")
        .await?
        .map(|r| r.get(0))
        .ok_or(StoreError::NoConversation(conversation))
}

/// The conversation's summary of its context `context_version`, if one is stored.
pub(super) async fn current(
    tx: &Tx<'_>,
    conversation: ConversationId,
    context_version: i64,
) -> Result<Option<Summary>, StoreError> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries WHERE conversation_id = $1 AND context_version = $2"
    );
    Ok(query_opt(
        tx,
        &sql,
        &[&conversation.0, &context_version],
        "reading the summary",
    )
    .await?
    .map(|r| summary_row(&r)))
}

/// A summary from its columns ([`SUMMARY_COLUMNS`]).
pub(super) fn summary_row(r: &Row) -> Summary {
    rows::summary(
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        r.get(6),
    )
}

/// Store `summary` unless the row holds a summary of its context covering as much or
/// more; `true` if it was stored.
async fn upsert(tx: &Tx<'_>, summary: &NewSummary, now: Timestamp) -> Result<bool, StoreError> {
    let usage = summary.usage;
    let stored = execute(
        tx,
        "INSERT INTO summaries (conversation_id, context_version, through_reply, through_message,
                                through_at, messages, text, model, prompt_tokens, completion_tokens, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (conversation_id) DO UPDATE SET
             context_version = excluded.context_version, through_reply = excluded.through_reply,
             through_message = excluded.through_message, through_at = excluded.through_at,
             messages = excluded.messages, text = excluded.text, model = excluded.model,
             prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens,
             created_at = excluded.created_at
         WHERE summaries.context_version <> excluded.context_version
            OR summaries.through_reply < excluded.through_reply",
        &[
            &summary.conversation.0,
            &summary.context_version,
            &summary.through_reply,
            &summary.through_message,
            &summary.through_at.0,
            &(summary.messages as i64),
            &summary.text,
            &summary.model,
            &usage.map(|u| u.prompt as i64),
            &usage.map(|u| u.completion as i64),
            &now.0,
        ],
        "storing a summary",
    )
    .await?;
    Ok(stored == 1)
}

/// The counter-test's store (`LULL_TEST_SUMMARY_WRITE_BACK`): the peers' trimmed
/// history saved over the full one — the summary replaces the row whoever holds the
/// lease and whatever it covers, and the texts it covers and every text after its
/// picture are removed.
async fn write_back(
    tx: &Tx<'_>,
    summary: &NewSummary,
    now: Timestamp,
) -> Result<SummaryStored, StoreError> {
    execute(
        tx,
        "DELETE FROM summaries WHERE conversation_id = $1",
        &[&summary.conversation.0],
        "writing the history back",
    )
    .await?;
    upsert(tx, summary, now).await?;
    execute(
        tx,
        "UPDATE messages SET text = '', transcript = NULL
         WHERE conversation_id = $1 AND (id <= $2 OR id > $3)",
        &[
            &summary.conversation.0,
            &summary.through_message,
            &summary.picture_newest_message,
        ],
        "writing the history back",
    )
    .await?;
    Ok(SummaryStored::Stored)
}

//! The rounds area on SQLite: a conversation's round under its lease.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::leases::{claim, ensure_lease};
use super::messages::pending_after;
use super::outbox::read_owed;
use super::sql::Context;
use super::{SqliteStore, stored_at};
use crate::domain::{
    ConversationId, ConversationRef, Lease, LeaseKey, LeaseToken, Platform, Said, Timestamp,
    Version,
};
use crate::store::rules::{self, conversation_of};
use crate::store::{
    Batch, Claimed, CommitOutcome, Exchange, OutboxRow, PendingMessage, RoundStore, StoreError,
    TimerState,
};
use crate::store::{GiveUp, IdleDisarm, ReplyCommit, RoundClaim, RoundFailure, TranscriptWrite};
use crate::timing::TimerPolicy;

#[async_trait]
impl RoundStore for SqliteStore {
    async fn claim_round(&self, asked: RoundClaim<'_>) -> Result<Option<Claimed>, StoreError> {
        let key = LeaseKey::Conversation(asked.conversation);
        let holder = asked.holder.clone();
        let row = self.lease_rows.row(&key, &holder);
        self.write("claiming a round", move |tx| {
            let Some(lease) = claim(tx, key, holder, &row, asked.ttl, asked.now)? else {
                return Ok(None);
            };
            give_back_orphans(tx, asked.conversation, lease.token)?;
            // What the round works on, read under the lease it just claimed.
            let batch = read_batch(tx, asked.conversation, asked.history, asked.summaries)?;
            let owed = read_owed(tx, asked.conversation, asked.now)?;
            Ok(Some(Claimed {
                lease,
                batch,
                owed: owed.rows,
                held_back: owed.held_back,
            }))
        })
        .await
    }

    async fn collect(
        &self,
        conversation: ConversationId,
        history: usize,
    ) -> Result<Batch, StoreError> {
        self.with_conn(move |conn| {
            // One read snapshot (WAL): version, pending messages and timer agree.
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Deferred)
                .ctx("collecting a batch")?;
            read_batch(&tx, conversation, history, false)
        })
        .await
    }

    async fn commit_reply(&self, asked: ReplyCommit<'_>) -> Result<CommitOutcome, StoreError> {
        let lease = asked.lease.clone();
        let conversation = asked.batch.conversation_id;
        let v0 = asked.batch.v0;
        let covered: Vec<i64> = asked.batch.pending.iter().map(|m| m.row).collect();
        let message_ids: Vec<(i64, String)> = asked
            .batch
            .pending
            .iter()
            .map(|m| (m.row, m.message_id.clone()))
            .collect();
        let reference = asked.batch.conversation.clone();
        let reply_to = asked.batch.last_message_id().map(str::to_owned);
        let oldest = asked.batch.oldest_pending_at().unwrap_or(asked.now);
        let received: Vec<Timestamp> = asked.batch.pending.iter().map(|m| m.received_at).collect();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let policy = self.timers;
        self.write("committing a reply", move |tx| {
            ensure_lease(tx, &lease, &row.resource, asked.now)?;
            let version: i64 = tx
                .prepare_cached("SELECT version FROM conversations WHERE id = ?1")
                .ctx("preparing a statement")?
                .query_row([conversation.0], |r| r.get(0))
                .ctx("reading the version")?;
            // Fresh: stale unless the cap forces it out (`rules::commit_verdict`).
            let Some(forced) = rules::commit_verdict(policy, version, v0, oldest, asked.now) else {
                return Ok(rules::stale(version));
            };
            // No duplicate: a message edited since it was collected is pending again
            // (its version is past v0), so the reply covers only what is unchanged.
            let covered = if forced {
                unchanged_since(tx, &covered, v0)?
            } else {
                covered
            };
            if covered.is_empty() {
                return Ok(rules::stale(version));
            }
            let usage = asked.reply.usage.unwrap_or_default();
            let outbox: i64 = tx
                .prepare_cached(
                    "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token, forced,
                                         prompt_tokens, completion_tokens, llm_ms, owner, created_at, next_attempt_at)
                     VALUES (?1, 'reply', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?11, ?10, ?10)
                     RETURNING id",
                )
                .ctx("preparing a statement")?
                .query_row(
                    params![
                        conversation.0,
                        &asked.reply.text,
                        reply_to,
                        v0.0,
                        lease.token.0,
                        forced,
                        asked.reply.usage.map(|_| usage.prompt as i64),
                        asked.reply.usage.map(|_| usage.completion as i64),
                        asked.reply.llm_ms as i64,
                        asked.now.0,
                        lease.holder.as_str(),
                    ],
                    |r| r.get(0),
                )
                .ctx("storing a reply")?;
            record_covers(tx, outbox, &covered)?;
            let notices = store_held_out(tx, &lease, &reference, &asked.reply.held_out, v0, forced, asked.now)?;
            answer_through(tx, conversation, v0, policy)?;
            super::rhythm::learn(tx, conversation, &received, policy)?;
            let memories = super::memories::apply(tx, &asked.reply.memories, asked.now)?;
            let reply = rules::reply_row(outbox, reference, asked.reply.text, reply_to, stored_at(asked.now));
            let collected = message_ids.iter().map(|(row, id)| (*row, id.as_str()));
            Ok(rules::committed(collected, &covered, reply, notices, forced, memories))
        })
        .await
    }

    async fn give_up(&self, giving_up: GiveUp<'_>) -> Result<Option<OutboxRow>, StoreError> {
        let lease = giving_up.lease.clone();
        let conversation = giving_up.batch.conversation_id;
        let v0 = giving_up.batch.v0;
        let reply_to = giving_up.batch.last_message_id().map(str::to_owned);
        let reference = giving_up.batch.conversation.clone();
        let notice = giving_up.notice.to_owned();
        let quick_replies = giving_up.quick_replies.to_vec();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let policy = self.timers;
        self.write("giving up on a batch", move |tx| {
            ensure_lease(tx, &lease, &row.resource, giving_up.now)?;
            // What this give-up ends: messages still pending up to v0 (an edit since
            // the batch was collected moved its message past v0: it stays pending).
            // No duplicate: a message already covered is never covered again.
            let covered: Vec<(i64, String)> = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT m.id, m.platform_message_id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE c.id = ?1 AND m.version > c.answered_version AND m.version <= ?2
                           AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)
                         ORDER BY m.id",
                    )
                    .ctx("finding the messages given up on")?;
                stmt.query_map(params![conversation.0, v0.0], |r| Ok((r.get(0)?, r.get(1)?)))
                    .ctx("finding the messages given up on")?
                    .collect::<Result<_, _>>()
                    .ctx("finding the messages given up on")?
            };
            if covered.is_empty() {
                return Ok(None);
            }
            let notice_row = CoveringNotice { text: &notice, reply_to: &reply_to, quick_replies: &quick_replies, v0, lease: &lease, now: giving_up.now };
            let outbox = notice_row.store(tx, conversation, &covered, "storing a give-up notice")?;
            answer_through(tx, conversation, v0, policy)?;
            let covers = covered.into_iter().map(|(_, id)| id).collect();
            Ok(Some(rules::notice_row(outbox, reference, notice, reply_to, covers, quick_replies, stored_at(giving_up.now))))
        })
        .await
    }

    async fn store_transcript(&self, write: TranscriptWrite<'_>) -> Result<bool, StoreError> {
        let lease = write.lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let transcript = write.transcript.to_owned();
        self.write("storing a transcript", move |tx| {
            ensure_lease(tx, &lease, &row.resource, write.now)?;
            let conversation = conversation_of(&lease);
            let stored = tx
                .execute(
                    "UPDATE messages SET transcript = ?3
                     WHERE id = ?1 AND conversation_id = ?2 AND transcript IS NULL",
                    params![write.message, conversation.0, transcript],
                )
                .ctx("storing a transcript")?;
            Ok(stored == 1)
        })
        .await
    }

    async fn disarm_idle_timer(&self, disarm: IdleDisarm<'_>) -> Result<(), StoreError> {
        let lease = disarm.lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("disarming an idle timer", move |tx| {
            ensure_lease(tx, &lease, &row.resource, disarm.now)?;
            let conversation = conversation_of(&lease);
            tx.prepare_cached(
                "DELETE FROM timers WHERE conversation_id = ?1 AND armed_version <= ?2
                 AND NOT EXISTS (SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                 WHERE c.id = ?1 AND m.version > c.answered_version)",
            )
            .ctx("preparing a statement")?
            .execute(params![conversation.0, disarm.v0.0])
            .ctx("disarming an idle timer")?;
            Ok(())
        })
        .await
    }

    async fn record_failure(&self, failure: RoundFailure<'_>) -> Result<u32, StoreError> {
        let lease = failure.lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("recording a failed generation", move |tx| {
            ensure_lease(tx, &lease, &row.resource, failure.now)?;
            let conversation = conversation_of(&lease);
            let attempts: Option<u32> = tx
                .prepare_cached(
                    "UPDATE timers SET attempts = attempts + 1, retry_at = ?2,
                         due_at = CASE WHEN due_at < ?2 THEN ?2 ELSE due_at END
                     WHERE conversation_id = ?1 RETURNING attempts",
                )
                .ctx("preparing a statement")?
                .query_row(params![conversation.0, failure.retry_at.0], |r| r.get(0))
                .optional()
                .ctx("recording a failed generation")?;
            Ok(attempts.unwrap_or(0))
        })
        .await
    }
}

/// Hold a conversation's timer: not due before `until` (a later deadline is kept).
/// Give back the reservations of the conversation's earlier leases (rounds abandoned
/// before they settled: a lost lease, a stop, a crash), tokens and dollars, each on
/// the row it was reserved on, in the lock order of every charge (scope, then day).
fn give_back_orphans(
    tx: &Connection,
    conversation: ConversationId,
    token: LeaseToken,
) -> Result<(), StoreError> {
    let orphans: Vec<(String, String, i64, i64)> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT scope, day, SUM(tokens), SUM(cost) FROM token_reservations
                 WHERE conversation_id = ?1 AND lease_token < ?2
                 GROUP BY scope, day ORDER BY scope, day",
            )
            .ctx("reading abandoned reservations")?;
        stmt.query_map(params![conversation.0, token.0], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .ctx("reading abandoned reservations")?
        .collect::<Result<_, _>>()
        .ctx("reading abandoned reservations")?
    };
    if orphans.is_empty() {
        return Ok(());
    }
    let mut give_back = tx
        .prepare_cached(
            "UPDATE token_usage SET tokens = MAX(tokens - ?3, 0), cost = MAX(cost - ?4, 0)
             WHERE scope = ?1 AND day = ?2",
        )
        .ctx("giving back a reservation")?;
    for (scope, day, tokens, cost) in &orphans {
        give_back
            .execute(params![scope, day, tokens, cost])
            .ctx("giving back a reservation")?;
    }
    tx.prepare_cached(
        "DELETE FROM token_reservations WHERE conversation_id = ?1 AND lease_token < ?2",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, token.0])
    .ctx("giving back a reservation")?;
    tracing::info!(%conversation, scopes = orphans.len(), "gave back the reservation of an abandoned round");
    Ok(())
}

/// The batch of a conversation: version, pending messages, recent history (after the
/// summary, with `summaries`) and timer, read on `tx` (one snapshot).
fn read_batch(
    tx: &Connection,
    conversation: ConversationId,
    history: usize,
    summaries: bool,
) -> Result<Batch, StoreError> {
    let row: Option<(String, String, bool, i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT platform, key, is_group, version, answered_version, context_version
             FROM conversations WHERE id = ?1",
        )
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .optional()
        .ctx("reading a conversation")?;
    let Some((platform, key, is_group, version, answered, context_version)) = row else {
        return Err(StoreError::NoConversation(conversation));
    };
    let platform: Platform = platform.parse().map_err(StoreError::Corrupt)?;
    let pending = read_pending(tx, conversation, answered)?;
    let timer = tx
        .prepare_cached("SELECT due_at, attempts FROM timers WHERE conversation_id = ?1")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| {
            Ok(TimerState {
                due_at: Timestamp(r.get(0)?),
                attempts: r.get(1)?,
            })
        })
        .optional()
        .ctx("reading the timer")?;
    // Nothing to answer (a round that only delivers): no history needed.
    let summary = if summaries && !pending.is_empty() {
        super::summaries::current(tx, conversation, context_version)?
    } else {
        None
    };
    let history = if pending.is_empty() {
        Vec::new()
    } else {
        let after = summary.as_ref().map_or(0, |s| s.through_reply);
        read_history(tx, conversation, context_version, after, history)?
    };
    Ok(Batch {
        conversation_id: conversation,
        conversation: ConversationRef::new(platform, key),
        is_group,
        v0: Version(version),
        pending,
        history,
        summary,
        timer,
    })
}

/// The messages of `conversation` after its answered version, oldest first: the
/// pending batch.
fn read_pending(
    tx: &Connection,
    conversation: ConversationId,
    answered: i64,
) -> Result<Vec<PendingMessage>, StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT id, platform_message_id, user_id, author, text, version, received_at, media, transcript
             FROM messages WHERE conversation_id = ?1 AND version > ?2 ORDER BY id",
        )
        .ctx("reading pending messages")?;
    let rows = stmt
        .query_map(params![conversation.0, answered], |r| {
            let media: Option<String> = r.get(7)?;
            let message = PendingMessage {
                row: r.get(0)?,
                message_id: r.get(1)?,
                user_id: r.get(2)?,
                author: r.get(3)?,
                text: r.get(4)?,
                version: Version(r.get(5)?),
                received_at: Timestamp(r.get(6)?),
                media: Vec::new(),
                transcript: r.get(8)?,
            };
            Ok((message, media))
        })
        .ctx("reading pending messages")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading pending messages")?;
    rows.into_iter()
        .map(|(message, media)| {
            Ok(PendingMessage {
                media: crate::store::decode_media(media.as_deref())?,
                ..message
            })
        })
        .collect()
}

/// The rows among `rows` that still carry a version at or before `v0`: an edit moves a
/// message past `v0`, making it pending again.
fn unchanged_since(tx: &Connection, rows: &[i64], v0: Version) -> Result<Vec<i64>, StoreError> {
    let mut stmt = tx
        .prepare_cached("SELECT version <= ?2 FROM messages WHERE id = ?1")
        .ctx("checking for edits")?;
    let mut unchanged = Vec::with_capacity(rows.len());
    for &row in rows {
        let same: bool = stmt
            .query_row(params![row, v0.0], |r| r.get(0))
            .ctx("checking for edits")?;
        if same {
            unchanged.push(row);
        }
    }
    Ok(unchanged)
}

/// The notices of a reply's held-out messages ([`NewReply::held_out`]), stored in the
/// commit's transaction: each covers its messages still pending up to `v0` (after a
/// forced commit, not those edited since) and not covered yet (no duplicate), so the
/// `answered_version` the commit sets leaves none of them unanswered (no loss).
fn store_held_out(
    tx: &Connection,
    lease: &Lease,
    conversation: &ConversationRef,
    held_out: &[crate::store::HeldOut],
    v0: Version,
    forced: bool,
    now: Timestamp,
) -> Result<Vec<OutboxRow>, StoreError> {
    let id = conversation_of(lease);
    let mut notices = Vec::new();
    for held in held_out {
        let rows = if forced {
            unchanged_since(tx, &held.rows, v0)?
        } else {
            held.rows.clone()
        };
        let mut covered: Vec<(i64, String)> = Vec::new();
        {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT platform_message_id FROM messages m
                     WHERE id = ?1 AND conversation_id = ?2
                       AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)",
                )
                .ctx("reading held-out messages")?;
            for row in rows {
                if let Some(message_id) = stmt
                    .query_row(params![row, id.0], |r| r.get::<_, String>(0))
                    .optional()
                    .ctx("reading held-out messages")?
                {
                    covered.push((row, message_id));
                }
            }
        }
        if covered.is_empty() {
            continue;
        }
        let notice = CoveringNotice {
            text: &held.text,
            reply_to: &held.reply_to,
            quick_replies: &[],
            v0,
            lease,
            now,
        };
        let outbox = notice.store(tx, id, &covered, "storing a held-out notice")?;
        let at = stored_at(now);
        notices.push(rules::held_out_row(outbox, conversation, held, covered, at));
    }
    Ok(notices)
}

/// A notice that answers messages (a give-up, or the notice of messages a reply left
/// out), stored under the lease at `v0`.
struct CoveringNotice<'a> {
    text: &'a str,
    reply_to: &'a Option<String>,
    quick_replies: &'a [lull_port::QuickReply],
    v0: Version,
    lease: &'a Lease,
    now: Timestamp,
}

impl CoveringNotice<'_> {
    /// Store it as an outbox row covering `covered` (message row, platform id), with its
    /// `reply_covers`, in the caller's transaction; the row's id.
    fn store(
        &self,
        tx: &Connection,
        conversation: ConversationId,
        covered: &[(i64, String)],
        context: &'static str,
    ) -> Result<i64, StoreError> {
        let outbox: i64 = tx
            .prepare_cached(
                "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token,
                                     owner, created_at, next_attempt_at, quick_replies)
                 VALUES (?1, 'notice', ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8)
                 RETURNING id",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![
                    conversation.0,
                    self.text,
                    self.reply_to,
                    self.v0.0,
                    self.lease.token.0,
                    self.lease.holder.as_str(),
                    self.now.0,
                    rules::encode_quick_replies(self.quick_replies),
                ],
                |r| r.get(0),
            )
            .ctx(context)?;
        let rows: Vec<i64> = covered.iter().map(|(row, _)| *row).collect();
        record_covers(tx, outbox, &rows)?;
        Ok(outbox)
    }
}

/// Record which messages an outbox row (a reply, or a give-up notice) answers.
fn record_covers(tx: &Connection, outbox: i64, messages: &[i64]) -> Result<(), StoreError> {
    let mut cover = tx
        .prepare_cached("INSERT INTO reply_covers (outbox_id, message_id) VALUES (?1, ?2)")
        .ctx("recording covered messages")?;
    for message in messages {
        cover
            .execute(params![outbox, message])
            .ctx("recording covered messages")?;
    }
    Ok(())
}

/// Mark everything up to `v0` answered, after a reply or a give-up was stored in the
/// same transaction: the timer goes unless a newer message armed it, and then it is
/// re-armed for the messages still pending.
fn answer_through(
    tx: &Connection,
    conversation: ConversationId,
    v0: Version,
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    // The answered version only grows.
    tx.prepare_cached(
        "UPDATE conversations SET answered_version = ?2 WHERE id = ?1 AND answered_version < ?2",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, v0.0])
    .ctx("marking the batch answered")?;
    // The timer goes only if nothing newer than v0 armed it.
    let deleted = tx
        .prepare_cached("DELETE FROM timers WHERE conversation_id = ?1 AND armed_version <= ?2")
        .ctx("preparing a statement")?
        .execute(params![conversation.0, v0.0])
        .ctx("deleting the timer")?;
    if deleted == 0 {
        rearm_for_remaining(tx, conversation, v0, policy)?;
    }
    Ok(())
}

/// After a forced commit, messages newer than `v0` are still pending: their timer
/// stays, and its cap now counts from the oldest of them, not from the burst just
/// answered.
fn rearm_for_remaining(
    tx: &Connection,
    conversation: ConversationId,
    v0: Version,
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    let (pending, first_pending) = pending_after(tx, conversation, v0.0)?;
    let Some(first_pending) = first_pending else {
        return Ok(());
    };
    let armed_at: Option<i64> = tx
        .prepare_cached("SELECT armed_at FROM timers WHERE conversation_id = ?1")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| r.get(0))
        .optional()
        .ctx("reading the timer")?;
    let Some(armed_at) = armed_at else {
        return Ok(());
    };
    let due_at = policy.due_at(Timestamp(armed_at), first_pending, pending);
    tx.prepare_cached(
        "UPDATE timers SET due_at = MAX(?2, held_until), attempts = 0, retry_at = 0 WHERE conversation_id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, due_at.0])
    .ctx("re-arming the timer")?;
    Ok(())
}

/// The last `limit` replies since the context was reset and after the reply `after`
/// (the summary's last), with the messages each covered, oldest first. Dropped
/// (stale) replies were never stored, so they never appear here; nor do replies whose
/// text retention removed.
fn read_history(
    tx: &Connection,
    conversation: ConversationId,
    context_version: i64,
    after: i64,
    limit: usize,
) -> Result<Vec<Exchange>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    // The last `limit` replies with the messages each covered, in one query.
    let mut stmt = tx
        .prepare_cached(
            "SELECT o.id, o.text, m.author, m.text, m.transcript
             FROM (SELECT id, text FROM outbox
                   WHERE conversation_id = ?1 AND kind = 'reply' AND failed_at IS NULL AND version > ?2
                     AND id > ?4 AND erased_at IS NULL
                   ORDER BY id DESC LIMIT ?3) o
             JOIN reply_covers rc ON rc.outbox_id = o.id
             JOIN messages m ON m.id = rc.message_id
             ORDER BY o.id, m.id",
        )
        .ctx("reading history")?;
    let mut rows = stmt
        .query(params![
            conversation.0,
            context_version,
            limit as i64,
            after
        ])
        .ctx("reading history")?;
    let mut read = Vec::new();
    while let Some(row) = rows.next().ctx("reading history")? {
        let text: String = row.get(3).ctx("reading history")?;
        let transcript: Option<String> = row.get(4).ctx("reading history")?;
        let said = Said {
            author: row.get(2).ctx("reading history")?,
            text: crate::store::said_text(&text, transcript.as_deref()),
        };
        read.push((
            row.get(0).ctx("reading history")?,
            row.get(1).ctx("reading history")?,
            said,
        ));
    }
    Ok(crate::store::rules::exchanges(read))
}

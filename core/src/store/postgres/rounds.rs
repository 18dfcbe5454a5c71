//! The rounds area on PostgreSQL: a conversation's round under its lease.

use async_trait::async_trait;

use super::PostgresStore;
use super::clock::{Now, on_caller_timeline};
use super::leases::{claim, ensure_lease};
use super::messages::pending_after;
use super::outbox::{OWED, owed_rows};
use super::sql::Context as _;
use super::sql::{Tx, execute, query, query_one, query_opt};
use crate::domain::{
    ConversationId, ConversationRef, Lease, LeaseKey, LeaseToken, Platform, Said, Timestamp,
    Version,
};
use crate::store::faults::Operation;
use crate::store::rules::{self, conversation_of};
use crate::store::{
    Batch, Claimed, CommitOutcome, OutboxRow, PendingMessage, RoundStore, StoreError, TimerState,
};
use crate::store::{GiveUp, IdleDisarm, ReplyCommit, RoundClaim, RoundFailure, TranscriptWrite};
use crate::timing::TimerPolicy;

#[async_trait]
impl RoundStore for PostgresStore {
    async fn claim_round(&self, asked: RoundClaim<'_>) -> Result<Option<Claimed>, StoreError> {
        let key = LeaseKey::Conversation(asked.conversation);
        let row = self.row(&key, asked.holder);
        let fixed = self.fixed_now(asked.now);
        // Five round trips: BEGIN, the claim (on the clock it reads), the give-back of
        // abandoned reservations, then every read of the batch and the outbox at once
        // (pipelined), and COMMIT.
        transaction!(self, Operation::Other, "claiming a round", |tx| async {
            let claimed = claim(
                &tx,
                key.clone(),
                asked.holder.clone(),
                &row,
                asked.ttl,
                fixed,
            )
            .await?;
            let Some((lease, claimed_at)) = claimed else {
                return Ok(None);
            };
            let now = self.now_read(claimed_at, asked.now);
            give_back_orphans(&tx, asked.conversation, lease.token).await?;
            // What the round works on, read under the lease it just claimed.
            let (batch, (mut owed, held_back)) = read_batch_and_owed(
                &tx,
                asked.conversation,
                asked.history,
                asked.summaries,
                Some(now.db),
            )
            .await?;
            // On the caller's timeline: its deadlines are counted on its own clock.
            let mut batch = batch;
            if let Some(timer) = batch.timer.as_mut() {
                timer.due_at = now.to_caller(timer.due_at);
            }
            on_caller_timeline(&mut owed, now);
            Ok(Some(Claimed {
                lease,
                batch,
                owed,
                held_back,
            }))
        }
        .await)
    }

    async fn collect(
        &self,
        conversation: ConversationId,
        history: usize,
    ) -> Result<Batch, StoreError> {
        transaction!(self, Operation::Read, "collecting a batch", |tx| async {
            Ok(read_batch_and_owed(&tx, conversation, history, false, None)
                .await?
                .0)
        }
        .await)
    }

    async fn commit_reply(&self, asked: ReplyCommit<'_>) -> Result<CommitOutcome, StoreError> {
        let conversation = asked.batch.conversation_id;
        let v0 = asked.batch.v0;
        let reply_to = asked.batch.last_message_id().map(str::to_owned);
        let row = self.row(&asked.lease.key, &asked.lease.holder);
        let policy = self.timers;
        transaction!(self, Operation::Other, "committing a reply", |tx| {
            async {
                let (now, version) = self.fence(&tx, asked.lease, &row, conversation, asked.now).await?;
                let oldest = asked.batch.oldest_pending_at().unwrap_or(now.db);
                // Fresh: stale unless the cap forces it out (`rules::commit_verdict`).
                let Some(forced) = rules::commit_verdict(policy, version, v0, oldest, now.db) else {
                    return Ok(rules::stale(version));
                };
                let collected: Vec<i64> = asked.batch.pending.iter().map(|m| m.row).collect();
                // No duplicate: a message edited since it was collected is pending again
                // (its version is past v0), so the reply covers only what is unchanged.
                let covered: Vec<i64> = if forced {
                    query(
                        &tx,
                        "SELECT id FROM messages WHERE id = ANY($1) AND version <= $2",
                        &[&collected, &v0.0],
                        "checking for edits",
                    )
                    .await?
                    .into_iter()
                    .map(|r| r.get(0))
                    .collect()
                } else {
                    collected
                };
                if covered.is_empty() {
                    return Ok(rules::stale(version));
                }
                let usage = asked.reply.usage.unwrap_or_default();
                // The reply and the messages it covers: one statement.
                let outbox: i64 = query_one(
                    &tx,
                    "WITH reply AS (
                         INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token, forced,
                                             prompt_tokens, completion_tokens, llm_ms, owner, created_at, next_attempt_at)
                         VALUES ($1, 'reply', $2, $3, $4, $5, $6, $7, $8, $9, $11, $10, $10)
                         RETURNING id),
                     covers AS (
                         INSERT INTO reply_covers (outbox_id, message_id)
                         SELECT reply.id, unnest($12::int8[]) FROM reply)
                     SELECT id FROM reply",
                    &[
                        &conversation.0,
                        &asked.reply.text,
                        &reply_to,
                        &v0.0,
                        &asked.lease.token.0,
                        &forced,
                        &asked.reply.usage.map(|_| usage.prompt as i64),
                        &asked.reply.usage.map(|_| usage.completion as i64),
                        &(asked.reply.llm_ms as i64),
                        &now.db.0,
                        &asked.lease.holder.as_str(),
                        &covered,
                    ],
                    "storing a reply",
                )
                .await?
                .get(0);
                let notices =
                    store_held_out(&tx, asked.lease, &asked.batch.conversation, &asked.reply.held_out, v0, forced, now)
                        .await?;
                answer_through(&tx, conversation, v0, policy).await?;
                let received: Vec<Timestamp> = asked.batch.pending.iter().map(|m| m.received_at).collect();
                super::rhythm::learn(&tx, conversation, &received, policy).await?;
                let memories = super::memories::apply(&tx, &asked.reply.memories, now.db).await?;
                let conversation = asked.batch.conversation.clone();
                let reply = rules::reply_row(outbox, conversation, asked.reply.text.clone(), reply_to.clone(), now.stored());
                let collected = asked.batch.pending.iter().map(|m| (m.row, m.message_id.as_str()));
                Ok(rules::committed(collected, &covered, reply, notices, forced, memories))
            }
            .await
        })
    }

    async fn give_up(&self, giving_up: GiveUp<'_>) -> Result<Option<OutboxRow>, StoreError> {
        let conversation = giving_up.batch.conversation_id;
        let v0 = giving_up.batch.v0;
        let reply_to = giving_up.batch.last_message_id().map(str::to_owned);
        let row = self.row(&giving_up.lease.key, &giving_up.lease.holder);
        let policy = self.timers;
        transaction!(self, Operation::Other, "giving up on a batch", |tx| {
            async {
                let (now, _) = self.fence(&tx, giving_up.lease, &row, conversation, giving_up.now).await?;
                // What this give-up ends: messages still pending up to v0. No duplicate: a
                // message already covered is never covered again.
                let covered: Vec<(i64, String)> = query(
                    &tx,
                    "SELECT m.id, m.platform_message_id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                     WHERE c.id = $1 AND m.version > c.answered_version AND m.version <= $2
                       AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)
                     ORDER BY m.id",
                    &[&conversation.0, &v0.0],
                    "finding the messages given up on",
                )
                .await?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
                if covered.is_empty() {
                    return Ok(None);
                }
                let notice_row = CoveringNotice { text: giving_up.notice, reply_to: &reply_to, quick_replies: giving_up.quick_replies, v0, lease: giving_up.lease, now: &now };
                let outbox = notice_row.store(&tx, conversation, &covered, "storing a give-up notice").await?;
                answer_through(&tx, conversation, v0, policy).await?;
                let covers = covered.into_iter().map(|(_, id)| id).collect();
                let conversation = giving_up.batch.conversation.clone();
                let text = giving_up.notice.to_owned();
                let quick_replies = giving_up.quick_replies.to_vec();
                Ok(Some(rules::notice_row(outbox, conversation, text, reply_to.clone(), covers, quick_replies, now.stored())))
            }
            .await
        })
    }

    async fn store_transcript(&self, write: TranscriptWrite<'_>) -> Result<bool, StoreError> {
        let row = self.row(&write.lease.key, &write.lease.holder);
        let conversation = conversation_of(write.lease);
        transaction!(self, Operation::Other, "storing a transcript", |tx| async {
            let now = self.now(&tx, write.now).await?;
            ensure_lease(&tx, write.lease, &row, now).await?;
            let stored = execute(
                &tx,
                "UPDATE messages SET transcript = $3
                 WHERE id = $1 AND conversation_id = $2 AND transcript IS NULL",
                &[&write.message, &conversation.0, &write.transcript],
                "storing a transcript",
            )
            .await?;
            Ok(stored == 1)
        }
        .await)
    }

    async fn disarm_idle_timer(&self, disarm: IdleDisarm<'_>) -> Result<(), StoreError> {
        let row = self.row(&disarm.lease.key, &disarm.lease.holder);
        let conversation = conversation_of(disarm.lease);
        transaction!(self, Operation::Other, "disarming an idle timer", |tx| {
            async {
                self.fence(&tx, disarm.lease, &row, conversation, disarm.now).await?;
                // No loss: a timer with messages pending is never disarmed.
                execute(
                    &tx,
                    "DELETE FROM timers WHERE conversation_id = $1 AND armed_version <= $2
                       AND NOT EXISTS (SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                       WHERE c.id = $1 AND m.version > c.answered_version)",
                    &[&conversation.0, &disarm.v0.0],
                    "disarming an idle timer",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }

    async fn record_failure(&self, failure: RoundFailure<'_>) -> Result<u32, StoreError> {
        let row = self.row(&failure.lease.key, &failure.lease.holder);
        let conversation = conversation_of(failure.lease);
        transaction!(
            self,
            Operation::Other,
            "recording a failed generation",
            |tx| {
                async {
                    let (now, _) = self.fence(&tx, failure.lease, &row, conversation, failure.now).await?;
                    let retry_at = now.to_db(failure.retry_at);
                    let attempts = query_opt(
                        &tx,
                        "UPDATE timers SET attempts = attempts + 1, retry_at = $2, due_at = GREATEST(due_at, $2)
                         WHERE conversation_id = $1 RETURNING attempts",
                        &[&conversation.0, &retry_at.0],
                        "recording a failed generation",
                    )
                    .await?;
                    Ok(attempts.map_or(0, |r| r.get::<_, i32>(0) as u32))
                }
                .await
            }
        )
    }
}

/// The batch of a conversation (version, pending messages, recent history, timer)
/// and, given the transaction's `now`, its outbox rows owed ([`read_owed`]). The
/// conversation row is read first under a `FOR SHARE` lock, so no ingest commits while
/// the rest is read and everything agrees; the rest reads the answered and context
/// versions from that locked row. All of it is one round trip: every statement is
/// prepared first, then all are sent at once (tokio-postgres pipelines queries issued
/// together) and the server runs them in the order sent, the lock first.
async fn read_batch_and_owed(
    tx: &Tx<'_>,
    conversation: ConversationId,
    history: usize,
    summaries: bool,
    now: Option<Timestamp>,
) -> Result<(Batch, (Vec<OutboxRow>, bool)), StoreError> {
    use futures_util::future::{TryFutureExt, try_join, try_join5};

    let context = "reading a batch";
    let prepare = |sql: &'static str| async move { tx.prepare_cached(sql).await.ctx(context) };
    let locked = prepare(
        "SELECT platform, key, is_group, version, answered_version, context_version
         FROM conversations WHERE id = $1 FOR SHARE",
    )
    .await?;
    let pending = prepare(
        "SELECT id, platform_message_id, user_id, author, text, version, received_at, media, transcript
         FROM messages
         WHERE conversation_id = $1 AND version > (SELECT answered_version FROM conversations WHERE id = $1)
         ORDER BY id",
    )
    .await?;
    let timer = prepare("SELECT due_at, attempts FROM timers WHERE conversation_id = $1").await?;
    // The last `limit` replies since the context was reset and after the summary of
    // that context (with `summaries`), with the messages each covered, oldest first;
    // replies whose text retention removed are left out.
    let exchanges = prepare(
        "SELECT o.id, o.text, m.author, m.text, m.transcript
         FROM (SELECT id, text FROM outbox
               WHERE conversation_id = $1 AND kind = 'reply' AND failed_at IS NULL
                 AND version > (SELECT context_version FROM conversations WHERE id = $1)
                 AND erased_at IS NULL
                 AND id > CASE WHEN $3 THEN COALESCE((
                     SELECT s.through_reply FROM summaries s JOIN conversations c ON c.id = s.conversation_id
                     WHERE s.conversation_id = $1 AND s.context_version = c.context_version), 0) ELSE 0 END
               ORDER BY id DESC LIMIT $2) o
         JOIN reply_covers rc ON rc.outbox_id = o.id
         JOIN messages m ON m.id = rc.message_id
         ORDER BY o.id, m.id",
    )
    .await?;
    let summary = prepare(
        "SELECT s.through_reply, s.through_message, s.through_at, s.messages, s.text, s.model, s.created_at
         FROM summaries s JOIN conversations c ON c.id = s.conversation_id
         WHERE s.conversation_id = $1 AND s.context_version = c.context_version AND $2",
    )
    .await?;
    let owed = prepare(OWED).await?;
    let limit = history as i64;
    let id = conversation.0;
    let ((row, pending, timer, exchanges, owed), summary) = try_join(
        try_join5(
            tx.query_opt(&locked, &[&id]),
            tx.query(&pending, &[&id]),
            tx.query_opt(&timer, &[&id]),
            tx.query(&exchanges, &[&id, &limit, &summaries]),
            async {
                match now {
                    Some(_) => tx.query(&owed, &[&id]).await,
                    None => Ok(Vec::new()),
                }
            },
        ),
        tx.query_opt(&summary, &[&id, &summaries]),
    )
    .map_err(|e| super::sql::classify(context, &e))
    .await?;
    let Some(row) = row else {
        return Err(StoreError::NoConversation(conversation));
    };
    let platform: Platform = row
        .get::<_, String>(0)
        .parse()
        .map_err(StoreError::Corrupt)?;
    let (key, is_group, version): (String, bool, i64) = (row.get(1), row.get(2), row.get(3));
    let pending = pending_messages(pending)?;
    let timer = timer.map(|r| TimerState {
        due_at: Timestamp(r.get(0)),
        attempts: r.get::<_, i32>(1) as u32,
    });
    // Nothing to answer (a round that only delivers): no history needed.
    let history = if history == 0 || pending.is_empty() {
        Vec::new()
    } else {
        history_exchanges(exchanges)
    };
    let summary = summary
        .filter(|_| !pending.is_empty())
        .map(|r| super::summaries::summary_row(&r));
    let batch = Batch {
        conversation_id: conversation,
        conversation: ConversationRef::new(platform, key),
        is_group,
        v0: Version(version),
        pending,
        history,
        summary,
        timer,
    };
    let owed = match now {
        Some(now) => owed_rows(owed, now)?,
        None => (Vec::new(), false),
    };
    Ok((batch, owed))
}

/// The pending messages from their rows (the batch query's columns).
fn pending_messages(rows: Vec<tokio_postgres::Row>) -> Result<Vec<PendingMessage>, StoreError> {
    rows.into_iter()
        .map(|r| {
            Ok(PendingMessage {
                row: r.get(0),
                message_id: r.get(1),
                user_id: r.get(2),
                author: r.get(3),
                text: r.get(4),
                version: Version(r.get(5)),
                received_at: Timestamp(r.get(6)),
                media: crate::store::decode_media(r.get(7))?,
                transcript: r.get(8),
            })
        })
        .collect()
}

/// The history's exchanges from their rows (reply id, reply text, author, text,
/// transcript), oldest first.
fn history_exchanges(rows: Vec<tokio_postgres::Row>) -> Vec<crate::store::Exchange> {
    crate::store::rules::exchanges(rows.into_iter().map(|row| {
        let said = Said {
            author: row.get(2),
            text: crate::store::said_text(row.get(3), row.get(4)),
        };
        (row.get(0), row.get(1), said)
    }))
}

/// A notice that answers messages (a give-up, or the notice of messages a reply left
/// out), stored under the lease at `v0`.
struct CoveringNotice<'a> {
    text: &'a str,
    reply_to: &'a Option<String>,
    quick_replies: &'a [lull_port::QuickReply],
    v0: Version,
    lease: &'a Lease,
    now: &'a Now,
}

impl CoveringNotice<'_> {
    /// Store it as an outbox row covering `covered` (message row, platform id), with its
    /// `reply_covers`, in the caller's transaction; the row's id.
    async fn store(
        &self,
        tx: &Tx<'_>,
        conversation: ConversationId,
        covered: &[(i64, String)],
        context: &'static str,
    ) -> Result<i64, StoreError> {
        let outbox: i64 = query_one(
            tx,
            "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token,
                                 owner, created_at, next_attempt_at, quick_replies)
             VALUES ($1, 'notice', $2, $3, $4, $5, $6, $7, $7, $8)
             RETURNING id",
            &[
                &conversation.0,
                &self.text,
                self.reply_to,
                &self.v0.0,
                &self.lease.token.0,
                &self.lease.holder.as_str(),
                &self.now.db.0,
                &rules::encode_quick_replies(self.quick_replies),
            ],
            context,
        )
        .await?
        .get(0);
        let rows: Vec<i64> = covered.iter().map(|(row, _)| *row).collect();
        record_covers(tx, outbox, &rows).await?;
        Ok(outbox)
    }
}

/// The notices of a reply's held-out messages ([`NewReply::held_out`]), stored in the
/// commit's transaction: each covers its messages still pending up to `v0` (after a
/// forced commit, not those edited since) and not covered yet (no duplicate), so the
/// `answered_version` the commit sets leaves none of them unanswered (no loss).
async fn store_held_out(
    tx: &Tx<'_>,
    lease: &Lease,
    conversation: &ConversationRef,
    held_out: &[crate::store::HeldOut],
    v0: Version,
    forced: bool,
    now: Now,
) -> Result<Vec<OutboxRow>, StoreError> {
    let id = conversation_of(lease);
    let mut notices = Vec::new();
    for held in held_out {
        let covered: Vec<(i64, String)> = query(
            tx,
            "SELECT m.id, m.platform_message_id FROM messages m
             WHERE m.id = ANY($1) AND m.conversation_id = $2 AND ($4 OR m.version <= $3)
               AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)
             ORDER BY m.id",
            &[&held.rows, &id.0, &v0.0, &!forced],
            "reading held-out messages",
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
        if covered.is_empty() {
            continue;
        }
        let notice = CoveringNotice {
            text: &held.text,
            reply_to: &held.reply_to,
            quick_replies: &[],
            v0,
            lease,
            now: &now,
        };
        let outbox = notice
            .store(tx, id, &covered, "storing a held-out notice")
            .await?;
        let at = now.stored();
        notices.push(rules::held_out_row(outbox, conversation, held, covered, at));
    }
    Ok(notices)
}

/// Give back the reservations of the conversation's earlier leases (rounds abandoned
/// before they settled: a lost lease, a stop, a crash), tokens and dollars, each on
/// the row it was reserved on; budget rows are locked in the order every charge takes
/// (scope, then row key: a month is counted under a scope of its own, `month:bot`, so
/// no scope has both day and month rows, and the key's text order is the charge's).
async fn give_back_orphans(
    tx: &Tx<'_>,
    conversation: ConversationId,
    token: LeaseToken,
) -> Result<(), StoreError> {
    let orphans = query(
        tx,
        "DELETE FROM token_reservations WHERE conversation_id = $1 AND lease_token < $2
         RETURNING scope, day, tokens, cost",
        &[&conversation.0, &token.0],
        "reading abandoned reservations",
    )
    .await?;
    if orphans.is_empty() {
        return Ok(());
    }
    let mut sums: std::collections::BTreeMap<(String, String), (i64, i64)> = Default::default();
    for r in orphans {
        let sum = sums.entry((r.get(0), r.get(1))).or_default();
        sum.0 += r.get::<_, i64>(2);
        sum.1 += r.get::<_, i64>(3);
    }
    for ((scope, day), (tokens, cost)) in &sums {
        execute(
            tx,
            "UPDATE token_usage SET tokens = GREATEST(tokens - $3::int8, 0), cost = GREATEST(cost - $4::int8, 0)
             WHERE scope = $1 AND day = $2",
            &[scope, day, tokens, cost],
            "giving back a reservation",
        )
        .await?;
    }
    tracing::info!(%conversation, scopes = sums.len(), "gave back the reservation of an abandoned round");
    Ok(())
}

async fn record_covers(tx: &Tx<'_>, outbox: i64, messages: &[i64]) -> Result<(), StoreError> {
    execute(
        tx,
        "INSERT INTO reply_covers (outbox_id, message_id) SELECT $1::int8, unnest($2::int8[])",
        &[&outbox, &messages],
        "recording covered messages",
    )
    .await?;
    Ok(())
}

/// Mark everything up to `v0` answered, after a reply or a give-up was stored in the
/// same transaction: the timer goes unless a newer message armed it, and then it is
/// re-armed for the messages still pending (its cap counting from the oldest of them).
async fn answer_through(
    tx: &Tx<'_>,
    conversation: ConversationId,
    v0: Version,
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    use futures_util::future::{TryFutureExt, try_join};

    let context = "marking the batch answered";
    // The answered version only grows.
    let answered = tx
        .prepare_cached(
            "UPDATE conversations SET answered_version = $2 WHERE id = $1 AND answered_version < $2",
        )
        .await
        .ctx(context)?;
    // The timer goes only if nothing newer than v0 armed it.
    let disarm = tx
        .prepare_cached("DELETE FROM timers WHERE conversation_id = $1 AND armed_version <= $2")
        .await
        .ctx(context)?;
    // Both at once (pipelined), in this order: the conversation row is ours already.
    let (_, deleted) = try_join(
        tx.execute(&answered, &[&conversation.0, &v0.0]),
        tx.execute(&disarm, &[&conversation.0, &v0.0]),
    )
    .map_err(|e| super::sql::classify(context, &e))
    .await?;
    if deleted > 0 {
        return Ok(());
    }
    let (pending, first_pending) = pending_after(tx, conversation, v0.0).await?;
    let Some(first_pending) = first_pending else {
        return Ok(());
    };
    let armed_at = query_opt(
        tx,
        "SELECT armed_at FROM timers WHERE conversation_id = $1",
        &[&conversation.0],
        "reading the timer",
    )
    .await?;
    let Some(armed_at) = armed_at.map(|r| r.get::<_, i64>(0)) else {
        return Ok(());
    };
    let due_at = policy.due_at(Timestamp(armed_at), first_pending, pending);
    execute(
        tx,
        "UPDATE timers SET due_at = GREATEST($2, held_until), attempts = 0, retry_at = 0
         WHERE conversation_id = $1",
        &[&conversation.0, &due_at.0],
        "re-arming the timer",
    )
    .await?;
    Ok(())
}

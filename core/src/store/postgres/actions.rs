//! The actions area on PostgreSQL: the journal of tool calls that act. What each call
//! writes is decided in `rules` (`reserve_step`, `decide_step`); this file holds the
//! locks and the SQL.
//!
//! Locks, in the store's one order: a reservation takes the lease row `FOR UPDATE`
//! (fencing), then the conversation row `FOR UPDATE` (the final check reads a version
//! no ingest changes before the commit, and reservations of one conversation queue
//! there, so two of the same key never both insert), then the journal row of its key.
//! A decision locks only the journal row it moves (`FOR UPDATE`): of two deciders one
//! waits, then reads the row the other left. A result is one conditional UPDATE.
//!
//! Times: expiries are stored and compared on the database's clock; rows are handed
//! out, and the decision rules run, on the caller's timeline (`Now::to_caller`), where
//! comparing with the caller's `now` decides as the database's clock would.

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::clock::Now;
use super::leases::ensure_lease;
use super::messages::lock_conversation;
use super::sql::{Tx, execute, query, query_one, query_opt};
use crate::domain::{ConversationId, ConversationRef, LeaseToken, Timestamp};
use crate::store::faults::Operation;
use crate::store::rules::{self, ActionStep, conversation_of};
use crate::store::{
    ActionKey, ActionReservation, ActionRow, ActionState, ActionStore, Decision, StoreError,
};
use crate::store::{
    ActionResult, ApprovalAnswer, BatchOf, ConversationAt, Reserve, WaitingApproval,
    console_answer_of,
};

/// A batch's actions, in the order stored (index `actions_batch`).
const ACTIONS_OF_BATCH_SQL: &str = concat!(
    "SELECT ",
    action_columns!(),
    " FROM actions WHERE conversation_id = $1 AND batch = $2 ORDER BY id"
);

/// Every chat's open approvals, oldest first, each with its chat: the action's
/// columns, then the chat's platform, key and kind (columns 13 to 15), and the
/// console's answer stored for it (16: `MAX` prefers a cancel, as a round does).
const WAITING_APPROVALS_SQL: &str = concat!(
    "SELECT a.*, c.platform, c.key, c.is_group,
        (SELECT MAX(m.platform_message_id) FROM messages m WHERE m.conversation_id = a.conversation_id
            AND m.platform_message_id IN ('console:approve:' || a.id, 'console:cancel:' || a.id))
     FROM (SELECT ",
    action_columns!(),
    " FROM actions WHERE state IN ('awaiting', 'approved')
        AND (state = 'approved' OR expires_at > $1) ORDER BY id LIMIT $2) a
     JOIN conversations c ON c.id = a.conversation_id ORDER BY a.id"
);

/// A conversation's open approvals, oldest first (index `actions_open`).
const OPEN_APPROVALS_SQL: &str = concat!(
    "SELECT ",
    action_columns!(),
    " FROM actions WHERE conversation_id = $1 AND state IN ('awaiting', 'approved')
        AND (state = 'approved' OR expires_at > $2) ORDER BY id"
);

/// No translation: a read given no `now` hands its rows' times out as stored
/// ([`ActionStore::actions_of_batch`]).
const AS_STORED: Now = Now {
    db: Timestamp(0),
    offset: 0,
    fixed: None,
};

#[async_trait]
impl ActionStore for PostgresStore {
    async fn reserve_action(&self, ask: Reserve<'_>) -> Result<ActionReservation, StoreError> {
        let row = self.row(&ask.lease.key, &ask.lease.holder);
        let conversation = conversation_of(ask.lease);
        let caller = ask.now;
        transaction!(self, Operation::Other, "reserving an action", |tx| async {
            let now = self.now(&tx, caller).await?;
            ensure_lease(&tx, ask.lease, &row, now).await?;
            let version = lock_conversation(&tx, conversation).await?;
            let found = query_opt(
                &tx,
                concat!(
                    "SELECT ",
                    action_columns!(),
                    // The conversation's own (a key of another's is refused at insert).
                    " FROM actions WHERE key = $1 AND conversation_id = $2 FOR UPDATE"
                ),
                &[&ask.action.key.0, &conversation.0],
                "reading an action",
            )
            .await?
            .map(|r| action_row(&r, now))
            .transpose()?;
            let step = rules::reserve_step(
                version,
                ask.v0,
                found,
                ask.action.clone(),
                ask.lease.token,
                caller,
            );
            apply(&tx, conversation, step, now).await
        }
        .await)
    }

    async fn finish_action(&self, done: ActionResult<'_>) -> Result<bool, StoreError> {
        let caller = done.now;
        transaction!(self, Operation::Other, "storing an action's result", |tx| {
            async {
                let now = self.now(&tx, caller).await?;
                let changed = execute(
                    &tx,
                    "UPDATE actions SET state = CASE WHEN $6 THEN 'unknown' ELSE 'done' END,
                         result = $3, is_error = $4, updated_at = $5
                 WHERE key = $1 AND token = $2 AND state IN ('reserved', 'unknown')",
                    &[
                        &done.key.0,
                        &done.token.0,
                        &done.result,
                        &done.is_error,
                        &now.db.0,
                        &done.unknown,
                    ],
                    "storing an action's result",
                )
                .await?;
                Ok(changed == 1)
            }
            .await
        })
    }

    async fn idempotency_salt(&self) -> Result<String, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "reading the idempotency salt",
            |tx| async {
                Ok(query_one(
                    &tx,
                    "SELECT salt FROM instance WHERE id = 1",
                    &[],
                    "reading the idempotency salt",
                )
                .await?
                .get(0))
            }
            .await
        )
    }

    async fn actions_of_batch(&self, of: BatchOf) -> Result<Vec<ActionRow>, StoreError> {
        transaction!(self, Operation::Read, "reading a batch's actions", |tx| {
            let params: [&(dyn ToSql + Sync); 2] = [&of.conversation.0, &of.batch];
            read_rows(
                &tx,
                ACTIONS_OF_BATCH_SQL,
                &params,
                "reading a batch's actions",
                AS_STORED,
            )
            .await
        })
    }

    async fn open_approvals(
        &self,
        at: ConversationAt,
        answered: std::time::Duration,
    ) -> Result<Vec<ActionRow>, StoreError> {
        let caller = at.now;
        transaction!(self, Operation::Read, "reading open approvals", |tx| {
            async {
                let now = self.now(&tx, caller).await?;
                // Open when the answers arrived, not now.
                let open_at = now.db.minus(answered);
                let params: [&(dyn ToSql + Sync); 2] = [&at.conversation.0, &open_at.0];
                read_rows(
                    &tx,
                    OPEN_APPROVALS_SQL,
                    &params,
                    "reading open approvals",
                    now,
                )
                .await
            }
            .await
        })
    }

    async fn waiting_approvals(
        &self,
        caller: Timestamp,
        limit: usize,
    ) -> Result<Vec<WaitingApproval>, StoreError> {
        transaction!(self, Operation::Read, "reading open approvals", |tx| {
            async {
                let now = self.now(&tx, caller).await?;
                let limit = limit as i64;
                let params: [&(dyn ToSql + Sync); 2] = [&now.db.0, &limit];
                let rows = query(
                    &tx,
                    WAITING_APPROVALS_SQL,
                    &params,
                    "reading open approvals",
                )
                .await?;
                rows.iter()
                    .map(|r| {
                        let platform: String = r.get(13);
                        let platform = platform.parse().map_err(StoreError::Corrupt)?;
                        let key: String = r.get(14);
                        Ok::<_, StoreError>(WaitingApproval {
                            action: action_row(r, now)?,
                            conversation: ConversationRef::new(platform, key),
                            is_group: r.get(15),
                            console_answer: r
                                .get::<_, Option<&str>>(16)
                                .and_then(console_answer_of),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            }
            .await
        })
    }

    async fn decide_action(&self, answer: ApprovalAnswer) -> Result<Decision, StoreError> {
        let caller = answer.now;
        transaction!(self, Operation::Other, "deciding an approval", |tx| async {
            let now = self.now(&tx, caller).await?;
            // Once: the row is locked, so a concurrent decider reads it after this
            // decision commits and finds it decided.
            let found = query_opt(
                &tx,
                concat!(
                    "SELECT ",
                    action_columns!(),
                    " FROM actions WHERE id = $1 AND conversation_id = $2 FOR UPDATE"
                ),
                &[&answer.id, &answer.conversation.0],
                "reading an approval",
            )
            .await?
            .map(|r| action_row(&r, now))
            .transpose()?;
            apply(
                &tx,
                answer.conversation,
                rules::decide_step(found, answer.approve, caller),
                now,
            )
            .await
        }
        .await)
    }
}

/// Write what `step` names (in the caller's transaction, times moved to the
/// database's clock) and answer from the row written, or answer as it says.
async fn apply<A>(
    tx: &Tx<'_>,
    conversation: ConversationId,
    step: ActionStep<A>,
    now: Now,
) -> Result<A, StoreError> {
    let (row, answer) = match step {
        ActionStep::Answer(answer) => return Ok(answer),
        ActionStep::Insert {
            action,
            write,
            answer,
        } => {
            let row = query_one(
                tx,
                concat!(
                    "INSERT INTO actions (key, conversation_id, batch, tool, arguments, state, token,
                                          expires_at, requested_by, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)
                     RETURNING ",
                    action_columns!()
                ),
                &[
                    &action.key.0,
                    &conversation.0,
                    &action.batch,
                    &action.tool,
                    &action.arguments,
                    &write.state.as_str(),
                    &write.token.0,
                    &now.to_db(write.expires_at).0,
                    &action.requested_by,
                    &now.db.0,
                ],
                "storing an action",
            )
            .await?;
            (row, answer)
        }
        ActionStep::Update { id, write, answer } => {
            let row = query_one(
                tx,
                concat!(
                    "UPDATE actions SET state = $2, token = $3, expires_at = $4, updated_at = $5
                     WHERE id = $1 RETURNING ",
                    action_columns!()
                ),
                &[
                    &id,
                    &write.state.as_str(),
                    &write.token.0,
                    &now.to_db(write.expires_at).0,
                    &now.db.0,
                ],
                "moving an action",
            )
            .await?;
            (row, answer)
        }
    };
    Ok(answer(action_row(&row, now)?))
}

/// The rows `sql` finds, in its order, their times moved by `now`.
async fn read_rows(
    tx: &Tx<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &'static str,
    now: Now,
) -> Result<Vec<ActionRow>, StoreError> {
    query(tx, sql, params, context)
        .await?
        .iter()
        .map(|r| action_row(r, now))
        .collect()
}

/// An [`ActionRow`] from the columns of `action_columns!`, its times on the caller's timeline.
fn action_row(r: &Row, now: Now) -> Result<ActionRow, StoreError> {
    Ok(ActionRow {
        id: r.get(0),
        key: ActionKey(r.get(1)),
        conversation_id: ConversationId(r.get(2)),
        batch: r.get(3),
        tool: r.get(4),
        arguments: r.get(5),
        state: ActionState::parse(r.get(6))?,
        result: r.get(7),
        is_error: r.get(8),
        token: LeaseToken(r.get(9)),
        expires_at: now.to_caller(Timestamp(r.get(10))),
        requested_by: r.get(11),
        created_at: now.to_caller(Timestamp(r.get(12))),
    })
}

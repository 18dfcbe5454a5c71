//! The actions area on SQLite: the journal of tool calls that act. Every write goes
//! through the one writer, so a reservation's fence, final check, read of the row
//! with its key and write are one transaction no other write interleaves with; what
//! each call writes is decided in `rules` (`reserve_step`, `decide_step`).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::leases::ensure_lease;
use super::sql::Context;
use crate::domain::{ConversationId, ConversationRef, LeaseToken, Timestamp};
use crate::store::rules::{self, ActionStep, conversation_of};
use crate::store::{
    ActionKey, ActionReservation, ActionRow, ActionState, ActionStore, Decision, StoreError,
};
use crate::store::{
    ActionResult, ApprovalAnswer, BatchOf, ConversationAt, Reserve, WaitingApproval,
    console_answer_of,
};

/// A batch's actions, in the order stored (index `actions_batch`).
pub(super) const ACTIONS_OF_BATCH_SQL: &str = concat!(
    "SELECT ",
    action_columns!(),
    " FROM actions WHERE conversation_id = ?1 AND batch = ?2 ORDER BY id"
);

/// A conversation's open approvals, oldest first (index `actions_open`).
pub(super) const OPEN_APPROVALS_SQL: &str = concat!(
    "SELECT ",
    action_columns!(),
    " FROM actions WHERE conversation_id = ?1 AND state IN ('awaiting', 'approved')
        AND (state = 'approved' OR expires_at > ?2) ORDER BY id"
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
        AND (state = 'approved' OR expires_at > ?1) ORDER BY id LIMIT ?2) a
     JOIN conversations c ON c.id = a.conversation_id ORDER BY a.id"
);

#[async_trait]
impl ActionStore for SqliteStore {
    async fn reserve_action(&self, ask: Reserve<'_>) -> Result<ActionReservation, StoreError> {
        let lease = ask.lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("reserving an action", move |tx| {
            ensure_lease(tx, &lease, &row.resource, ask.now)?;
            let conversation = conversation_of(&lease);
            let version: i64 = tx
                .prepare_cached("SELECT version FROM conversations WHERE id = ?1")
                .ctx("preparing a statement")?
                .query_row([conversation.0], |r| r.get(0))
                .ctx("reading the version")?;
            let found = tx
                .prepare_cached(concat!(
                    "SELECT ",
                    action_columns!(),
                    // The conversation's own: a key of another's is never read here
                    // (its insert is refused by the key's uniqueness instead).
                    " FROM actions WHERE key = ?1 AND conversation_id = ?2"
                ))
                .ctx("preparing a statement")?
                .query_row(params![ask.action.key.0, conversation.0], action_row)
                .optional()
                .ctx("reading an action")?
                .transpose()?;
            let step =
                rules::reserve_step(version, ask.v0, found, ask.action, lease.token, ask.now);
            apply(tx, conversation, step, ask.now)
        })
        .await
    }

    async fn finish_action(&self, done: ActionResult<'_>) -> Result<bool, StoreError> {
        let key = done.key.clone();
        let result = done.result.to_owned();
        self.write("storing an action's result", move |tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE actions SET state = CASE WHEN ?6 THEN 'unknown' ELSE 'done' END,
                         result = ?3, is_error = ?4, updated_at = ?5
                     WHERE key = ?1 AND token = ?2 AND state IN ('reserved', 'unknown')",
                )
                .ctx("preparing a statement")?
                .execute(params![
                    key.0,
                    done.token.0,
                    result,
                    done.is_error,
                    done.now.0,
                    done.unknown
                ])
                .ctx("storing an action's result")?;
            Ok(changed == 1)
        })
        .await
    }

    async fn idempotency_salt(&self) -> Result<String, StoreError> {
        self.with_conn(|conn| {
            conn.prepare_cached("SELECT salt FROM instance WHERE id = 1")
                .ctx("reading the idempotency salt")?
                .query_row([], |r| r.get(0))
                .ctx("reading the idempotency salt")
        })
        .await
    }

    async fn actions_of_batch(&self, of: BatchOf) -> Result<Vec<ActionRow>, StoreError> {
        self.with_conn(move |conn| {
            read_rows(
                conn,
                ACTIONS_OF_BATCH_SQL,
                params![of.conversation.0, of.batch],
            )
        })
        .await
    }

    async fn open_approvals(
        &self,
        at: ConversationAt,
        answered: std::time::Duration,
    ) -> Result<Vec<ActionRow>, StoreError> {
        // Open when the answers arrived, not now.
        let open_at = at.now.minus(answered);
        self.with_conn(move |conn| {
            read_rows(
                conn,
                OPEN_APPROVALS_SQL,
                params![at.conversation.0, open_at.0],
            )
        })
        .await
    }

    async fn waiting_approvals(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<WaitingApproval>, StoreError> {
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached(WAITING_APPROVALS_SQL)
                .ctx("reading open approvals")?;
            let rows = stmt
                .query_map(params![now.0, limit as i64], |r| {
                    let chat: (String, String, bool) = (r.get(13)?, r.get(14)?, r.get(15)?);
                    let answer: Option<String> = r.get(16)?;
                    Ok((action_row(r)?, chat, answer))
                })
                .ctx("reading open approvals")?
                .collect::<Result<Vec<_>, _>>()
                .ctx("reading open approvals")?;
            rows.into_iter()
                .map(|(action, (platform, key, is_group), answer)| {
                    let platform = platform.parse().map_err(StoreError::Corrupt)?;
                    Ok(WaitingApproval {
                        action: action?,
                        conversation: ConversationRef::new(platform, key),
                        is_group,
                        console_answer: answer.as_deref().and_then(console_answer_of),
                    })
                })
                .collect()
        })
        .await
    }

    async fn decide_action(&self, answer: ApprovalAnswer) -> Result<Decision, StoreError> {
        self.write("deciding an approval", move |tx| {
            // Once: the writer runs one decision at a time, so the row read here is
            // the row the compare-and-swap moves.
            let found = tx
                .prepare_cached(concat!(
                    "SELECT ",
                    action_columns!(),
                    " FROM actions WHERE id = ?1 AND conversation_id = ?2"
                ))
                .ctx("preparing a statement")?
                .query_row(params![answer.id, answer.conversation.0], action_row)
                .optional()
                .ctx("reading an approval")?
                .transpose()?;
            apply(
                tx,
                answer.conversation,
                rules::decide_step(found, answer.approve, answer.now),
                answer.now,
            )
        })
        .await
    }
}

/// Write what `step` names (in the caller's transaction) and answer from the row
/// written, or answer as it says.
fn apply<A>(
    tx: &Connection,
    conversation: ConversationId,
    step: ActionStep<A>,
    now: Timestamp,
) -> Result<A, StoreError> {
    let written = match step {
        ActionStep::Answer(answer) => return Ok(answer),
        ActionStep::Insert {
            action,
            write,
            answer,
        } => {
            let row = tx
                .prepare_cached(concat!(
                    "INSERT INTO actions (key, conversation_id, batch, tool, arguments, state, token,
                                          expires_at, requested_by, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)
                     RETURNING ",
                    action_columns!()
                ))
                .ctx("preparing a statement")?
                .query_row(
                    params![
                        action.key.0,
                        conversation.0,
                        action.batch,
                        action.tool,
                        action.arguments,
                        write.state.as_str(),
                        write.token.0,
                        write.expires_at.0,
                        action.requested_by,
                        now.0,
                    ],
                    action_row,
                )
                .ctx("storing an action")??;
            answer(row)
        }
        ActionStep::Update { id, write, answer } => {
            let row = tx
                .prepare_cached(concat!(
                    "UPDATE actions SET state = ?2, token = ?3, expires_at = ?4, updated_at = ?5
                     WHERE id = ?1 RETURNING ",
                    action_columns!()
                ))
                .ctx("preparing a statement")?
                .query_row(
                    params![
                        id,
                        write.state.as_str(),
                        write.token.0,
                        write.expires_at.0,
                        now.0
                    ],
                    action_row,
                )
                .ctx("moving an action")??;
            answer(row)
        }
    };
    Ok(written)
}

/// The rows `sql` finds, in its order.
fn read_rows(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<ActionRow>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).ctx("reading actions")?;
    let rows = stmt
        .query_map(params, action_row)
        .ctx("reading actions")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading actions")?;
    rows.into_iter().collect()
}

/// An [`ActionRow`] from the columns of `action_columns!`; a state the schema does not know
/// is corruption (the inner error).
fn action_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<ActionRow, StoreError>> {
    let state = match ActionState::parse(&r.get::<_, String>(6)?) {
        Ok(state) => state,
        Err(corrupt) => return Ok(Err(corrupt)),
    };
    Ok(Ok(ActionRow {
        id: r.get(0)?,
        key: ActionKey(r.get(1)?),
        conversation_id: ConversationId(r.get(2)?),
        batch: r.get(3)?,
        tool: r.get(4)?,
        arguments: r.get(5)?,
        state,
        result: r.get(7)?,
        is_error: r.get(8)?,
        token: LeaseToken(r.get(9)?),
        expires_at: Timestamp(r.get(10)?),
        requested_by: r.get(11)?,
        created_at: Timestamp(r.get(12)?),
    }))
}

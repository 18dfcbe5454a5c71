//! The **approvals** stage: a destructive call waits for the person's yes (`/approve ID`, or
//! `/cancel ID`), sent as a message in the conversation, so it reaches a round like
//! any message and is decided under the conversation's lease.
//!
//! The answers of one batch make one decision per approval: a `/cancel` anywhere in
//! the batch wins over an `/approve` (two quick taps). A yes is taken with the call's
//! reservation, in one write fenced by the lease and `v0`
//! ([`NewAction::approved`](crate::store::NewAction::approved)): a batch that moved on
//! (a `/cancel` just arrived) decides nothing and runs nothing, and the next round,
//! covering the newer messages too, decides again; a double tap, or the same answer
//! reaching two replicas, runs the call once. A no is the journal's compare-and-swap
//! ([`ActionStore::decide_action`](crate::store::ActionStore::decide_action)), which also
//! refuses a call approved but not yet run. Only the people whose messages led to the
//! call, or an admin, may answer; a tool's output never can (only a person's message is
//! read here). A question that had expired when the answer arrived is refused.

use super::{Answering, Ending, Flow, Interrupt, Round, StaleAt};
use crate::domain::{Timestamp, Version};
use crate::llm::{ToolCall, ToolTurn};
use crate::store::{
    ActionReservation, ActionRow, ActionState, ApprovalAnswer, Batch, BatchOf, ConversationAt,
    Decision, NewAction, OutboxRow, Reserve,
};
use crate::texts::{self, NoticeText};
use crate::tools::Effect;

/// An answer to an approval found in a message: `/approve [ID]` or `/cancel [ID]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answered {
    approve: bool,
    id: Option<i64>,
}

/// The approval answer `text` gives, if it is one.
fn answer_in(text: &str) -> Option<Answered> {
    let mut words = text.split_whitespace();
    let command = words.next()?.strip_prefix('/')?;
    let command = command.split('@').next().unwrap_or(command);
    let approve = match command.to_ascii_lowercase().as_str() {
        "approve" => true,
        "cancel" => false,
        _ => return None,
    };
    let id = match words.next() {
        None => None,
        Some(word) => Some(word.trim_start_matches('#').parse().ok()?),
    };
    Some(Answered { approve, id })
}

/// What a round's approvals did ([`Round::approvals`]).
#[derive(Debug, Default)]
pub(super) struct Approvals {
    /// The journal rows decided, for the reply's report.
    pub(super) decided: Vec<ActionRow>,
    /// A tool turn per answer, shown to the model after the batch.
    pub(super) turns: Vec<ToolTurn>,
    /// The report of what they did (empty: nothing decided), and the answers it
    /// offers, for a notice that must say it when no reply will yet.
    pub(super) report: NoticeText,
}

impl Round<'_> {
    /// Over a budget the batch waits, held until it resets; what its approvals did is
    /// said now (the reply that will report it waits too). Returns the notice, if queued
    /// now.
    pub(super) async fn approvals_held(
        &self,
        batch: &Batch,
        approvals: &Approvals,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        if approvals.decided.is_empty() {
            return Ok(None);
        }
        let key = format!("approvals-held/{}/{}", batch.conversation, batch.v0.0);
        let notice = NoticeText {
            text: texts::approvals_taken_held(&approvals.report.text),
            quick_replies: approvals.report.quick_replies.clone(),
        };
        self.notice(batch, notice, key).await
    }
}

/// The decision a batch's answers make on one approval: the last answer decides,
/// except that a `/cancel` anywhere in the batch wins over an `/approve` (two quick taps
/// on different buttons: the safe one wins).
struct Decided<'a> {
    row: ActionRow,
    approve: bool,
    /// The first `/approve` of it, by arrival: its expiry is judged then.
    approved_at: Option<Timestamp>,
    /// The message whose answer is shown to the model as the decision.
    message: &'a crate::store::PendingMessage,
}

impl Round<'_> {
    /// The `approvals` stage: decide the approvals the batch's messages answer, run
    /// the approved calls (reserved, once: the yes and the reservation are one write,
    /// fenced by the lease and `v0`), and keep the journal rows decided here (for the
    /// reply's report) with a tool turn for each, to show the model. Taken before
    /// anyone pays: an approval costs no tokens, so a person over their budget can
    /// still answer one. Ends stale when a newer message arrived before an approved
    /// call could be reserved (nothing ran, nothing was decided; the next round,
    /// covering it, decides again — a `/cancel` in it wins).
    pub(super) async fn approvals(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let mut approvals = match self.decide_approvals(&a.batch).await? {
            Ok(approvals) => approvals,
            Err(version) => {
                let at = StaleAt::BeforeAction;
                return Ok(Flow::End(Ending::Stale { version, at }));
            }
        };
        if !approvals.decided.is_empty() {
            approvals.report = self.actions_report(&a.batch, &approvals.decided).await?;
        }
        a.approvals = approvals;
        Ok(Flow::Go)
    }

    /// [`Round::approvals`] before the report: `Err(version)` when stale.
    async fn decide_approvals(
        &self,
        batch: &Batch,
    ) -> Result<Result<Approvals, Version>, Interrupt> {
        let d = self.dispatcher;
        let mut turns = Vec::new();
        let Some(toolbox) = d.toolbox().cloned() else {
            return Ok(Ok(Approvals::default()));
        };
        let answers: Vec<_> = batch
            .pending
            .iter()
            .filter_map(|m| answer_in(&m.text).map(|a| (m, a)))
            .collect();
        let Some(earliest) = answers.iter().map(|(m, _)| m.received_at).min() else {
            return Ok(Ok(Approvals::default()));
        };
        let now = d.clock.now();
        // Expiry is judged when an answer arrived, not when this round reads it.
        let open = d
            .store
            .open_approvals(
                ConversationAt {
                    conversation: self.conversation,
                    now,
                },
                earliest.until(now),
            )
            .await?;
        let decisions = self.decisions(batch, &answers, &open, &mut turns);
        let mut decided = Vec::new();
        for decision in decisions {
            let call_id = format!("approval_{}", decision.message.row);
            let (row, result) = if decision.approve {
                match self
                    .run_approved(batch, toolbox.as_ref(), &decision, now)
                    .await?
                {
                    Ok(result) => (decision.row, result),
                    Err(version) => return Ok(Err(version)),
                }
            } else {
                self.cancel(&decision, now).await?
            };
            turns.push(turn(&call_id, &row.tool, &row.arguments, result));
            decided.extend(
                d.store
                    .actions_of_batch(BatchOf {
                        conversation: self.conversation,
                        batch: row.batch,
                    })
                    .await?
                    .into_iter()
                    .filter(|r| r.id == row.id),
            );
        }
        Ok(Ok(Approvals {
            decided,
            turns,
            report: NoticeText::default(),
        }))
    }

    /// The batch's answers, one decision per open approval they name (a `/cancel`
    /// anywhere wins), in the order of the approvals; answers naming nothing open, or
    /// given by someone who may not, are told to the model here.
    fn decisions<'a>(
        &self,
        batch: &Batch,
        answers: &[(&'a crate::store::PendingMessage, Answered)],
        open: &[ActionRow],
        turns: &mut Vec<ToolTurn>,
    ) -> Vec<Decided<'a>> {
        let admins = &self.dispatcher.settings.access.admins;
        let mut decided: Vec<Decided<'a>> = Vec::new();
        for (message, answer) in answers {
            let call_id = format!("approval_{}", message.row);
            let row = match answer.id {
                Some(id) => open.iter().find(|r| r.id == id),
                None if open.len() == 1 => open.first(),
                None => None,
            };
            let Some(row) = row else {
                // Nothing open by that id: decided already, expired, or never asked.
                let text = match answer.id {
                    Some(id) => texts::no_open_approval_result(id),
                    None => texts::WHICH_APPROVAL_RESULT.to_owned(),
                };
                turns.push(turn(&call_id, "approval", "{}", text));
                continue;
            };
            let may = row.askers().contains(&message.user_id)
                || admins.contains(batch.conversation.platform, &message.user_id);
            if !may {
                tracing::info!(conversation = %self.conversation, action = row.id, "an approval answered by someone who may not; refused");
                turns.push(turn(
                    &call_id,
                    &row.tool,
                    &row.arguments,
                    texts::NOT_YOURS_TO_APPROVE_RESULT.to_owned(),
                ));
                continue;
            }
            let approved_at = answer.approve.then_some(message.received_at);
            match decided.iter_mut().find(|d| d.row.id == row.id) {
                Some(earlier) => {
                    earlier.approve &= answer.approve;
                    earlier.approved_at = earlier.approved_at.or(approved_at);
                    earlier.message = message;
                }
                None => decided.push(Decided {
                    row: row.clone(),
                    approve: answer.approve,
                    approved_at,
                    message,
                }),
            }
        }
        decided.sort_by_key(|d| d.row.id);
        decided
    }

    /// Refuse an approval (`/cancel`): an open question, or a call approved but not
    /// yet run. The row after it, and what the model is told.
    async fn cancel(
        &self,
        decision: &Decided<'_>,
        now: Timestamp,
    ) -> Result<(ActionRow, String), Interrupt> {
        let answer = ApprovalAnswer {
            conversation: self.conversation,
            id: decision.row.id,
            approve: false,
            now,
        };
        Ok(match self.dispatcher.store.decide_action(answer).await? {
            Decision::Decided(row) | Decision::Expired(row) => {
                (row, texts::REFUSED_ACTION_RESULT.to_owned())
            }
            // Too late to refuse: reserved (running) or done by an earlier round.
            Decision::AlreadyDecided(row) if row.state != ActionState::Refused => {
                let told = texts::too_late_to_cancel_result(row.state.as_str());
                (row, told)
            }
            Decision::AlreadyDecided(row) => (row, texts::REFUSED_ACTION_RESULT.to_owned()),
            Decision::NotFound => (
                decision.row.clone(),
                texts::no_open_approval_result(decision.row.id),
            ),
        })
    }

    /// Take an approval's yes: the decision and the reservation in one write fenced by
    /// the lease and `v0`, then run the call once. `Err(version)`: a newer message
    /// arrived first (nothing decided, nothing ran), unless the cap forces this round's
    /// reply out (then the call is told not run, and the approval stays open).
    async fn run_approved(
        &self,
        batch: &Batch,
        toolbox: &dyn crate::tools::Toolbox,
        decision: &Decided<'_>,
        now: Timestamp,
    ) -> Result<Result<String, Version>, Interrupt> {
        let d = self.dispatcher;
        let row = &decision.row;
        let spec = toolbox.tools().into_iter().find(|t| t.name == row.tool);
        let idempotent = matches!(
            spec.as_ref().map(|s| s.effect),
            Some(Effect::Destructive { idempotent: true } | Effect::Acts { idempotent: true })
        );
        let action = NewAction {
            key: row.key.clone(),
            batch: row.batch,
            tool: row.tool.clone(),
            arguments: row.arguments.clone(),
            idempotent,
            needs_approval: true,
            requested_by: row.requested_by.clone(),
            expires_at: now
                .plus(d.settings.tools.call_timeout + super::actions::RESERVATION_MARGIN),
            approved: Some(decision.approved_at.unwrap_or(now).until(now)),
        };
        // Read before the reservation: once reserved, nothing may fail before the call.
        let salt = d.idempotency_salt().await?;
        let lease = self.keeper.lease();
        let reserve = Reserve {
            lease: &lease,
            v0: batch.v0,
            action,
            now,
        };
        Ok(Ok(match d.store.reserve_action(reserve).await? {
            ActionReservation::Reserved(reserved) => match spec {
                Some(spec) => {
                    let arguments = serde_json::from_str(&reserved.arguments).unwrap_or_default();
                    self.run_reserved(batch, toolbox, &spec, arguments, (&reserved, salt))
                        .await?
                }
                None => texts::unknown_tool_result(&row.tool),
            },
            ActionReservation::Done(done) => texts::reused_result(&done.result.unwrap_or_default()),
            ActionReservation::Stale { .. } if self.at_cap(batch) => {
                texts::MOVED_ON_RESULT.to_owned()
            }
            ActionReservation::Stale { version } => return Ok(Err(version)),
            ActionReservation::Unknown(_) | ActionReservation::InFlight { .. } => {
                texts::OUTCOME_UNKNOWN_RESULT.to_owned()
            }
            ActionReservation::Refused(refused) if refused.expires_at <= now => {
                texts::APPROVAL_EXPIRED_RESULT.to_owned()
            }
            ActionReservation::Awaiting { .. } | ActionReservation::Refused(_) => {
                texts::REFUSED_ACTION_RESULT.to_owned()
            }
        }))
    }
}

/// A tool turn showing the model one call and its result.
fn turn(id: &str, tool: &str, arguments: &str, result: String) -> ToolTurn {
    ToolTurn {
        text: String::new(),
        calls: vec![ToolCall {
            id: id.to_owned(),
            name: tool.to_owned(),
            arguments: arguments.to_owned(),
        }],
        results: vec![result],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_answers_are_read_from_messages() {
        assert_eq!(
            answer_in("/approve 12"),
            Some(Answered {
                approve: true,
                id: Some(12)
            })
        );
        assert_eq!(
            answer_in("/cancel"),
            Some(Answered {
                approve: false,
                id: None
            })
        );
        assert_eq!(
            answer_in("/approve@lull_bot #3"),
            Some(Answered {
                approve: true,
                id: Some(3)
            })
        );
        assert_eq!(answer_in("/approve soon"), None);
        assert_eq!(answer_in("please /approve 3"), None);
        assert_eq!(answer_in("/approval 3"), None);
    }
}

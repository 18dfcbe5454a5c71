//! Approvals: a destructive call waits for the person's yes (`/approve ID`, or
//! `/cancel ID`), sent as a message in the conversation, so it reaches a round like
//! any message and is decided under the conversation's lease.
//!
//! The decision is the journal's compare-and-swap
//! ([`ActionStore::decide_action`](crate::store::ActionStore::decide_action)): a
//! double tap, or the same answer reaching two replicas, decides once; the approved
//! call is then reserved like any call that acts, so it runs once. Only the person
//! whose message led to the call, or an admin, may answer; a tool's output never can
//! (only a person's message is read here). An expired question is refused.

use super::{Interrupt, Round};
use crate::domain::Version;
use crate::llm::{Prompt, ToolCall, ToolTurn};
use crate::store::{
    ActionReservation, ActionRow, ActionState, ApprovalAnswer, Batch, BatchOf, ConversationAt,
    Decision, NewAction, Reserve,
};
use crate::texts;
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

impl Round<'_> {
    /// Decide the approvals the batch's messages answer, run the approved calls
    /// (reserved, once), and show the model each as a tool turn. Returns the journal
    /// rows decided here, for the reply's report; `Err(version)`: a newer message
    /// arrived before an approved call could be reserved (nothing ran; the next
    /// round, covering it, decides again).
    pub(super) async fn take_approvals(
        &self,
        batch: &Batch,
        prompt: &mut Prompt,
    ) -> Result<Result<Vec<ActionRow>, Version>, Interrupt> {
        let d = self.dispatcher;
        let Some(toolbox) = d.toolbox().cloned() else {
            return Ok(Ok(Vec::new()));
        };
        let answers: Vec<_> = batch
            .pending
            .iter()
            .filter_map(|m| answer_in(&m.text).map(|a| (m, a)))
            .collect();
        if answers.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        let admins = &d.settings.access.admins;
        let mut decided = Vec::new();
        for (message, answer) in answers {
            let now = d.clock.now();
            let open = d
                .store
                .open_approvals(ConversationAt {
                    conversation: self.conversation,
                    now,
                })
                .await?;
            let row = match answer.id {
                Some(id) => open.into_iter().find(|r| r.id == id),
                None if open.len() == 1 => open.into_iter().next(),
                None => None,
            };
            let call_id = format!("approval_{}", message.row);
            let Some(row) = row else {
                // Nothing open by that id: decided already, expired, or never asked.
                let text = match answer.id {
                    Some(id) => texts::no_open_approval_result(id),
                    None => texts::WHICH_APPROVAL_RESULT.to_owned(),
                };
                prompt.turns.push(turn(&call_id, "approval", "{}", text));
                continue;
            };
            let may = row.requested_by.as_deref() == Some(message.user_id.as_str())
                || admins.contains(batch.conversation.platform, &message.user_id);
            if !may {
                tracing::info!(conversation = %self.conversation, action = row.id, "an approval answered by someone who may not; refused");
                prompt.turns.push(turn(
                    &call_id,
                    &row.tool,
                    &row.arguments,
                    texts::NOT_YOURS_TO_APPROVE_RESULT.to_owned(),
                ));
                continue;
            }
            // The row as the decision left it (the report shows what is true now).
            let mut row = row;
            if row.state == ActionState::Awaiting {
                match d
                    .store
                    .decide_action(ApprovalAnswer {
                        conversation: self.conversation,
                        id: row.id,
                        approve: answer.approve,
                        now,
                    })
                    .await?
                {
                    Decision::Decided(now) | Decision::AlreadyDecided(now) => row = now,
                    Decision::Expired(row) => {
                        prompt.turns.push(turn(
                            &call_id,
                            &row.tool,
                            &row.arguments,
                            texts::APPROVAL_EXPIRED_RESULT.to_owned(),
                        ));
                        decided.push(row);
                        continue;
                    }
                    Decision::NotFound => continue,
                }
            }
            if !answer.approve || row.state == ActionState::Refused {
                prompt.turns.push(turn(
                    &call_id,
                    &row.tool,
                    &row.arguments,
                    texts::REFUSED_ACTION_RESULT.to_owned(),
                ));
                decided.push(row);
                continue;
            }
            // Approved: reserved like any call that acts (so it runs once), then run.
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
                    .plus(d.settings.tools.call_timeout + super::tools::RESERVATION_MARGIN),
            };
            let lease = self.keeper.lease();
            let result = match d
                .store
                .reserve_action(Reserve {
                    lease: &lease,
                    v0: batch.v0,
                    action,
                    now,
                })
                .await?
            {
                ActionReservation::Reserved(reserved) => match spec {
                    Some(spec) => {
                        let arguments =
                            serde_json::from_str(&reserved.arguments).unwrap_or_default();
                        self.run_reserved(batch, toolbox.as_ref(), &spec, arguments, &reserved)
                            .await?
                    }
                    None => texts::unknown_tool_result(&row.tool),
                },
                ActionReservation::Done(done) => {
                    texts::reused_result(&done.result.unwrap_or_default())
                }
                ActionReservation::Stale { version } => {
                    // A newer message: the next round (covering this answer too)
                    // decides again; the approval stays approved.
                    return Ok(Err(version));
                }
                ActionReservation::Unknown(_) | ActionReservation::InFlight { .. } => {
                    texts::OUTCOME_UNKNOWN_RESULT.to_owned()
                }
                ActionReservation::Awaiting { .. } | ActionReservation::Refused(_) => {
                    texts::REFUSED_ACTION_RESULT.to_owned()
                }
            };
            prompt
                .turns
                .push(turn(&call_id, &row.tool, &row.arguments, result));
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
        Ok(Ok(decided))
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

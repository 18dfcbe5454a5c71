//! Ingest: every inbound update is stored in one short transaction, or answered at
//! once (a command, see `commands`; a denial; a message lull cannot read). Nothing
//! here waits for the model: the reply comes later, from a round.
//!
//! An update walks one chain. First the admission steps ([`ADMISSION`], in `admit`),
//! each of which passes it on or ends its ingest with the adapter's answer:
//!
//! 1. **platform**: an update from a platform lull does not run is refused, and one
//!    sent as the console's operator (`access::CONSOLE_OPERATOR`).
//! 2. **thread**: a message in a Discord thread lull opened needs no mention.
//! 3. **overheard**: a group message not addressed to lull is group context at most.
//! 4. **access**: a sender who is not admitted is told how to get access, once.
//! 5. **content**: what lull cannot read is told; an empty or too long one refused.
//! 6. **command**: a command is answered at once, never joining a burst.
//! 7. **idle**: a conversation silent for `LULL_IDLE_RESET` starts a fresh context.
//!
//! Then the update is **stored** (idempotent on its platform id: a redelivery is a
//! duplicate), and once it is, the after-store effects ([`AFTER_STORE`], in
//! `stored`) run; their failures are logged, never reported as "not stored":
//!
//! 1. **title**: the chat's name as its platform shows it, noted when it changed
//!    (`titles`).
//! 2. **rate**: over `LULL_RATE_PER_MIN`, the message is held, and the rest skipped.
//! 3. **wake**: the scheduler is woken for the new deadline.
//! 4. **ack**: 👀 on a burst whose reply is not immediate (`acks`).
//! 5. **draft**: "Thinking…" in the conversation's draft while the debounce waits.
//!
//! A new admission policy or effect lands as one step in one of the two lists (and a
//! line here, in the same order: a test checks it).

mod admit;
mod stored;

use lull_port::{Accepted, Content, Incoming, IncomingKind, IngestError};

use super::Dispatcher;
use super::not_stored::not_stored;
use crate::domain::{ConversationId, Timestamp, Version};
use crate::store::{IngestOutcome, MessageEdit, NewMessage, StoredBy};

/// One admission step, in [`ADMISSION`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    Platform,
    Thread,
    Overheard,
    Access,
    Content,
    Command,
    Idle,
}

/// The admission steps, in the order an update meets them.
const ADMISSION: [Admission; 7] = [
    Admission::Platform,
    Admission::Thread,
    Admission::Overheard,
    Admission::Access,
    Admission::Content,
    Admission::Command,
    Admission::Idle,
];

/// One effect after a message is stored, in [`AFTER_STORE`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterStore {
    Title,
    Rate,
    Wake,
    Ack,
    Draft,
}

/// The effects after a message is stored, in order.
const AFTER_STORE: [AfterStore; 5] = [
    AfterStore::Title,
    AfterStore::Rate,
    AfterStore::Wake,
    AfterStore::Ack,
    AfterStore::Draft,
];

/// What a step says: pass the update on, or end its ingest with this answer.
enum Step {
    Next,
    Done(Accepted),
}

/// An update on its way in, and what the steps learned of it.
struct Arriving<'a> {
    dispatcher: &'a Dispatcher,
    incoming: Incoming,
    /// When it arrived (its notices and its storing are stamped with it).
    now: Timestamp,
    /// Whether its sender is an admin (from the environment): read once, by `access`.
    admin: bool,
    /// The text stored: the caption after one marker per piece of media (`content`).
    text: String,
}

/// A message (or edit) stored: where, at which version, and when it is due.
#[derive(Debug, Clone, Copy)]
struct Stored {
    conversation: ConversationId,
    version: Version,
    due_at: Timestamp,
}

/// Accept an inbound update: `Ok` once it is stored for good (or deliberately not
/// stored), so the adapter may acknowledge it to its platform.
pub(super) async fn ingest(
    dispatcher: &Dispatcher,
    incoming: Incoming,
) -> Result<Accepted, IngestError> {
    let mut arriving = Arriving {
        dispatcher,
        now: dispatcher.clock.now(),
        incoming,
        admin: false,
        text: String::new(),
    };
    for step in ADMISSION {
        if let Step::Done(accepted) = arriving.admit(step).await? {
            tracing::trace!(step = step.name(), ?accepted, "admission ends here");
            return Ok(accepted);
        }
    }
    let Some(outcome) = arriving.store().await? else {
        return Ok(Accepted::Overheard);
    };
    let stored = match outcome {
        IngestOutcome::Stored {
            conversation,
            version,
            due_at,
        } => Stored {
            conversation,
            version,
            due_at,
        },
        IngestOutcome::Duplicate { conversation } => {
            tracing::debug!(%conversation, "redelivered message ignored");
            return Ok(Accepted::Duplicate);
        }
        IngestOutcome::EditIgnored => return Ok(Accepted::EditIgnored),
    };
    arriving.announce(&stored);
    // The message is stored: a failure from here on is logged, never reported as
    // "not stored" (a redelivery would only be a duplicate).
    for effect in AFTER_STORE {
        if let Step::Done(accepted) = arriving.after_store(effect, &stored).await {
            tracing::trace!(effect = effect.name(), "the effects after storing end here");
            return Ok(accepted);
        }
    }
    Ok(Accepted::Stored {
        conversation: stored.conversation,
        version: stored.version,
    })
}

impl Arriving<'_> {
    /// Store the message or the edit, in one transaction (version bump, timer armed);
    /// `None`: an overheard update, which is never stored as a message.
    async fn store(&self) -> Result<Option<IngestOutcome>, IngestError> {
        let d = self.dispatcher;
        let incoming = &self.incoming;
        let text = self.text.clone();
        match incoming.kind {
            IncomingKind::New => {
                let message = NewMessage {
                    conversation: incoming.conversation.clone(),
                    is_group: incoming.is_group,
                    message_id: incoming.message_id.clone(),
                    user_id: incoming.user_id.clone(),
                    author: incoming.author.clone(),
                    text,
                    media: incoming.media.clone(),
                };
                d.store.ingest(message, &d.holder, self.now).await
            }
            IncomingKind::Edit => {
                let edit = MessageEdit {
                    conversation: incoming.conversation.clone(),
                    message_id: incoming.message_id.clone(),
                    text,
                };
                let by = StoredBy {
                    holder: &d.holder,
                    now: self.now,
                };
                d.store.edit(edit, by).await
            }
            // Kept (or dropped) by `overheard`, never stored as a message; a message
            // that opened a thread is a new message by then (`thread`).
            IncomingKind::Overheard | IncomingKind::OpenedThread => return Ok(None),
        }
        .map(Some)
        .map_err(not_stored)
    }

    /// Whether the update is text lull can read (`None`: unsupported content).
    fn text(&self) -> Option<&str> {
        match &self.incoming.content {
            Content::Text(text) => Some(text),
            Content::Unsupported(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module doc's two numbered lists, by their bold names.
    fn doc_lists() -> Vec<Vec<String>> {
        let mut lists: Vec<Vec<String>> = Vec::new();
        let mut last = 0;
        for line in include_str!("mod.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
        {
            let line = line.trim_start_matches("//!").trim_start();
            let Some((number, rest)) = line.split_once(". **") else {
                continue;
            };
            let Ok(number) = number.parse::<usize>() else {
                continue;
            };
            if number <= last || lists.is_empty() {
                lists.push(Vec::new());
            }
            last = number;
            let name = rest.split("**").next().unwrap_or_default();
            lists.last_mut().expect("a list").push(name.to_owned());
        }
        lists
    }

    /// The module doc names the admission steps and the after-store effects
    /// one-to-one, in the order they run.
    #[test]
    fn the_ingest_doc_names_the_steps_in_order() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let admission: Vec<&str> = ADMISSION.iter().map(|s| s.name()).collect();
        let after: Vec<&str> = AFTER_STORE.iter().map(|s| s.name()).collect();
        assert_eq!(doc_lists(), vec![names(&admission), names(&after)]);
    }
}

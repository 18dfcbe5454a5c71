//! Ingest: every inbound update is stored in one short transaction, or answered at
//! once (a command, a denial, a message lull cannot read). Nothing here waits for the
//! model: the reply comes later, from a round.

use lull_port::{Accepted, Command, Content, Incoming, IncomingKind, IngestError};

use super::{Dispatcher, Event};
use crate::access::AccessList;
use crate::commands;
use crate::domain::Timestamp;
use crate::metrics as names;
use crate::store::{IngestOutcome, MessageEdit, NewMessage, NewNotice, StoreError};

/// Accept an inbound update: `Ok` once it is stored for good (or deliberately not
/// stored), so the adapter may acknowledge it to its platform.
pub(super) async fn ingest(
    dispatcher: &Dispatcher,
    incoming: Incoming,
) -> Result<Accepted, IngestError> {
    let platform = incoming.conversation.platform;
    if !dispatcher.outbounds.contains_key(&platform) {
        return Err(IngestError::UnknownPlatform(platform));
    }
    let settings = &dispatcher.settings;
    let now = dispatcher.clock.now();
    if !settings.access.allows(platform, &incoming.user_id) {
        if incoming.kind == IncomingKind::New {
            deny(dispatcher, &incoming, now).await.map_err(not_stored)?;
        }
        return Ok(Accepted::Denied);
    }
    let text = match incoming.content {
        Content::Text(ref text) => text.clone(),
        Content::Unsupported(ref what) => {
            if incoming.kind == IncomingKind::New {
                let text = commands::unsupported_text(what);
                notify(dispatcher, &incoming, text, "unsupported", now)
                    .await
                    .map_err(not_stored)?;
            }
            return Ok(Accepted::Unsupported);
        }
    };
    if text.trim().is_empty() && incoming.media.is_empty() {
        return Err(IngestError::Empty);
    }
    let chars = lull_port::split::char_len(&text);
    if chars > settings.max_message_chars {
        return Err(IngestError::TooLong {
            chars,
            max: settings.max_message_chars,
        });
    }
    if incoming.kind == IncomingKind::New
        && incoming.media.is_empty()
        && let Some(command) = Command::parse(&text)
    {
        answer_command(dispatcher, &incoming, command, now)
            .await
            .map_err(not_stored)?;
        return Ok(Accepted::Command(command));
    }
    // Media enter prompts and history as their marker before the caption, so the
    // model (and `echo`) sees that something was sent; only the pending batch fetches
    // the bytes. An edited caption arrives with its media and keeps the marker.
    let text = with_markers(&incoming.media, &text);
    let store = &dispatcher.store;
    let holder = &dispatcher.holder;
    let conversation_ref = incoming.conversation.clone();
    let outcome = match incoming.kind {
        IncomingKind::New => {
            let message = NewMessage {
                conversation: incoming.conversation,
                is_group: incoming.is_group,
                message_id: incoming.message_id,
                user_id: incoming.user_id,
                author: incoming.author,
                text,
                media: incoming.media,
            };
            store.ingest(message, holder, now).await
        }
        IncomingKind::Edit => {
            let edit = MessageEdit {
                conversation: incoming.conversation,
                message_id: incoming.message_id,
                text,
            };
            store.edit(edit, holder, now).await
        }
    }
    .map_err(not_stored)?;
    Ok(match outcome {
        IngestOutcome::Stored {
            conversation,
            version,
            due_at,
        } => {
            metrics::counter!(names::MESSAGES_INGESTED).increment(1);
            tracing::debug!(%conversation, %version, due_in_ms = now.until(due_at).as_millis() as u64, "message stored");
            dispatcher.emit(Event::Ingested {
                conversation,
                version,
            });
            dispatcher.wake_by(due_at);
            // "Thinking…" in the conversation's draft while the debounce waits.
            if let Some(outbound) = dispatcher
                .drafts
                .outbound(&dispatcher.outbounds, &conversation_ref)
            {
                dispatcher
                    .drafts
                    .placeholder(outbound, conversation_ref, version);
            }
            Accepted::Stored {
                conversation,
                version,
            }
        }
        IngestOutcome::Duplicate { conversation } => {
            tracing::debug!(%conversation, "redelivered message ignored");
            Accepted::Duplicate
        }
        IngestOutcome::EditIgnored => Accepted::EditIgnored,
    })
}

/// `text` after one marker per piece of media ("[image] what is this?").
fn with_markers(media: &[lull_port::Media], text: &str) -> String {
    let markers: Vec<&str> = media.iter().map(|m| m.kind.marker()).collect();
    match (markers.is_empty(), text.trim().is_empty()) {
        (true, _) => text.to_owned(),
        (false, true) => markers.join(" "),
        (false, false) => format!("{} {text}", markers.join(" ")),
    }
}

/// The update was not stored: the adapter must not acknowledge it. A database that
/// is busy, full or failing is reported by the store (once per change); anything else
/// is unexpected and logged here.
fn not_stored(error: StoreError) -> IngestError {
    if !matches!(
        error,
        StoreError::Busy
            | StoreError::Full
            | StoreError::Pool(_)
            | StoreError::Damaged(_)
            | StoreError::Io(_)
    ) {
        tracing::error!(error = %error, "could not store an update");
    }
    IngestError::from(error)
}

/// Answer a command at once, without the model.
async fn answer_command(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    command: Command,
    now: Timestamp,
) -> Result<(), StoreError> {
    let text = match command {
        Command::Start | Command::Help => commands::HELP_TEXT.to_owned(),
        Command::Reset => {
            dispatcher
                .store
                .reset_context(
                    &incoming.conversation,
                    incoming.is_group,
                    &dispatcher.holder,
                    now,
                )
                .await?;
            commands::RESET_TEXT.to_owned()
        }
    };
    tracing::info!(conversation = %incoming.conversation, command = command.name(), "command");
    notify(dispatcher, incoming, text, command.name(), now).await
}

/// Queue a notice answering `incoming`, once per message (a redelivered command is not
/// answered twice), and wake the scheduler to deliver it.
async fn notify(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    text: String,
    what: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let dedupe_key = format!("{what}/{}/{}", incoming.conversation, incoming.message_id);
    queue_notice(dispatcher, incoming, text, dedupe_key, now).await
}

/// Tell an unlisted user how to get access: once a day per user, whatever they send,
/// and nothing reaches the model.
async fn deny(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    now: Timestamp,
) -> Result<(), StoreError> {
    let platform = incoming.conversation.platform;
    tracing::info!(%platform, user = %incoming.user_id, "message from a user not in LULL_ALLOWED_USERS");
    let day = now.0 / 86_400_000;
    let text = AccessList::denial_text(platform, &incoming.user_id);
    let dedupe_key = format!("denied/{platform}/{}/{day}", incoming.user_id);
    queue_notice(dispatcher, incoming, text, dedupe_key, now).await
}

/// Store a notice (at most once per dedupe key) and wake the scheduler to deliver it.
async fn queue_notice(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    text: String,
    dedupe_key: String,
    now: Timestamp,
) -> Result<(), StoreError> {
    let notice = NewNotice {
        conversation: incoming.conversation.clone(),
        is_group: incoming.is_group,
        text,
        reply_to: incoming.is_group.then(|| incoming.message_id.clone()),
        dedupe_key,
    };
    if dispatcher
        .store
        .enqueue_notice(notice, &dispatcher.holder, now)
        .await?
        .is_some()
    {
        dispatcher.wake_by(now);
    }
    Ok(())
}

//! Ingest: every inbound update is stored in one short transaction, or answered at
//! once (a command, see `commands`; a denial; a message lull cannot read). Nothing
//! here waits for the model: the reply comes later, from a round.

use lull_port::{Accepted, Command, Content, Incoming, IncomingKind, IngestError};

use super::not_stored::not_stored;
use super::{Dispatcher, Event, commands, notices};
use crate::access::Sender;
use crate::domain::{ConversationId, Timestamp};
use crate::limits;
use crate::metrics as names;
use crate::store::{
    IdleForget, IngestOutcome, MessageEdit, NewMessage, RateCheck, RateHold, RateWindow,
    StoreError, StoredBy,
};
use crate::texts;

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
    let incoming = super::threads::admit(dispatcher, incoming).await?;
    if incoming.kind == IncomingKind::Overheard {
        return super::overheard::overhear(dispatcher, incoming).await;
    }
    let settings = &dispatcher.settings;
    let now = dispatcher.clock.now();
    let rules = dispatcher.access_rules().await.map_err(not_stored)?;
    if !settings.access.allows(Sender::of(&incoming), &rules) {
        metrics::counter!(names::LIMITED, "reason" => "denied").increment(1);
        if incoming.kind == IncomingKind::New {
            deny(dispatcher, &incoming, now).await.map_err(not_stored)?;
        }
        return Ok(Accepted::Denied);
    }
    let text = match incoming.content {
        Content::Text(ref text) => text.clone(),
        Content::Unsupported(ref what) => {
            if incoming.kind == IncomingKind::New {
                let text = texts::unsupported_text(what);
                notices::answer_message(dispatcher, &incoming, text, "unsupported", now)
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
        commands::answer(dispatcher, &incoming, command, &text, now)
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
    let (kind, message_id) = (incoming.kind, incoming.message_id.clone());
    // The sender of a message or edit the rate limit counts (admins are not
    // limited). An edit counts as a message: it makes the batch stale as a new
    // message does, so unlimited edits could keep every generation from being
    // answered.
    let rate_limited = (settings.limits.rate_per_min > 0
        && !settings.access.is_admin(Sender::of(&incoming)))
    .then(|| incoming.clone());
    // `LULL_IDLE_RESET`: a conversation silent that long starts afresh (history only;
    // no message is dropped).
    if let Some(idle) = settings.controls.idle_reset
        && incoming.kind == IncomingKind::New
        && store
            .forget_if_idle(IdleForget {
                conversation: &incoming.conversation,
                idle,
                now,
            })
            .await
            .map_err(not_stored)?
    {
        tracing::info!(conversation = %incoming.conversation, "idle longer than LULL_IDLE_RESET: a fresh context");
    }
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
            store.edit(edit, StoredBy { holder, now }).await
        }
        // Kept (or dropped) at the top, never stored as a message; a message that
        // opened a thread is a new message by then (see `threads`).
        IncomingKind::Overheard | IncomingKind::OpenedThread => return Ok(Accepted::Overheard),
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
            // The message is stored: a failure from here on is logged, never reported
            // as "not stored" (a redelivery would only be a duplicate).
            if let Some(limited) = &rate_limited {
                let rate = RateWindow {
                    max: settings.limits.rate_per_min,
                    window: limits::rate_window(),
                };
                match dispatcher
                    .store
                    .hold_over_rate(RateCheck {
                        conversation,
                        user_id: &limited.user_id,
                        rate,
                        now,
                    })
                    .await
                {
                    Ok(None) => {}
                    Ok(Some(hold)) => {
                        // Stored and pending: answered with the rest when the hold ends.
                        if let Err(e) =
                            rate_held(dispatcher, limited, conversation, hold, now).await
                        {
                            tracing::warn!(%conversation, error = %e, "could not tell a user about their rate limit");
                        }
                        return Ok(Accepted::Stored {
                            conversation,
                            version,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(%conversation, error = %e, "could not apply the rate limit; the message is answered as usual");
                    }
                }
            }
            dispatcher.wake_by(due_at);
            // 👀 on a burst whose reply is not immediate (see `acks`).
            if kind == IncomingKind::New
                && due_at > now
                && let Some(outbound) = dispatcher.outbounds.get(&conversation_ref.platform)
            {
                dispatcher.acks.stored(
                    outbound.clone(),
                    conversation_ref.clone(),
                    conversation,
                    message_id,
                );
            }
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

/// `text` after one marker per piece of media (`[image] what is this?`).
fn with_markers(media: &[lull_port::Media], text: &str) -> String {
    let markers: Vec<&str> = media.iter().map(|m| m.kind.marker()).collect();
    match (markers.is_empty(), text.trim().is_empty()) {
        (true, _) => text.to_owned(),
        (false, true) => markers.join(" "),
        (false, false) => format!("{} {text}", markers.join(" ")),
    }
}

/// A message was held by the rate limit: count it, and tell the user once per hold
/// when their messages will be answered.
async fn rate_held(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    conversation: ConversationId,
    hold: RateHold,
    now: Timestamp,
) -> Result<(), StoreError> {
    metrics::counter!(names::LIMITED, "reason" => "rate").increment(1);
    tracing::info!(%conversation, user = %incoming.user_id, until = hold.until.0, "over LULL_RATE_PER_MIN: messages held");
    dispatcher.emit(Event::Limited {
        conversation,
        reason: "rate",
        until: hold.until,
    });
    if !hold.began {
        return Ok(());
    }
    let limits = &dispatcher.settings.limits;
    let text = texts::rate_text(limits.rate_per_min, &limits.timezone.show(hold.until, now));
    let dedupe_key = format!(
        "rate/{}/{}/{}",
        incoming.conversation, incoming.user_id, hold.until.0
    );
    notices::answer(dispatcher, incoming, text, dedupe_key, now).await
}

/// Tell a user who is not admitted how to get access: once per conversation, whatever
/// they send, and nothing reaches the model.
async fn deny(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    now: Timestamp,
) -> Result<(), StoreError> {
    let platform = incoming.conversation.platform;
    tracing::info!(%platform, user = %incoming.user_id, chats = ?incoming.chats, "message from a user not admitted (LULL_ALLOWED_USERS, LULL_ALLOWED_CHATS, /allow)");
    let chat = incoming.chats.last().map(String::as_str);
    let text = texts::denial_text(platform, &incoming.user_id, chat);
    let dedupe_key = format!("denied/{}/{}", incoming.conversation, incoming.user_id);
    notices::answer(dispatcher, incoming, text, dedupe_key, now).await
}

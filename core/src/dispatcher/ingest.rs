//! Ingest: every inbound update is stored in one short transaction, or answered at
//! once (a command, a denial, a message lull cannot read). Nothing here waits for the
//! model: the reply comes later, from a round.

use lull_port::{Accepted, Command, Content, Incoming, IncomingKind, IngestError};

use super::{Dispatcher, Event};
use crate::access::{AccessList, AccessRule, Sender, Subject, SubjectKind};
use crate::commands;
use crate::domain::{ConversationId, Platform, Timestamp};
use crate::limits;
use crate::metrics as names;
use crate::store::{
    IngestOutcome, MessageEdit, NewMessage, NewNotice, RateHold, RateWindow, StoreError,
};

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
    let rules = dispatcher.access_rules().await.map_err(not_stored)?;
    if !settings.access.allows(sender(&incoming), &rules) {
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
        answer_command(dispatcher, &incoming, command, &text, now)
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
    // The sender of a message or edit the rate limit counts (admins are not
    // limited). An edit counts as a message: it makes the batch stale as a new
    // message does, so unlimited edits could keep every generation from being
    // answered.
    let rate_limited = (settings.limits.rate_per_min > 0
        && !settings.access.is_admin(sender(&incoming)))
    .then(|| incoming.clone());
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
            // The message is stored: a failure from here on is logged, never reported
            // as "not stored" (a redelivery would only be a duplicate).
            if let Some(limited) = &rate_limited {
                let rate = RateWindow {
                    max: settings.limits.rate_per_min,
                    window: limits::rate_window(),
                };
                match dispatcher
                    .store
                    .hold_over_rate(conversation, &limited.user_id, rate, now)
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

/// Who sent `incoming`, as access decisions see it.
fn sender(incoming: &Incoming) -> Sender<'_> {
    Sender {
        platform: incoming.conversation.platform,
        user_id: &incoming.user_id,
        chats: &incoming.chats,
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
    let text = commands::rate_text(limits.rate_per_min, &limits.timezone.show(hold.until, now));
    let dedupe_key = format!(
        "rate/{}/{}/{}",
        incoming.conversation, incoming.user_id, hold.until.0
    );
    queue_notice(dispatcher, incoming, text, dedupe_key, now).await
}

/// Answer a command at once, without the model. `text` is the whole message (the
/// arguments of `/usage`, `/allow`, `/deny`).
async fn answer_command(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    command: Command,
    text: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let settings = &dispatcher.settings;
    let admin = settings.access.is_admin(sender(incoming));
    let args: Vec<&str> = text.split_whitespace().skip(1).collect();
    let text = match command {
        Command::Start | Command::Help => commands::HELP_TEXT.to_owned(),
        // In a group only an admin resets; anyone resets their private chat.
        Command::Reset if incoming.is_group && !admin => commands::admins_only("reset"),
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
        Command::Usage => usage(dispatcher, incoming, admin, &args, now).await?,
        Command::Allow | Command::Deny if !admin => commands::admins_only(command.name()),
        Command::Allow | Command::Deny => match subject(incoming, &args) {
            Ok(subject) => {
                let allowed = command == Command::Allow;
                let rule = AccessRule {
                    subject,
                    allowed,
                    set_by: AccessList::entry_for(
                        incoming.conversation.platform,
                        &incoming.user_id,
                    ),
                    set_at: now,
                };
                dispatcher.store.set_access(&rule).await?;
                dispatcher.forget_access_rules();
                tracing::info!(subject = %rule.subject, allowed, by = %rule.set_by, "access decision recorded");
                commands::access_set_text(&rule.subject.to_string(), allowed)
            }
            Err(why) => why,
        },
    };
    tracing::info!(conversation = %incoming.conversation, command = command.name(), "command");
    notify(dispatcher, incoming, text, command.name(), now).await
}

/// Whom `/allow` or `/deny` names: `platform:user_id` (or a bare user id on this
/// platform), or `chat` with `platform:chat_id` (or nothing, in a group: this group;
/// on Discord, its server).
fn subject(incoming: &Incoming, args: &[&str]) -> Result<Subject, String> {
    let platform = incoming.conversation.platform;
    let (kind, id) = match args {
        ["chat"] => match incoming.chats.last() {
            Some(chat) => (SubjectKind::Chat, chat.as_str()),
            None => return Err(commands::ACCESS_USAGE_TEXT.to_owned()),
        },
        ["chat", id] => (SubjectKind::Chat, *id),
        [id] => (SubjectKind::User, *id),
        _ => return Err(commands::ACCESS_USAGE_TEXT.to_owned()),
    };
    let (platform, id) = match id.split_once(':') {
        Some((p, id)) => (
            p.parse::<Platform>()
                .map_err(|e| format!("{e}. {}", commands::ACCESS_USAGE_TEXT))?,
            id,
        ),
        None => (platform, id),
    };
    if id.is_empty() || id == "*" {
        return Err(commands::ACCESS_USAGE_TEXT.to_owned());
    }
    Ok(Subject {
        platform,
        kind,
        id: id.to_owned(),
    })
}

/// What `/usage` answers: the sender's own use today and their limit; an admin also
/// sees the whole bot's, and asks for a group's (in the group) or a user's (named).
async fn usage(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    admin: bool,
    args: &[&str],
    now: Timestamp,
) -> Result<String, StoreError> {
    let limits = &dispatcher.settings.limits;
    let platform = incoming.conversation.platform;
    let day = limits.timezone.day(now);
    let resets = limits.timezone.show(limits.timezone.next_day(now), now);
    let (label, scope, limit) = match (admin, args) {
        (true, [who]) => {
            let (p, id) = who
                .split_once(':')
                .and_then(|(p, id)| Some((p.parse::<Platform>().ok()?, id)))
                .unwrap_or((platform, who));
            (
                format!("{p}:{id}"),
                limits::user_scope(p, id),
                limits.user_daily_tokens,
            )
        }
        (true, []) if incoming.is_group => (
            "this group".to_owned(),
            limits::conversation_scope(&incoming.conversation),
            0,
        ),
        _ => (
            "you".to_owned(),
            limits::user_scope(platform, &incoming.user_id),
            if admin { 0 } else { limits.user_daily_tokens },
        ),
    };
    let scopes = [scope, limits::BOT_SCOPE.to_owned()];
    let used = dispatcher.store.token_usage(&day, &scopes).await?;
    Ok(commands::usage_text(
        &day,
        &label,
        used[0],
        limit,
        admin.then_some((used[1], limits.daily_tokens)),
        &resets,
    ))
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
    let text = AccessList::denial_text(platform, &incoming.user_id, chat);
    let dedupe_key = format!("denied/{}/{}", incoming.conversation, incoming.user_id);
    queue_notice(dispatcher, incoming, text, dedupe_key, now).await
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

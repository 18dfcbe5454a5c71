//! Auto threads (`LULL_DISCORD_AUTO_THREAD`): a mention in a guild channel is
//! answered in a thread lull opens on it.
//!
//! Discord facts this relies on:
//! - `POST /channels/{channel}/messages/{message}/threads` starts a thread from a
//!   message, and the thread's id is the message's id: whichever replica opens it,
//!   the thread (the conversation) is the same one, and the mention is stored in it
//!   once (deduplicated by its message id as any message).
//! - A message starts at most one thread: a second attempt is refused with JSON
//!   error code 160004 ("a thread has already been created for this message"), which
//!   means the thread exists.
//! - Threads cannot be started inside a thread (or in a channel that has none, or
//!   without the *Create Public Threads* permission): any other refusal or failure
//!   leaves the mention in its channel, answered there, as without the setting.

use serde_json::json;
use serenity::all::{LightMethod, Message, Request, Route};

use super::Rest;
use lull_port::domain::{ConversationRef, Platform};
use lull_port::{Incoming, IncomingKind};

/// Discord's JSON error code for a message that already started a thread.
const THREAD_EXISTS: u64 = 160_004;
/// Discord's limit on a thread name, in characters.
const NAME_CHARS: usize = 100;
/// Idle minutes before Discord archives the thread (one day; a message reopens it).
const ARCHIVE_MINUTES: u32 = 1440;

/// `incoming` (a mention in a guild channel) moved into the thread opened on
/// `message`, or unchanged when no thread could be opened.
pub(crate) async fn open(rest: &Rest, message: &Message, incoming: Incoming) -> Incoming {
    let thread = message.id.get();
    match start(rest, message).await {
        Ok(()) => {
            let parent = message.channel_id.to_string();
            let mut chats = vec![thread.to_string()];
            // Admission as in its channel: the channel, then the server.
            chats.extend(incoming.chats.iter().cloned());
            tracing::debug!(channel = %parent, thread, "answering a mention in a thread of its own");
            Incoming {
                conversation: ConversationRef::new(Platform::Discord, thread.to_string()),
                chats,
                kind: IncomingKind::OpenedThread,
                ..incoming
            }
        }
        Err(reason) => {
            tracing::info!(channel = %message.channel_id, message = thread, %reason, "no thread opened for a mention (LULL_DISCORD_AUTO_THREAD); answering in its channel");
            incoming
        }
    }
}

/// Start the thread, or find it already started (by another replica, or before a
/// restart).
async fn start(rest: &Rest, message: &Message) -> Result<(), String> {
    let body = json!({
        "name": name(&message.content, &message.author.name),
        "auto_archive_duration": ARCHIVE_MINUTES,
    });
    let bytes = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    let request = Request::new(
        Route::ChannelMessageThreads {
            channel_id: message.channel_id,
            message_id: message.id,
        },
        LightMethod::Post,
    )
    .body(Some(bytes));
    let response = rest
        .request(request)?
        .send()
        .await
        .map_err(|e| rest.redactor.redact(e.without_url()))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let error: serde_json::Value = response.json().await.unwrap_or_default();
    if error["code"].as_u64() == Some(THREAD_EXISTS) {
        return Ok(());
    }
    Err(format!(
        "HTTP {status}: {}",
        error["message"].as_str().unwrap_or("no message")
    ))
}

/// The thread's name: the message's first words without mentions, else whose
/// question it is.
fn name(content: &str, author: &str) -> String {
    let words: Vec<&str> = content
        .split_whitespace()
        .filter(|w| !(w.starts_with("<@") && w.ends_with('>')))
        .collect();
    let text = words.join(" ");
    let name = if text.is_empty() {
        format!("{author}'s question")
    } else {
        text
    };
    name.chars().take(NAME_CHARS).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_is_named_after_its_message_without_mentions() {
        assert_eq!(super::name("<@900> what is 2+2?", "ann"), "what is 2+2?");
        assert_eq!(super::name("<@900>", "ann"), "ann's question");
        assert_eq!(super::name(&"x".repeat(300), "ann").chars().count(), 100);
    }
}

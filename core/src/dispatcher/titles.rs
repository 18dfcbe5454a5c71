//! Chat titles: the chat's name as its platform shows it (`Incoming::title`), noted in
//! the store for the console when it changed. What this process noted last is kept,
//! so a busy chat costs one write after a start and one per rename, never one per
//! message; a failed write is logged and tried again with the next message.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Dispatcher;
use crate::domain::ConversationId;

/// The most chats whose noted title is kept; past it the memory starts over (each
/// chat then writes its title once more).
const REMEMBERED: usize = 10_000;

/// The longest title noted, in characters (platforms allow about 100 to 128).
const MAX_CHARS: usize = 200;

/// The titles this process noted last, by chat.
#[derive(Debug, Default)]
pub(super) struct Titles {
    /// A std mutex: held for one map operation, never across an await.
    noted: Mutex<HashMap<ConversationId, String>>,
}

impl Titles {
    fn noted(&self) -> std::sync::MutexGuard<'_, HashMap<ConversationId, String>> {
        self.noted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Note `title` for `conversation`, unless this process noted it already.
pub(super) async fn note(d: &Dispatcher, conversation: ConversationId, title: &str) {
    let title: String = title.trim().chars().take(MAX_CHARS).collect();
    if title.is_empty() || d.titles.noted().get(&conversation) == Some(&title) {
        return;
    }
    match d.store.note_chat_title(conversation, &title).await {
        Ok(()) => {
            let mut noted = d.titles.noted();
            if noted.len() >= REMEMBERED {
                noted.clear();
            }
            noted.insert(conversation, title);
        }
        Err(e) => {
            tracing::warn!(%conversation, error = %e, "could not note a chat's title; trying again with its next message")
        }
    }
}

//! Group context (`LULL_GROUP_CONTEXT`): a group message not addressed to lull is
//! kept beside the conversation, bounded, for the model to read when lull is
//! addressed. It is never a message to answer: no version bump, no timer, no
//! reaction, no notice, not even to a sender who is not admitted.

use lull_port::{Accepted, Content, Incoming, IngestError};

use super::Dispatcher;
use super::not_stored::not_stored;
use crate::access::Sender;
use crate::store::{OverheardMessage, Overhearing};

/// Keep an overheard message when group context is on, the chat is a group and its
/// sender is one lull would answer there (`LULL_ALLOWED_USERS`, `LULL_ALLOWED_CHATS`,
/// `/allow`); otherwise drop it silently.
pub(super) async fn overhear(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
) -> Result<Accepted, IngestError> {
    let keep = dispatcher.settings.group_context;
    let Content::Text(text) = &incoming.content else {
        return Ok(Accepted::Overheard);
    };
    if keep == 0 || !incoming.is_group || text.trim().is_empty() {
        return Ok(Accepted::Overheard);
    }
    let rules = dispatcher.access_rules().await.map_err(not_stored)?;
    if !dispatcher
        .settings
        .access
        .allows(Sender::of(incoming), &rules)
    {
        return Ok(Accepted::Overheard);
    }
    // Context, not a conversation of its own: a long paste is cut, not refused.
    let text: String = text
        .chars()
        .take(dispatcher.settings.max_message_chars)
        .collect();
    let message = OverheardMessage {
        conversation: incoming.conversation.clone(),
        message_id: incoming.message_id.clone(),
        user_id: incoming.user_id.clone(),
        author: incoming.author.clone(),
        text,
    };
    let now = dispatcher.clock.now();
    let kept = dispatcher
        .store
        .overhear(Overhearing { message, keep, now })
        .await
        .map_err(not_stored)?;
    tracing::debug!(kept, "group message kept as context");
    Ok(Accepted::Overheard)
}

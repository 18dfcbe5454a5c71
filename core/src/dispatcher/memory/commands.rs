//! `/memory`, `/memory forget N`, `/memory clear` and `/forgetme`: what the person
//! sees and deletes. Each change is one statement on the rows (never a list written
//! back), so a reply committing a memory at the same moment keeps it or loses it as
//! a whole.
//!
//! Here is the scope the chat shows: in a private chat the person's, in a group the
//! chat's (changed by admins only). A person's memories are never listed in a group.

use lull_port::Incoming;

use super::{count, texts};
use crate::dispatcher::Dispatcher;
use crate::domain::Timestamp;
use crate::store::{MEMORIES_PER_SCOPE, Scope, StoreError};

/// The scope `/memory` shows and changes in `incoming`'s chat.
fn here(incoming: &Incoming) -> Scope {
    if incoming.is_group {
        Scope::chat(&incoming.conversation)
    } else {
        Scope::person(incoming.conversation.platform, &incoming.user_id)
    }
}

/// `/memory [forget N | clear]`: the answer.
pub(in crate::dispatcher) async fn memory(
    d: &Dispatcher,
    incoming: &Incoming,
    args: &[&str],
    admin: bool,
) -> Result<String, StoreError> {
    if d.settings.memory.is_none() {
        return Ok(texts::MEMORY_OFF_TEXT.to_owned());
    }
    let scope = here(incoming);
    let may_change = !incoming.is_group || admin;
    match args {
        [] => {
            let memories = d
                .store
                .memories(std::slice::from_ref(&scope), MEMORIES_PER_SCOPE)
                .await?;
            Ok(texts::memory_list(scope.kind, &memories))
        }
        [forget, id] if forget.eq_ignore_ascii_case("forget") => {
            let Ok(id) = id.trim_start_matches('#').parse::<i64>() else {
                return Ok(texts::MEMORY_USAGE_TEXT.to_owned());
            };
            if !may_change {
                return Ok(texts::GROUP_ADMINS_ONLY_TEXT.to_owned());
            }
            forget_in(d, &scope, id).await
        }
        [clear] if clear.eq_ignore_ascii_case("clear") => {
            if !may_change {
                return Ok(texts::GROUP_ADMINS_ONLY_TEXT.to_owned());
            }
            clear_in(d, &scope).await
        }
        _ => Ok(texts::MEMORY_USAGE_TEXT.to_owned()),
    }
}

/// `/memory forget N` in `scope` (the chat's command, or the console's): the answer.
pub(in crate::dispatcher) async fn forget_in(
    d: &Dispatcher,
    scope: &Scope,
    id: i64,
) -> Result<String, StoreError> {
    Ok(if d.store.forget_memory(scope, id).await? {
        count("command_forget", 1);
        tracing::info!(scope = %scope.owner, memory = id, "memory forgotten by command");
        texts::forgotten_text(id)
    } else {
        texts::no_such_memory_text(id)
    })
}

/// `/memory clear` of `scope` (the chat's command, or the console's): every memory
/// deleted and the rounds in flight fenced (the store's clear); the answer.
pub(in crate::dispatcher) async fn clear_in(
    d: &Dispatcher,
    scope: &Scope,
) -> Result<String, StoreError> {
    let cleared = d.store.clear_memories(scope).await?;
    count("clear", cleared);
    tracing::info!(scope = %scope.owner, cleared, "memories cleared by command");
    Ok(texts::cleared_text(cleared))
}

/// `/forgetme`: every memory of the sender (theirs, and the chat memories they asked
/// for, in every chat of the platform), the text of every message they sent, and
/// their overheard group messages — erased in one transaction. Works with memory off
/// too: it erases stored texts.
pub(in crate::dispatcher) async fn forget_me(
    d: &Dispatcher,
    incoming: &Incoming,
    now: Timestamp,
) -> Result<String, StoreError> {
    let platform = incoming.conversation.platform;
    let erased = d
        .store
        .erase_person(platform, &incoming.user_id, now)
        .await?;
    count("erase", erased.memories);
    // Who asked is logged as their platform id only: the point is that their words go.
    tracing::info!(
        %platform,
        memories = erased.memories,
        messages = erased.messages,
        overheard = erased.overheard,
        "a person's memories and texts erased (/forgetme)"
    );
    Ok(texts::erased_text(erased))
}

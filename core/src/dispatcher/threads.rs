//! Discord threads lull opened (`LULL_DISCORD_AUTO_THREAD`): the adapter moves a
//! mention into a thread it opened for it ([`IncomingKind::OpenedThread`]); the
//! thread is remembered in the database, and there a message needs no mention: the
//! adapter passes unaddressed messages on as overheard, and those of lull's threads
//! become messages here.

use lull_port::{Incoming, IncomingKind, IngestError};

use super::Dispatcher;
use super::not_stored::not_stored;

/// The kind of `incoming` as ingest handles it: a message that opened a thread is a
/// new message (its thread remembered first, so the follow-ups that arrive after it
/// need no mention); an overheard message in one of lull's threads is a new message
/// too.
pub(super) async fn admit(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
) -> Result<IncomingKind, IngestError> {
    let store = &dispatcher.store;
    let auto_thread = dispatcher.settings.discord_auto_thread;
    let in_our_thread = match incoming.kind {
        // Never lost, whatever the settings: a message to answer in any case.
        IncomingKind::OpenedThread if !auto_thread => true,
        IncomingKind::Overheard if !auto_thread => false,
        IncomingKind::OpenedThread => {
            let now = dispatcher.clock.now();
            store
                .remember_thread(&incoming.conversation, now)
                .await
                .map_err(not_stored)?;
            true
        }
        IncomingKind::Overheard => store
            .is_thread(&incoming.conversation)
            .await
            .map_err(not_stored)?,
        IncomingKind::New | IncomingKind::Edit => false,
    };
    Ok(if in_our_thread {
        IncomingKind::New
    } else {
        incoming.kind
    })
}

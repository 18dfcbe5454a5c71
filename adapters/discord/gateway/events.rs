//! serenity's side of a gateway session: the event handler that queues what the
//! gateway sends (in the order [`GatewayEvent::order`] sorts it), answers
//! interactions within Discord's 3 s at once, and stops a shard that reconnects after
//! its session ended.
//!
//! Nothing here stores: the handler returns as soon as an event is queued, and the
//! [`Feeder`](super::feeder::Feeder) hands the queue to the core.

use std::sync::{Arc, OnceLock};

use serenity::all::{
    CommandInteraction, ComponentInteraction, Context, EventHandler, Interaction, InteractionId,
    Message, MessageUpdateEvent, Ready, ResumedEvent, ShardManager, TypingStartEvent,
};
use serenity::http::{LightMethod, Request, Route};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::discord::Rest;

/// What the event handler queues for the feeder.
#[derive(Debug)]
pub(super) enum GatewayEvent {
    /// A fresh session: catch up from history.
    Ready,
    /// A resumed session: Discord replays what it missed.
    Resumed,
    Message(Box<Message>),
    Edit(Box<MessageUpdateEvent>),
    /// A button clicked (already answered to Discord).
    Tap(Box<ComponentInteraction>),
    /// A slash command (already deferred: Discord shows "thinking…").
    Slash(Box<CommandInteraction>),
    /// Someone started typing (Discord repeats it about every 10 s while they type).
    Typing(Box<TypingStartEvent>),
}

impl GatewayEvent {
    /// Events that arrived together are stored in this order: session events first,
    /// then messages by id (the order they were sent in), an edit after its message.
    pub(super) fn order(&self) -> (u8, u64, u8) {
        match self {
            GatewayEvent::Ready | GatewayEvent::Resumed => (0, 0, 0),
            GatewayEvent::Message(m) => (1, m.id.get(), 0),
            GatewayEvent::Edit(e) => (1, e.id.get(), 1),
            GatewayEvent::Tap(i) => (1, i.id.get(), 0),
            GatewayEvent::Slash(i) => (1, i.id.get(), 0),
            // After the messages that came with it: typing holds a burst already stored.
            GatewayEvent::Typing(_) => (2, 0, 0),
        }
    }
}

/// serenity's event handler: queues events and returns. serenity calls it from a task
/// per event, concurrently, so ordering and storing happen in
/// [`Feeder`](super::feeder::Feeder).
pub(super) struct Handler {
    /// Answers clicks.
    pub(super) rest: Rest,
    pub(super) events: mpsc::UnboundedSender<GatewayEvent>,
    /// Set when the session ended: a shard that reconnects afterwards is stopped.
    pub(super) retired: CancellationToken,
    pub(super) manager: Arc<OnceLock<Arc<ShardManager>>>,
}

impl Handler {
    fn queue(&self, event: GatewayEvent) {
        if self.retire() {
            return;
        }
        // The feeder is gone only when the session ended; the next one catches up.
        let _ = self.events.send(event);
    }

    /// A shard that was waiting to reconnect when its session ended comes back with
    /// no one to hear it: stop it, so this process keeps no gateway session without
    /// the lease.
    fn retire(&self) -> bool {
        if !self.retired.is_cancelled() {
            return false;
        }
        if let Some(manager) = self.manager.get() {
            let manager = manager.clone();
            tokio::spawn(async move { manager.shutdown_all().await });
        }
        true
    }
}

#[serenity::async_trait]
impl EventHandler for Handler {
    async fn ready(&self, _ctx: Context, ready: Ready) {
        tracing::debug!(session = %ready.session_id, "Discord gateway READY");
        self.queue(GatewayEvent::Ready);
    }

    async fn resume(&self, _ctx: Context, _event: ResumedEvent) {
        self.queue(GatewayEvent::Resumed);
    }

    async fn message(&self, _ctx: Context, message: Message) {
        self.queue(GatewayEvent::Message(Box::new(message)));
    }

    async fn message_update(
        &self,
        _ctx: Context,
        _old: Option<Message>,
        _new: Option<Message>,
        event: MessageUpdateEvent,
    ) {
        self.queue(GatewayEvent::Edit(Box::new(event)));
    }

    /// Typing (with the typing intents): the author of a pending burst is still writing.
    async fn typing_start(&self, _ctx: Context, event: TypingStartEvent) {
        self.queue(GatewayEvent::Typing(Box::new(event)));
    }

    /// Button clicks: answered at once (Discord waits 3 s), then queued. Other
    /// interactions (lull registers no commands) are not lull's.
    async fn interaction_create(&self, _ctx: Context, interaction: Interaction) {
        if self.retired.is_cancelled() {
            // No session stores it: let Discord tell the user it failed.
            self.retire();
            return;
        }
        match interaction {
            Interaction::Component(click) => {
                acknowledge(&self.rest, click.id, &click.token, DEFERRED_UPDATE);
                self.queue(GatewayEvent::Tap(Box::new(click)));
            }
            Interaction::Command(command) => {
                self.rest.deferrals.remember(command.channel_id, &command);
                acknowledge(&self.rest, command.id, &command.token, DEFERRED_MESSAGE);
                self.queue(GatewayEvent::Slash(Box::new(command)));
            }
            _ => {}
        }
    }
}

/// `DEFERRED_UPDATE_MESSAGE`: a click is taken, nothing changes on screen.
const DEFERRED_UPDATE: u8 = 6;
/// `DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE`: a slash command is taken, "thinking…"
/// shows until its answer replaces it (see `slash`).
const DEFERRED_MESSAGE: u8 = 5;

/// Answer an interaction with the deferred response `kind` (`POST
/// /interactions/{id}/{token}/callback`), on a task of its own: never awaited by the
/// gateway or the intake. A failure is logged once; the interaction is stored anyway
/// (Discord then shows the user "This interaction failed", and the answer to it still
/// comes). The token is in the URL: no error carries the URL.
fn acknowledge(rest: &Rest, id: InteractionId, token: &str, kind: u8) {
    let request = Request::new(
        Route::InteractionResponse {
            interaction_id: id,
            token,
        },
        LightMethod::Post,
    )
    .body(Some(format!(r#"{{"type":{kind}}}"#).into_bytes()));
    let built = rest.request(request);
    let redactor = rest.redactor.clone();
    tokio::spawn(async move {
        let outcome = match built {
            Ok(request) => match request.send().await {
                Ok(response) if response.status().is_success() => return,
                Ok(response) => format!("Discord answered HTTP {}", response.status().as_u16()),
                Err(e) => format!("Discord unreachable: {}", redactor.redact(e.without_url())),
            },
            Err(e) => e,
        };
        tracing::warn!(interaction = id.get(), error = %outcome, "could not acknowledge an interaction (a click or slash command); it is taken anyway");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_that_arrive_together_are_stored_in_message_order() {
        let message = |id: u64| {
            let m: Message = serde_json::from_value(serde_json::json!({
                "id": id.to_string(), "channel_id": "1", "content": "x",
                "author": {"id": "5", "username": "u", "discriminator": "0", "avatar": null},
                "timestamp": "2026-01-01T00:00:00+00:00", "edited_timestamp": null, "tts": false,
                "mention_everyone": false, "mentions": [], "mention_roles": [], "attachments": [],
                "embeds": [], "pinned": false, "type": 0
            }))
            .unwrap();
            GatewayEvent::Message(Box::new(m))
        };
        let mut batch = [message(30), message(10), GatewayEvent::Ready, message(20)];
        batch.sort_by_key(GatewayEvent::order);
        let order: Vec<_> = batch.iter().map(|e| e.order().1).collect();
        assert_eq!(order, [0, 10, 20, 30]);
    }
}

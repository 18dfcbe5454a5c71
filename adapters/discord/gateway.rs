//! Receiving from Discord: the gateway connection, each shard held by one process at a
//! time.
//!
//! The core runs the election: the process holding a shard's *poller lease* gets a
//! [`Session`] for that shard and connects it to the gateway (serenity's
//! `start_shard(index, total)`); the others stand by and one of them takes over within
//! the lease TTL when the holder dies. A session whose lease is lost disconnects at
//! once. With one shard (the default) that is the whole gateway.
//!
//! Platform facts this relies on, and what it does about them:
//!
//! - **serenity dispatches events concurrently** (each event handler call is its own
//!   task), so two messages sent close together may reach the handler out of order.
//!   The handler only queues events; one intake task stores them one at a time,
//!   ordered by message id (snowflakes grow with time), after letting events that
//!   arrived together settle.
//! - **The gateway does not replay messages sent while no session was connected.**
//!   After every READY (a fresh session: first start, take-over, re-IDENTIFY), the
//!   channels with recent activity whose events belong to this shard are read back
//!   from history after the last stored message, before live events are stored. A resumed session gets the missed events
//!   replayed by Discord and needs no catch-up.
//! - **Discord has no acknowledgement per message**, and the core stores a message id
//!   once. A message is handed to the core until it is stored: a failing store is
//!   retried with backoff, never skipped, because a later message stored in its place
//!   would move the catch-up point past it. Whatever is still queued when the session
//!   ends (a crash, a lost lease) is read back by the next session's catch-up.
//! - **A button click is an interaction** (`INTERACTION_CREATE`, type 3), sent to one
//!   connection only (the shard of its guild, DMs on shard 0), to be answered within
//!   3 s or the user sees "This interaction failed". The handler answers it at once
//!   with `DEFERRED_UPDATE_MESSAGE` (type 6: nothing changes on screen) on a task of
//!   its own, before and apart from storing, so a slow database never makes Discord
//!   time out and a failed answer never holds the click back; the click itself is
//!   queued like a message and stored as the message its button spells.
//! - serenity resumes or re-identifies after a dropped connection by itself (waiting
//!   five seconds between IDENTIFYs, as Discord requires).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serenity::all::{
    ChannelId, ClientBuilder, CommandInteraction, ComponentInteraction, Context, EventHandler,
    GatewayError, Interaction, InteractionId, Message, MessageId, MessagePagination,
    MessageUpdateEvent, Ready, ResumedEvent, ShardManager, TypingStartEvent,
};
use serenity::http::{LightMethod, Request, Route};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::outbound::from_serenity;
use super::translate::{self, BotIdentity};
use super::{ChannelKinds, Place, Rest, Shards, channel_of, intents, shard_of};
use lull_port::domain::{Platform, Timestamp, millis};
use lull_port::health::AdapterState;
use lull_port::{
    Accepted, Backoff, Inbound, Incoming, IncomingKind, IngestError, Intake, RecentConversation,
    SendError, Session, SessionEnd,
};

/// How far back catch-up looks for channels with activity.
const CATCH_UP_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// At most this many channels are read back after a (re)connect, most recent first.
const CATCH_UP_CHANNELS: usize = 100;
/// Messages per history request (Discord's maximum).
const PAGE: u8 = 100;
/// At most this many pages per channel: a busy guild channel is mostly chatter lull
/// ignores, and reading it all back would spend the rate limit.
const CATCH_UP_PAGES: usize = 10;
/// Events that arrive within this window are stored in message-id order.
const SETTLE: Duration = Duration::from_millis(10);
/// How long queued events may still be stored after the session ended.
const DRAIN_FOR: Duration = Duration::from_secs(2);
/// Waits before handing the core an update it could not store yet.
const STORE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// Waits between attempts to read a page of history.
const HISTORY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(300), Duration::from_secs(1));
/// Attempts to read a page of history before giving up on a channel's catch-up.
const HISTORY_ATTEMPTS: u32 = 3;

/// The receiving half of the Discord adapter.
pub struct DiscordInbound {
    rest: Rest,
    channels: Arc<ChannelKinds>,
    shards: Shards,
    /// `LULL_GROUP_CONTEXT` is on: guild messages not addressed to lull are passed on.
    overhear: bool,
    /// `LULL_DISCORD_AUTO_THREAD`: mentions in guild channels are answered in a thread.
    auto_thread: bool,
}

impl DiscordInbound {
    pub(crate) fn new(
        rest: Rest,
        channels: Arc<ChannelKinds>,
        shards: Shards,
        overhear: bool,
        auto_thread: bool,
    ) -> Self {
        Self {
            rest,
            channels,
            shards,
            overhear,
            auto_thread,
        }
    }
}

#[async_trait]
impl Inbound for DiscordInbound {
    fn platform(&self) -> Platform {
        Platform::Discord
    }

    /// `LULL_DISCORD_SHARDS`; for `auto`, the count Discord recommends for the bot
    /// (`GET /gateway/bot`), read once at start.
    async fn shards(&self) -> Result<u32, SessionEnd> {
        match self.shards {
            Shards::Fixed(n) => Ok(n),
            Shards::Auto => {
                let gateway =
                    self.rest.http.get_bot_gateway().await.map_err(|e| {
                        self.rest_failure("asking for the recommended shard count", &e)
                    })?;
                tracing::info!(
                    shards = gateway.shards,
                    "Discord recommends this many shards (LULL_DISCORD_SHARDS=auto)"
                );
                Ok(gateway.shards.max(1))
            }
        }
    }

    async fn session(&self, intake: &dyn Intake, session: &Session) -> SessionEnd {
        let (end, ready) = self.connected(intake, session).await;
        match end {
            SessionEnd::Failed { reason, .. } => SessionEnd::Failed {
                reason,
                connected: ready,
            },
            other => other,
        }
    }
}

impl DiscordInbound {
    /// One gateway session under the lease: connect, store events until the session
    /// ends or the connection fails, then disconnect and store what is still queued.
    /// Also says whether the session got as far as READY.
    async fn connected(&self, intake: &dyn Intake, session: &Session) -> (SessionEnd, bool) {
        session.report(AdapterState::Starting);
        let connect = async {
            let bot = self.whoami().await?;
            let gateway_url = self
                .rest
                .http
                .get_gateway()
                .await
                .map_err(|e| self.rest_failure("reading the gateway URL", &e))?
                .url;
            Ok::<_, SessionEnd>((bot, gateway_url))
        };
        let (bot, gateway_url) = tokio::select! {
            connected = connect => match connected {
                Ok(connected) => connected,
                Err(end) => return (end, false),
            },
            end = session.ended() => return (end, false),
        };

        let (events, mut queue) = mpsc::unbounded_channel();
        let retired = CancellationToken::new();
        let manager = Arc::new(OnceLock::new());
        let handler = Handler {
            rest: self.rest.clone(),
            events,
            retired: retired.clone(),
            manager: manager.clone(),
        };
        let mut client = match ClientBuilder::new_with_http(self.rest.http_for_gateway(), intents())
            .event_handler(handler)
            .await
        {
            Ok(client) => client,
            Err(e) => return (failed(self.rest.redactor.redact(e)), false),
        };
        // serenity asked for the gateway URL again while building, and falls back to
        // Discord's own on failure: use the one read above, from DISCORD_API_URL.
        *client.ws_url.lock().await = gateway_url;
        let shards = client.shard_manager.clone();
        let _ = manager.set(shards.clone());
        // This shard alone, of the total: IDENTIFY carries `shard: [index, total]`, so
        // Discord sends it only its guilds' events.
        let shard = session.shard();
        let mut running =
            tokio::spawn(async move { client.start_shard(shard.index(), shard.total()).await });
        tracing::info!(bot = %bot.name, %shard, "connecting to the Discord gateway");

        let mut feeder = Feeder {
            intake,
            rest: self.rest.clone(),
            channels: self.channels.clone(),
            session,
            bot,
            overhear: self.overhear,
            auto_thread: self.auto_thread,
            ready: false,
        };
        let end = tokio::select! {
            end = session.ended() => end,
            () = feeder.run(&mut queue) => failed("the gateway event stream ended"),
            ended = &mut running => match ended {
                Ok(Ok(())) => failed("the gateway connection closed"),
                Ok(Err(e)) => self.gateway_failure(e),
                Err(e) => failed(format!("the gateway task failed: {e}")),
            },
        };

        // Leave the gateway first, so no second session lingers beside the next
        // holder's. A shard still waiting to reconnect has no runner to stop yet; the
        // handler stops it if it ever connects (see `Handler::retire`).
        retired.cancel();
        if tokio::time::timeout(Duration::from_secs(10), shards.shutdown_all())
            .await
            .is_err()
        {
            tracing::warn!("the Discord gateway did not close in time");
        }
        running.abort();
        feeder.drain(&mut queue).await;
        (end, feeder.ready)
    }

    /// Who the bot is (`GET /users/@me`). A failure ends this attempt; the run loop
    /// tries again after a pause.
    async fn whoami(&self) -> Result<BotIdentity, SessionEnd> {
        let user = self
            .rest
            .http
            .get_current_user()
            .await
            .map_err(|e| self.rest_failure("reading the bot's own user", &e))?;
        Ok(BotIdentity {
            id: user.id,
            name: user.name.clone(),
        })
    }

    fn rest_failure(&self, doing: &str, error: &serenity::Error) -> SessionEnd {
        let status = match error {
            serenity::Error::Http(e) => e.status_code().map(|s| s.as_u16()),
            _ => None,
        };
        let reason = match from_serenity(error, &self.rest.redactor) {
            SendError::RetryAfter(wait) => format!("rate limited for {wait:?}"),
            SendError::Transient(e) | SendError::Permanent(e) => e,
        };
        if status == Some(401) {
            SessionEnd::Fatal(format!(
                "Discord refused DISCORD_BOT_TOKEN while {doing} (HTTP 401); check the bot token"
            ))
        } else {
            failed(format!("{doing}: {reason}"))
        }
    }

    fn gateway_failure(&self, error: serenity::Error) -> SessionEnd {
        match error {
            serenity::Error::Gateway(GatewayError::InvalidAuthentication) => SessionEnd::Fatal(
                "the Discord gateway refused DISCORD_BOT_TOKEN; check the bot token".into(),
            ),
            serenity::Error::Gateway(
                GatewayError::DisallowedGatewayIntents | GatewayError::InvalidGatewayIntents,
            ) => SessionEnd::Fatal(
                "the Discord gateway refused the intents lull needs: enable MESSAGE CONTENT INTENT \
                 under Bot → Privileged Gateway Intents in the Discord developer portal"
                    .into(),
            ),
            other => failed(self.rest.redactor.redact(other)),
        }
    }
}

/// A failed session; whether it got as far as READY is filled in by the caller.
fn failed(reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Failed {
        reason: reason.into(),
        connected: false,
    }
}

/// What the event handler queues for the feeder.
#[derive(Debug)]
enum GatewayEvent {
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
    fn order(&self) -> (u8, u64, u8) {
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
/// per event, concurrently, so ordering and storing happen in [`Feeder`].
struct Handler {
    /// Answers clicks.
    rest: Rest,
    events: mpsc::UnboundedSender<GatewayEvent>,
    /// Set when the session ended: a shard that reconnects afterwards is stopped.
    retired: CancellationToken,
    manager: Arc<OnceLock<Arc<ShardManager>>>,
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

/// Hands gateway events to the core one at a time, in order, each until it is stored.
struct Feeder<'a> {
    intake: &'a dyn Intake,
    rest: Rest,
    channels: Arc<ChannelKinds>,
    session: &'a Session,
    bot: BotIdentity,
    /// `LULL_GROUP_CONTEXT` is on: guild messages not addressed to lull are passed on.
    overhear: bool,
    /// `LULL_DISCORD_AUTO_THREAD`: mentions in guild channels are answered in a
    /// thread; unaddressed messages are passed on (the core answers those in its
    /// threads).
    auto_thread: bool,
    /// Whether the session got as far as READY.
    ready: bool,
}

impl Feeder<'_> {
    /// Runs until the queue closes; the session ends it by dropping the future.
    async fn run(&mut self, queue: &mut mpsc::UnboundedReceiver<GatewayEvent>) {
        while let Some(first) = queue.recv().await {
            tokio::time::sleep(SETTLE).await;
            let mut batch = vec![first];
            while let Ok(event) = queue.try_recv() {
                batch.push(event);
            }
            batch.sort_by_key(GatewayEvent::order);
            for event in batch {
                self.handle(event).await;
            }
        }
    }

    /// Store what is still queued, briefly and without catch-up: the next session's
    /// catch-up reads back anything left.
    async fn drain(&mut self, queue: &mut mpsc::UnboundedReceiver<GatewayEvent>) {
        let mut batch = Vec::new();
        while let Ok(event) = queue.try_recv() {
            if !matches!(event, GatewayEvent::Ready | GatewayEvent::Resumed) {
                batch.push(event);
            }
        }
        if batch.is_empty() {
            return;
        }
        batch.sort_by_key(GatewayEvent::order);
        let drained = async {
            for event in batch {
                self.handle(event).await;
            }
        };
        if tokio::time::timeout(DRAIN_FOR, drained).await.is_err() {
            tracing::warn!(
                "not every queued Discord message was stored before disconnecting; the next session reads them back"
            );
        }
    }

    async fn handle(&mut self, event: GatewayEvent) {
        match event {
            GatewayEvent::Ready => {
                tracing::info!(bot = %self.bot.name, "connected to the Discord gateway");
                self.ready = true;
                self.session.report(AdapterState::Up);
                self.catch_up().await;
            }
            GatewayEvent::Resumed => {
                tracing::info!("Discord gateway session resumed");
                self.session.report(AdapterState::Up);
            }
            GatewayEvent::Message(message) => {
                let in_guild = message.guild_id.is_some();
                let place = match message.guild_id {
                    Some(guild) => Place::Guild(Some(guild)),
                    None => Place::Dm,
                };
                self.channels.remember(message.channel_id, place);
                match self.translated(&message, in_guild) {
                    // Opened in a thread's channel, the thread is refused and the
                    // mention answered where it is.
                    Some(incoming)
                        if self.auto_thread && in_guild && incoming.kind == IncomingKind::New =>
                    {
                        let incoming = super::threads::open(&self.rest, &message, incoming).await;
                        self.store(incoming).await;
                    }
                    Some(incoming) => self.store(incoming).await,
                    None => {}
                }
            }
            GatewayEvent::Edit(event) => {
                if let Some(incoming) = translate::edit(&event, &self.bot) {
                    self.store(incoming).await;
                }
            }
            GatewayEvent::Typing(event) => {
                let (conversation, user) = translate::typing(&event);
                // Best effort: a typing event that is not heard only costs a wait.
                if let Err(e) = self.intake.typing(conversation, user).await {
                    tracing::debug!(error = %e, "a Discord typing event was not applied");
                }
            }
            GatewayEvent::Tap(click) => {
                let place = match click.guild_id {
                    Some(guild) => Place::Guild(Some(guild)),
                    None => Place::Dm,
                };
                self.channels.remember(click.channel_id, place);
                match translate::tapped(&click, &self.bot) {
                    Some(incoming) => self.store(incoming).await,
                    None => tracing::debug!(
                        interaction = click.id.get(),
                        "a button click that is no quick reply of lull's; ignored"
                    ),
                }
            }
            GatewayEvent::Slash(command) => {
                let place = command
                    .guild_id
                    .map_or(Place::Dm, |g| Place::Guild(Some(g)));
                self.channels.remember(command.channel_id, place);
                if let Some(incoming) = super::slash::incoming(&command, &self.bot) {
                    self.store(incoming).await;
                }
            }
        }
    }

    /// A message for the core: addressed to lull, or overheard when the core may want
    /// it (group context, lull's threads, where no mention is needed).
    fn translated(&self, message: &Message, in_guild: bool) -> Option<Incoming> {
        translate::new_message(message, &self.bot, in_guild).or_else(|| {
            let heard = translate::overheard(message, &self.bot, in_guild);
            heard.filter(|_| self.overhear || self.auto_thread)
        })
    }

    /// Hand one update to the core until it is stored (or refused for good).
    async fn store(&self, incoming: Incoming) {
        let mut failures = 0;
        loop {
            match self.intake.ingest(incoming.clone()).await {
                Ok(accepted) => {
                    if !matches!(accepted, Accepted::Stored { .. }) {
                        tracing::debug!(conversation = %incoming.conversation, message = %incoming.message_id, ?accepted, "Discord message handled");
                    }
                    return;
                }
                Err(e @ IngestError::NotStored(_)) => {
                    failures += 1;
                    let wait = STORE_BACKOFF.delay(failures);
                    tracing::warn!(conversation = %incoming.conversation, message = %incoming.message_id, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot store a Discord message yet; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    tracing::warn!(conversation = %incoming.conversation, message = %incoming.message_id, error = %e, "Discord message refused");
                    return;
                }
            }
        }
    }

    /// Read back what was sent while no process was connected: for each channel with
    /// recent activity, the messages after the last one stored, oldest first.
    async fn catch_up(&self) {
        let now = Timestamp::now();
        let since = Timestamp(now.0.saturating_sub(millis(CATCH_UP_WINDOW)));
        // Retried like a message that cannot be stored yet: live events wait behind
        // it, and storing them first would move the catch-up point past the gap.
        let mut failures = 0;
        let recent = loop {
            match self
                .intake
                .recent_conversations(Platform::Discord, since, CATCH_UP_CHANNELS)
                .await
            {
                Ok(recent) => break recent,
                Err(e) => {
                    failures += 1;
                    let wait = STORE_BACKOFF.delay(failures);
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "cannot list recent Discord conversations yet; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let shard = self.session.shard();
        let (mut read, mut channels) = (0, 0);
        for conversation in &recent {
            if !self.on_this_shard(conversation).await {
                continue;
            }
            channels += 1;
            read += self.catch_up_channel(conversation).await;
        }
        tracing::info!(
            %shard,
            channels,
            messages = read,
            "caught up with Discord channels"
        );
    }

    /// Whether a conversation's events arrive on this session's shard, so its
    /// catch-up is this session's to do: DMs on shard 0, a guild channel on its
    /// guild's shard. A channel whose guild cannot be learnt is read back anyway: a
    /// second reader costs a request, the core stores each message once.
    async fn on_this_shard(&self, recent: &RecentConversation) -> bool {
        let shard = self.session.shard();
        if shard.total() == 1 {
            return true;
        }
        let Some(channel) = channel_of(&recent.conversation.key) else {
            return true;
        };
        let guild = if recent.is_group {
            match self.channels.place(&self.rest, channel).await {
                Ok(Place::Guild(guild)) => guild,
                Ok(Place::Dm) => None,
                Err(error) => {
                    tracing::debug!(
                        channel = channel.get(),
                        error,
                        "cannot tell a channel's guild; reading it back on this shard too"
                    );
                    return true;
                }
            }
        } else {
            None
        };
        if recent.is_group && guild.is_none() {
            return true;
        }
        shard_of(guild, shard.total()) == shard.index()
    }

    /// Returns how many messages were handed to the core.
    async fn catch_up_channel(&self, recent: &RecentConversation) -> usize {
        let key = &recent.conversation.key;
        // The last stored may be a click (`interaction:<id>`): its snowflake is as good.
        let (Some(channel), Some(mut after)) = (
            channel_of(key),
            translate::snowflake(&recent.last_message_id),
        ) else {
            tracing::warn!(conversation = %recent.conversation, "not a Discord channel and message id; skipping catch-up");
            return 0;
        };
        let place = if recent.is_group {
            Place::Guild(None)
        } else {
            Place::Dm
        };
        self.channels.remember(channel, place);
        // Read back over REST, messages carry no server (what LULL_ALLOWED_CHATS may
        // name): ask for it once.
        let guild = match self.channels.place(&self.rest, channel).await {
            Ok(Place::Guild(guild)) if recent.is_group => guild,
            _ => None,
        };
        let mut handed = 0;
        for _ in 0..CATCH_UP_PAGES {
            let Some(mut page) = self.history_after(channel, after).await else {
                return handed;
            };
            let full = page.len() >= usize::from(PAGE);
            // Discord lists newest first; store oldest first.
            page.sort_by_key(|m| m.id);
            for message in &mut page {
                message.guild_id = message.guild_id.or(guild);
                after = after.max(message.id.get());
                // A mention a thread was started from was stored in that thread's
                // conversation when it came (the thread's id is the message's): not
                // again here. A mention missed while down is answered where it is,
                // without a thread.
                if self.auto_thread && message.thread.is_some() {
                    continue;
                }
                if let Some(incoming) = self.translated(message, recent.is_group) {
                    handed += 1;
                    self.store(incoming).await;
                }
            }
            if !full {
                return handed;
            }
        }
        tracing::warn!(conversation = %recent.conversation, pages = CATCH_UP_PAGES, "stopped reading a busy channel's history; older missed messages there are not answered");
        handed
    }

    /// One page of history after `after`, with a few retries.
    async fn history_after(&self, channel: ChannelId, after: u64) -> Option<Vec<Message>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match self
                .rest
                .http
                .get_messages(
                    channel,
                    Some(MessagePagination::After(MessageId::new(after.max(1)))),
                    Some(PAGE),
                )
                .await
            {
                Ok(page) => return Some(page),
                Err(e) => from_serenity(&e, &self.rest.redactor),
            };
            let wait = match &error {
                SendError::Permanent(_) => None,
                _ if attempts >= HISTORY_ATTEMPTS => None,
                SendError::RetryAfter(asked) => {
                    Some(HISTORY_BACKOFF.delay_honouring(attempts, Some(*asked)))
                }
                SendError::Transient(_) => Some(HISTORY_BACKOFF.delay(attempts)),
            };
            let Some(wait) = wait else {
                tracing::warn!(channel = channel.get(), error = %error, "cannot read a Discord channel's history; messages sent there while disconnected are not answered");
                return None;
            };
            tokio::time::sleep(wait).await;
        }
    }
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

//! A fake Discord on loopback, for running the real `lull` binary against it.
//!
//! - REST (axum), under `/api/v10`: `GET /gateway`, `GET /gateway/bot`,
//!   `GET /users/@me`, `GET /channels/{id}`, `GET /channels/{id}/messages?after=`,
//!   `POST /channels/{id}/messages` (recording nonce, `enforce_nonce`, content,
//!   `message_reference` (whose `message_id` must be a snowflake), `allowed_mentions`; a repeated nonce with `enforce_nonce`
//!   returns the earlier message instead of creating one, as Discord does; content
//!   over 2000 characters is refused with 400, as Discord does) and
//!   `POST /channels/{id}/typing`. Every request must carry `Authorization: Bot
//!   <token>`. Failures can be injected into message POSTs: before creating the
//!   message (429 with `retry_after`, 5xx) or after (the message exists but the
//!   answer is a 500, as when a response is lost).
//! - Shards as Discord routes them: IDENTIFY's `shard: [index, total]` (default
//!   `[0, 1]`) makes a session receive only the events of guilds on that shard
//!   (`(guild_id >> 22) % total`; DMs on shard 0); `GET /gateway/bot` answers a
//!   recommended shard count a test sets, and is counted. Two live connections of one
//!   shard are counted too ([`DiscordFake::shard_overlaps`]).
//! - A WebSocket gateway (tokio-tungstenite): HELLO, IDENTIFY → READY, heartbeat →
//!   ACK, RESUME → replay of what the session missed and RESUMED (or, when told to,
//!   INVALID_SESSION so the client identifies afresh), dispatches of `MESSAGE_CREATE`
//!   and `MESSAGE_UPDATE` to every session (buffered for disconnected ones, as Discord
//!   does for resumable sessions), a forced disconnect, and a count of connected
//!   sessions.
//!
//! - Threads from messages as Discord starts them: `POST
//!   /channels/{id}/messages/{message}/threads` (a `name` of 1–100 characters) makes
//!   a thread channel whose id is the message's, in the channel's guild; a second
//!   start from the same message is refused with 400 and code 160004, a start inside
//!   a thread or a DM with 400 and code 50024, an unknown message with 404; every
//!   call is recorded ([`DiscordFake::thread_calls`], [`DiscordFake::threads_started`])
//!   and all can be refused with 403 ([`DiscordFake::refuse_threads`]).
//!
//! - Buttons: a message POST's `components` are recorded and checked as Discord
//!   does (action rows, type 1, of at most 5 buttons, type 2, at most 5 rows;
//!   a `custom_id` of 1–100 characters; else 400). A user clicks one with
//!   [`DiscordFake::click`]: an `INTERACTION_CREATE` (type 3, message component) is
//!   dispatched to the shard of its guild, carrying `member` in a guild and `user` in
//!   a DM, a token, and the message clicked on; [`DiscordFake::dispatch_interaction`]
//!   sends one again. `POST /interactions/{id}/{token}/callback` (no authorization
//!   needed, as Discord) is recorded with its `type`, refused with 404 "Unknown
//!   interaction" for a wrong token, and can be failed on demand
//!   ([`DiscordFake::fail_callbacks`]).
//!
//! - Reactions: `PUT` and `DELETE /channels/{c}/messages/{m}/reactions/{emoji}/@me`
//!   (204; 404 "Unknown Message" for a message not in the channel), every call
//!   recorded ([`DiscordFake::reactions`]); a test makes them fail or hang
//!   ([`DiscordFake::fault_reactions`]).
//!
//! - Slash commands: `GET /oauth2/applications/@me` names the application (the bot's
//!   id); `PUT /applications/{id}/commands` replaces the commands (names of 1–32
//!   characters, descriptions of 1–100, else 400; [`DiscordFake::commands`]). A user
//!   runs one with [`DiscordFake::slash`]: an `INTERACTION_CREATE` of type 2. A second
//!   callback for one interaction is refused with 400 "already acknowledged"; after a
//!   type 5 callback, `PATCH /webhooks/{app}/{token}/messages/@original` (no
//!   authorization) edits the response ([`DiscordFake::responses`]), 404 "Unknown
//!   Webhook" before.
//!
//! - A CDN: an image attachment ([`Say::image`]) is served at its `url`
//!   (`/attachments/<id>/<name>`, no authorization, as Discord's CDN); every download
//!   is recorded with the `Authorization` header it carried, if any.
//!
//! Users "send" messages through [`DiscordFake::say`]: the message joins the channel's
//! history (what `GET …/messages` returns) and is dispatched to the sessions. A
//! message said while no session is connected is only in the history, like a message
//! sent while the bot was down.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// The bot's user id.
pub(crate) const BOT_ID: u64 = 1_100_000_000_000_000_001;
/// The guild every guild channel and thread belongs to.
pub(crate) const GUILD_ID: u64 = 1_100_000_000_000_000_002;
/// Discord's limit on a message's content, in characters.
pub(crate) const MAX_CONTENT: usize = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChannelKind {
    Dm,
    Guild,
    Thread,
}

impl ChannelKind {
    fn type_code(self) -> u8 {
        match self {
            ChannelKind::Dm => 1,
            ChannelKind::Guild => 0,
            ChannelKind::Thread => 11,
        }
    }
}

/// A message the bot created (one per distinct nonce).
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub channel: u64,
    pub id: u64,
    pub content: String,
    pub nonce: Option<String>,
    pub enforce_nonce: bool,
    /// `message_reference.message_id`
    pub reply_to: Option<String>,
    pub fail_if_not_exists: Option<bool>,
    pub allowed_mentions: Option<Value>,
    /// The `components` it was created with (action rows of buttons), if any.
    pub components: Option<Value>,
}

impl Sent {
    /// `(label, custom_id)` of every button, row by row.
    pub(crate) fn buttons(&self) -> Vec<(String, String)> {
        self.components
            .as_ref()
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(|row| row["components"].as_array().cloned().unwrap_or_default())
            .map(|b| {
                (
                    b["label"].as_str().unwrap_or_default().to_owned(),
                    b["custom_id"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

/// One `POST /interactions/{id}/{token}/callback` and how the fake answered it.
#[derive(Debug, Clone)]
pub(crate) struct Callback {
    pub interaction: u64,
    /// The response `type` (6: DEFERRED_UPDATE_MESSAGE).
    pub kind: Option<u64>,
    pub status: u16,
    pub at: Instant,
}

/// One `POST /channels/{id}/messages` attempt and the status the fake answered.
#[derive(Debug, Clone)]
pub(crate) struct Post {
    pub channel: u64,
    pub nonce: Option<String>,
    pub status: u16,
    /// The id of the message returned (new or, for a repeated nonce, the earlier one).
    pub message: Option<u64>,
    pub at: Instant,
}

/// One reaction call (`PUT`: `on`, `DELETE`: not) and the status it got.
#[derive(Debug, Clone)]
pub(crate) struct ReactionCall {
    pub channel: u64,
    pub message: u64,
    pub emoji: String,
    pub on: bool,
    pub status: u16,
    pub at: Instant,
}

/// How every reaction call is answered, until changed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReactionFault {
    /// This status, nothing changed.
    Fail(u16),
    /// No answer for this long, then as usual.
    Hang(Duration),
}

/// A fault for the next message POST.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PostFault {
    /// Answer this status without creating the message (`retry_after` for a 429).
    Refuse { status: u16, retry_after: f64 },
    /// Create the message, then answer 500: the response was lost.
    LoseResponse,
    /// Create nothing and never answer: a request that hangs until its sender gives up
    /// or is killed.
    Hang,
}

/// What a user sends.
#[derive(Debug, Clone)]
pub(crate) struct Say {
    pub channel: u64,
    pub user: u64,
    pub text: String,
    /// Mention the bot at the start (`<@bot> text`).
    pub mention: bool,
    /// Reply to this message (its author comes from the channel's history).
    pub reply_to: Option<u64>,
    /// Attach a file.
    pub attachment: bool,
    /// Attach an image (PNG) with these bytes, served by the fake's CDN.
    pub image: Option<Vec<u8>>,
    /// The author is a bot.
    pub bot: bool,
}

impl Say {
    pub(crate) fn new(channel: u64, user: u64, text: &str) -> Self {
        Self {
            channel,
            user,
            text: text.into(),
            mention: false,
            reply_to: None,
            attachment: false,
            image: None,
            bot: false,
        }
    }

    pub(crate) fn mention(mut self) -> Self {
        self.mention = true;
        self
    }

    pub(crate) fn reply_to(mut self, id: u64) -> Self {
        self.reply_to = Some(id);
        self
    }

    pub(crate) fn attachment(mut self) -> Self {
        self.attachment = true;
        self
    }

    pub(crate) fn image(mut self, bytes: Vec<u8>) -> Self {
        self.image = Some(bytes);
        self
    }

    pub(crate) fn by_bot(mut self) -> Self {
        self.bot = true;
        self
    }
}

enum Command {
    Text(String),
    Close(u16),
}

struct Session {
    /// `(index, total)` from IDENTIFY.
    shard: (u64, u64),
    seq: u64,
    /// Every dispatch of this session, for replay on RESUME.
    log: Vec<(u64, String)>,
    /// The connection currently carrying the session: its id and its outbox.
    link: Option<(u64, mpsc::UnboundedSender<Command>)>,
}

struct Channel {
    kind: ChannelKind,
    /// The guild of a guild channel or thread.
    guild: Option<u64>,
    /// Every message, oldest first.
    messages: Vec<Value>,
}

#[derive(Default)]
struct Inner {
    channels: HashMap<u64, Channel>,
    sent: Vec<Sent>,
    posts: Vec<Post>,
    by_nonce: HashMap<String, Value>,
    typing: HashMap<u64, usize>,
    faults: VecDeque<PostFault>,
    sessions: HashMap<String, Session>,
    identifies: usize,
    resumes: usize,
    refuse_resume: bool,
    /// The gateway refuses every IDENTIFY (4004) although REST accepts the token.
    refuse_identify: bool,
    unauthorized: usize,
    /// `(channel, after)` of every history request.
    history_reads: Vec<(u64, Option<u64>)>,
    /// What `GET /gateway/bot` recommends.
    recommended_shards: u64,
    bot_gateway_calls: usize,
    /// `(index, total)` of every IDENTIFY.
    identified_shards: Vec<(u64, u64)>,
    /// Times a session of a shard went live while another session of that shard was
    /// connected.
    shard_overlaps: usize,
    /// Attachment id → bytes the CDN serves.
    files: HashMap<u64, Vec<u8>>,
    /// The signature attachment URLs carry (`?ex=`): URLs with an older one answer
    /// 404, as Discord's CDN does once a signed URL expired (about a day).
    signature: u64,
    /// URLs asked to be signed again (`POST /attachments/refresh-urls`).
    refreshed: Vec<String>,
    /// `(attachment id, Authorization header)` of every CDN download.
    downloads: Vec<(u64, Option<String>)>,
    /// Interaction id → its token.
    interactions: HashMap<u64, String>,
    /// Every interaction callback.
    callbacks: Vec<Callback>,
    /// Interaction callbacks still to answer 500.
    failing_callbacks: usize,
    /// Every reaction call.
    reactions: Vec<ReactionCall>,
    /// The slash commands registered last, and how many PUTs registered them.
    commands: Vec<Value>,
    command_puts: usize,
    /// Interactions answered with a deferred message (type 5): their responses
    /// exist and may be edited.
    deferred: std::collections::HashSet<u64>,
    /// Interactions acknowledged at all (a second callback is refused).
    acknowledged: std::collections::HashSet<u64>,
    /// (interaction, content) of every accepted response edit.
    responses: Vec<(u64, String)>,
    reaction_fault: Option<ReactionFault>,
    /// Every accepted start of a thread from a message: (channel, message, name).
    threads_started: Vec<(u64, u64, String)>,
    /// Every call to start a thread from a message, accepted or not: (channel, message).
    thread_calls: Vec<(u64, u64)>,
    /// Starting threads is refused with 403 (the bot lacks *Create Public Threads*).
    refuse_threads: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    changed: Notify,
    token: String,
    gateway_url: String,
    /// Where the CDN serves attachments (the REST server, outside `/api`).
    cdn_url: String,
    snowflake: AtomicU64,
    connections: AtomicU64,
}

impl Shared {
    fn next_id(&self) -> u64 {
        self.snowflake.fetch_add(1, Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    fn bot_user(&self) -> Value {
        user_json(BOT_ID, "lull", true)
    }
}

fn user_json(id: u64, name: &str, bot: bool) -> Value {
    json!({"id": id.to_string(), "username": name, "discriminator": "0", "global_name": null,
           "avatar": null, "bot": bot})
}

/// The shard of `total` a guild's events go to; DMs (no guild) go to shard 0.
pub(crate) fn shard_of(guild: Option<u64>, total: u64) -> u64 {
    guild.map_or(0, |g| (g >> 22) % total.max(1))
}

/// A guild id whose events go to shard `index` of `total`.
pub(crate) fn guild_on_shard(index: u64, total: u64) -> u64 {
    let base = GUILD_ID >> 22;
    let bump = (index + total - base % total) % total;
    (base + bump) << 22 | (GUILD_ID & ((1 << 22) - 1))
}

/// Send `t`/`d` to every session of the shard its guild is on: at once to connected
/// ones, into the log of all.
fn dispatch(inner: &mut Inner, t: &str, d: &Value) {
    dispatch_where(inner, t, d, false);
}

/// [`dispatch`], or to every session whatever its shard (`everywhere`).
fn dispatch_where(inner: &mut Inner, t: &str, d: &Value, everywhere: bool) {
    let guild = d["guild_id"].as_str().and_then(|g| g.parse::<u64>().ok());
    for session in inner.sessions.values_mut() {
        let (index, total) = session.shard;
        if !everywhere && shard_of(guild, total) != index {
            continue;
        }
        session.seq += 1;
        let frame = json!({"op": 0, "t": t, "s": session.seq, "d": d}).to_string();
        session.log.push((session.seq, frame.clone()));
        if let Some((_, link)) = &session.link
            && link.send(Command::Text(frame)).is_err()
        {
            session.link = None;
        }
    }
}

/// The fake; dropping it stops both servers.
pub(crate) struct DiscordFake {
    /// What `DISCORD_API_URL` should be.
    pub api_url: String,
    shared: Arc<Shared>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for DiscordFake {
    fn drop(&mut self) {
        for server in &self.servers {
            server.abort();
        }
    }
}

impl DiscordFake {
    pub(crate) async fn start(token: &str) -> DiscordFake {
        let rest = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                recommended_shards: 1,
                ..Inner::default()
            }),
            changed: Notify::new(),
            token: token.into(),
            gateway_url: format!("ws://{}", gateway.local_addr().unwrap()),
            cdn_url: format!("http://{}/attachments", rest.local_addr().unwrap()),
            snowflake: AtomicU64::new(1_200_000_000_000_000_000),
            connections: AtomicU64::new(0),
        });
        let api = Router::new()
            .route("/api/v10/gateway", get(get_gateway))
            .route("/api/v10/gateway/bot", get(get_bot_gateway))
            .route("/api/v10/users/@me", get(get_me))
            .route("/api/v10/channels/{id}", get(get_channel))
            .route(
                "/api/v10/channels/{id}/messages",
                get(get_messages).post(post_message),
            )
            .route("/api/v10/channels/{id}/typing", post(post_typing))
            .route(
                "/api/v10/channels/{id}/messages/{message}/threads",
                post(start_thread),
            )
            .route(
                "/api/v10/channels/{id}/messages/{message}/reactions/{emoji}/@me",
                axum::routing::put(put_reaction).delete(delete_reaction),
            )
            .route("/api/v10/attachments/refresh-urls", post(refresh_urls))
            .route("/api/v10/oauth2/applications/@me", get(get_application))
            .route(
                "/api/v10/applications/{id}/commands",
                axum::routing::put(put_commands),
            )
            .layer(middleware::from_fn_with_state(shared.clone(), authorize))
            .route("/attachments/{id}/{name}", get(get_attachment))
            .route(
                "/api/v10/interactions/{id}/{token}/callback",
                post(interaction_callback),
            )
            .route(
                "/api/v10/webhooks/{application}/{token}/messages/@original",
                axum::routing::patch(edit_response),
            )
            .with_state(shared.clone());
        let api_url = format!("http://{}", rest.local_addr().unwrap());
        let rest_server = tokio::spawn(async move {
            axum::serve(rest, api).await.unwrap();
        });
        let gateway_shared = shared.clone();
        let gateway_server = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = gateway.accept().await else {
                    return;
                };
                tokio::spawn(connection(gateway_shared.clone(), tcp));
            }
        });
        DiscordFake {
            api_url,
            shared,
            servers: vec![rest_server, gateway_server],
        }
    }

    /// A new channel of this kind (in the guild [`GUILD_ID`] unless a DM); returns
    /// its id.
    pub(crate) fn channel(&self, kind: ChannelKind) -> u64 {
        self.channel_in(kind, GUILD_ID)
    }

    /// A new channel of this kind in `guild` (ignored for a DM); returns its id.
    pub(crate) fn channel_in(&self, kind: ChannelKind, guild: u64) -> u64 {
        let id = self.shared.next_id();
        self.shared.lock().channels.insert(
            id,
            Channel {
                kind,
                guild: (kind != ChannelKind::Dm).then_some(guild),
                messages: Vec::new(),
            },
        );
        id
    }

    /// What `GET /gateway/bot` recommends from now on.
    pub(crate) fn recommend_shards(&self, shards: u64) {
        self.shared.lock().recommended_shards = shards;
    }

    pub(crate) fn bot_gateway_calls(&self) -> usize {
        self.shared.lock().bot_gateway_calls
    }

    /// `(index, total)` of every IDENTIFY so far.
    pub(crate) fn identified_shards(&self) -> Vec<(u64, u64)> {
        self.shared.lock().identified_shards.clone()
    }

    /// `(index, total)` of every connected session.
    pub(crate) fn connected_shards(&self) -> Vec<(u64, u64)> {
        let mut shards: Vec<_> = self
            .shared
            .lock()
            .sessions
            .values()
            .filter(|s| s.link.is_some())
            .map(|s| s.shard)
            .collect();
        shards.sort();
        shards
    }

    /// Times a shard had two live connections.
    pub(crate) fn shard_overlaps(&self) -> usize {
        self.shared.lock().shard_overlaps
    }

    /// Every accepted start of a thread from a message: (channel, message, name).
    pub(crate) fn threads_started(&self) -> Vec<(u64, u64, String)> {
        self.shared.lock().threads_started.clone()
    }

    /// Every call to start a thread from a message: (channel, message).
    pub(crate) fn thread_calls(&self) -> Vec<(u64, u64)> {
        self.shared.lock().thread_calls.clone()
    }

    /// Refuse every start of a thread with 403 Missing Permissions.
    pub(crate) fn refuse_threads(&self, refuse: bool) {
        self.shared.lock().refuse_threads = refuse;
    }

    /// A user sends a message; returns its id.
    pub(crate) fn say(&self, say: Say) -> u64 {
        let id = self.shared.next_id();
        let mut inner = self.shared.lock();
        let channel = inner.channels.get(&say.channel).expect("unknown channel");
        let guild = channel.guild;
        let referenced = say.reply_to.map(|to| {
            channel
                .messages
                .iter()
                .find(|m| m["id"].as_str() == Some(to.to_string().as_str()))
                .cloned()
                .expect("replying to an unknown message")
        });
        let author = user_json(say.user, &format!("user{}", say.user % 1000), say.bot);
        let mut mentions = Vec::new();
        let mut content = say.text.clone();
        if say.mention {
            content = format!("<@{BOT_ID}> {content}");
            mentions.push(self.shared.bot_user());
        }
        if let Some(r) = &referenced {
            // Discord lists the author of the replied-to message among the mentions.
            mentions.push(r["author"].clone());
        }
        let attachments = if let Some(bytes) = &say.image {
            let url = format!(
                "{}/{id}/photo.png?ex={}",
                self.shared.cdn_url, inner.signature
            );
            let size = bytes.len();
            inner.files.insert(id, bytes.clone());
            vec![
                json!({"id": id.to_string(), "filename": "photo.png", "size": size,
                        "content_type": "image/png", "url": url, "proxy_url": url}),
            ]
        } else if say.attachment {
            vec![
                json!({"id": id.to_string(), "filename": "photo.jpg", "size": 1234,
                        "url": "https://cdn.invalid/photo.jpg", "proxy_url": "https://cdn.invalid/photo.jpg"}),
            ]
        } else {
            Vec::new()
        };
        let mut message = message_json(id, say.channel, guild, author, &content);
        message["mentions"] = Value::Array(mentions);
        message["attachments"] = Value::Array(attachments);
        if let Some(r) = referenced {
            message["type"] = json!(19);
            message["message_reference"] =
                json!({"message_id": r["id"], "channel_id": say.channel.to_string()});
            message["referenced_message"] = r;
        }
        inner
            .channels
            .get_mut(&say.channel)
            .unwrap()
            .messages
            .push(message.clone());
        dispatch(&mut inner, "MESSAGE_CREATE", &message);
        drop(inner);
        self.shared.changed.notify_waiters();
        id
    }

    /// User `user` starts typing in `channel`: dispatches a `TYPING_START` (Discord
    /// sends it with the typing intents, and again about every 10 s while they type).
    pub(crate) fn typing_start(&self, channel: u64, user: u64) {
        let mut inner = self.shared.lock();
        let guild = inner.channels.get(&channel).expect("unknown channel").guild;
        let mut event = json!({
            "channel_id": channel.to_string(),
            "user_id": user.to_string(),
            "timestamp": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        });
        if let Some(guild) = guild {
            event["guild_id"] = json!(guild.to_string());
        }
        dispatch(&mut inner, "TYPING_START", &event);
        drop(inner);
        self.shared.changed.notify_waiters();
    }

    /// User `user` clicks the button `custom_id` on message `on` in `channel`:
    /// dispatches an `INTERACTION_CREATE` (type 3) and returns it (for
    /// [`DiscordFake::dispatch_interaction`]).
    pub(crate) fn click(&self, channel: u64, user: u64, on: u64, custom_id: &str) -> Value {
        let message = self.shared.lock().channels[&channel]
            .messages
            .iter()
            .find(|m| m["id"].as_str() == Some(on.to_string().as_str()))
            .cloned()
            .expect("clicking on an unknown message");
        let data = json!({"custom_id": custom_id, "component_type": 2});
        self.interact(channel, user, 3, data, Some(message))
    }

    /// User `user` runs the slash command `name` in `channel`, with `value` for its
    /// string option `option` if given: dispatches an `INTERACTION_CREATE` (type 2)
    /// and returns it (for [`DiscordFake::dispatch_interaction`]).
    pub(crate) fn slash(
        &self,
        channel: u64,
        user: u64,
        name: &str,
        option: Option<(&str, &str)>,
    ) -> Value {
        let mut data = json!({"id": self.shared.next_id().to_string(), "name": name, "type": 1});
        if let Some((option, value)) = option {
            data["options"] = json!([{"name": option, "type": 3, "value": value}]);
        }
        self.interact(channel, user, 2, data, None)
    }

    /// Dispatch an interaction of `kind` by `user` in `channel` (see
    /// [`DiscordFake::click`], [`DiscordFake::slash`]).
    fn interact(
        &self,
        channel: u64,
        user: u64,
        kind: u8,
        data: Value,
        message: Option<Value>,
    ) -> Value {
        let id = self.shared.next_id();
        let token: String = std::iter::repeat_with(fastrand::alphanumeric)
            .take(40)
            .collect();
        let mut inner = self.shared.lock();
        let guild = inner.channels.get(&channel).expect("unknown channel").guild;
        let mut interaction = json!({
            "id": id.to_string(), "application_id": BOT_ID.to_string(), "type": kind,
            "token": token, "version": 1, "channel_id": channel.to_string(),
            "channel": {"id": channel.to_string(), "type": inner.channels[&channel].kind.type_code()},
            "data": data, "locale": "en-US", "entitlements": [],
            "app_permissions": "0", "attachment_size_limit": 10_485_760,
        });
        if let Some(message) = message {
            interaction["message"] = message;
        }
        let clicker = user_json(user, &format!("user{}", user % 1000), false);
        match guild {
            Some(guild) => {
                interaction["guild_id"] = json!(guild.to_string());
                interaction["guild_locale"] = json!("en-US");
                interaction["member"] = json!({"user": clicker, "nick": null, "roles": [],
                    "joined_at": "2026-01-01T00:00:00+00:00", "deaf": false, "mute": false,
                    "flags": 0, "permissions": "0"});
            }
            None => interaction["user"] = clicker,
        }
        inner.interactions.insert(id, token);
        dispatch(&mut inner, "INTERACTION_CREATE", &interaction);
        drop(inner);
        self.shared.changed.notify_waiters();
        interaction
    }

    /// Dispatch `interaction` (from [`DiscordFake::click`]) again.
    pub(crate) fn dispatch_interaction(&self, interaction: &Value) {
        dispatch(&mut self.shared.lock(), "INTERACTION_CREATE", interaction);
        self.shared.changed.notify_waiters();
    }

    /// Every reaction call so far.
    pub(crate) fn reactions(&self) -> Vec<ReactionCall> {
        self.shared.lock().reactions.clone()
    }

    /// Answer every reaction call from now on with `fault` (`None`: as usual).
    pub(crate) fn fault_reactions(&self, fault: Option<ReactionFault>) {
        self.shared.lock().reaction_fault = fault;
    }

    /// Dispatch `interaction` to every connected session, whatever its shard (as if
    /// several replicas had received it).
    pub(crate) fn dispatch_interaction_everywhere(&self, interaction: &Value) {
        dispatch_where(
            &mut self.shared.lock(),
            "INTERACTION_CREATE",
            interaction,
            true,
        );
        self.shared.changed.notify_waiters();
    }

    /// The slash commands registered last (`PUT /applications/{id}/commands`), and
    /// how many times they were.
    pub(crate) fn commands(&self) -> (Vec<Value>, usize) {
        let inner = self.shared.lock();
        (inner.commands.clone(), inner.command_puts)
    }

    /// Every edit of a deferred response (`PATCH …/messages/@original`) that Discord
    /// took: (interaction id, content).
    pub(crate) fn responses(&self) -> Vec<(u64, String)> {
        self.shared.lock().responses.clone()
    }

    /// Every interaction callback so far.
    pub(crate) fn callbacks(&self) -> Vec<Callback> {
        self.shared.lock().callbacks.clone()
    }

    /// Answer the next `n` interaction callbacks with 500.
    pub(crate) fn fail_callbacks(&self, n: usize) {
        self.shared.lock().failing_callbacks = n;
    }

    /// `(attachment id, Authorization header)` of every CDN download so far.
    pub(crate) fn downloads(&self) -> Vec<(u64, Option<String>)> {
        self.shared.lock().downloads.clone()
    }

    /// Every attachment URL given out so far expires: the CDN answers 404 to it until
    /// it is signed again (`POST /attachments/refresh-urls`).
    pub(crate) fn expire_attachment_urls(&self) {
        self.shared.lock().signature += 1;
    }

    /// The URLs lull asked to have signed again, in order.
    pub(crate) fn refreshed(&self) -> Vec<String> {
        self.shared.lock().refreshed.clone()
    }

    /// A user edits a message (`MESSAGE_UPDATE`).
    pub(crate) fn edit(&self, channel: u64, id: u64, text: &str) {
        let mut inner = self.shared.lock();
        let guild = inner.channels[&channel].guild;
        let message = inner
            .channels
            .get_mut(&channel)
            .unwrap()
            .messages
            .iter_mut()
            .find(|m| m["id"].as_str() == Some(id.to_string().as_str()))
            .expect("editing an unknown message");
        message["content"] = json!(text);
        message["edited_timestamp"] = json!("2026-01-01T00:00:01+00:00");
        let mut update = message.clone();
        if let Some(guild) = guild {
            update["guild_id"] = json!(guild.to_string());
        }
        dispatch(&mut inner, "MESSAGE_UPDATE", &update);
    }

    /// Messages the bot created in `channel`, oldest first.
    pub(crate) fn sent(&self, channel: u64) -> Vec<Sent> {
        self.shared
            .lock()
            .sent
            .iter()
            .filter(|s| s.channel == channel)
            .cloned()
            .collect()
    }

    /// Every message POST (including refused and deduplicated ones).
    pub(crate) fn posts(&self) -> Vec<Post> {
        self.shared.lock().posts.clone()
    }

    /// Wait until the bot created at least `n` messages in `channel`.
    pub(crate) async fn wait_sent(&self, channel: u64, n: usize, limit: Duration) -> Vec<Sent> {
        self.wait_for(limit, || {
            let sent = self.sent(channel);
            (sent.len() >= n).then_some(sent)
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "expected {n} message(s) from the bot in channel {channel} within {limit:?}, got {:#?}",
                self.sent(channel)
            )
        })
    }

    /// Wait until `check` returns `Some`, woken by every change; `None` after `limit`.
    pub(crate) async fn wait_for<T>(
        &self,
        limit: Duration,
        check: impl Fn() -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.shared.changed.notified();
            if let Some(value) = check() {
                return Some(value);
            }
            // Changes without a notification (typing, history reads) are polled.
            let poll = tokio::time::sleep(Duration::from_millis(50));
            tokio::select! {
                () = changed => {}
                () = poll => {}
                () = tokio::time::sleep_until(deadline) => return check(),
            }
        }
    }

    /// Fail the next message POSTs, in order.
    pub(crate) fn fault_next_posts(&self, faults: &[PostFault]) {
        self.shared.lock().faults.extend(faults.iter().copied());
    }

    pub(crate) fn typing(&self, channel: u64) -> usize {
        self.shared
            .lock()
            .typing
            .get(&channel)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn connected(&self) -> usize {
        self.shared
            .lock()
            .sessions
            .values()
            .filter(|s| s.link.is_some())
            .count()
    }

    pub(crate) fn identifies(&self) -> usize {
        self.shared.lock().identifies
    }

    pub(crate) fn resumes(&self) -> usize {
        self.shared.lock().resumes
    }

    pub(crate) fn unauthorized(&self) -> usize {
        self.shared.lock().unauthorized
    }

    pub(crate) fn history_reads(&self) -> Vec<(u64, Option<u64>)> {
        self.shared.lock().history_reads.clone()
    }

    /// Wait until the connected sessions are of exactly these shards
    /// (`(index, total)`, sorted).
    pub(crate) async fn wait_shards(&self, shards: &[(u64, u64)], limit: Duration) {
        self.wait_for(limit, || (self.connected_shards() == shards).then_some(()))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "expected shards {shards:?} connected within {limit:?}, have {:?}",
                    self.connected_shards()
                )
            });
    }

    /// Wait until exactly `n` sessions are connected and have been for `steady`.
    pub(crate) async fn wait_connected(&self, n: usize, limit: Duration) {
        self.wait_for(limit, || (self.connected() == n).then_some(()))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "expected {n} connected gateway session(s) within {limit:?}, have {}",
                    self.connected()
                )
            });
    }

    /// Close every gateway connection with code 4000 (unknown error: the client may
    /// resume).
    pub(crate) fn drop_connections(&self) {
        let mut inner = self.shared.lock();
        for session in inner.sessions.values_mut() {
            if let Some((_, link)) = session.link.take() {
                let _ = link.send(Command::Close(4000));
            }
        }
    }

    /// Answer every RESUME with INVALID_SESSION, so clients identify afresh.
    pub(crate) fn refuse_resume(&self, refuse: bool) {
        self.shared.lock().refuse_resume = refuse;
    }

    /// From now on the gateway closes every IDENTIFY with 4004 (authentication
    /// failed), as for a token revoked after the REST check.
    pub(crate) fn refuse_identify(&self) {
        self.shared.lock().refuse_identify = true;
    }
}

fn message_json(id: u64, channel: u64, guild: Option<u64>, author: Value, content: &str) -> Value {
    let mut message = json!({
        "id": id.to_string(), "channel_id": channel.to_string(), "author": author,
        "content": content, "timestamp": "2026-01-01T00:00:00+00:00", "edited_timestamp": null,
        "tts": false, "mention_everyone": false, "mentions": [], "mention_roles": [],
        "attachments": [], "embeds": [], "pinned": false, "type": 0
    });
    if let Some(guild) = guild {
        message["guild_id"] = json!(guild.to_string());
    }
    message
}

/// `POST /interactions/{id}/{token}/callback`.
async fn interaction_callback(
    State(shared): State<Arc<Shared>>,
    Path((id, token)): Path<(u64, String)>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut inner = shared.lock();
    let status = if inner.interactions.get(&id) != Some(&token) {
        404
    } else if inner.failing_callbacks > 0 {
        inner.failing_callbacks -= 1;
        500
    } else if !inner.acknowledged.insert(id) {
        400
    } else {
        if body["type"] == 5 {
            inner.deferred.insert(id);
        }
        204
    };
    inner.callbacks.push(Callback {
        interaction: id,
        kind: body["type"].as_u64(),
        status,
        at: Instant::now(),
    });
    drop(inner);
    shared.changed.notify_waiters();
    match status {
        404 => error(StatusCode::NOT_FOUND, 10062, "Unknown interaction"),
        400 => error(
            StatusCode::BAD_REQUEST,
            40060,
            "Interaction has already been acknowledged.",
        ),
        500 => error(StatusCode::INTERNAL_SERVER_ERROR, 0, "injected failure"),
        _ => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn get_application() -> axum::Json<Value> {
    axum::Json(json!({"id": BOT_ID.to_string(), "name": "lull", "bot_public": true}))
}

/// A bulk overwrite of the global commands: names of 1–32 characters `a-z 0-9 _ -`,
/// descriptions of 1–100, at most 100 commands (else 400); the last list wins.
async fn put_commands(
    State(shared): State<Arc<Shared>>,
    Path(application): Path<u64>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    if application != BOT_ID {
        return error(StatusCode::FORBIDDEN, 50001, "Missing Access");
    }
    let Some(commands) = body.as_array() else {
        return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
    };
    let valid = commands.len() <= 100
        && commands.iter().all(|c| {
            let name = c["name"].as_str().unwrap_or("");
            let description = c["description"].as_str().unwrap_or("");
            (1..=32).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
                && (1..=100).contains(&description.chars().count())
        });
    if !valid {
        return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
    }
    let mut inner = shared.lock();
    inner.commands = commands.clone();
    inner.command_puts += 1;
    drop(inner);
    shared.changed.notify_waiters();
    axum::Json(body).into_response()
}

/// An edit of a deferred response: only of an interaction answered with type 5,
/// by its token (no authorization, as Discord).
async fn edit_response(
    State(shared): State<Arc<Shared>>,
    Path((_application, token)): Path<(u64, String)>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut inner = shared.lock();
    let interaction = inner
        .interactions
        .iter()
        .find(|(_, t)| **t == token)
        .map(|(id, _)| *id)
        .filter(|id| inner.deferred.contains(id));
    let Some(interaction) = interaction else {
        return error(StatusCode::NOT_FOUND, 10015, "Unknown Webhook");
    };
    let content = body["content"].as_str().unwrap_or("").to_owned();
    inner.responses.push((interaction, content.clone()));
    drop(inner);
    shared.changed.notify_waiters();
    axum::Json(json!({"id": interaction.to_string(), "content": content})).into_response()
}

/// Whether `components` are what Discord accepts for buttons: 1–5 action rows
/// (type 1) of 1–5 buttons (type 2) with a label and a `custom_id` of 1–100
/// characters.
fn valid_components(components: &Value) -> bool {
    let Some(rows) = components.as_array() else {
        return false;
    };
    (1..=5).contains(&rows.len())
        && rows.iter().all(|row| {
            row["type"] == 1
                && row["components"].as_array().is_some_and(|buttons| {
                    (1..=5).contains(&buttons.len())
                        && buttons.iter().all(|b| {
                            b["type"] == 2
                                && b["label"].as_str().is_some_and(|l| l.chars().count() <= 80)
                                && b["custom_id"]
                                    .as_str()
                                    .is_some_and(|c| (1..=100).contains(&c.chars().count()))
                        })
                })
        })
}

fn error(status: StatusCode, code: u32, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"code": code, "message": message})),
    )
        .into_response()
}

/// The CDN: an attachment's bytes, without authorization.
/// `POST /attachments/refresh-urls`: each URL signed with the current signature.
async fn refresh_urls(
    State(shared): State<Arc<Shared>>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut inner = shared.lock();
    let signature = inner.signature;
    let mut refreshed = Vec::new();
    for url in body["attachment_urls"].as_array().into_iter().flatten() {
        let Some(original) = url.as_str() else {
            return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
        };
        inner.refreshed.push(original.to_owned());
        let base = original.split_once('?').map_or(original, |(base, _)| base);
        refreshed
            .push(json!({"original": original, "refreshed": format!("{base}?ex={signature}")}));
    }
    axum::Json(json!({ "refreshed_urls": refreshed })).into_response()
}

async fn get_attachment(
    State(shared): State<Arc<Shared>>,
    Path((id, _name)): Path<(u64, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let mut inner = shared.lock();
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    inner.downloads.push((id, authorization));
    if query.get("ex") != Some(&inner.signature.to_string()) {
        return (
            StatusCode::NOT_FOUND,
            "This content is no longer available.",
        )
            .into_response();
    }
    match inner.files.get(&id).cloned() {
        Some(bytes) => ([(axum::http::header::CONTENT_TYPE, "image/png")], bytes).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn authorize(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let expected = format!("Bot {}", shared.token);
    let given = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if given != Some(expected.as_str()) {
        shared.lock().unauthorized += 1;
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    next.run(request).await
}

async fn get_gateway(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    axum::Json(json!({
        "url": shared.gateway_url, "shards": 1,
        "session_start_limit": {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}
    }))
}

async fn get_bot_gateway(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    let shards = {
        let mut inner = shared.lock();
        inner.bot_gateway_calls += 1;
        inner.recommended_shards
    };
    axum::Json(json!({
        "url": shared.gateway_url, "shards": shards,
        "session_start_limit": {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}
    }))
}

async fn get_me(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    axum::Json(shared.bot_user())
}

async fn get_channel(State(shared): State<Arc<Shared>>, Path(id): Path<u64>) -> Response {
    let inner = shared.lock();
    let Some(channel) = inner.channels.get(&id) else {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    let mut body = json!({"id": id.to_string(), "type": channel.kind.type_code()});
    if let Some(guild) = channel.guild {
        body["guild_id"] = json!(guild.to_string());
    }
    axum::Json(body).into_response()
}

async fn get_messages(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<u64>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let after = query.get("after").and_then(|a| a.parse::<u64>().ok());
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(50)
        .min(100);
    let mut inner = shared.lock();
    inner.history_reads.push((id, after));
    let Some(channel) = inner.channels.get(&id) else {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    // The oldest `limit` messages after `after`, listed newest first, as Discord does.
    let mut page: Vec<Value> = channel
        .messages
        .iter()
        .filter(|m| {
            let mid: u64 = m["id"].as_str().unwrap().parse().unwrap();
            after.is_none_or(|a| mid > a)
        })
        .take(limit)
        .map(|m| {
            // History read over REST carries no guild id.
            let mut m = m.clone();
            m.as_object_mut().unwrap().remove("guild_id");
            m
        })
        .collect();
    page.reverse();
    axum::Json(Value::Array(page)).into_response()
}

/// Marks the answer of a post that is to hang ([`PostFault::Hang`]).
#[derive(Clone, Copy)]
struct Hung;

async fn post_message(
    shared: State<Arc<Shared>>,
    id: Path<u64>,
    body: axum::Json<Value>,
) -> Response {
    let response = post_message_now(shared, id, body);
    if response.extensions().get::<Hung>().is_some() {
        // Recorded, and never answered: not even the status line.
        std::future::pending::<()>().await;
    }
    response
}

fn post_message_now(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<u64>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let nonce = match &body["nonce"] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let enforce_nonce = body["enforce_nonce"].as_bool().unwrap_or(false);
    let content = body["content"].as_str().unwrap_or("").to_owned();
    let mut inner = shared.lock();
    let Some(guild) = inner.channels.get(&id).map(|c| c.guild) else {
        inner.posts.push(Post {
            at: Instant::now(),
            channel: id,
            nonce,
            status: 404,
            message: None,
        });
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    let fault = inner.faults.pop_front();
    let refuse = |inner: &mut Inner, status: u16| {
        inner.posts.push(Post {
            at: Instant::now(),
            channel: id,
            nonce: nonce.clone(),
            status,
            message: None,
        });
    };
    if let Some(PostFault::Refuse {
        status,
        retry_after,
    }) = fault
    {
        refuse(&mut inner, status);
        drop(inner);
        shared.changed.notify_waiters();
        let status = StatusCode::from_u16(status).unwrap();
        if status == StatusCode::TOO_MANY_REQUESTS {
            return (
                status,
                [("retry-after", format!("{}", retry_after.ceil() as u64))],
                axum::Json(json!({"message": "You are being rate limited.",
                                   "retry_after": retry_after, "global": false})),
            )
                .into_response();
        }
        return error(status, 0, "injected failure");
    }
    if matches!(fault, Some(PostFault::Hang)) {
        refuse(&mut inner, 0);
        drop(inner);
        shared.changed.notify_waiters();
        let mut hung = StatusCode::OK.into_response();
        hung.extensions_mut().insert(Hung);
        return hung;
    }
    if nonce.as_ref().is_some_and(|n| n.chars().count() > 25) {
        refuse(&mut inner, 400);
        return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body (nonce)");
    }
    if content.is_empty() || content.chars().count() > MAX_CONTENT {
        refuse(&mut inner, 400);
        return error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body (content)",
        );
    }
    let snowflake = |v: &Value| match v {
        Value::String(s) => s.parse::<u64>().is_ok(),
        Value::Number(n) => n.as_u64().is_some(),
        _ => false,
    };
    if body
        .get("message_reference")
        .is_some_and(|r| !snowflake(&r["message_id"]))
    {
        refuse(&mut inner, 400);
        return error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body (message_reference.message_id: Value is not snowflake.)",
        );
    }
    let components = body.get("components").cloned();
    if components.as_ref().is_some_and(|c| !valid_components(c)) {
        refuse(&mut inner, 400);
        return error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body (components)",
        );
    }
    // enforce_nonce: a nonce seen before returns the earlier message.
    if let (true, Some(n)) = (enforce_nonce, &nonce)
        && let Some(earlier) = inner.by_nonce.get(n).cloned()
    {
        let earlier_id = earlier["id"].as_str().unwrap().parse().unwrap();
        inner.posts.push(Post {
            at: Instant::now(),
            channel: id,
            nonce: nonce.clone(),
            status: 200,
            message: Some(earlier_id),
        });
        drop(inner);
        shared.changed.notify_waiters();
        return axum::Json(earlier).into_response();
    }
    let message_id = shared.next_id();
    let mut message = message_json(message_id, id, guild, shared.bot_user(), &content);
    if let Some(n) = &nonce {
        message["nonce"] = json!(n);
    }
    if let Some(c) = &components {
        message["components"] = c.clone();
    }
    let reference = body.get("message_reference").cloned();
    if let Some(r) = &reference {
        message["message_reference"] = r.clone();
        message["type"] = json!(19);
    }
    inner
        .channels
        .get_mut(&id)
        .unwrap()
        .messages
        .push(message.clone());
    inner.sent.push(Sent {
        channel: id,
        id: message_id,
        content,
        nonce: nonce.clone(),
        enforce_nonce,
        reply_to: reference.as_ref().and_then(|r| match &r["message_id"] {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }),
        fail_if_not_exists: reference
            .as_ref()
            .and_then(|r| r["fail_if_not_exists"].as_bool()),
        allowed_mentions: body.get("allowed_mentions").cloned(),
        components,
    });
    if let Some(n) = &nonce {
        inner.by_nonce.insert(n.clone(), message.clone());
    }
    // The bot's own messages reach its gateway too.
    dispatch(&mut inner, "MESSAGE_CREATE", &message);
    let lost = matches!(fault, Some(PostFault::LoseResponse));
    inner.posts.push(Post {
        at: Instant::now(),
        channel: id,
        nonce,
        status: if lost { 500 } else { 200 },
        message: Some(message_id),
    });
    drop(inner);
    shared.changed.notify_waiters();
    if lost {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            0,
            "injected: response lost",
        );
    }
    axum::Json(message).into_response()
}

async fn start_thread(
    State(shared): State<Arc<Shared>>,
    Path((channel, message)): Path<(u64, u64)>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut inner = shared.lock();
    inner.thread_calls.push((channel, message));
    if inner.refuse_threads {
        return error(StatusCode::FORBIDDEN, 50013, "Missing Permissions");
    }
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    if name.is_empty() || name.chars().count() > 100 {
        return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body (name)");
    }
    let Some(parent) = inner.channels.get(&channel) else {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    if parent.kind != ChannelKind::Guild {
        return error(
            StatusCode::BAD_REQUEST,
            50024,
            "Cannot execute action on this channel type",
        );
    }
    let exists = parent
        .messages
        .iter()
        .any(|m| m["id"].as_str() == Some(message.to_string().as_str()));
    if !exists {
        return error(StatusCode::NOT_FOUND, 10008, "Unknown Message");
    }
    if inner.channels.contains_key(&message) {
        return error(
            StatusCode::BAD_REQUEST,
            160004,
            "A thread has already been created for this message",
        );
    }
    let guild = parent.guild;
    inner.channels.insert(
        message,
        Channel {
            kind: ChannelKind::Thread,
            guild,
            messages: Vec::new(),
        },
    );
    inner.threads_started.push((channel, message, name.clone()));
    drop(inner);
    shared.changed.notify_waiters();
    axum::Json(json!({
        "id": message.to_string(), "type": ChannelKind::Thread.type_code(),
        "guild_id": guild.map(|g| g.to_string()), "parent_id": channel.to_string(),
        "name": name,
    }))
    .into_response()
}

async fn put_reaction(
    State(shared): State<Arc<Shared>>,
    Path((channel, message, emoji)): Path<(u64, u64, String)>,
) -> Response {
    reaction(&shared, channel, message, emoji, true).await
}

async fn delete_reaction(
    State(shared): State<Arc<Shared>>,
    Path((channel, message, emoji)): Path<(u64, u64, String)>,
) -> Response {
    reaction(&shared, channel, message, emoji, false).await
}

/// A reaction call: recorded with the status it got.
async fn reaction(
    shared: &Shared,
    channel: u64,
    message: u64,
    emoji: String,
    on: bool,
) -> Response {
    let fault = shared.lock().reaction_fault;
    if let Some(ReactionFault::Hang(wait)) = fault {
        tokio::time::sleep(wait).await;
    }
    let mut inner = shared.lock();
    let exists = inner.channels.get(&channel).is_some_and(|c| {
        c.messages
            .iter()
            .any(|m| m["id"].as_str() == Some(message.to_string().as_str()))
    });
    let status = match fault {
        Some(ReactionFault::Fail(status)) => status,
        _ if !exists => 404,
        _ => 204,
    };
    inner.reactions.push(ReactionCall {
        channel,
        message,
        emoji,
        on,
        status,
        at: Instant::now(),
    });
    drop(inner);
    shared.changed.notify_waiters();
    match status {
        204 => StatusCode::NO_CONTENT.into_response(),
        404 => error(StatusCode::NOT_FOUND, 10008, "Unknown Message"),
        status => error(
            StatusCode::from_u16(status).unwrap(),
            0,
            "Internal Server Error",
        ),
    }
}

async fn post_typing(State(shared): State<Arc<Shared>>, Path(id): Path<u64>) -> StatusCode {
    *shared.lock().typing.entry(id).or_default() += 1;
    StatusCode::NO_CONTENT
}

/// One gateway connection.
async fn connection(shared: Arc<Shared>, tcp: tokio::net::TcpStream) {
    let Ok(ws) = tokio_tungstenite::accept_async(tcp).await else {
        return;
    };
    let connection_id = shared.connections.fetch_add(1, Ordering::SeqCst);
    let (mut sink, mut stream) = ws.split();
    let (link, mut commands) = mpsc::unbounded_channel::<Command>();
    let hello = json!({"op": 10, "d": {"heartbeat_interval": 5000}}).to_string();
    if sink.send(Frame::Text(hello)).await.is_err() {
        return;
    }
    let mut session_id: Option<String> = None;
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                Some(Command::Text(text)) => {
                    if sink.send(Frame::Text(text)).await.is_err() {
                        break;
                    }
                }
                Some(Command::Close(code)) => {
                    let _ = sink
                        .send(Frame::Close(Some(CloseFrame {
                            code: CloseCode::from(code),
                            reason: "forced disconnect".into(),
                        })))
                        .await;
                    break;
                }
                None => break,
            },
            frame = stream.next() => match frame {
                Some(Ok(Frame::Text(text))) => {
                    let Ok(payload) = serde_json::from_str::<Value>(&text) else {
                        continue;
                    };
                    match payload["op"].as_u64() {
                        Some(1) if sink.send(Frame::Text(json!({"op": 11}).to_string())).await.is_err() => {
                            break;
                        }
                        Some(2) => {
                            if shared.lock().refuse_identify || !token_ok(&shared, &payload["d"]["token"]) {
                                let _ = sink.send(Frame::Close(Some(CloseFrame {
                                    code: CloseCode::from(4004),
                                    reason: "Authentication failed.".into(),
                                }))).await;
                                break;
                            }
                            let shard = &payload["d"]["shard"];
                            let shard = (shard[0].as_u64().unwrap_or(0), shard[1].as_u64().unwrap_or(1));
                            session_id = Some(identify(&shared, connection_id, &link, shard));
                        }
                        Some(6) => {
                            let d = &payload["d"];
                            if !token_ok(&shared, &d["token"]) {
                                break;
                            }
                            let id = d["session_id"].as_str().unwrap_or("").to_owned();
                            let seq = d["seq"].as_u64().unwrap_or(0);
                            if resume(&shared, &id, seq, connection_id, &link) {
                                session_id = Some(id);
                            } else {
                                let invalid = json!({"op": 9, "d": false}).to_string();
                                if sink.send(Frame::Text(invalid)).await.is_err() {
                                    break;
                                }
                            }
                        }
                        _ => {}
                    }
                }
                Some(Ok(Frame::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    if let Some(id) = session_id {
        let mut inner = shared.lock();
        if let Some(session) = inner.sessions.get_mut(&id)
            && session
                .link
                .as_ref()
                .is_some_and(|(c, _)| *c == connection_id)
        {
            session.link = None;
        }
    }
    shared.changed.notify_waiters();
}

fn token_ok(shared: &Shared, token: &Value) -> bool {
    let token = token.as_str().unwrap_or("");
    token.strip_prefix("Bot ").unwrap_or(token) == shared.token
}

/// Count a session of `shard` going live beside another live one of that shard.
fn note_overlap(inner: &mut Inner, shard: (u64, u64), except: &str) {
    if inner
        .sessions
        .iter()
        .any(|(id, s)| id != except && s.link.is_some() && s.shard == shard)
    {
        inner.shard_overlaps += 1;
    }
}

/// A new session of `shard`: READY.
fn identify(
    shared: &Shared,
    connection: u64,
    link: &mpsc::UnboundedSender<Command>,
    shard: (u64, u64),
) -> String {
    let mut inner = shared.lock();
    inner.identifies += 1;
    inner.identified_shards.push(shard);
    let id = format!("session-{}", inner.identifies);
    let ready = json!({
        "op": 0, "t": "READY", "s": 1,
        "d": {"v": 10, "user": shared.bot_user(), "guilds": [], "session_id": id,
              "resume_gateway_url": shared.gateway_url, "shard": [shard.0, shard.1],
              "application": {"id": BOT_ID.to_string(), "flags": 0}}
    })
    .to_string();
    let _ = link.send(Command::Text(ready.clone()));
    note_overlap(&mut inner, shard, &id);
    inner.sessions.insert(
        id.clone(),
        Session {
            shard,
            seq: 1,
            log: vec![(1, ready)],
            link: Some((connection, link.clone())),
        },
    );
    drop(inner);
    shared.changed.notify_waiters();
    id
}

/// Resume a known session: replay what it missed, then RESUMED. False if refused.
fn resume(
    shared: &Shared,
    id: &str,
    seq: u64,
    connection: u64,
    link: &mpsc::UnboundedSender<Command>,
) -> bool {
    let mut inner = shared.lock();
    if inner.refuse_resume {
        inner.sessions.remove(id);
        return false;
    }
    let Some(session) = inner.sessions.get_mut(id) else {
        return false;
    };
    for (_, frame) in session.log.iter().filter(|(s, _)| *s > seq) {
        let _ = link.send(Command::Text(frame.clone()));
    }
    session.seq += 1;
    let resumed = json!({"op": 0, "t": "RESUMED", "s": session.seq, "d": {}}).to_string();
    session.log.push((session.seq, resumed.clone()));
    let _ = link.send(Command::Text(resumed));
    session.link = Some((connection, link.clone()));
    let shard = session.shard;
    note_overlap(&mut inner, shard, id);
    inner.resumes += 1;
    drop(inner);
    shared.changed.notify_waiters();
    true
}

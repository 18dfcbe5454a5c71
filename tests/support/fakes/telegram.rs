//! A fake Telegram Bot API server on loopback.
//!
//! It serves `/bot<TOKEN>/<method>` with the method name matched case-insensitively
//! (teloxide sends `GetUpdates`, Telegram documents `getUpdates`), and keeps what a
//! test needs to check: the updates queue with Telegram's offset semantics (an
//! update is dropped once a poll carries an offset above its id), long polls that
//! wait for updates or their `timeout`, 409 Conflict for a poll while another is
//! open (counted), every sent message and chat action, and faults on demand (429
//! with `retry_after`, 5xx, HTML it "cannot parse"). It validates HTML the way
//! Telegram does (known tags, nesting, escaped `<`, `>`, `&`) and refuses texts over
//! 4096 characters, so an accepted message is a well-formed one.
//!
//! Webhooks as Telegram serves them: `setWebhook` (`url`, `secret_token` of 1–256
//! characters `A-Z a-z 0-9 _ -`, `allowed_updates`, `drop_pending_updates`; every
//! call recorded), `deleteWebhook`, `getWebhookInfo`, and `getUpdates` refused with 409
//! while a webhook is set. With a webhook set, queued updates are POSTed to it one at
//! a time, oldest first, with `X-Telegram-Bot-Api-Secret-Token`; a 2xx confirms an
//! update, anything else is retried after a pause (every attempt recorded). A test
//! can put a load balancer in front ([`TelegramFake::balance`]: the registered path on
//! several servers in turn) and can forge a request with any secret
//! ([`TelegramFake::forge`]).
//!
//! `sendMessageDraft` (Bot API 9.5) is served as Telegram serves it: private chats
//! only (400 for groups), a non-zero `draft_id`, 1–4096 characters after entity
//! parsing (400 otherwise), the same HTML check as messages; every accepted draft is
//! recorded (chat, draft id, text, time). Faults (a 429 with `retry_after`) are
//! scripted like any method's.
//!
//! Buttons as the Bot API serves them: a sent message's `reply_markup` is recorded
//! (an `inline_keyboard` whose callback buttons carry 1–64 bytes of `callback_data`,
//! else 400 "BUTTON_DATA_INVALID"); a test taps one by queueing a `callback_query`
//! update ([`TelegramFake::push_callback`], [`callback_query`]); `answerCallbackQuery`
//! calls are recorded ([`TelegramFake::callback_answers`]) and can be faulted like
//! any method. `allowed_updates` is honoured as Telegram does: the last list given
//! (to `getUpdates` or `setWebhook`) decides which queued updates are handed out;
//! the others are held back.
//!
//! Reactions and menus as the Bot API serves them: `setMessageReaction` takes at most
//! one emoji reaction of Telegram's list (400 "REACTION_INVALID" otherwise) on a
//! message that exists (400 "message to react not found"); an empty list takes the
//! bot's off. `setMyCommands` takes 1–100 commands (names of 1–32 characters `a-z
//! 0-9 _`, descriptions of 1–256) for a `scope`. Both are recorded
//! ([`TelegramFake::reactions`], [`TelegramFake::command_sets`]) and faulted like any
//! method; [`Fault::Hang`] holds a call before answering it.
//!
//! `getMe` reports the bot's privacy mode (`can_read_all_group_messages`, false
//! unless [`TelegramFake::set_privacy_mode`] turned it off).
//!
//! Files as the Bot API serves them: a test stores bytes under a `file_id`
//! ([`TelegramFake::add_file`]); `getFile` answers its `file_path` and `file_size`
//! (400 "invalid file_id" for an unknown one), and `/file/bot<TOKEN>/<path>` serves the
//! bytes as `application/octet-stream` (every download recorded).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

pub(crate) const BOT_ID: i64 = 7_000_001;
pub(crate) const BOT_USERNAME: &str = "lull_test_bot";

/// A sent message (sendMessage or editMessageText) as the fake recorded it.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub method: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub text: String,
    pub parse_mode: Option<String>,
    pub reply_to: Option<i64>,
    pub allow_without_reply: bool,
    pub message_id: i64,
    /// The `reply_markup` sent with it (an inline keyboard), if any.
    pub reply_markup: Option<Value>,
    pub at: Instant,
}

impl Sent {
    /// `(text, callback_data)` of every button of its inline keyboard, row by row.
    pub(crate) fn buttons(&self) -> Vec<(String, String)> {
        let Some(markup) = &self.reply_markup else {
            return Vec::new();
        };
        markup["inline_keyboard"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|row| row.as_array().cloned().unwrap_or_default())
            .map(|b| {
                (
                    b["text"].as_str().unwrap_or_default().to_owned(),
                    b["callback_data"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

impl Sent {
    /// The text the user sees (entities parsed).
    pub(crate) fn visible(&self) -> String {
        visible_text(&self.text, self.parse_mode.as_deref()).expect("accepted messages parse")
    }
}

/// A draft (sendMessageDraft) as the fake recorded it.
#[derive(Debug, Clone)]
pub(crate) struct DraftSent {
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub draft_id: i64,
    pub text: String,
    pub parse_mode: Option<String>,
    pub at: Instant,
}

impl DraftSent {
    /// The text the user sees (entities parsed).
    pub(crate) fn visible(&self) -> String {
        visible_text(&self.text, self.parse_mode.as_deref()).expect("accepted drafts parse")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ChatActionSent {
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub action: String,
    pub at: Instant,
}

/// One `setMessageReaction` call as the fake accepted it.
#[derive(Debug, Clone)]
pub(crate) struct ReactionSet {
    pub chat_id: i64,
    pub message_id: i64,
    /// The emoji set; `None`: the bot's reaction taken off.
    pub emoji: Option<String>,
    pub at: Instant,
}

/// One `setMyCommands` call as the fake accepted it.
#[derive(Debug, Clone)]
pub(crate) struct CommandsSet {
    /// The `scope` object (`{"type": "default"}` when none was given).
    pub scope: Value,
    /// `(command, description)` pairs, in order.
    pub commands: Vec<(String, String)>,
}

/// The emoji Telegram takes as reactions (a part of its list: the ones tests use and
/// a few more).
const REACTIONS: [&str; 10] = ["👀", "👍", "👎", "❤", "🔥", "🎉", "🤔", "👌", "🙏", "✍"];

/// One getUpdates call.
#[derive(Debug, Clone)]
pub(crate) struct PollRecord {
    pub offset: Option<i64>,
    pub timeout: u64,
    pub started: Instant,
    /// HTTP status it was answered with (0 while open).
    pub status: u16,
    pub returned: Vec<i64>,
}

/// One `setWebhook` call as the fake accepted it.
#[derive(Debug, Clone)]
pub(crate) struct WebhookSet {
    pub url: String,
    pub secret_token: Option<String>,
    pub allowed_updates: Option<Vec<String>>,
    pub drop_pending_updates: bool,
}

/// One POST of an update to the webhook and the status it got (0: no answer).
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub update_id: i64,
    pub target: String,
    pub status: u16,
    pub at: Instant,
}

/// Pause before a webhook delivery that failed is tried again.
const REDELIVERY_PAUSE: Duration = Duration::from_millis(300);

/// A fault to answer a method's next call with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    /// 429 with `parameters.retry_after` seconds.
    TooManyRequests(u64),
    /// A server error with this status.
    ServerError(u16),
    /// 200 with a body that is not JSON (a proxy's error page).
    Garbage,
    /// 403: the user blocked the bot.
    Blocked,
    /// No answer for this long, then answered as usual (a hanging server).
    Hang(Duration),
    /// Answered as usual: scripts a fault for a later call (`[Pass, TooManyRequests]`
    /// fails the second call).
    Pass,
}

#[derive(Default)]
struct FakeState {
    /// (update_id, update JSON), oldest first.
    queue: Vec<(i64, Value)>,
    next_update_id: i64,
    /// The highest offset any poll carried: updates below it are confirmed.
    confirmed_below: i64,
    /// Update ids handed out by some poll.
    served: HashSet<i64>,
    sent: Vec<Sent>,
    drafts: Vec<DraftSent>,
    actions: Vec<ChatActionSent>,
    next_message_id: i64,
    /// (chat, message id) of every message that exists (injected or sent).
    messages: HashSet<(i64, i64)>,
    faults: HashMap<String, VecDeque<Fault>>,
    reject_html: bool,
    polls: Vec<PollRecord>,
    open_polls: usize,
    conflicts: usize,
    calls: Vec<(String, Instant)>,
    /// (method, time) of every call answered with a fault.
    faulted: Vec<(String, Instant)>,
    /// The webhook set now, if any.
    webhook: Option<WebhookSet>,
    /// Every accepted `setWebhook`, in order.
    webhook_sets: Vec<WebhookSet>,
    /// Base URLs (`http://host:port`) deliveries go to in turn, with the registered
    /// URL's path: a load balancer in front of several processes. Empty: the
    /// registered URL itself.
    balance: Vec<String>,
    deliveries: Vec<Delivery>,
    /// file_id → bytes (see [`TelegramFake::add_file`]).
    files: HashMap<String, Vec<u8>>,
    /// The `file_path` of every download served, in order.
    downloads: Vec<String>,
    /// `(callback_query_id, time)` of every `answerCallbackQuery` answered ok.
    callback_answers: Vec<(String, Instant)>,
    /// The last `allowed_updates` given to `getUpdates` (None: every kind).
    poll_allowed: Option<Vec<String>>,
    /// Every accepted `setMessageReaction`, in order.
    reactions: Vec<ReactionSet>,
    /// Every accepted `setMyCommands`, in order.
    command_sets: Vec<CommandsSet>,
    /// What `getMe` reports as `can_read_all_group_messages`: the bot's privacy mode
    /// is off (see [`TelegramFake::set_privacy_mode`]).
    reads_all_group_messages: bool,
}

struct Inner {
    token: String,
    state: Mutex<FakeState>,
    changed: Notify,
}

/// The fake; dropping it stops the server.
pub(crate) struct TelegramFake {
    pub url: String,
    pub token: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl TelegramFake {
    pub(crate) async fn start() -> TelegramFake {
        // A token shaped like a real one (digits, colon, 35 characters), unique per
        // fake so a test can search logs for it.
        let secret: String = std::iter::repeat_with(fastrand::alphanumeric)
            .take(35)
            .collect();
        let token = format!("{BOT_ID}:{secret}");
        let inner = Arc::new(Inner {
            token: token.clone(),
            state: Mutex::new(FakeState {
                next_update_id: 500_000,
                next_message_id: 900_000,
                ..FakeState::default()
            }),
            changed: Notify::new(),
        });
        let router = Router::new()
            .route("/{bot}/{method}", post(handle).get(handle_get))
            .route("/file/{bot}/{*path}", axum::routing::get(download))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let deliverer = inner.clone();
        let server = tokio::spawn(async move {
            let delivering = tokio::spawn(deliver(deliverer));
            axum::serve(listener, router).await.unwrap();
            delivering.abort();
        });
        TelegramFake {
            url: format!("http://{addr}"),
            token,
            inner,
            _server: server,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.inner.state.lock().unwrap()
    }

    /// Serve `bytes` as the file `file_id` (`getFile` and a download).
    pub(crate) fn add_file(&self, file_id: &str, bytes: Vec<u8>) {
        self.state().files.insert(file_id.to_owned(), bytes);
    }

    /// The `file_path`s downloaded so far, in order.
    pub(crate) fn downloads(&self) -> Vec<String> {
        self.state().downloads.clone()
    }

    /// Queue an update of `kind` (`message`, `edited_message`) carrying `message`;
    /// returns its update id.
    pub(crate) fn push(&self, kind: &str, message: Value) -> i64 {
        {
            let mut s = self.state();
            let chat = message["chat"]["id"].as_i64().unwrap();
            let msg = message["message_id"].as_i64().unwrap();
            s.messages.insert((chat, msg));
        }
        self.push_update(kind, message)
    }

    /// Queue an update of any `kind` carrying `payload` as is; returns its update id.
    fn push_update(&self, kind: &str, payload: Value) -> i64 {
        let id = {
            let mut s = self.state();
            let id = s.next_update_id;
            s.next_update_id += 1;
            s.queue
                .push((id, json!({ "update_id": id, kind: payload })));
            id
        };
        self.inner.changed.notify_waiters();
        id
    }

    /// Queue a `callback_query` update (a tapped button, see [`callback_query`]);
    /// returns its update id. Queueing the same query twice is Telegram delivering it
    /// again.
    pub(crate) fn push_callback(&self, query: Value) -> i64 {
        self.push_update("callback_query", query)
    }

    /// Every accepted `setMessageReaction`, in order.
    pub(crate) fn reactions(&self) -> Vec<ReactionSet> {
        self.state().reactions.clone()
    }

    /// Every accepted `setMyCommands`, in order.
    pub(crate) fn command_sets(&self) -> Vec<CommandsSet> {
        self.state().command_sets.clone()
    }

    /// The `callback_query_id`s `answerCallbackQuery` was called with (and answered
    /// ok), in order.
    pub(crate) fn callback_answers(&self) -> Vec<String> {
        self.state()
            .callback_answers
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub(crate) fn push_message(&self, message: Value) -> i64 {
        self.push("message", message)
    }

    /// Answer the next `times` calls of `method` with `fault`.
    pub(crate) fn fail(&self, method: &str, fault: Fault, times: usize) {
        let mut s = self.state();
        let queue = s.faults.entry(method.to_ascii_lowercase()).or_default();
        queue.extend(std::iter::repeat_n(fault, times));
    }

    /// The bot's privacy mode as `getMe` reports it (on: `can_read_all_group_messages`
    /// is false, Telegram's default). The fake hands out whatever is queued either way.
    pub(crate) fn set_privacy_mode(&self, on: bool) {
        self.state().reads_all_group_messages = !on;
    }

    /// Refuse every HTML message with 400 "can't parse entities".
    pub(crate) fn reject_html(&self, reject: bool) {
        self.state().reject_html = reject;
    }

    /// Forget a message, as if it was deleted (quoting it then fails).
    pub(crate) fn delete_message(&self, chat: i64, message_id: i64) {
        self.state().messages.remove(&(chat, message_id));
    }

    pub(crate) fn sent(&self) -> Vec<Sent> {
        self.state().sent.clone()
    }

    pub(crate) fn sent_to(&self, chat: i64) -> Vec<Sent> {
        self.sent()
            .into_iter()
            .filter(|s| s.chat_id == chat)
            .collect()
    }

    pub(crate) fn actions(&self) -> Vec<ChatActionSent> {
        self.state().actions.clone()
    }

    /// Drafts accepted for `chat`, in order.
    pub(crate) fn drafts_to(&self, chat: i64) -> Vec<DraftSent> {
        self.state()
            .drafts
            .iter()
            .filter(|d| d.chat_id == chat)
            .cloned()
            .collect()
    }

    /// Every Bot API call but polling (getUpdates), with its method: what answering
    /// costs.
    pub(crate) fn calls_except_polling(&self) -> Vec<(String, Instant)> {
        self.state()
            .calls
            .iter()
            .filter(|(m, _)| m != "getupdates")
            .cloned()
            .collect()
    }

    pub(crate) fn polls(&self) -> Vec<PollRecord> {
        self.state().polls.clone()
    }

    /// Polls answered with 409 because another was open.
    pub(crate) fn conflicts(&self) -> usize {
        self.state().conflicts
    }

    /// Every update below this id is confirmed.
    pub(crate) fn confirmed_below(&self) -> i64 {
        self.state().confirmed_below
    }

    pub(crate) fn was_served(&self, update_id: i64) -> bool {
        self.state().served.contains(&update_id)
    }

    /// Calls of a method (case-insensitive), with their times.
    pub(crate) fn calls(&self, method: &str) -> Vec<Instant> {
        let method = method.to_ascii_lowercase();
        self.state()
            .calls
            .iter()
            .filter(|(m, _)| *m == method)
            .map(|(_, at)| *at)
            .collect()
    }

    /// Calls of a method answered with a fault, with their times.
    pub(crate) fn faulted(&self, method: &str) -> Vec<Instant> {
        let method = method.to_ascii_lowercase();
        self.state()
            .faulted
            .iter()
            .filter(|(m, _)| *m == method)
            .map(|(_, at)| *at)
            .collect()
    }

    /// The webhook set now.
    pub(crate) fn webhook(&self) -> Option<WebhookSet> {
        self.state().webhook.clone()
    }

    /// Every accepted `setWebhook`, in order.
    pub(crate) fn webhook_sets(&self) -> Vec<WebhookSet> {
        self.state().webhook_sets.clone()
    }

    /// Deliver to these servers in turn (the registered path on each), as a load
    /// balancer in front of them would.
    pub(crate) fn balance(&self, bases: &[String]) {
        self.state().balance = bases.to_vec();
        self.inner.changed.notify_waiters();
    }

    /// Every webhook delivery attempt.
    pub(crate) fn deliveries(&self) -> Vec<Delivery> {
        self.state().deliveries.clone()
    }

    /// POST an update carrying `message` to the registered webhook URL with
    /// `secret` in the secret-token header (none: no header), outside the queue, as
    /// a forger would; returns the status.
    pub(crate) async fn forge(&self, message: Value, secret: Option<&str>) -> u16 {
        let url = self.webhook().expect("a webhook is set").url;
        let update = json!({"update_id": 1, "message": message});
        let mut request = reqwest::Client::new().post(url).json(&update);
        if let Some(secret) = secret {
            request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
        }
        request.send().await.unwrap().status().as_u16()
    }

    /// Wait until `check` holds on the fake's state (re-checked on every change and
    /// every 50 ms); panics after `limit` with `what`.
    pub(crate) async fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(value) = check(self) {
                return value;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "{what}: not within {limit:?}; sent so far: {:#?}",
                    self.sent()
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
    }

    /// Wait until `n` messages were sent to `chat`; returns them.
    pub(crate) async fn wait_sent(&self, chat: i64, n: usize, limit: Duration) -> Vec<Sent> {
        self.wait_for(&format!("{n} message(s) to chat {chat}"), limit, |f| {
            let sent = f.sent_to(chat);
            (sent.len() >= n).then_some(sent)
        })
        .await
    }
}

fn ok(result: Value) -> Response {
    (
        StatusCode::OK,
        axum::Json(json!({"ok": true, "result": result})),
    )
        .into_response()
}

fn error(status: StatusCode, description: &str) -> Response {
    (
        status,
        axum::Json(json!({"ok": false, "error_code": status.as_u16(), "description": description})),
    )
        .into_response()
}

fn fault_response(fault: Fault) -> Response {
    match fault {
        Fault::TooManyRequests(secs) => (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({
                "ok": false, "error_code": 429,
                "description": format!("Too Many Requests: retry after {secs}"),
                "parameters": {"retry_after": secs},
            })),
        )
            .into_response(),
        Fault::ServerError(status) => error(
            StatusCode::from_u16(status).unwrap(),
            if status == 502 {
                "Bad Gateway"
            } else {
                "Internal Server Error"
            },
        ),
        Fault::Garbage => (StatusCode::OK, "<html>upstream unavailable</html>").into_response(),
        Fault::Blocked => error(
            StatusCode::FORBIDDEN,
            "Forbidden: bot was blocked by the user",
        ),
        Fault::Pass | Fault::Hang(_) => unreachable!("answered as usual"),
    }
}

pub(crate) fn bot_user() -> Value {
    json!({"id": BOT_ID, "is_bot": true, "first_name": "lull", "username": BOT_USERNAME})
}

/// A chat object for an id: positive ids are private chats, negative ones
/// supergroups (forums when `forum`).
pub(crate) fn chat(id: i64, forum: bool) -> Value {
    if id > 0 {
        json!({"id": id, "type": "private", "first_name": "User"})
    } else if forum {
        json!({"id": id, "type": "supergroup", "title": "Group", "is_forum": true})
    } else {
        json!({"id": id, "type": "supergroup", "title": "Group"})
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn handle_get(state: State<Arc<Inner>>, path: Path<(String, String)>) -> Response {
    handle(
        state,
        path,
        axum::http::HeaderMap::new(),
        axum::body::Bytes::new(),
    )
    .await
}

/// The fields of a `multipart/form-data` body (teloxide sends methods that can upload
/// a file, such as `setWebhook`, that way): arrays, objects and booleans as JSON,
/// everything else as text.
fn form_fields(body: &[u8], boundary: &str) -> Option<Value> {
    let body = std::str::from_utf8(body).ok()?;
    let mut fields = serde_json::Map::new();
    for part in body.split(&format!("--{boundary}")) {
        let Some((head, value)) = part.split_once("\r\n\r\n") else {
            continue;
        };
        let Some(name) = head
            .split("name=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let value = value.strip_suffix("\r\n").unwrap_or(value);
        let parsed = match value {
            "true" | "false" => serde_json::from_str(value).ok(),
            v if v.starts_with('[') || v.starts_with('{') => serde_json::from_str(v).ok(),
            _ => None,
        };
        fields.insert(name.to_owned(), parsed.unwrap_or_else(|| json!(value)));
    }
    Some(Value::Object(fields))
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    Path((bot, method)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if bot.strip_prefix("bot") != Some(inner.token.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    let method = method.to_ascii_lowercase();
    let boundary = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.starts_with("multipart/form-data"))
        .and_then(|v| v.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_owned());
    let params: Value = if body.is_empty() {
        json!({})
    } else if let Some(boundary) = boundary {
        match form_fields(&body, &boundary) {
            Some(v) => v,
            None => return error(StatusCode::BAD_REQUEST, "Bad Request: invalid form"),
        }
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => return error(StatusCode::BAD_REQUEST, "Bad Request: invalid JSON"),
        }
    };
    let fault = {
        let mut s = inner.state.lock().unwrap();
        s.calls.push((method.clone(), Instant::now()));
        s.faults.get_mut(&method).and_then(VecDeque::pop_front)
    };
    if let Some(Fault::Hang(wait)) = fault {
        tokio::time::sleep(wait).await;
    }
    if let Some(fault) = fault.filter(|f| !matches!(f, Fault::Pass | Fault::Hang(_))) {
        inner
            .state
            .lock()
            .unwrap()
            .faulted
            .push((method.clone(), Instant::now()));
        return fault_response(fault);
    }
    match method.as_str() {
        "getme" => ok(json!({
            "id": BOT_ID, "is_bot": true, "first_name": "lull", "username": BOT_USERNAME,
            "can_join_groups": true,
            "can_read_all_group_messages": inner.state.lock().unwrap().reads_all_group_messages,
            "supports_inline_queries": false, "can_connect_to_business": false,
            "has_main_web_app": false,
        })),
        "getwebhookinfo" => {
            let s = inner.state.lock().unwrap();
            let url = s
                .webhook
                .as_ref()
                .map(|w| w.url.clone())
                .unwrap_or_default();
            ok(
                json!({"url": url, "has_custom_certificate": false, "pending_update_count": s.queue.len()}),
            )
        }
        "setwebhook" => set_webhook(&inner, &params),
        "getfile" => {
            let file_id = params["file_id"].as_str().unwrap_or_default().to_owned();
            let size = inner
                .state
                .lock()
                .unwrap()
                .files
                .get(&file_id)
                .map(Vec::len);
            match size {
                Some(size) => ok(json!({
                    "file_id": file_id, "file_unique_id": format!("u{file_id}"),
                    "file_size": size, "file_path": format!("photos/{file_id}.jpg"),
                })),
                None => error(StatusCode::BAD_REQUEST, "Bad Request: invalid file_id"),
            }
        }
        "deletewebhook" => {
            let mut s = inner.state.lock().unwrap();
            s.webhook = None;
            if params["drop_pending_updates"].as_bool() == Some(true) {
                s.queue.clear();
            }
            ok(json!(true))
        }
        "getupdates" if inner.state.lock().unwrap().webhook.is_some() => error(
            StatusCode::CONFLICT,
            "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
        ),
        "getupdates" => get_updates(inner, params).await,
        "sendmessage" | "editmessagetext" => send_message(&inner, &method, &params),
        "sendmessagedraft" => send_message_draft(&inner, &params),
        "answercallbackquery" => {
            let Some(id) = params["callback_query_id"].as_str() else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: callback_query_id is empty",
                );
            };
            inner
                .state
                .lock()
                .unwrap()
                .callback_answers
                .push((id.to_owned(), Instant::now()));
            inner.changed.notify_waiters();
            ok(json!(true))
        }
        "setmessagereaction" => set_message_reaction(&inner, &params),
        "setmycommands" => set_my_commands(&inner, &params),
        "sendchataction" => {
            let mut s = inner.state.lock().unwrap();
            s.actions.push(ChatActionSent {
                chat_id: params["chat_id"].as_i64().unwrap_or_default(),
                thread_id: params["message_thread_id"].as_i64(),
                action: params["action"].as_str().unwrap_or_default().to_owned(),
                at: Instant::now(),
            });
            drop(s);
            inner.changed.notify_waiters();
            ok(json!(true))
        }
        _ => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// `setMessageReaction`: at most one emoji of [`REACTIONS`] on a message that exists.
fn set_message_reaction(inner: &Inner, params: &Value) -> Response {
    let chat_id = params["chat_id"].as_i64().unwrap_or_default();
    let message_id = params["message_id"].as_i64().unwrap_or_default();
    let reactions = params["reaction"].as_array().cloned().unwrap_or_default();
    if reactions.len() > 1 {
        return error(StatusCode::BAD_REQUEST, "Bad Request: REACTIONS_TOO_MANY");
    }
    let emoji = match reactions.first() {
        None => None,
        Some(r)
            if r["type"] == "emoji" && REACTIONS.contains(&r["emoji"].as_str().unwrap_or("")) =>
        {
            r["emoji"].as_str().map(str::to_owned)
        }
        Some(_) => return error(StatusCode::BAD_REQUEST, "Bad Request: REACTION_INVALID"),
    };
    let mut s = inner.state.lock().unwrap();
    if !s.messages.contains(&(chat_id, message_id)) {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message to react not found",
        );
    }
    s.reactions.push(ReactionSet {
        chat_id,
        message_id,
        emoji,
        at: Instant::now(),
    });
    drop(s);
    inner.changed.notify_waiters();
    ok(json!(true))
}

/// `setMyCommands`: 1–100 commands, names of 1–32 characters `a-z 0-9 _`,
/// descriptions of 1–256 characters.
fn set_my_commands(inner: &Inner, params: &Value) -> Response {
    let commands: Vec<(String, String)> = params["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["command"].as_str().unwrap_or_default().to_owned(),
                c["description"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let valid = (1..=100).contains(&commands.len())
        && commands.iter().all(|(name, description)| {
            (1..=32).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && (1..=256).contains(&description.chars().count())
        });
    if !valid {
        return error(StatusCode::BAD_REQUEST, "Bad Request: BOT_COMMAND_INVALID");
    }
    let scope = match &params["scope"] {
        Value::Null => json!({"type": "default"}),
        scope => scope.clone(),
    };
    inner
        .state
        .lock()
        .unwrap()
        .command_sets
        .push(CommandsSet { scope, commands });
    inner.changed.notify_waiters();
    ok(json!(true))
}

/// `/file/bot<TOKEN>/<path>`: the bytes of a file `getFile` named.
async fn download(
    State(inner): State<Arc<Inner>>,
    Path((bot, path)): Path<(String, String)>,
) -> Response {
    if bot.strip_prefix("bot") != Some(inner.token.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    let mut s = inner.state.lock().unwrap();
    let file_id = path
        .strip_prefix("photos/")
        .and_then(|p| p.strip_suffix(".jpg"))
        .unwrap_or_default();
    match s.files.get(file_id).cloned() {
        Some(bytes) => {
            s.downloads.push(path);
            (
                [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
                bytes,
            )
                .into_response()
        }
        None => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// `setWebhook`, checked as Telegram checks it (a secret token of 1–256 characters
/// `A-Z a-z 0-9 _ -`; an https URL, or http on loopback for tests).
fn set_webhook(inner: &Inner, params: &Value) -> Response {
    let url = params["url"].as_str().unwrap_or_default().to_owned();
    if url.is_empty() {
        inner.state.lock().unwrap().webhook = None;
        return ok(json!(true));
    }
    if !(url.starts_with("https://") || url.starts_with("http://127.0.0.1:")) {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: bad webhook: An HTTPS URL must be provided for webhook",
        );
    }
    let secret_token = params["secret_token"].as_str().map(str::to_owned);
    if let Some(secret) = &secret_token
        && (secret.is_empty()
            || secret.len() > 256
            || !secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: secret token contains unallowed characters",
        );
    }
    let set = WebhookSet {
        url,
        secret_token,
        allowed_updates: params["allowed_updates"].as_array().map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        }),
        drop_pending_updates: params["drop_pending_updates"].as_bool() == Some(true),
    };
    let mut s = inner.state.lock().unwrap();
    if set.drop_pending_updates {
        s.queue.clear();
    }
    s.webhook = Some(set.clone());
    s.webhook_sets.push(set);
    drop(s);
    inner.changed.notify_waiters();
    ok(json!(true))
}

/// The webhook deliverer: while a webhook is set, POST the oldest queued update to it
/// (or to the next balanced server) until it is answered 2xx, then the next.
async fn deliver(inner: Arc<Inner>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut turn = 0usize;
    loop {
        let notified = inner.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = {
            let s = inner.state.lock().unwrap();
            let allowed = s.webhook.as_ref().and_then(|h| h.allowed_updates.clone());
            s.webhook
                .clone()
                .zip(
                    s.queue
                        .iter()
                        .find(|(_, u)| kind_allowed(allowed.as_deref(), u))
                        .cloned(),
                )
                .map(|(hook, update)| {
                    let target = if s.balance.is_empty() {
                        hook.url.clone()
                    } else {
                        let path = hook
                            .url
                            .splitn(4, '/')
                            .nth(3)
                            .map(|p| format!("/{p}"))
                            .unwrap_or_default();
                        format!("{}{path}", s.balance[turn % s.balance.len()])
                    };
                    (hook, update, target)
                })
        };
        let Some((hook, (id, update), target)) = next else {
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            continue;
        };
        turn += 1;
        let mut request = client.post(&target).json(&update);
        if let Some(secret) = &hook.secret_token {
            request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
        }
        let status = match request.send().await {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        };
        {
            let mut s = inner.state.lock().unwrap();
            s.served.insert(id);
            s.deliveries.push(Delivery {
                update_id: id,
                target,
                status,
                at: Instant::now(),
            });
            if (200..300).contains(&status) {
                s.queue.retain(|(queued, _)| *queued != id);
                s.confirmed_below = s.confirmed_below.max(id + 1);
            }
        }
        inner.changed.notify_waiters();
        if !(200..300).contains(&status) {
            tokio::time::sleep(REDELIVERY_PAUSE).await;
        }
    }
}

/// Marks the poll closed however its handler ends (answered, or dropped because
/// the client went away).
struct OpenPoll(Arc<Inner>);

impl Drop for OpenPoll {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().open_polls -= 1;
    }
}

async fn get_updates(inner: Arc<Inner>, params: Value) -> Response {
    let offset = params["offset"].as_i64();
    let timeout = params["timeout"].as_u64().unwrap_or(0);
    if let Some(allowed) = params["allowed_updates"].as_array() {
        inner.state.lock().unwrap().poll_allowed = Some(
            allowed
                .iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect(),
        );
    }
    let limit = params["limit"].as_u64().unwrap_or(100).clamp(1, 100) as usize;
    let index = {
        let mut s = inner.state.lock().unwrap();
        if s.open_polls > 0 {
            // Telegram: one getUpdates per token at a time.
            s.conflicts += 1;
            s.polls.push(PollRecord {
                offset,
                timeout,
                started: Instant::now(),
                status: 409,
                returned: Vec::new(),
            });
            return error(
                StatusCode::CONFLICT,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
            );
        }
        s.open_polls += 1;
        if let Some(offset) = offset.filter(|&o| o > 0) {
            // Everything below the offset is confirmed and forgotten.
            s.queue.retain(|(id, _)| *id >= offset);
            s.confirmed_below = s.confirmed_below.max(offset);
        }
        s.polls.push(PollRecord {
            offset,
            timeout,
            started: Instant::now(),
            status: 0,
            returned: Vec::new(),
        });
        s.polls.len() - 1
    };
    let _open = OpenPoll(inner.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    loop {
        let notified = inner.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut s = inner.state.lock().unwrap();
            let from = offset.filter(|&o| o > 0).unwrap_or(i64::MIN);
            let allowed = s.poll_allowed.clone();
            let updates: Vec<(i64, Value)> = s
                .queue
                .iter()
                .filter(|(id, u)| *id >= from && kind_allowed(allowed.as_deref(), u))
                .take(limit)
                .cloned()
                .collect();
            if !updates.is_empty() || tokio::time::Instant::now() >= deadline {
                let ids: Vec<i64> = updates.iter().map(|(id, _)| *id).collect();
                s.served.extend(ids.iter().copied());
                s.polls[index].status = 200;
                s.polls[index].returned = ids;
                drop(s);
                inner.changed.notify_waiters();
                return ok(Value::Array(updates.into_iter().map(|(_, u)| u).collect()));
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

/// Whether an update's kind is in `allowed` (None: every kind). Telegram holds back
/// the kinds a bot did not ask for.
fn kind_allowed(allowed: Option<&[String]>, update: &Value) -> bool {
    allowed.is_none_or(|allowed| {
        update
            .as_object()
            .is_some_and(|o| o.keys().any(|k| k != "update_id" && allowed.contains(k)))
    })
}

/// The text a reader sees of `text` in `parse_mode`, or why Telegram refuses it.
fn visible_text(text: &str, parse_mode: Option<&str>) -> Result<String, String> {
    if parse_mode.is_some_and(|m| m.eq_ignore_ascii_case("html")) {
        html_visible_text(text)
    } else {
        Ok(text.to_owned())
    }
}

fn send_message_draft(inner: &Inner, params: &Value) -> Response {
    let Some(chat_id) = params["chat_id"].as_i64() else {
        return error(StatusCode::BAD_REQUEST, "Bad Request: chat_id is empty");
    };
    if chat_id < 0 {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: drafts can be sent to private chats only",
        );
    }
    let draft_id = params["draft_id"].as_i64().unwrap_or_default();
    if draft_id == 0 {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: draft_id must be non-zero",
        );
    }
    let text = params["text"].as_str().unwrap_or_default().to_owned();
    let parse_mode = params["parse_mode"].as_str().map(str::to_owned);
    let mut s = inner.state.lock().unwrap();
    if s.reject_html && parse_mode.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: can't parse entities: Unsupported start tag \"b\" at byte offset 0",
        );
    }
    let visible = match visible_text(&text, parse_mode.as_deref()) {
        Ok(visible) => visible,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("Bad Request: can't parse entities: {e}"),
            );
        }
    };
    if visible.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: text must be non-empty",
        );
    }
    if visible.encode_utf16().count() > 4096 {
        return error(StatusCode::BAD_REQUEST, "Bad Request: text is too long");
    }
    s.drafts.push(DraftSent {
        chat_id,
        thread_id: params["message_thread_id"].as_i64(),
        draft_id,
        text,
        parse_mode,
        at: Instant::now(),
    });
    drop(s);
    inner.changed.notify_waiters();
    ok(json!(true))
}

fn send_message(inner: &Inner, method: &str, params: &Value) -> Response {
    let chat_id = match &params["chat_id"] {
        Value::Number(n) => n.as_i64().unwrap_or_default(),
        Value::String(s) => s.parse().unwrap_or_default(),
        _ => return error(StatusCode::BAD_REQUEST, "Bad Request: chat_id is empty"),
    };
    let text = params["text"].as_str().unwrap_or_default().to_owned();
    let parse_mode = params["parse_mode"].as_str().map(str::to_owned);
    let thread_id = params["message_thread_id"].as_i64();
    let reply_to = params["reply_parameters"]["message_id"].as_i64();
    let allow_without_reply = params["reply_parameters"]["allow_sending_without_reply"]
        .as_bool()
        .unwrap_or(false);
    let mut s = inner.state.lock().unwrap();
    let html = parse_mode
        .as_deref()
        .is_some_and(|m| m.eq_ignore_ascii_case("html"));
    let visible = if html {
        if s.reject_html {
            return error(
                StatusCode::BAD_REQUEST,
                "Bad Request: can't parse entities: Unsupported start tag \"b\" at byte offset 0",
            );
        }
        match html_visible_text(&text) {
            Ok(visible) => visible,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("Bad Request: can't parse entities: {e}"),
                );
            }
        }
    } else {
        text.clone()
    };
    if visible.trim().is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message text is empty",
        );
    }
    if visible.encode_utf16().count() > 4096 {
        return error(StatusCode::BAD_REQUEST, "Bad Request: message is too long");
    }
    let reply_markup = params.get("reply_markup").cloned();
    if let Some(markup) = &reply_markup {
        let rows = markup["inline_keyboard"].as_array();
        let valid = rows.is_some_and(|rows| {
            rows.iter().all(|row| {
                row.as_array().is_some_and(|row| {
                    row.iter().all(|b| {
                        b["text"].as_str().is_some_and(|t| !t.is_empty())
                            && b["callback_data"]
                                .as_str()
                                .is_none_or(|d| (1..=64).contains(&d.len()))
                    })
                })
            })
        });
        if !valid {
            return error(StatusCode::BAD_REQUEST, "Bad Request: BUTTON_DATA_INVALID");
        }
    }
    if let Some(reply_to) = reply_to
        && !allow_without_reply
        && !s.messages.contains(&(chat_id, reply_to))
    {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message to be replied not found",
        );
    }
    let message_id = if method == "editmessagetext" {
        params["message_id"].as_i64().unwrap_or_default()
    } else {
        s.next_message_id += 1;
        s.next_message_id
    };
    s.messages.insert((chat_id, message_id));
    s.sent.push(Sent {
        method: method.to_owned(),
        chat_id,
        thread_id,
        text: text.clone(),
        parse_mode,
        reply_to,
        allow_without_reply,
        message_id,
        reply_markup,
        at: Instant::now(),
    });
    drop(s);
    inner.changed.notify_waiters();
    let mut message = json!({
        "message_id": message_id,
        "date": now_secs(),
        "chat": chat(chat_id, thread_id.is_some()),
        "from": bot_user(),
        "text": visible,
    });
    if let Some(thread) = thread_id {
        message["message_thread_id"] = json!(thread);
        message["is_topic_message"] = json!(true);
    }
    ok(message)
}

/// The text a reader sees, or why Telegram would refuse the HTML: only its tags,
/// properly nested, `<`, `>` and `&` escaped.
pub(crate) fn html_visible_text(html: &str) -> Result<String, String> {
    const TAGS: &[&str] = &[
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "span",
        "tg-spoiler",
        "a",
        "code",
        "pre",
        "blockquote",
        "tg-emoji",
    ];
    let mut visible = String::new();
    let mut stack: Vec<String> = Vec::new();
    let mut i = 0;
    while i < html.len() {
        let rest = &html[i..];
        let c = rest.chars().next().unwrap();
        match c {
            '<' => {
                let end = rest
                    .find('>')
                    .ok_or_else(|| format!("unclosed tag at byte offset {i}"))?;
                let tag = &rest[1..end];
                if let Some(name) = tag.strip_prefix('/') {
                    let open = stack
                        .pop()
                        .ok_or_else(|| format!("unexpected end tag at byte offset {i}"))?;
                    if open != name.trim() {
                        return Err(format!(
                            "can't find end tag corresponding to start tag \"{open}\""
                        ));
                    }
                } else {
                    let name = tag.split_whitespace().next().unwrap_or("");
                    if !TAGS.contains(&name) {
                        return Err(format!(
                            "Unsupported start tag \"{name}\" at byte offset {i}"
                        ));
                    }
                    stack.push(name.to_owned());
                }
                i += end + 1;
            }
            '>' => return Err(format!("unescaped '>' at byte offset {i}")),
            '&' => {
                let end = rest
                    .find(';')
                    .filter(|&e| e <= 8)
                    .ok_or_else(|| format!("unescaped '&' at byte offset {i}"))?;
                let entity = &rest[1..end];
                let ch = match entity {
                    "lt" => '<',
                    "gt" => '>',
                    "amp" => '&',
                    "quot" => '"',
                    e if e.starts_with('#') => e[1..]
                        .parse::<u32>()
                        .ok()
                        .and_then(char::from_u32)
                        .ok_or_else(|| format!("bad entity at byte offset {i}"))?,
                    _ => return Err(format!("unsupported entity at byte offset {i}")),
                };
                visible.push(ch);
                i += end + 1;
            }
            c => {
                visible.push(c);
                i += c.len_utf8();
            }
        }
    }
    if let Some(open) = stack.pop() {
        return Err(format!(
            "can't find end tag corresponding to start tag \"{open}\""
        ));
    }
    Ok(visible)
}

// Message builders for tests.

static NEXT_MESSAGE_ID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1000);

/// A fresh message id (unique across the test binary).
pub(crate) fn message_id() -> i64 {
    NEXT_MESSAGE_ID.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

pub(crate) fn user(id: i64, first_name: &str) -> Value {
    json!({"id": id, "is_bot": false, "first_name": first_name})
}

/// A text message from `from` in chat `chat_id`.
pub(crate) fn text_message(chat_id: i64, from: i64, text: &str) -> Value {
    json!({
        "message_id": message_id(),
        "date": now_secs(),
        "chat": chat(chat_id, false),
        "from": user(from, &format!("User{from}")),
        "text": text,
    })
}

/// A photo from `from` in chat `chat_id`, offered in `sizes` (`(file_id, bytes)`,
/// smallest first, as Telegram lists them), with an optional caption.
pub(crate) fn photo_message(
    chat_id: i64,
    from: i64,
    caption: Option<&str>,
    sizes: &[(&str, usize)],
) -> Value {
    let sizes: Vec<Value> = sizes
        .iter()
        .enumerate()
        .map(|(i, (id, size))| {
            let side = 90 * (i + 1);
            json!({"file_id": id, "file_unique_id": format!("u{id}"), "width": side, "height": side, "file_size": size})
        })
        .collect();
    let mut m = json!({
        "message_id": message_id(),
        "date": now_secs(),
        "chat": chat(chat_id, false),
        "from": user(from, &format!("User{from}")),
        "photo": sizes,
    });
    if let Some(caption) = caption {
        m["caption"] = json!(caption);
    }
    m
}

/// A voice note from `from` in chat `chat_id`, served as the file `file_id`.
pub(crate) fn voice_message(
    chat_id: i64,
    from: i64,
    file_id: &str,
    size: usize,
    secs: u32,
) -> Value {
    json!({
        "message_id": message_id(),
        "date": now_secs(),
        "chat": chat(chat_id, false),
        "from": user(from, &format!("User{from}")),
        "voice": {"file_id": file_id, "file_unique_id": format!("u{file_id}"),
                  "duration": secs, "mime_type": "audio/ogg", "file_size": size},
    })
}

/// A group message mentioning the bot (`@lull_test_bot` is prepended).
pub(crate) fn mention(chat_id: i64, from: i64, text: &str) -> Value {
    let mut m = text_message(chat_id, from, &format!("@{BOT_USERNAME} {text}"));
    m["entities"] = json!([{"type": "mention", "offset": 0, "length": BOT_USERNAME.len() + 1}]);
    m
}

/// The same message in forum topic `thread`.
pub(crate) fn in_topic(mut message: Value, thread: i64) -> Value {
    message["chat"]["is_forum"] = json!(true);
    message["message_thread_id"] = json!(thread);
    message["is_topic_message"] = json!(true);
    message
}

/// A `callback_query`: user `from` tapped the button with `data` on the bot's
/// message `sent` (as the fake recorded it), query id `id`.
pub(crate) fn callback_query(id: &str, from: i64, sent: &Sent, data: &str) -> Value {
    let mut message = json!({
        "message_id": sent.message_id,
        "date": now_secs(),
        "chat": chat(sent.chat_id, sent.thread_id.is_some()),
        "from": bot_user(),
        "text": sent.visible(),
    });
    if let Some(thread) = sent.thread_id {
        message["message_thread_id"] = json!(thread);
        message["is_topic_message"] = json!(true);
    }
    json!({
        "id": id,
        "from": user(from, &format!("User{from}")),
        "message": message,
        "chat_instance": format!("ci{}", sent.chat_id),
        "data": data,
    })
}

/// An edit of `message` to `text`.
pub(crate) fn edited(message: &Value, text: &str) -> Value {
    let mut m = message.clone();
    m["text"] = json!(text);
    m["edit_date"] = json!(now_secs());
    m
}

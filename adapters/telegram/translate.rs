//! Telegram updates as [`Incoming`] messages.
//!
//! Telegram facts this relies on:
//! - A private chat has one conversation; a group or supergroup too, except forums,
//!   where every topic message carries `is_topic_message` and the topic's
//!   `message_thread_id` (the General topic carries neither).
//! - In groups a bot sees commands, replies to it and mentions (all messages when
//!   privacy mode is off); lull answers only those addressed to it: a mention
//!   (`@username` or a text mention), a reply to one of its messages, or one of its
//!   commands, also as `/cmd@botname` (Telegram sends `/cmd` without a name to every
//!   bot in the group).
//! - In forum topics a message that replies to nothing still has `reply_to_message`
//!   set: the topic's creation message. That is not a reply to the bot.
//! - An album arrives as separate messages sharing a `media_group_id`, the caption on
//!   one of them (clients put it on the first); a forward with a comment arrives as
//!   the comment followed by the forwarded messages, all with the same `date`. Both
//!   simply join the same burst; the translator only has to keep group filtering
//!   from dropping the parts that do not themselves mention the bot. That memory is
//!   per process: after a poller takeover a part may be judged on its own.
//! - A tap on an inline keyboard button arrives as a `callback_query` update: `from`
//!   is the user who tapped (in a group, anyone who sees the message may tap),
//!   `message` the bot's message the button is on (absent for inline-mode messages,
//!   "inaccessible" once it is too old), `data` the button's `callback_data`, which
//!   any client can set to anything, and `id` is unique per tap (an update delivered
//!   again carries the same one). The query must be answered (`answerCallbackQuery`)
//!   or the client shows a spinner for a while; that is the receiving halves' job.

use std::collections::{HashMap, VecDeque};

use teloxide::types::{
    CallbackQuery, Message, MessageEntityKind, MessageEntityRef, MessageKind, MessageOrigin,
    Update, UpdateKind, User,
};

use super::ChatKey;
use lull_port::Command;
use lull_port::domain::{ConversationRef, Platform};
use lull_port::{Content, Incoming, IncomingKind, Media, MediaKind, QuickReply};

/// The bot as `getMe` described it.
#[derive(Debug, Clone)]
pub(super) struct BotIdentity {
    pub id: u64,
    pub username: String,
}

/// How far apart (in seconds, by message `date`) a comment and the forwards that
/// follow it may be and still count as one.
const FORWARD_WINDOW_SECS: i64 = 2;
/// How many albums and recent senders are remembered.
const MEMORY: usize = 512;

/// Translates updates; remembers recent albums and senders so that the parts of a
/// burst addressed to the bot are kept together in groups.
#[derive(Debug)]
pub(super) struct Translator {
    me: BotIdentity,
    /// `LULL_MAX_IMAGE_BYTES`: the largest photo size under it is kept.
    max_image_bytes: u64,
    /// media_group_id → whether the album was taken (addressed to the bot).
    albums: HashMap<String, bool>,
    album_order: VecDeque<String>,
    /// (conversation, user) → `date` of the last message taken from them in a group.
    recent: HashMap<(ChatKey, String), i64>,
    /// `LULL_GROUP_CONTEXT` is on: group messages not addressed to the bot become
    /// [`IncomingKind::Overheard`] instead of being dropped.
    overhear: bool,
}

impl Translator {
    pub(super) fn new(me: BotIdentity, max_image_bytes: u64) -> Self {
        Self {
            me,
            max_image_bytes,
            albums: HashMap::new(),
            album_order: VecDeque::new(),
            recent: HashMap::new(),
            overhear: false,
        }
    }

    /// Pass group messages not addressed to the bot on as overheard (group context).
    #[must_use]
    pub(super) fn overhearing(mut self, overhear: bool) -> Self {
        self.overhear = overhear;
        self
    }

    /// The update as a message for the core, or `None` if lull ignores it (not
    /// addressed to the bot in a group, unless overhearing; from a bot, a service
    /// message, another update type).
    pub(super) fn translate(&mut self, update: &Update) -> Option<Incoming> {
        match &update.kind {
            UpdateKind::Message(m) => self.message(m, IncomingKind::New),
            UpdateKind::EditedMessage(m) => self.message(m, IncomingKind::Edit),
            UpdateKind::CallbackQuery(q) => tapped(q),
            _ => None,
        }
    }

    fn message(&mut self, msg: &Message, kind: IncomingKind) -> Option<Incoming> {
        if msg.chat.is_channel() || msg.is_automatic_forward() {
            return None;
        }
        let (user_id, author) = sender(msg)?;
        let key = chat_key(msg);
        let is_group = !msg.chat.is_private();
        let (text, entities) = match (msg.text(), msg.caption()) {
            (Some(text), _) => (Some(text), msg.parse_entities().unwrap_or_default()),
            (None, Some(caption)) => (
                Some(caption),
                msg.parse_caption_entities().unwrap_or_default(),
            ),
            (None, None) => (None, Vec::new()),
        };
        let command = text.map(|t| self.command(t)).unwrap_or(CommandTarget::None);
        if command == CommandTarget::OtherBot && is_group {
            return None;
        }
        let text = text.map(|t| self.clean(t));
        let media = self.media(msg);

        if kind == IncomingKind::Edit {
            // The core applies an edit only to a message it stored, so a group edit
            // needs no filtering here; an edit to a message that was never taken is
            // ignored there.
            if text.is_none() && media.is_empty() {
                return None;
            }
            let content = Content::Text(text.unwrap_or_default());
            return Some(Incoming {
                media,
                ..incoming(key, is_group, user_id, author, msg, content, kind)
            });
        }

        let album = msg.media_group_id().map(|g| g.0.clone());
        let album_seen = album.as_ref().and_then(|g| self.albums.get(g).copied());
        if text.is_none() && media.is_empty() && album_seen.is_some() {
            // A further part of an album lull cannot read: the part that carried the
            // caption (or the "text only" notice) covers it. Photos of an album are
            // messages of their own, and join the same burst.
            return None;
        }
        let date = msg.date.timestamp();
        let addressed = !is_group
            || command == CommandTarget::Us
            || self.mentioned(&entities)
            || self.replies_to_bot(msg)
            || album_seen == Some(true)
            || (msg.forward_origin().is_some()
                && self
                    .recent
                    .get(&(key, user_id.clone()))
                    .is_some_and(|&at| (date - at).abs() <= FORWARD_WINDOW_SECS));
        if let Some(album) = album {
            self.remember_album(album, addressed || album_seen == Some(true));
        }
        if !addressed {
            // Group context, when on: the text (a caption too) for the model to read
            // when lull is addressed; the core decides whether the group is admitted.
            let text = text.filter(|t| self.overhear && !t.trim().is_empty())?;
            let content = Content::Text(text);
            let kind = IncomingKind::Overheard;
            return Some(incoming(key, is_group, user_id, author, msg, content, kind));
        }
        if is_group {
            if self.recent.len() >= MEMORY {
                self.recent.clear();
            }
            self.recent.insert((key, user_id.clone()), date);
        }
        let content = match text {
            Some(text) => Content::Text(match msg.forward_origin() {
                Some(origin) => format!("[forwarded from {}]\n{text}", origin_name(origin)),
                None => text,
            }),
            None if !media.is_empty() => Content::Text(String::new()),
            None => Content::Unsupported(unsupported_name(msg)?.to_owned()),
        };
        Some(Incoming {
            media,
            ..incoming(key, is_group, user_id, author, msg, content, kind)
        })
    }

    fn remember_album(&mut self, album: String, taken: bool) {
        if !self.albums.contains_key(&album) {
            self.album_order.push_back(album.clone());
            if self.album_order.len() > MEMORY
                && let Some(old) = self.album_order.pop_front()
            {
                self.albums.remove(&old);
            }
        }
        self.albums.insert(album, taken);
    }

    /// The media of a message as references (Telegram `file_id`s, durable for the
    /// bot): a photo in the largest size under `LULL_MAX_IMAGE_BYTES` (the smallest if
    /// none is, so the user is told it is too large), a document whose MIME type is an
    /// image, a voice note or an audio file (with its duration, for
    /// `LULL_MAX_AUDIO_SECONDS`).
    fn media(&self, msg: &Message) -> Vec<Media> {
        let audio = |kind, file: &teloxide::types::FileMeta, secs: u32, mime: Option<&str>| {
            vec![Media {
                kind,
                reference: file.id.0.clone(),
                size: Some(u64::from(file.size)),
                mime: mime.map(str::to_owned),
                duration_secs: Some(secs),
            }]
        };
        if let Some(voice) = msg.voice() {
            let mime = voice.mime_type.as_ref().map(|m| m.essence_str());
            return audio(
                MediaKind::Voice,
                &voice.file,
                voice.duration.seconds(),
                mime,
            );
        }
        if let Some(track) = msg.audio() {
            let mime = track.mime_type.as_ref().map(|m| m.essence_str());
            return audio(
                MediaKind::Audio,
                &track.file,
                track.duration.seconds(),
                mime,
            );
        }
        if let Some(sizes) = msg.photo() {
            let fits = |size: u32| u64::from(size) <= self.max_image_bytes;
            let best = sizes
                .iter()
                .filter(|p| fits(p.file.size))
                .max_by_key(|p| (p.file.size, p.width * p.height))
                .or_else(|| sizes.iter().min_by_key(|p| p.file.size));
            return best
                .map(|p| Media {
                    kind: MediaKind::Image,
                    reference: p.file.id.0.clone(),
                    size: Some(u64::from(p.file.size)),
                    mime: None,
                    duration_secs: None,
                })
                .into_iter()
                .collect();
        }
        if let Some(document) = msg.document()
            && let Some(mime) = &document.mime_type
            && mime.type_() == "image"
        {
            return vec![Media {
                kind: MediaKind::Image,
                reference: document.file.id.0.clone(),
                size: Some(u64::from(document.file.size)),
                mime: Some(mime.essence_str().to_owned()),
                duration_secs: None,
            }];
        }
        Vec::new()
    }

    /// Whom a leading `/command` is for.
    fn command(&self, text: &str) -> CommandTarget {
        let Some(word) = text.split_whitespace().next() else {
            return CommandTarget::None;
        };
        let Some(name) = word.strip_prefix('/') else {
            return CommandTarget::None;
        };
        match name.split_once('@') {
            Some((_, target)) if target.eq_ignore_ascii_case(&self.me.username) => {
                CommandTarget::Us
            }
            Some(_) => CommandTarget::OtherBot,
            // One of lull's commands, or the answer to its approval question; an
            // unknown `/word` in a group may be another bot's (without `@`, Telegram
            // sends it to every bot there): not taken as addressed to lull.
            None if Command::parse(word).is_some_and(|c| c != Command::Unknown)
                || lull_port::QuickReply::could_be(text) =>
            {
                CommandTarget::Us
            }
            None => CommandTarget::None,
        }
    }

    fn mentioned(&self, entities: &[MessageEntityRef<'_>]) -> bool {
        entities.iter().any(|e| match e.kind() {
            MessageEntityKind::Mention => e
                .text()
                .strip_prefix('@')
                .is_some_and(|name| name.eq_ignore_ascii_case(&self.me.username)),
            MessageEntityKind::TextMention { user } => user.id.0 == self.me.id,
            _ => false,
        })
    }

    fn replies_to_bot(&self, msg: &Message) -> bool {
        msg.reply_to_message().is_some_and(|reply| {
            reply.forum_topic_created().is_none()
                && reply.from.as_ref().is_some_and(|u| u.id.0 == self.me.id)
        })
    }

    /// The text without the decorations Telegram adds for bots: `/cmd@botname`
    /// becomes `/cmd` (the core parses commands), and a leading `@botname` goes.
    fn clean(&self, text: &str) -> String {
        let mention = format!("@{}", self.me.username);
        let trimmed = text.trim_start();
        if let Some(word) = trimmed.split_whitespace().next()
            && word.starts_with('/')
            && word.len() > mention.len()
            && word[word.len() - mention.len()..].eq_ignore_ascii_case(&mention)
        {
            let command = &word[..word.len() - mention.len()];
            return format!("{command}{}", &trimmed[word.len()..]);
        }
        if trimmed.len() >= mention.len()
            && trimmed.is_char_boundary(mention.len())
            && trimmed[..mention.len()].eq_ignore_ascii_case(&mention)
        {
            let rest = &trimmed[mention.len()..];
            let ends_name = rest
                .chars()
                .next()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == ':');
            if ends_name && !rest.is_empty() {
                return rest.to_owned();
            }
        }
        text.to_owned()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommandTarget {
    None,
    Us,
    OtherBot,
}

fn incoming(
    key: ChatKey,
    is_group: bool,
    user_id: String,
    author: String,
    msg: &Message,
    content: Content,
    kind: IncomingKind,
) -> Incoming {
    Incoming {
        conversation: ConversationRef::new(Platform::Telegram, key.to_string()),
        is_group,
        user_id,
        // What LULL_ALLOWED_CHATS names: the group's chat id (a forum topic belongs to
        // its supergroup). A private chat is admitted by its user alone.
        chats: if is_group {
            vec![msg.chat.id.0.to_string()]
        } else {
            Vec::new()
        },
        // A group's title; a private chat is named after the person.
        title: msg
            .chat
            .title()
            .map(str::to_owned)
            .or_else(|| (!is_group).then(|| author.clone())),
        author,
        message_id: msg.id.0.to_string(),
        content,
        media: Vec::new(),
        kind,
    }
}

/// The conversation of a message: its chat, or its forum topic (a topic message
/// carries the topic's thread id; the General topic carries none).
fn chat_key(msg: &Message) -> ChatKey {
    ChatKey {
        chat: msg.chat.id.0,
        topic: if msg.is_topic_message {
            msg.thread_id.map(|t| t.0.0)
        } else {
            None
        },
    }
}

/// The callback query of an update, which must be answered whether or not its tap
/// is taken.
pub(super) fn callback_query(update: &Update) -> Option<&CallbackQuery> {
    match &update.kind {
        UpdateKind::CallbackQuery(q) => Some(q),
        _ => None,
    }
}

/// A tap on one of lull's quick reply buttons, as the message it stands for: a new
/// message from the user who tapped, in the conversation of the message the button is
/// on, whose text is exactly the button's `callback_data` and whose id is
/// `cb:<callback query id>` (so a redelivered update is stored once, and a tap never
/// shares an id with a message). `None` for data lull could not have sent (see
/// [`QuickReply::could_be`]), taps by bots, buttons on inline-mode or inaccessible
/// messages (approvals expire long before a message becomes inaccessible), channels.
/// Group messages need no addressing check: the button is on the bot's own message.
fn tapped(query: &CallbackQuery) -> Option<Incoming> {
    let data = query.data.as_deref()?;
    if !QuickReply::could_be(data) || query.from.is_bot {
        return None;
    }
    let msg = query.regular_message()?;
    if msg.chat.is_channel() {
        return None;
    }
    let key = chat_key(msg);
    let is_group = !msg.chat.is_private();
    Some(Incoming {
        message_id: format!("cb:{}", query.id.0),
        ..incoming(
            key,
            is_group,
            query.from.id.0.to_string(),
            display_name(&query.from),
            msg,
            Content::Text(data.to_owned()),
            IncomingKind::New,
        )
    })
}

/// The sender's id (what `LULL_ALLOWED_USERS` lists) and display name. Messages
/// sent on behalf of a chat (anonymous group admins) carry that chat; messages from
/// bots (including lull itself) are ignored.
fn sender(msg: &Message) -> Option<(String, String)> {
    if let Some(chat) = &msg.sender_chat {
        let name = chat.title().or(chat.username()).unwrap_or("someone");
        return Some((chat.id.0.to_string(), name.to_owned()));
    }
    let user = msg.from.as_ref()?;
    if user.is_bot {
        return None;
    }
    Some((user.id.0.to_string(), display_name(user)))
}

/// First and last name, else the username.
pub(super) fn display_name(user: &User) -> String {
    let name = user.full_name();
    if !name.trim().is_empty() {
        return name.trim().to_owned();
    }
    user.username
        .clone()
        .unwrap_or_else(|| user.id.0.to_string())
}

fn origin_name(origin: &MessageOrigin) -> String {
    match origin {
        MessageOrigin::User { sender_user, .. } => display_name(sender_user),
        MessageOrigin::HiddenUser {
            sender_user_name, ..
        } => sender_user_name.clone(),
        MessageOrigin::Chat { sender_chat, .. } => {
            sender_chat.title().unwrap_or("a chat").to_owned()
        }
        MessageOrigin::Channel { chat, .. } => chat.title().unwrap_or("a channel").to_owned(),
    }
}

/// What a message without text is, for the "text only" notice; `None` for service
/// messages (members joining, pins, topic changes), which get no answer.
fn unsupported_name(msg: &Message) -> Option<&'static str> {
    Some(if msg.sticker().is_some() {
        "sticker"
    } else if msg.voice().is_some() {
        "voice message"
    } else if msg.video_note().is_some() {
        "video message"
    } else if msg.photo().is_some() {
        "photo"
    } else if msg.animation().is_some() {
        "GIF"
    } else if msg.video().is_some() {
        "video"
    } else if msg.audio().is_some() {
        "audio file"
    } else if msg.document().is_some() {
        "file"
    } else if msg.location().is_some() {
        "location"
    } else if msg.contact().is_some() {
        "contact"
    } else if msg.poll().is_some() {
        "poll"
    } else if msg.dice().is_some() {
        "dice"
    } else if matches!(msg.kind, MessageKind::Common(_) | MessageKind::Empty {}) {
        // Something newer than teloxide's types, or a kind of content not named here.
        "message"
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const BOT: u64 = 777;

    fn translator() -> Translator {
        Translator::new(
            BotIdentity {
                id: BOT,
                username: "lull_bot".into(),
            },
            10_000,
        )
    }

    fn user(id: u64, first: &str) -> Value {
        json!({"id": id, "is_bot": false, "first_name": first})
    }

    fn private(text: &str) -> Value {
        json!({
            "message_id": 10, "date": 1_700_000_000,
            "chat": {"id": 42, "type": "private", "first_name": "Ann"},
            "from": {"id": 42, "is_bot": false, "first_name": "Ann", "last_name": "Lee"},
            "text": text,
        })
    }

    fn group(id: i32, text: &str) -> Value {
        json!({
            "message_id": id, "date": 1_700_000_000,
            "chat": {"id": -100123, "type": "supergroup", "title": "G"},
            "from": user(5, "Bo"),
            "text": text,
        })
    }

    /// `text` with a mention entity over the first occurrence of `@lull_bot`.
    fn mentioning(id: i32, text: &str) -> Value {
        let mut m = group(id, text);
        let offset = text.find("@lull_bot").unwrap();
        m["entities"] = json!([{"type": "mention", "offset": offset, "length": 9}]);
        m
    }

    fn update(kind: &str, message: Value) -> Update {
        // From text, as teloxide parses it (its `Update` does not parse from a `Value`).
        serde_json::from_str(&json!({"update_id": 1, kind: message}).to_string()).unwrap()
    }

    fn take(t: &mut Translator, message: Value) -> Option<Incoming> {
        t.translate(&update("message", message))
    }

    fn text(i: &Incoming) -> &str {
        match &i.content {
            Content::Text(t) => t,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn private_messages_are_one_conversation() {
        let mut t = translator();
        let i = take(&mut t, private("hello")).unwrap();
        assert_eq!(i.conversation.key, "42");
        assert!(!i.is_group);
        assert_eq!(
            (i.user_id.as_str(), i.author.as_str(), i.message_id.as_str()),
            ("42", "Ann Lee", "10")
        );
        assert_eq!(
            i.title.as_deref(),
            Some("Ann Lee"),
            "named after the person"
        );
        assert_eq!(text(&i), "hello");
        assert_eq!(i.kind, IncomingKind::New);
        let edit = t
            .translate(&update("edited_message", private("hello!")))
            .unwrap();
        assert_eq!(edit.kind, IncomingKind::Edit);
        assert_eq!(text(&edit), "hello!");
    }

    #[test]
    fn overhearing_passes_group_messages_not_addressed_to_the_bot_on() {
        let mut t = translator().overhearing(true);
        let i = take(&mut t, group(1, "just chatting")).unwrap();
        assert_eq!(i.kind, IncomingKind::Overheard);
        assert_eq!((text(&i), i.author.as_str()), ("just chatting", "Bo"));
        assert_eq!(
            i.chats,
            ["-100123"],
            "the core decides admission by the group"
        );
        let i = take(&mut t, mentioning(2, "@lull_bot hi")).unwrap();
        assert_eq!(i.kind, IncomingKind::New, "addressed: a message");
        assert_eq!(
            take(&mut t, private("hello")).unwrap().kind,
            IncomingKind::New,
            "private chats are always addressed"
        );
        // Commands for another bot are not context.
        assert!(take(&mut t, group(3, "/start@other_bot")).is_none());
    }

    #[test]
    fn groups_take_only_messages_addressed_to_the_bot() {
        let mut t = translator();
        assert!(take(&mut t, group(1, "just chatting")).is_none());
        assert!(take(&mut t, group(2, "@someone_else hi")).is_none());
        let i = take(&mut t, mentioning(3, "@lull_bot, what is 2+2?")).unwrap();
        assert!(i.is_group);
        assert_eq!(i.conversation.key, "-100123");
        assert_eq!(i.title.as_deref(), Some("G"), "the group's title");
        assert_eq!(text(&i), "what is 2+2?", "the leading mention is stripped");
        let i = take(&mut t, mentioning(4, "tell me @lull_bot")).unwrap();
        assert_eq!(text(&i), "tell me @lull_bot");

        // A reply to one of the bot's messages.
        let mut reply = group(5, "and then?");
        reply["reply_to_message"] = json!({
            "message_id": 4, "date": 1_700_000_000,
            "chat": {"id": -100123, "type": "supergroup", "title": "G"},
            "from": {"id": BOT, "is_bot": true, "first_name": "lull", "username": "lull_bot"},
            "text": "an answer",
        });
        assert_eq!(text(&take(&mut t, reply).unwrap()), "and then?");

        // A text mention (a user without username picked from the member list).
        let mut m = group(6, "lull help");
        m["entities"] = json!([{"type": "text_mention", "offset": 0, "length": 4,
            "user": {"id": BOT, "is_bot": true, "first_name": "lull"}}]);
        assert!(take(&mut t, m).is_some());
    }

    #[test]
    fn commands_in_groups() {
        let mut t = translator();
        assert_eq!(
            text(&take(&mut t, group(1, "/help@lull_bot")).unwrap()),
            "/help"
        );
        assert_eq!(
            text(&take(&mut t, group(2, "/reset@LULL_BOT now")).unwrap()),
            "/reset now"
        );
        assert_eq!(text(&take(&mut t, group(3, "/start")).unwrap()), "/start");
        assert!(take(&mut t, group(4, "/help@other_bot")).is_none());
        // The answer to lull's approval question is for lull; another bot's command
        // without `@` is not.
        assert_eq!(
            text(&take(&mut t, group(10, "/approve 3")).unwrap()),
            "/approve 3"
        );
        assert!(take(&mut t, group(11, "/weather Berlin")).is_none());
        assert!(take(&mut t, group(5, "/weather")).is_none());
        // In a private chat the name goes too.
        assert_eq!(
            text(&take(&mut t, private("/help@lull_bot")).unwrap()),
            "/help"
        );
    }

    #[test]
    fn each_forum_topic_is_a_conversation() {
        let mut t = translator();
        let mut m = mentioning(7, "@lull_bot hi");
        m["chat"]["is_forum"] = json!(true);
        m["message_thread_id"] = json!(99);
        m["is_topic_message"] = json!(true);
        // Telegram sets reply_to_message to the topic's creation message.
        m["reply_to_message"] = json!({
            "message_id": 99, "date": 1_700_000_000,
            "chat": {"id": -100123, "type": "supergroup", "title": "G", "is_forum": true},
            "from": {"id": BOT, "is_bot": true, "first_name": "lull", "username": "lull_bot"},
            "forum_topic_created": {"name": "T", "icon_color": 7322096},
        });
        assert_eq!(
            take(&mut t, m.clone()).unwrap().conversation.key,
            "-100123:99"
        );
        // Not a reply to the bot, though the bot created the topic.
        m["text"] = json!("no mention");
        m.as_object_mut().unwrap().remove("entities");
        assert!(take(&mut t, m).is_none());
    }

    #[test]
    fn photos_are_media_with_their_caption_and_other_media_are_named() {
        let mut t = translator();
        let mut photo = private("x");
        photo.as_object_mut().unwrap().remove("text");
        // Telegram lists the sizes smallest first; the largest under the limit is kept.
        photo["photo"] = json!([
            {"file_id": "s", "file_unique_id": "us", "width": 90, "height": 90, "file_size": 900},
            {"file_id": "m", "file_unique_id": "um", "width": 320, "height": 320, "file_size": 9_000},
            {"file_id": "l", "file_unique_id": "ul", "width": 1280, "height": 1280, "file_size": 90_000},
        ]);
        let taken = take(&mut t, photo.clone()).unwrap();
        assert_eq!(text(&taken), "", "no caption");
        let image = |id: &str, size: u64, mime: Option<&str>| Media {
            kind: MediaKind::Image,
            reference: id.into(),
            size: Some(size),
            mime: mime.map(str::to_owned),
            duration_secs: None,
        };
        assert_eq!(taken.media, [image("m", 9_000, None)]);
        photo["caption"] = json!("what is this?");
        assert_eq!(text(&take(&mut t, photo.clone()).unwrap()), "what is this?");
        // None fits: the smallest is kept, and the core tells the user it is too large.
        photo["photo"] = json!([
            {"file_id": "l", "file_unique_id": "ul", "width": 1280, "height": 1280, "file_size": 90_000},
        ]);
        assert_eq!(
            take(&mut t, photo).unwrap().media,
            [image("l", 90_000, None)]
        );

        let mut document = private("x");
        document.as_object_mut().unwrap().remove("text");
        document["document"] = json!({"file_id": "d", "file_unique_id": "ud",
            "mime_type": "image/png", "file_size": 500});
        assert_eq!(
            take(&mut t, document.clone()).unwrap().media,
            [image("d", 500, Some("image/png"))]
        );
        document["document"]["mime_type"] = json!("application/pdf");
        assert_eq!(
            take(&mut t, document).unwrap().content,
            Content::Unsupported("file".into())
        );

        let mut sticker = private("x");
        sticker.as_object_mut().unwrap().remove("text");
        sticker["sticker"] = json!({"file_id": "f", "file_unique_id": "u", "type": "regular",
            "width": 1, "height": 1, "is_animated": false, "is_video": false});
        assert_eq!(
            take(&mut t, sticker).unwrap().content,
            Content::Unsupported("sticker".into())
        );

        let mut voice = private("x");
        voice.as_object_mut().unwrap().remove("text");
        voice["voice"] = json!({"file_id": "f", "file_unique_id": "u", "duration": 1,
            "mime_type": "audio/ogg", "file_size": 100});
        let voice = take(&mut t, voice).unwrap();
        assert_eq!(voice.content, Content::Text(String::new()));
        assert_eq!(
            voice.media,
            [Media {
                kind: MediaKind::Voice,
                reference: "f".into(),
                size: Some(100),
                mime: Some("audio/ogg".into()),
                duration_secs: Some(1),
            }]
        );
    }

    #[test]
    fn album_parts_follow_the_part_that_mentioned_the_bot() {
        let mut t = translator();
        let part = |id: i32, caption: Option<&str>| {
            let mut m = group(id, "");
            let o = m.as_object_mut().unwrap();
            o.remove("text");
            o.insert("media_group_id".into(), json!("alb1"));
            o.insert(
                "photo".into(),
                json!([{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]),
            );
            if let Some(c) = caption {
                o.insert("caption".into(), json!(c));
                o.insert(
                    "caption_entities".into(),
                    json!([{"type": "mention", "offset": 0, "length": 9}]),
                );
            }
            m
        };
        let first = take(&mut t, part(1, Some("@lull_bot compare these"))).unwrap();
        assert_eq!(text(&first), "compare these");
        // Captionless parts join the burst with their photo.
        let second = take(&mut t, part(2, None)).unwrap();
        assert_eq!((text(&second), second.media.len()), ("", 1));
        // A captioned later part without mention still joins.
        let mut third = part(3, None);
        third["caption"] = json!("and this one");
        assert_eq!(text(&take(&mut t, third).unwrap()), "and this one");
    }

    #[test]
    fn a_forward_right_after_a_comment_joins_it() {
        let mut t = translator();
        assert!(
            take(
                &mut t,
                mentioning(1, "@lull_bot what do you think of this?")
            )
            .is_some()
        );
        let mut fwd = group(2, "the forwarded text");
        fwd["forward_origin"] =
            json!({"type": "user", "date": 1_600_000_000, "sender_user": user(9, "Cy")});
        let i = take(&mut t, fwd.clone()).unwrap();
        assert_eq!(text(&i), "[forwarded from Cy]\nthe forwarded text");
        // Much later, a forward alone is not addressed to the bot.
        fwd["date"] = json!(1_700_000_100);
        assert!(take(&mut t, fwd).is_none());
    }

    /// A callback query on the bot's message `on` (as Telegram sends it).
    fn callback(id: &str, from: Value, on: Value, data: &str) -> Update {
        update(
            "callback_query",
            json!({"id": id, "from": from, "message": on, "chat_instance": "ci", "data": data}),
        )
    }

    fn bots_message(chat: Value) -> Value {
        json!({
            "message_id": 50, "date": 1_700_000_000, "chat": chat,
            "from": {"id": BOT, "is_bot": true, "first_name": "lull", "username": "lull_bot"},
            "text": "I'd like to run t. Answer /approve 7 or /cancel 7.",
        })
    }

    #[test]
    fn a_tapped_quick_reply_is_a_new_message_from_the_tapping_user() {
        let mut t = translator();
        let chat = json!({"id": 42, "type": "private", "first_name": "Ann"});
        let tap = callback("4711", user(42, "Ann"), bots_message(chat), "/approve 7");
        let i = t.translate(&tap).unwrap();
        assert_eq!(i.conversation.key, "42");
        assert_eq!(text(&i), "/approve 7");
        assert_eq!(
            (i.user_id.as_str(), i.author.as_str(), i.message_id.as_str()),
            ("42", "Ann", "cb:4711")
        );
        assert_eq!(i.kind, IncomingKind::New);
        assert!(!i.is_group && i.chats.is_empty());
        assert!(callback_query(&tap).is_some());
        assert!(callback_query(&update("message", private("hi"))).is_none());

        // In a forum topic, by another member than the one asked: the core decides
        // who may answer, from the user id.
        let mut on = bots_message(
            json!({"id": -100123, "type": "supergroup", "title": "G", "is_forum": true}),
        );
        on["message_thread_id"] = json!(99);
        on["is_topic_message"] = json!(true);
        let i = t
            .translate(&callback("4712", user(5, "Bo"), on, "/cancel 7"))
            .unwrap();
        assert_eq!(i.conversation.key, "-100123:99");
        assert!(i.is_group);
        assert_eq!(i.chats, ["-100123"]);
        assert_eq!((i.user_id.as_str(), text(&i)), ("5", "/cancel 7"));
    }

    #[test]
    fn taps_lull_could_not_have_offered_are_ignored() {
        let mut t = translator();
        let chat = json!({"id": 42, "type": "private", "first_name": "Ann"});
        for data in ["/reset", "hello", "/approve 7; rm -rf", "/approve"] {
            let tap = callback("1", user(42, "Ann"), bots_message(chat.clone()), data);
            assert!(t.translate(&tap).is_none(), "{data}");
            assert!(callback_query(&tap).is_some(), "still answered");
        }
        let by_bot = callback(
            "2",
            json!({"id": 8, "is_bot": true, "first_name": "b"}),
            bots_message(chat.clone()),
            "/approve 7",
        );
        assert!(t.translate(&by_bot).is_none());
        // An inaccessible message (Telegram sends date 0).
        let mut old = bots_message(chat);
        old["date"] = json!(0);
        assert!(
            t.translate(&callback("3", user(42, "Ann"), old, "/approve 7"))
                .is_none()
        );
        let inline: Update = update(
            "callback_query",
            json!({"id": "4", "from": user(42, "Ann"), "inline_message_id": "im",
                   "chat_instance": "ci", "data": "/approve 7"}),
        );
        assert!(t.translate(&inline).is_none());
    }

    #[test]
    fn bots_and_service_messages_are_ignored() {
        let mut t = translator();
        let mut own = private("echo");
        own["from"] =
            json!({"id": BOT, "is_bot": true, "first_name": "lull", "username": "lull_bot"});
        assert!(take(&mut t, own).is_none());
        let mut joined = private("x");
        let o = joined.as_object_mut().unwrap();
        o.remove("text");
        o.insert("new_chat_members".into(), json!([user(8, "Di")]));
        assert!(take(&mut t, joined).is_none());
    }
}

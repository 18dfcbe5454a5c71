//! From Discord messages to the core's [`Incoming`]: which messages lull answers and
//! the text the core sees. Pure functions: no I/O, no conversation logic.
//!
//! - Messages of bots (lull itself included) and system messages (joins, pins,
//!   thread starters) are ignored.
//! - In guilds (channels and threads) only messages that mention lull or reply to
//!   one of its messages are answered; DMs are always answered.
//! - A leading mention of lull is stripped, so `@lull /reset` is the command
//!   `/reset`; a mention elsewhere becomes `@name`.
//! - Image attachments (a `content_type` of `image/*`) and voice messages and audio
//!   (`audio/*`) become [`Media`] references
//!   (the attachment's id and CDN URL), fetched only when the reply is generated; the
//!   text is the caption. Other attachments or stickers without text become
//!   [`Content::Unsupported`], which the core answers with a short "text only" notice.
//! - A click on one of lull's buttons (an `INTERACTION_CREATE` of type 3, message
//!   component) becomes the message its `custom_id` spells (see [`tapped`]).

use serenity::all::{
    Attachment, ChannelId, ComponentInteraction, ComponentInteractionDataKind, GuildId, Message,
    MessageType, MessageUpdateEvent, UserId,
};

use lull_port::domain::{ConversationRef, Platform};
use lull_port::{Content, Incoming, IncomingKind, Media, MediaKind, QuickReply};

/// How the message id of a tapped button starts: `interaction:<interaction id>`.
/// Interaction ids are snowflakes like message ids, but never equal to one.
pub(super) const TAP_PREFIX: &str = "interaction:";

/// Who lull is on Discord (from `GET /users/@me`), to recognise mentions and replies.
#[derive(Debug, Clone)]
pub(super) struct BotIdentity {
    pub id: UserId,
    pub name: String,
}

/// A new message, if lull should see it. `in_guild` comes from the message's
/// `guild_id` for gateway events; messages read back over REST carry no `guild_id`,
/// so catch-up passes what the store knows about the conversation.
pub(super) fn new_message(
    message: &Message,
    bot: &BotIdentity,
    in_guild: bool,
) -> Option<Incoming> {
    if message.author.bot || message.author.id == bot.id {
        return None;
    }
    if !matches!(
        message.kind,
        MessageType::Regular | MessageType::InlineReply
    ) {
        return None;
    }
    if in_guild && !addressed_to(message, bot) {
        return None;
    }
    let text = strip_mentions(&message.content, bot);
    let media = images(&message.attachments);
    let content = if !text.is_empty() || !media.is_empty() {
        Content::Text(text)
    } else if !message.attachments.is_empty() {
        Content::Unsupported("attachment".into())
    } else if !message.sticker_items.is_empty() {
        Content::Unsupported("sticker".into())
    } else {
        // A bare mention, or an embed-only message: nothing to answer.
        return None;
    };
    Some(Incoming {
        content,
        media,
        ..incoming_of(message, in_guild)
    })
}

/// A new message as the core's [`Incoming`]: from its author (their nickname in a
/// guild), in its channel, with its guild for the access checks; the content is
/// the caller's.
fn incoming_of(message: &Message, in_guild: bool) -> Incoming {
    let author = message
        .member
        .as_ref()
        .and_then(|m| m.nick.clone())
        .or_else(|| message.author.global_name.clone())
        .unwrap_or_else(|| message.author.name.clone());
    Incoming {
        conversation: ConversationRef::new(Platform::Discord, message.channel_id.to_string()),
        is_group: in_guild,
        user_id: message.author.id.to_string(),
        chats: chats(message.channel_id, message.guild_id),
        // A DM is named after the person; a guild channel's name is not in its
        // messages (the console shows its id).
        title: (!in_guild).then(|| author.clone()),
        author,
        message_id: message.id.to_string(),
        content: Content::Text(String::new()),
        media: Vec::new(),
        kind: IncomingKind::New,
    }
}

/// A guild message not addressed to lull, as group context (`LULL_GROUP_CONTEXT`):
/// its text, mentions named, for the model to read when lull is addressed. `None`
/// for DMs, messages addressed to lull (those are [`new_message`]s), bots, system
/// messages and messages without text. The core decides whether the server or
/// channel is admitted.
pub(super) fn overheard(message: &Message, bot: &BotIdentity, in_guild: bool) -> Option<Incoming> {
    if !in_guild || addressed_to(message, bot) || message.author.bot {
        return None;
    }
    if !matches!(
        message.kind,
        MessageType::Regular | MessageType::InlineReply
    ) {
        return None;
    }
    let text = strip_mentions(&message.content, bot);
    if text.is_empty() {
        return None;
    }
    Some(Incoming {
        content: Content::Text(text),
        media: Vec::new(),
        kind: IncomingKind::Overheard,
        ..incoming_of(message, in_guild)
    })
}

/// The image and audio attachments of a message, as media references: `<id> <url>`
/// (the URL is what is fetched; Discord's CDN serves it without the bot token). A
/// voice message is an `audio/ogg` attachment with a `duration_secs`.
fn images(attachments: &[Attachment]) -> Vec<Media> {
    attachments
        .iter()
        .filter_map(|a| {
            let mime = a.content_type.as_deref()?;
            let kind = if mime.starts_with("image/") {
                MediaKind::Image
            } else if mime.starts_with("audio/") && a.duration_secs.is_some() {
                MediaKind::Voice
            } else if mime.starts_with("audio/") {
                MediaKind::Audio
            } else {
                return None;
            };
            Some(Media {
                kind,
                reference: format!("{} {}", a.id, a.url),
                size: Some(u64::from(a.size)),
                mime: a.content_type.clone(),
                duration_secs: a.duration_secs.map(|s| s.ceil() as u32),
            })
        })
        .collect()
}

/// An edit (`MESSAGE_UPDATE`), if it changed the text. The core applies it only to a
/// message that is still pending, so edits need no mention check: an edit of a
/// message lull never stored is ignored there.
pub(super) fn edit(event: &MessageUpdateEvent, bot: &BotIdentity) -> Option<Incoming> {
    // Updates without an author or content are embed unfurls and similar.
    let author = event.author.as_ref()?;
    if author.bot || author.id == bot.id {
        return None;
    }
    let text = strip_mentions(event.content.as_deref()?, bot);
    // An edited caption keeps its images (their markers stay in the text).
    let media = event.attachments.as_deref().map(images).unwrap_or_default();
    if text.is_empty() && media.is_empty() {
        return None;
    }
    Some(Incoming {
        conversation: ConversationRef::new(Platform::Discord, event.channel_id.to_string()),
        is_group: event.guild_id.is_some(),
        user_id: author.id.to_string(),
        chats: chats(event.channel_id, event.guild_id),
        author: author
            .global_name
            .clone()
            .unwrap_or_else(|| author.name.clone()),
        title: None,
        message_id: event.id.to_string(),
        content: Content::Text(text),
        media,
        kind: IncomingKind::Edit,
    })
}

/// A click on a button (a message component interaction) as the message it stands
/// for: a new message from the user who clicked (`member.user` in a guild, `user` in
/// a DM; serenity fills `user` from the member), in the interaction's channel, with
/// its guild for the access checks as a `MESSAGE_CREATE` has, whose text is exactly
/// the button's `custom_id` and whose id is `interaction:<interaction id>` (so a
/// redelivery is stored once, and a click never shares an id with a message). No
/// mention check: the button is on lull's own message. `None` for other components
/// (select menus), clicks by bots, and a `custom_id` lull could not have sent (see
/// [`QuickReply::could_be`]; any client can send any).
pub(super) fn tapped(interaction: &ComponentInteraction, bot: &BotIdentity) -> Option<Incoming> {
    if !matches!(interaction.data.kind, ComponentInteractionDataKind::Button) {
        return None;
    }
    let text = interaction.data.custom_id.as_str();
    let user = &interaction.user;
    if !QuickReply::could_be(text) || user.bot || user.id == bot.id {
        return None;
    }
    interaction_message(
        interaction.id,
        interaction.channel_id,
        interaction.guild_id,
        user,
        interaction.member.as_ref(),
        text.to_owned(),
        bot,
    )
}

/// An interaction (a click, a slash command) as the message it stands for: from the
/// user who sent it (their nickname in a guild), in its channel, with its guild for
/// the access checks, whose id is `interaction:<interaction id>`. `None` for bots.
pub(crate) fn interaction_message(
    id: serenity::all::InteractionId,
    channel: ChannelId,
    guild: Option<GuildId>,
    user: &serenity::all::User,
    member: Option<&serenity::all::Member>,
    text: String,
    bot: &BotIdentity,
) -> Option<Incoming> {
    if user.bot || user.id == bot.id {
        return None;
    }
    let author = member
        .and_then(|m| m.nick.clone())
        .or_else(|| user.global_name.clone())
        .unwrap_or_else(|| user.name.clone());
    Some(Incoming {
        conversation: ConversationRef::new(Platform::Discord, channel.to_string()),
        is_group: guild.is_some(),
        user_id: user.id.to_string(),
        chats: chats(channel, guild),
        title: guild.is_none().then(|| author.clone()),
        author,
        message_id: format!("{TAP_PREFIX}{id}"),
        content: Content::Text(text),
        media: Vec::new(),
        kind: IncomingKind::New,
    })
}

/// The snowflake of a stored message id: a message's own, or the interaction's of a
/// tapped button (both grow with time, so history read after it is what came later).
pub(super) fn snowflake(message_id: &str) -> Option<u64> {
    message_id
        .strip_prefix(TAP_PREFIX)
        .unwrap_or(message_id)
        .parse()
        .ok()
}

/// What `LULL_ALLOWED_CHATS` may name to admit a server message: its channel, then
/// its server (a `MESSAGE_CREATE` carries `guild_id` for server messages only).
/// Direct messages have none: a user is admitted to them alone.
fn chats(channel: ChannelId, guild: Option<GuildId>) -> Vec<String> {
    guild.map_or_else(Vec::new, |guild| {
        vec![channel.to_string(), guild.to_string()]
    })
}

/// Whether a guild message is meant for lull: it mentions lull or replies to one of
/// lull's messages.
fn addressed_to(message: &Message, bot: &BotIdentity) -> bool {
    message.mentions.iter().any(|u| u.id == bot.id)
        || mention_forms(bot)
            .iter()
            .any(|m| message.content.contains(m.as_str()))
        || message
            .referenced_message
            .as_ref()
            .is_some_and(|m| m.author.id == bot.id)
}

/// `<@id>` and the older nickname form `<@!id>`.
fn mention_forms(bot: &BotIdentity) -> [String; 2] {
    [format!("<@{}>", bot.id), format!("<@!{}>", bot.id)]
}

/// Strip a leading mention of lull; name any other mention of it.
fn strip_mentions(content: &str, bot: &BotIdentity) -> String {
    let forms = mention_forms(bot);
    let mut text = content.trim_start();
    for form in &forms {
        if let Some(rest) = text.strip_prefix(form.as_str()) {
            text = rest;
            break;
        }
    }
    let mut text = text.trim().to_owned();
    for form in &forms {
        text = text.replace(form.as_str(), &format!("@{}", bot.name));
    }
    text
}

/// A typing event as the core hears it: the conversation (its channel) and who types.
pub(super) fn typing(event: &serenity::all::TypingStartEvent) -> (ConversationRef, String) {
    (
        ConversationRef::new(Platform::Discord, event.channel_id.to_string()),
        event.user_id.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const BOT: u64 = 900;

    fn bot() -> BotIdentity {
        BotIdentity {
            id: UserId::new(BOT),
            name: "lull".into(),
        }
    }

    fn user(id: u64, bot: bool) -> Value {
        json!({"id": id.to_string(), "username": format!("user{id}"), "discriminator": "0",
               "global_name": null, "avatar": null, "bot": bot})
    }

    fn message(extra: Value) -> Message {
        let mut m = json!({
            "id": "1001", "channel_id": "77", "author": user(5, false), "content": "hello",
            "timestamp": "2026-01-01T00:00:00+00:00", "edited_timestamp": null, "tts": false,
            "mention_everyone": false, "mentions": [], "mention_roles": [], "attachments": [],
            "embeds": [], "pinned": false, "type": 0
        });
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        serde_json::from_value(m).unwrap()
    }

    #[test]
    fn dms_are_answered_as_they_are() {
        let incoming = new_message(&message(json!({})), &bot(), false).unwrap();
        assert_eq!(incoming.conversation.key, "77");
        assert_eq!(incoming.message_id, "1001");
        assert_eq!(incoming.user_id, "5");
        assert_eq!(incoming.content, Content::Text("hello".into()));
        assert!(!incoming.is_group);
        assert!(
            incoming.chats.is_empty(),
            "a DM is admitted by its user alone"
        );
    }

    #[test]
    fn guild_messages_need_a_mention_or_a_reply() {
        let plain = message(json!({"guild_id": "3"}));
        assert!(new_message(&plain, &bot(), true).is_none());

        let mention = message(json!({"guild_id": "3", "content": "<@900> /reset now",
                                     "mentions": [user(BOT, true)]}));
        let incoming = new_message(&mention, &bot(), true).unwrap();
        assert_eq!(incoming.content, Content::Text("/reset now".into()));
        assert!(incoming.is_group);
        assert_eq!(incoming.chats, ["77", "3"], "the channel, then its server");

        let reply = message(json!({"guild_id": "3", "type": 19, "content": "and then?",
            "referenced_message": message(json!({"id": "999", "author": user(BOT, true)}))}));
        assert_eq!(
            new_message(&reply, &bot(), true).unwrap().content,
            Content::Text("and then?".into())
        );
    }

    #[test]
    fn guild_messages_not_addressed_to_lull_can_be_overheard() {
        let plain = message(json!({"guild_id": "3", "content": "hi <@5> and <@!900>s fans"}));
        let heard = overheard(&plain, &bot(), true);
        assert!(heard.is_none(), "a mention of lull anywhere addresses it");
        let plain = message(json!({"guild_id": "3", "content": "just chatting"}));
        let heard = overheard(&plain, &bot(), true).unwrap();
        assert_eq!(heard.kind, IncomingKind::Overheard);
        assert_eq!(heard.content, Content::Text("just chatting".into()));
        assert_eq!(heard.chats, ["77", "3"]);
        assert!(overheard(&plain, &bot(), false).is_none(), "never in a DM");
        let mention = message(json!({"guild_id": "3", "content": "<@900> hi",
                                     "mentions": [user(BOT, true)]}));
        assert!(overheard(&mention, &bot(), true).is_none());
        let from_bot = message(json!({"guild_id": "3", "author": user(6, true)}));
        assert!(overheard(&from_bot, &bot(), true).is_none());
    }

    #[test]
    fn mentions_elsewhere_are_named() {
        let m = message(json!({"content": "hey <@!900>, and <@900>?"}));
        assert_eq!(
            new_message(&m, &bot(), false).unwrap().content,
            Content::Text("hey @lull, and @lull?".into())
        );
    }

    #[test]
    fn bots_system_messages_and_empty_ones_are_ignored() {
        assert!(new_message(&message(json!({"author": user(6, true)})), &bot(), false).is_none());
        assert!(new_message(&message(json!({"author": user(BOT, true)})), &bot(), false).is_none());
        assert!(new_message(&message(json!({"type": 7})), &bot(), false).is_none());
        assert!(new_message(&message(json!({"content": "<@900>"})), &bot(), false).is_none());
    }

    #[test]
    fn image_attachments_are_media_with_their_caption() {
        let m = message(json!({"content": "", "attachments": [
            {"id": "1", "filename": "cat.png", "size": 10, "url": "https://x/cat.png",
             "proxy_url": "https://x/cat.png", "content_type": "image/png"},
            {"id": "2", "filename": "notes.txt", "size": 5, "url": "https://x/notes.txt",
             "proxy_url": "https://x/notes.txt", "content_type": "text/plain"}]}));
        let incoming = new_message(&m, &bot(), false).unwrap();
        assert_eq!(incoming.content, Content::Text(String::new()));
        assert_eq!(
            incoming.media,
            [Media {
                kind: MediaKind::Image,
                reference: "1 https://x/cat.png".into(),
                size: Some(10),
                mime: Some("image/png".into()),
                duration_secs: None,
            }]
        );
    }

    #[test]
    fn voice_messages_are_audio_media_with_their_duration() {
        let m = message(json!({"content": "", "flags": 8192, "attachments": [
            {"id": "3", "filename": "voice-message.ogg", "size": 4000, "url": "https://x/v.ogg",
             "proxy_url": "https://x/v.ogg", "content_type": "audio/ogg", "duration_secs": 2.4}]}));
        let incoming = new_message(&m, &bot(), false).unwrap();
        assert_eq!(incoming.media[0].kind, MediaKind::Voice);
        assert_eq!(incoming.media[0].duration_secs, Some(3));
    }

    #[test]
    fn attachments_without_text_are_unsupported() {
        let m = message(json!({"content": "", "attachments": [{
            "id": "1", "filename": "cat.png", "size": 10, "url": "https://x/cat.png",
            "proxy_url": "https://x/cat.png"}]}));
        assert_eq!(
            new_message(&m, &bot(), false).unwrap().content,
            Content::Unsupported("attachment".into())
        );
    }

    /// A button click as the gateway sends it (`INTERACTION_CREATE`, type 3).
    fn click(extra: Value, custom_id: &str) -> ComponentInteraction {
        let mut i = json!({
            "id": "5000", "application_id": BOT.to_string(), "type": 3, "token": "tok",
            "version": 1, "channel_id": "77", "locale": "en-US", "entitlements": [],
            "attachment_size_limit": 10_485_760,
            "data": {"custom_id": custom_id, "component_type": 2},
            "message": message(json!({"id": "1002", "author": user(BOT, true)})),
            "user": user(5, false),
        });
        for (k, v) in extra.as_object().unwrap() {
            i[k] = v.clone();
        }
        serde_json::from_value(i).unwrap()
    }

    #[test]
    fn a_click_is_a_new_message_from_the_clicking_user() {
        let dm = tapped(&click(json!({}), "/approve 7"), &bot()).unwrap();
        assert_eq!(dm.conversation.key, "77");
        assert_eq!(dm.content, Content::Text("/approve 7".into()));
        assert_eq!(
            (dm.user_id.as_str(), dm.message_id.as_str()),
            ("5", "interaction:5000")
        );
        assert_eq!(dm.kind, IncomingKind::New);
        assert!(!dm.is_group && dm.chats.is_empty());

        // In a guild the clicking member comes as `member` (no `user`).
        let mut raw = json!({
            "id": "5000", "application_id": BOT.to_string(), "type": 3, "token": "tok",
            "version": 1, "channel_id": "77", "locale": "en-US", "entitlements": [],
            "attachment_size_limit": 10_485_760, "guild_id": "3",
            "data": {"custom_id": "/cancel 7", "component_type": 2},
            "member": {"user": user(6, false), "nick": "Six", "roles": [],
                "joined_at": "2026-01-01T00:00:00+00:00", "deaf": false, "mute": false, "flags": 0},
        });
        raw["message"] = serde_json::to_value(message(json!({"author": user(BOT, true)}))).unwrap();
        let member: ComponentInteraction = serde_json::from_value(raw).unwrap();
        let i = tapped(&member, &bot()).unwrap();
        assert_eq!(
            (i.user_id.as_str(), i.author.as_str()),
            ("6", "Six"),
            "the member who clicked"
        );
        assert!(i.is_group);
        assert_eq!(i.chats, ["77", "3"]);
        assert_eq!(snowflake(&i.message_id), Some(5000));
        assert_eq!(snowflake("1001"), Some(1001));
        assert_eq!(snowflake("x"), None);
    }

    #[test]
    fn clicks_lull_could_not_have_offered_are_ignored() {
        for custom_id in ["/reset", "approve 7", "/approve 7 and more"] {
            assert!(
                tapped(&click(json!({}), custom_id), &bot()).is_none(),
                "{custom_id}"
            );
        }
        let by_bot = click(json!({"user": user(8, true)}), "/approve 7");
        assert!(tapped(&by_bot, &bot()).is_none());
        let select = click(
            json!({"data": {"custom_id": "/approve 7", "component_type": 3, "values": ["a"]}}),
            "",
        );
        assert!(tapped(&select, &bot()).is_none());
    }

    #[test]
    fn edits_carry_the_new_text() {
        let event: MessageUpdateEvent = serde_json::from_value(json!({
            "id": "1001", "channel_id": "77", "guild_id": "3", "author": user(5, false),
            "content": "<@900> actually, Paris"
        }))
        .unwrap();
        let incoming = edit(&event, &bot()).unwrap();
        assert_eq!(incoming.kind, IncomingKind::Edit);
        assert_eq!(incoming.content, Content::Text("actually, Paris".into()));
        let unfurl: MessageUpdateEvent =
            serde_json::from_value(json!({"id": "1001", "channel_id": "77", "embeds": []}))
                .unwrap();
        assert!(edit(&unfurl, &bot()).is_none());
    }
}

//! Discord application (slash) commands: registered at start, answered through
//! their interactions.
//!
//! Discord facts this relies on:
//! - `PUT /applications/{application}/commands` replaces the bot's global commands
//!   with the list given (a bulk overwrite: the same list twice changes nothing), so
//!   every process may register at start. The application id comes from
//!   `GET /oauth2/applications/@me`.
//! - A slash command arrives as an interaction (`INTERACTION_CREATE`, type 2) on one
//!   connection only (the shard of its guild, DMs on shard 0). It must be answered
//!   within 3 s: lull answers at once with `DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE`
//!   (type 5, Discord shows "lull is thinking…"), before and apart from storing.
//! - The answer then replaces that placeholder: `PATCH
//!   /webhooks/{application}/{token}/messages/@original`, for 15 minutes after the
//!   interaction (the token's lifetime). Editing is idempotent: a retried edit shows
//!   the same message once.
//!
//! A command becomes the message a user would type (`/model gpt-x`), with the id
//! `interaction:<id>` (stored once, like a button click): the core parses it with
//! [`lull_port::Command::parse`], so commands it learns later just work, and a
//! redelivered interaction is answered once. The first outbox row for that channel
//! that answers it (a notice, or a row quoting the interaction) takes the deferred
//! response; once the token is too old, or Discord no longer knows it, the answer is
//! an ordinary message.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use serenity::all::{ChannelId, CommandDataOptionValue, CommandInteraction};

use super::Rest;
use super::translate::{BotIdentity, TAP_PREFIX};
use lull_port::{Incoming, MenuCommand, Menus};

/// How long a deferred response can still be edited: Discord's 15 minutes, less a
/// margin for the time a send takes.
const DEFERRED_FOR: Duration = Duration::from_secs(14 * 60);

/// Deferred slash command responses still to be answered, per channel, oldest first.
#[derive(Default)]
pub(crate) struct Deferrals {
    /// A std mutex: held for one map operation, never across an await.
    pending: Mutex<HashMap<ChannelId, Vec<Deferred>>>,
}

/// One deferred response: the interaction it answers and its token.
#[derive(Clone)]
pub(crate) struct Deferred {
    pub(crate) interaction: u64,
    pub(crate) application: u64,
    /// Names the response in URLs; never logged.
    pub(crate) token: String,
    at: Instant,
}

impl Deferrals {
    /// Remember the deferred response of `interaction` in `channel`.
    pub(crate) fn remember(&self, channel: ChannelId, interaction: &CommandInteraction) {
        let deferred = Deferred {
            interaction: interaction.id.get(),
            application: interaction.application_id.get(),
            token: interaction.token.clone(),
            at: Instant::now(),
        };
        let mut pending = self.pending.lock().expect("not poisoned");
        pending.retain(|_, waiting| {
            waiting.retain(|d| d.at.elapsed() < DEFERRED_FOR);
            !waiting.is_empty()
        });
        let waiting = pending.entry(channel).or_default();
        // A redelivered interaction is deferred once.
        if !waiting
            .iter()
            .any(|d| d.interaction == deferred.interaction)
        {
            waiting.push(deferred);
        }
    }

    /// Take the deferred response a part answers: the one of the interaction it
    /// quotes (`reply_to`), or else (a notice) the oldest of the channel.
    pub(crate) fn take(
        &self,
        channel: ChannelId,
        reply_to: Option<&str>,
        notice: bool,
    ) -> Option<Deferred> {
        let quoted = reply_to
            .and_then(|r| r.strip_prefix(TAP_PREFIX))
            .and_then(|id| id.parse::<u64>().ok());
        let mut pending = self.pending.lock().expect("not poisoned");
        let waiting = pending.get_mut(&channel)?;
        waiting.retain(|d| d.at.elapsed() < DEFERRED_FOR);
        let index = match quoted {
            Some(id) => waiting.iter().position(|d| d.interaction == id)?,
            None if notice && !waiting.is_empty() => 0,
            None => return None,
        };
        Some(waiting.remove(index))
    }

    /// Give back a response whose edit failed for now, to be tried again.
    pub(crate) fn put_back(&self, channel: ChannelId, deferred: Deferred) {
        let mut pending = self.pending.lock().expect("not poisoned");
        pending.entry(channel).or_default().insert(0, deferred);
    }
}

/// The application commands for `menus`: everyone's commands, each with its
/// optional string argument.
pub(super) fn commands(menus: &Menus) -> Value {
    let command = |c: &MenuCommand| {
        let mut command = json!({"name": c.name, "description": c.description, "type": 1});
        if let Some(argument) = c.argument {
            command["options"] = json!([{
                "type": 3, "name": argument.name, "description": argument.description,
                "required": false,
            }]);
        }
        command
    };
    Value::Array(menus.everyone.iter().map(command).collect())
}

/// Register `menus` as the bot's global slash commands (a bulk overwrite). Returns
/// how many; the error never contains the token.
pub(super) async fn register(rest: &Rest, menus: &Menus) -> Result<usize, String> {
    let api = format!("{}/api/v10", rest.api_url.trim_end_matches('/'));
    let authorization = rest.http.token().to_owned();
    let failed = |what: &str, e: reqwest::Error| {
        format!("{what}: {}", rest.redactor.redact(e.without_url()))
    };
    let application: Value = rest
        .client
        .get(format!("{api}/oauth2/applications/@me"))
        .header(reqwest::header::AUTHORIZATION, &authorization)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| failed("GET /oauth2/applications/@me", e))?
        .json()
        .await
        .map_err(|e| failed("GET /oauth2/applications/@me", e))?;
    let id = application["id"]
        .as_str()
        .ok_or("GET /oauth2/applications/@me named no application id")?;
    let commands = commands(menus);
    let count = commands.as_array().map_or(0, Vec::len);
    rest.client
        .put(format!("{api}/applications/{id}/commands"))
        .header(reqwest::header::AUTHORIZATION, &authorization)
        .json(&commands)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| failed("PUT /applications/{id}/commands", e))?;
    Ok(count)
}

/// The text a slash command stands for: `/name`, then its string argument if given
/// (`/model gpt-x`).
pub(super) fn command_text(interaction: &CommandInteraction) -> String {
    let mut text = format!("/{}", interaction.data.name);
    for option in &interaction.data.options {
        if let CommandDataOptionValue::String(value) = &option.value
            && !value.trim().is_empty()
        {
            text.push(' ');
            text.push_str(value.trim());
        }
    }
    text
}

/// A slash command as the message it stands for (see the module docs); `None` for
/// commands of bots.
pub(super) fn incoming(interaction: &CommandInteraction, bot: &BotIdentity) -> Option<Incoming> {
    super::translate::interaction_message(
        interaction.id,
        interaction.channel_id,
        interaction.guild_id,
        &interaction.user,
        interaction.member.as_deref(),
        command_text(interaction),
        bot,
    )
}

/// Replace the deferred response with `body` (a message's JSON). One attempt.
pub(crate) async fn answer(
    rest: &Rest,
    deferred: &Deferred,
    body: &Value,
) -> Result<reqwest::Response, String> {
    let url = format!(
        "{}/api/v10/webhooks/{}/{}/messages/@original",
        rest.api_url.trim_end_matches('/'),
        deferred.application,
        deferred.token
    );
    // The token is in the URL: no error carries the URL.
    rest.client.patch(url).json(body).send().await.map_err(|e| {
        format!(
            "Discord unreachable: {}",
            rest.redactor.redact(e.without_url())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slash(data: Value) -> CommandInteraction {
        serde_json::from_value(json!({
            "id": "5000", "application_id": "77", "type": 2, "token": "tok", "version": 1,
            "channel_id": "42", "channel": {"id": "42", "type": 1},
            "user": {"id": "9", "username": "ann", "discriminator": "0"},
            "data": data, "locale": "en-US", "entitlements": [], "app_permissions": "0",
            "attachment_size_limit": 10_485_760,
        }))
        .unwrap()
    }

    #[test]
    fn a_slash_command_is_the_command_typed() {
        let bare = slash(json!({"id": "1", "name": "usage", "type": 1}));
        assert_eq!(command_text(&bare), "/usage");
        let with = slash(json!({"id": "1", "name": "model", "type": 1,
            "options": [{"name": "name", "type": 3, "value": " gpt-x "}]}));
        assert_eq!(command_text(&with), "/model gpt-x");
        let bot = BotIdentity {
            id: serenity::all::UserId::new(1),
            name: "lull".into(),
        };
        let incoming = incoming(&with, &bot).unwrap();
        assert_eq!(incoming.message_id, "interaction:5000");
        assert_eq!(incoming.conversation.key, "42");
        assert!(!incoming.is_group);
    }

    #[test]
    fn commands_carry_their_optional_argument() {
        let commands = commands(&lull_port::Menus {
            everyone: vec![
                MenuCommand {
                    name: "new",
                    description: "Fresh start",
                    argument: None,
                },
                MenuCommand {
                    name: "model",
                    description: "Pick",
                    argument: Some(lull_port::command::Argument {
                        name: "name",
                        description: "The model",
                    }),
                },
            ],
            admins: Vec::new(),
        });
        assert_eq!(
            commands[0],
            json!({"name": "new", "description": "Fresh start", "type": 1})
        );
        assert_eq!(commands[1]["options"][0]["type"], 3);
        assert_eq!(commands[1]["options"][0]["required"], false);
    }

    #[test]
    fn a_notice_takes_the_oldest_deferral_and_a_quote_its_own() {
        let deferrals = Deferrals::default();
        let channel = ChannelId::new(42);
        for id in ["5000", "5001"] {
            let mut i = slash(json!({"id": "1", "name": "usage", "type": 1}));
            i.id = serenity::all::InteractionId::new(id.parse().unwrap());
            deferrals.remember(channel, &i);
        }
        assert!(
            deferrals.take(channel, None, false).is_none(),
            "a reply quoting nothing"
        );
        let quoted = deferrals
            .take(channel, Some("interaction:5001"), false)
            .unwrap();
        assert_eq!(quoted.interaction, 5001);
        assert_eq!(
            deferrals.take(channel, None, true).unwrap().interaction,
            5000
        );
        assert!(deferrals.take(channel, None, true).is_none());
    }
}

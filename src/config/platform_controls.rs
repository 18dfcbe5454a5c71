//! Platform controls: what lull shows on the platforms beside its replies — the ack
//! reaction on a message it will answer — and what it reads there besides messages
//! to it: group context.

use clap::Args;
use lull_core::dispatcher;

use super::ConfigError;

/// The longest `LULL_ACK_REACTION` accepted, in bytes: an emoji with its modifiers
/// (a family or a flag is at most 25 bytes), never a word.
const MAX_REACTION_BYTES: usize = 32;

/// The largest `LULL_GROUP_CONTEXT`: every overheard message goes into each prompt of
/// its group, so a larger window would crowd out the history.
pub(super) const MAX_GROUP_CONTEXT: usize = 100;

/// `LULL_ACK_REACTION`, `LULL_GROUP_CONTEXT`, `LULL_DISCORD_AUTO_THREAD`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Platform controls")]
pub(crate) struct PlatformControlsArgs {
    /// Reaction lull puts on a message it stored and will answer after the debounce (once per burst), taken off when the reply is sent; `off`: none. Telegram accepts only the emoji of its reaction list.
    #[arg(
        long,
        global = true,
        env = "LULL_ACK_REACTION",
        default_value = dispatcher::ACK_REACTION
    )]
    pub ack_reaction: String,
    /// In admitted groups, how many recent messages not addressed to lull it keeps per conversation and shows the model (with their authors) when addressed; never answered. 0: none. Telegram delivers them only with the bot's privacy mode off.
    #[arg(long, global = true, env = "LULL_GROUP_CONTEXT", default_value_t = 0)]
    pub group_context: usize,
    /// `on`: a mention in a Discord server channel opens a thread on it and is answered there; in the threads lull opened no mention is needed. `off`: answered in the channel.
    #[arg(
        long,
        global = true,
        env = "LULL_DISCORD_AUTO_THREAD",
        default_value = "off"
    )]
    pub discord_auto_thread: String,
}

impl PlatformControlsArgs {
    /// `LULL_ACK_REACTION`: `None` for `off`; otherwise one short emoji, no spaces.
    pub(crate) fn ack_reaction(&self) -> Result<Option<String>, ConfigError> {
        let reaction = self.ack_reaction.trim();
        if reaction.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let is_emoji = !reaction.is_empty()
            && reaction.len() <= MAX_REACTION_BYTES
            && !reaction.chars().any(|c| c.is_whitespace() || c.is_ascii());
        if !is_emoji {
            return Err(ConfigError(format!(
                "LULL_ACK_REACTION must be one emoji (such as {}) or `off`, got {:?}",
                dispatcher::ACK_REACTION,
                self.ack_reaction
            )));
        }
        Ok(Some(reaction.to_owned()))
    }

    /// `LULL_DISCORD_AUTO_THREAD`: `on` or `off`.
    pub(crate) fn discord_auto_thread(&self) -> Result<bool, ConfigError> {
        super::on_off("LULL_DISCORD_AUTO_THREAD", &self.discord_auto_thread)
    }

    /// `LULL_GROUP_CONTEXT`: at most [`MAX_GROUP_CONTEXT`].
    pub(crate) fn group_context(&self) -> Result<usize, ConfigError> {
        if self.group_context > MAX_GROUP_CONTEXT {
            return Err(ConfigError(format!(
                "LULL_GROUP_CONTEXT is at most {MAX_GROUP_CONTEXT} messages, got {}",
                self.group_context
            )));
        }
        Ok(self.group_context)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};

    #[test]
    fn the_ack_reaction_is_an_emoji_or_off() {
        let reaction = |args: &[&str]| {
            Config::from_settings(&settings(args))
                .unwrap()
                .dispatch
                .ack_reaction
        };
        assert_eq!(reaction(&[]).as_deref(), Some("👀"), "the default");
        assert_eq!(reaction(&["--ack-reaction", "🔥"]).as_deref(), Some("🔥"));
        assert_eq!(reaction(&["--ack-reaction", "off"]), None);
        assert_eq!(reaction(&["--ack-reaction", "OFF"]), None);
    }

    #[test]
    fn group_context_is_off_by_default_and_bounded() {
        let context = |args: &[&str]| {
            Config::from_settings(&settings(args))
                .unwrap()
                .dispatch
                .group_context
        };
        assert_eq!(context(&[]), 0, "off by default");
        assert_eq!(context(&["--group-context", "20"]), 20);
    }

    #[test]
    fn discord_auto_thread_is_on_or_off_and_off_by_default() {
        let config = |args: &[&str]| Config::from_settings(&settings(args)).unwrap();
        assert!(!config(&[]).dispatch.discord_auto_thread, "off by default");
        let on = config(&[
            "--discord-auto-thread",
            "on",
            "--discord-bot-token",
            "a-token",
        ]);
        assert!(on.dispatch.discord_auto_thread);
        assert!(on.discord.unwrap().auto_thread);
    }

    #[test]
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (&["--group-context", "101"], "LULL_GROUP_CONTEXT"),
            (
                &["--discord-auto-thread", "yes"],
                "LULL_DISCORD_AUTO_THREAD",
            ),
            (&["--ack-reaction", ""], "LULL_ACK_REACTION"),
            (&["--ack-reaction", "eyes"], "LULL_ACK_REACTION"),
            (&["--ack-reaction", "👀 👀"], "LULL_ACK_REACTION"),
            (
                &["--ack-reaction", "👀👀👀👀👀👀👀👀👀"],
                "LULL_ACK_REACTION",
            ),
        ]);
    }
}

//! Chat commands. They bypass the debounce: a command is answered at once, without
//! the model, and never joins a burst of messages.

/// A command a user can send on any platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `/start`: the greeting platforms send when a user opens the bot.
    Start,
    /// `/help`: what the bot does and how to use it.
    Help,
    /// `/reset`: start a fresh context for this conversation.
    Reset,
}

impl Command {
    /// Parse a message text as a command. Adapters strip platform decorations first
    /// (Telegram's `/cmd@botname`, a leading mention); anything after the command
    /// word is ignored.
    pub fn parse(text: &str) -> Option<Command> {
        let word = text.split_whitespace().next()?;
        let name = word.strip_prefix('/')?;
        match name.to_ascii_lowercase().as_str() {
            "start" => Some(Command::Start),
            "help" => Some(Command::Help),
            "reset" => Some(Command::Reset),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Command::Start => "start",
            Command::Help => "help",
            Command::Reset => "reset",
        }
    }
}

/// What `/help` and `/start` answer.
pub const HELP_TEXT: &str = "Hi, I'm lull, an AI assistant. Write to me as you would to a person: \
if you send several messages in a row, I wait until you pause and answer them together, once.\n\
\n\
Commands:\n\
/reset: forget our conversation so far and start fresh\n\
/help: show this message";

/// What `/reset` answers.
pub const RESET_TEXT: &str = "Done: I've forgotten our conversation so far. What's next?";

/// What a message lull cannot read gets.
pub fn unsupported_text(what: &str) -> String {
    format!("I can only read text, so I can't look at this {what}. Please describe it in words.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_case_insensitively_with_arguments() {
        assert_eq!(Command::parse("/help"), Some(Command::Help));
        assert_eq!(Command::parse("  /RESET now"), Some(Command::Reset));
        assert_eq!(Command::parse("/start"), Some(Command::Start));
        assert_eq!(Command::parse("/unknown"), None);
        assert_eq!(Command::parse("help"), None);
        assert_eq!(Command::parse(""), None);
        assert_eq!(Command::parse("what does /help do?"), None);
    }
}

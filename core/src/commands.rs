//! Chat commands. They bypass the debounce: a command is answered at once, without
//! the model, and never joins a burst of messages.

pub use lull_port::Command;

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

//! Chat commands. They bypass the debounce: a command is answered at once, without
//! the model, and never joins a burst of messages.

pub use lull_port::Command;

/// What `/help` and `/start` answer.
pub const HELP_TEXT: &str = "Hi, I'm lull, an AI assistant. Write to me as you would to a person: \
if you send several messages in a row, I wait until you pause and answer them together, once.\n\
\n\
Commands:\n\
/reset: forget our conversation so far and start fresh (in a group: admins only)\n\
/usage: how much you have used today, and your limit\n\
/help: show this message";

/// What `/reset` answers.
pub const RESET_TEXT: &str = "Done: I've forgotten our conversation so far. What's next?";

/// What a message lull cannot read gets.
pub fn unsupported_text(what: &str) -> String {
    format!("I can only read text, so I can't look at this {what}. Please describe it in words.")
}

/// What a non-admin gets for an admin's command.
pub fn admins_only(command: &str) -> String {
    format!("Sorry, only the bot's admins can use /{command} here.")
}

/// How `/allow` and `/deny` are used.
pub const ACCESS_USAGE_TEXT: &str = "Usage: /allow platform:user_id (a user), \
/allow chat platform:chat_id (every member of a group or server), or /allow chat in a group \
(this group; on Discord, this server). /deny takes the same forms.";

/// What `/allow` or `/deny` answers once recorded.
pub fn access_set_text(subject: &str, allowed: bool) -> String {
    if allowed {
        format!("Allowed {subject}. Every process of this bot follows it from now on.")
    } else {
        format!("Denied {subject}. Every process of this bot follows it from now on.")
    }
}

/// What a user over `LULL_RATE_PER_MIN` is told, once per hold.
pub fn rate_text(per_min: u32, until: &str) -> String {
    format!(
        "You're sending messages faster than this bot allows ({per_min} a minute). \
I've kept them and will answer them together at {until}."
    )
}

/// What a user over a token budget is told, once a day per conversation: how much
/// of which budget is used (`used` of `limit`, as the store counted when it refused),
/// and when the kept messages are answered.
pub fn budget_text(yours: bool, used: u64, limit: u64, resets: &str) -> String {
    if yours {
        format!(
            "Not enough left of your tokens for a reply: {used} of {limit} used today. \
I've kept your messages and will answer them when your budget resets, at {resets}."
        )
    } else {
        format!(
            "Not enough left of this bot's tokens for a reply: {used} of {limit} used today. \
I've kept your messages and will answer them when its budget resets, at {resets}."
        )
    }
}

/// What a group member over their token budget is told when the rest of the group is
/// answered without their messages: this notice answers those messages.
pub fn held_out_text(author: &str, used: u64, limit: u64, resets: &str) -> String {
    format!(
        "{author}: not enough left of your tokens for a reply: {used} of {limit} used today, \
so I answered the others without your messages. Your budget resets at {resets}; please ask again then."
    )
}

/// What a group member over their token budget is told when nobody else in the batch
/// could be answered either: this notice answers their messages.
pub fn over_budget_text(author: &str, used: u64, limit: u64, resets: &str) -> String {
    format!(
        "{author}: not enough left of your tokens for a reply: {used} of {limit} used today, \
so I can't answer this. Your budget resets at {resets}; please ask again then."
    )
}

/// What `/usage` answers: `who` used `used` tokens on `day` of `limit` (0: none);
/// with `bot`, the whole bot's use and limit too.
pub fn usage_text(
    day: &str,
    who: &str,
    used: u64,
    limit: u64,
    bot: Option<(u64, u64)>,
    resets: &str,
) -> String {
    let of = |used: u64, limit: u64| {
        if limit == 0 {
            format!("{used} tokens (no limit)")
        } else {
            format!("{used} of {limit} tokens")
        }
    };
    let mut text = format!("Today ({day}), {who}: {}.", of(used, limit));
    if let Some((used, limit)) = bot {
        text.push_str(&format!(" The whole bot: {}.", of(used, limit)));
    }
    text.push_str(&format!(" Budgets reset at {resets}."));
    text
}

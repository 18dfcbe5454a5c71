//! Access: who may talk to the bot (users, and every member of listed chats) and
//! who administers it. Admins' run-time `/allow` and `/deny` are kept in the store.

use clap::Args;
use lull_core::access::{Access, AccessList, Admins};

/// What admins may do, one literal for `--help` ([`ADMINS_HELP`]) and `ADMIN_POWERS`.
macro_rules! admin_powers {
    () => {
        "they alone change a group's conversation (/new, /stop, /retry, /model, /persona, its memory and jobs), set a chat's /prompt, see others' /usage, /allow or /deny at run time, and use admins-only tools; the per-user limits do not bind them"
    };
}

/// What admins may do, said the same in `--help`, `.env.example` and the docs (a
/// documentation test compares them).
#[cfg(test)]
pub(crate) const ADMIN_POWERS: &str = admin_powers!();

/// `LULL_ADMINS`'s `--help`: the entries' form, `ADMIN_POWERS`, the default.
const ADMINS_HELP: &str = concat!(
    "Admins, platform:user_id entries: ",
    admin_powers!(),
    " [default: none]"
);

/// `LULL_ALLOWED_USERS`, `LULL_ALLOWED_CHATS`, `LULL_ADMINS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Access")]
pub(crate) struct AccessArgs {
    /// Who may use the bot: `platform:user_id` entries, `platform:*` or `*` [default: local users only]
    #[arg(
        long,
        global = true,
        env = "LULL_ALLOWED_USERS",
        default_value = "",
        hide_default_value = true
    )]
    pub allowed_users: AccessList,
    /// Groups and servers whose every member may use the bot: `telegram:<chat_id>`, `discord:<server or channel id>`, `platform:*` [default: none]
    #[arg(
        long,
        global = true,
        env = "LULL_ALLOWED_CHATS",
        default_value = "",
        hide_default_value = true,
        value_parser = chat_list
    )]
    pub allowed_chats: AccessList,
    /// Admins, `platform:user_id` entries (`ADMIN_POWERS`) [default: none]
    #[arg(
        long,
        global = true,
        help = ADMINS_HELP,
        env = "LULL_ADMINS",
        default_value = "",
        hide_default_value = true
    )]
    pub admins: Admins,
}

/// A `LULL_ALLOWED_CHATS` list.
fn chat_list(s: &str) -> Result<AccessList, String> {
    AccessList::parse(s, "LULL_ALLOWED_CHATS")
}

impl AccessArgs {
    /// The access settings (each list was checked as it was parsed, naming its
    /// variable).
    pub(crate) fn access(&self) -> Access {
        Access {
            users: self.allowed_users.clone(),
            chats: self.allowed_chats.clone(),
            admins: self.admins.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::Cli;

    #[test]
    fn bad_lists_name_their_variable() {
        for (flag, variable) in [
            ("--allowed-users", "LULL_ALLOWED_USERS"),
            ("--allowed-chats", "LULL_ALLOWED_CHATS"),
            ("--admins", "LULL_ADMINS"),
        ] {
            let e = Cli::try_parse_from(["lull", flag, "irc:1"]).unwrap_err();
            assert!(e.to_string().contains(variable), "{flag}: {e}");
        }
    }
}

//! The command menus a platform shows (Telegram's `/` menu, Discord's application
//! commands): which commands, in which words, both derived from the command table
//! ([`crate::command::COMMANDS`]); an adapter only registers them with its platform.
//!
//! The invariant every adapter keeps: a command chosen from a menu arrives at the core
//! as a *new message* whose text is the command as a user would type it (`/model
//! gpt-x`), so [`crate::Command::parse`] decides what it does, exactly as for typed
//! text; a menu grants nothing typing would not.

use crate::command::{COMMANDS, CommandSpec, Menu, Who};

pub use crate::command::Argument;

/// One command of a menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MenuCommand {
    /// The command word without its `/` (`model`): 1–32 characters `a-z 0-9 _`.
    pub name: &'static str,
    /// What it does, for the menu (1–100 characters).
    pub description: &'static str,
    /// The one optional argument it takes, if any: a Discord slash command offers it
    /// as an optional string option.
    pub argument: Option<Argument>,
}

impl MenuCommand {
    /// The menu entry of `spec`, if it is listed in a menu.
    fn of(spec: &CommandSpec) -> Option<MenuCommand> {
        let description = match spec.menu {
            Menu::Everyone(description) | Menu::Admins(description) => description,
            Menu::NotListed => return None,
        };
        Some(MenuCommand {
            name: spec.name,
            description,
            argument: spec.argument,
        })
    }
}

/// The menus lull registers at start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Menus {
    /// Everyone's (Telegram: private chats; Discord: the slash commands).
    pub everyone: Vec<MenuCommand>,
    /// Added for admins (Telegram: group administrators' menu, after everyone's).
    pub admins: Vec<MenuCommand>,
}

impl Menus {
    /// lull's menus, from the command table: each menu lists its commands in the
    /// table's order, each entry a command as typed, so a pick from a menu is
    /// answered as the typed command is.
    pub fn of_commands() -> Menus {
        let listed = |wanted: fn(&Menu) -> bool| {
            COMMANDS
                .iter()
                .filter(|spec| wanted(&spec.menu))
                .filter_map(MenuCommand::of)
                .collect()
        };
        Menus {
            everyone: listed(|menu| matches!(menu, Menu::Everyone(_))),
            admins: listed(|menu| matches!(menu, Menu::Admins(_))),
        }
    }

    /// What an admin's menu shows: everyone's commands, then the admins' own.
    pub fn for_admins(&self) -> Vec<MenuCommand> {
        self.everyone.iter().chain(&self.admins).cloned().collect()
    }

    /// What any member of a group sees: everyone's commands that everyone may use in
    /// a group ([`crate::Command::who`]: `/status`, `/usage`, `/help`, the lists), the
    /// same rule that answers them.
    pub fn for_group_members(&self) -> Vec<MenuCommand> {
        self.everyone
            .iter()
            .filter(|c| {
                crate::Command::parse(&format!("/{}", c.name))
                    .is_some_and(|command| command.who(false) == Who::Anyone)
            })
            .cloned()
            .collect()
    }

    /// The command words of `commands`, as `lull check` prints them (`/new /stop …`).
    pub fn words(commands: &[MenuCommand]) -> String {
        commands
            .iter()
            .map(|c| format!("/{}", c.name))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A menu entry as plain words: name, description, argument (name, description).
    type Entry = (
        &'static str,
        &'static str,
        Option<(&'static str, &'static str)>,
    );

    /// The menus as they were registered before the table (issue 38 derived them from
    /// it, unchanged), with the job commands (issue 39) and the memory commands (issue 40) before `/help`: the same
    /// commands, order and words on every platform.
    #[test]
    fn the_menus_are_those_of_before() {
        let menus = Menus::of_commands();
        let entries = |commands: &[MenuCommand]| -> Vec<Entry> {
            commands
                .iter()
                .map(|c| {
                    let argument = c.argument.map(|a| (a.name, a.description));
                    (c.name, c.description, argument)
                })
                .collect()
        };
        assert_eq!(
            entries(&menus.everyone),
            [
                ("new", "Start a fresh conversation", None),
                ("stop", "Stop what I'm doing here", None),
                ("retry", "Answer the last messages again", None),
                (
                    "model",
                    "Show or pick the model",
                    Some(("name", "The model to use"))
                ),
                (
                    "persona",
                    "Show or pick a persona",
                    Some(("name", "The persona to use"))
                ),
                ("usage", "Tokens and dollars used, and the limits", None),
                ("status", "Model, persona and what is pending", None),
                (
                    "remind",
                    "Remind this chat of something later",
                    Some((
                        "when_and_text",
                        "When, then what to say: in 20m take the pizza out"
                    ))
                ),
                (
                    "schedule",
                    "Ask me something on a schedule",
                    Some((
                        "when_and_prompt",
                        "When, then what to ask me each time: every day 8:00 plan my day"
                    ))
                ),
                (
                    "jobs",
                    "This chat's reminders and scheduled tasks",
                    Some(("cancel", "cancel N stops job N"))
                ),
                (
                    "timezone",
                    "Show or choose this chat's time zone",
                    Some(("name", "An IANA time zone such as Europe/Berlin"))
                ),
                (
                    "memory",
                    "What I remember here",
                    Some((
                        "change",
                        "forget N forgets memory N; clear forgets them all"
                    ))
                ),
                ("forgetme", "Erase what I keep about you", None),
                ("help", "What I do and how to use me", None),
            ]
        );
        assert_eq!(
            entries(&menus.admins),
            [
                (
                    "prompt",
                    "Set this chat's own prompt (admins)",
                    Some(("text", "The prompt; empty to clear it"))
                ),
                (
                    "reset",
                    "Start a fresh conversation (admins in groups)",
                    None
                ),
            ]
        );
        assert_eq!(
            Menus::words(&menus.for_group_members()),
            "/model /persona /usage /status /jobs /timezone /memory /forgetme /help"
        );
    }
}

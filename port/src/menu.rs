//! The command menus a platform shows (Telegram's `/` menu, Discord's application
//! commands): which commands, in which words. The words are the core's (its texts);
//! an adapter only registers them with its platform.
//!
//! The invariant every adapter keeps: a command chosen from a menu arrives at the core
//! as a *new message* whose text is the command as a user would type it (`/model
//! gpt-x`), so [`crate::Command::parse`] decides what it does, exactly as for typed
//! text; a menu grants nothing typing would not.

/// One command of a menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MenuCommand {
    /// The command word without its `/` (`model`): 1–32 characters `a-z 0-9 _`.
    pub name: &'static str,
    /// What it does, for the menu (1–100 characters).
    pub description: &'static str,
    /// The one optional argument it takes (`name`, its description), if any: a
    /// Discord slash command offers it as an optional string option.
    pub argument: Option<(&'static str, &'static str)>,
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
                    .is_some_and(|command| command.who(false) == crate::Who::Anyone)
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

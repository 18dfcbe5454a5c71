//! Every chat command, declared once: [`COMMANDS`] holds one [`CommandSpec`] per
//! [`Command`] with its name, the argument its menu offers, who may use it, its line
//! in `/help`, its menu entry and whether it acts. Everything else is derived from
//! the table: [`Command::parse`], [`Command::who`], [`Command::name`],
//! [`Command::acts`] (which commands the core claims once per message), the help's
//! command lines ([`help_lines`]), the menus adapters register with Telegram and
//! Discord ([`crate::Menus::of_commands`]), and `lull check`'s menu line. A new command
//! is one entry here and the code that answers it.
//!
//! # Why the words are here, not in the core's texts
//!
//! Every other sentence lull says is in the core's `texts`; a command's own words
//! (its menu description, its argument's, its help line) are in its entry instead,
//! beside its name and its rules. The adapters, which register the menus, see only
//! this crate, and an entry that points at words kept elsewhere by a key is a second
//! list that can drift from the first (a menu entry without a description, a help line
//! for a command that is gone). The core's `texts::help_text` composes `/help` from
//! its own greeting and [`help_lines`], so the help still reads as one text there.
//!
//! Not commands: `/approve` and `/cancel` ([`NOT_COMMANDS`]) answer a tool's approval
//! question and are stored as messages, so a round decides them under the
//! conversation's lease.

/// A command a user can send on any platform. Commands bypass the debounce: they are
/// answered at once, without the model, and never join a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `/start`: the greeting platforms send when a user opens the bot.
    Start,
    /// `/help`: what the bot does and how to use it.
    Help,
    /// `/reset`: start a fresh context for this conversation (in a group: admins only).
    Reset,
    /// `/usage`: tokens used today and the limits (an admin: of the group, or of a
    /// user named after the command).
    Usage,
    /// `/allow <platform:user_id>` or `/allow chat [platform:chat_id]` (admins).
    Allow,
    /// `/deny <platform:user_id>` or `/deny chat [platform:chat_id]` (admins).
    Deny,
    /// `/new`: the same as `/reset` (the name users of other bots know).
    New,
    /// `/model [NAME | N]`: list the models, or pick one for this conversation (in a
    /// group: admins only).
    Model,
    /// `/persona [NAME | N | default]`: list the personas, or pick one.
    Persona,
    /// `/prompt TEXT` or `/prompt clear`: this conversation's own system prompt (admins).
    Prompt,
    /// `/stop`: drop the reply being written and close the pending messages unanswered.
    Stop,
    /// `/retry`: answer the last batch again.
    Retry,
    /// `/status`: the model, persona, what is pending, today's usage, the ids.
    Status,
    /// `/remind WHEN TEXT`: a reminder, TEXT delivered as is when due (no model).
    Remind,
    /// `/schedule WHEN PROMPT`: a task, PROMPT answered by the model when due.
    Schedule,
    /// `/jobs` or `/jobs cancel N`: this chat's reminders and tasks, or stop one.
    Jobs,
    /// `/timezone [NAME]`: the zone this chat's times are read in, or choose one.
    Timezone,
    /// `/memory [forget N | clear]`: what lull remembers here, or forget (in a group:
    /// the chat's memories, changed by admins only).
    Memory,
    /// `/forgetme`: erase every memory of the sender and the text of their messages.
    ForgetMe,
    /// Any other `/word`: answered with the help, never sent to the model. Not
    /// `/approve` and `/cancel`: those answer a question about a tool call and are
    /// stored as messages, so a round decides them under the conversation's lease.
    Unknown,
}

/// Who may use a command ([`Command::who`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// Everyone lull answers.
    Anyone,
    /// In a group, lull's admins (`LULL_ADMINS`); in a private chat, its person.
    AdminsInGroups,
    /// Lull's admins everywhere, and the person at `lull chat` (who runs lull).
    Admins,
}

/// The one optional argument a command's menu entry offers (a Discord slash command
/// shows it as an optional string option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argument {
    /// 1–32 characters `a-z 0-9 _`.
    pub name: &'static str,
    /// 1–100 characters.
    pub description: &'static str,
}

/// Which menu a command is listed in, and with which description (1–100 characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Menu {
    /// Everyone's menu (Telegram: private chats, and group members for the commands
    /// anyone may use bare; Discord: the slash commands); admins see it too.
    Everyone(&'static str),
    /// Only the admins' menu (Telegram: group administrators, after everyone's).
    Admins(&'static str),
    /// In no menu: the command is typed.
    NotListed,
}

/// A line of `/help`: where it stands among the others (the help reads in its own
/// order, not the menus'), and its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelpLine {
    pub order: u8,
    pub text: &'static str,
}

/// Everything lull knows about one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandSpec {
    pub command: Command,
    /// The command word without its `/`: 1–32 characters `a-z 0-9 _`, unique with
    /// every alias, as Telegram and Discord require.
    pub name: &'static str,
    /// Other words that mean the same command (none today: `/new` and `/reset` are
    /// two commands, listed in different menus and named apart in their answers).
    pub aliases: &'static [&'static str],
    /// The argument its menu entry offers, if any.
    pub argument: Option<Argument>,
    /// Who may use it with words after it (`/model NAME` picks).
    pub who: Who,
    /// Who may use it bare (`/model` lists): never fewer people than [`Self::who`].
    pub who_bare: Who,
    pub menu: Menu,
    /// Its line in `/help`, if it has one of its own (`/reset` is told in `/new`'s).
    pub help: Option<HelpLine>,
    /// Whether it changes something, and so is claimed once per message before it
    /// acts (a redelivery then does nothing); the others only read and may answer
    /// again.
    pub acts: bool,
}

/// Command words that are not commands: the answers to a tool's approval question,
/// stored as messages and decided by a round.
pub const NOT_COMMANDS: [&str; 2] = ["approve", "cancel"];

/// Every command, in the order of the menus (everyone's, then the admins'), then
/// those in no menu.
pub const COMMANDS: [CommandSpec; 20] = [
    CommandSpec {
        command: Command::New,
        name: "new",
        aliases: &[],
        argument: None,
        who: Who::AdminsInGroups,
        who_bare: Who::AdminsInGroups,
        menu: Menu::Everyone("Start a fresh conversation"),
        help: Some(HelpLine {
            order: 1,
            text: "/new (or /reset): forget our conversation so far and start fresh (in a group: admins only)",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Stop,
        name: "stop",
        aliases: &[],
        argument: None,
        who: Who::AdminsInGroups,
        who_bare: Who::AdminsInGroups,
        menu: Menu::Everyone("Stop what I'm doing here"),
        help: Some(HelpLine {
            order: 2,
            text: "/stop: stop the answer I'm writing and drop the messages waiting for one (in a group: admins only)",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Retry,
        name: "retry",
        aliases: &[],
        argument: None,
        who: Who::AdminsInGroups,
        who_bare: Who::AdminsInGroups,
        menu: Menu::Everyone("Answer the last messages again"),
        help: Some(HelpLine {
            order: 4,
            text: "/retry: write my last answer again (in a group: admins only)",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Model,
        name: "model",
        aliases: &[],
        argument: Some(Argument {
            name: "name",
            description: "The model to use",
        }),
        who: Who::AdminsInGroups,
        // The list only reads.
        who_bare: Who::Anyone,
        menu: Menu::Everyone("Show or pick the model"),
        help: Some(HelpLine {
            order: 3,
            text: "/model, /persona: list the models and personas, or pick one for this chat (in a group: admins only)",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Persona,
        name: "persona",
        aliases: &[],
        argument: Some(Argument {
            name: "name",
            description: "The persona to use",
        }),
        who: Who::AdminsInGroups,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("Show or pick a persona"),
        // Told in `/model`'s line.
        help: None,
        acts: true,
    },
    CommandSpec {
        command: Command::Usage,
        name: "usage",
        aliases: &[],
        argument: None,
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("Tokens and dollars used, and the limits"),
        help: Some(HelpLine {
            order: 6,
            text: "/usage: how much you have used today and this month, and your limits",
        }),
        acts: false,
    },
    CommandSpec {
        command: Command::Status,
        name: "status",
        aliases: &[],
        argument: None,
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("Model, persona and what is pending"),
        help: Some(HelpLine {
            order: 5,
            text: "/status: this chat's model, persona, what is waiting, today's usage",
        }),
        acts: false,
    },
    CommandSpec {
        command: Command::Remind,
        name: "remind",
        aliases: &[],
        argument: Some(Argument {
            name: "when_and_text",
            description: "When, then what to say: in 20m take the pizza out",
        }),
        // Bare, it says how to use it: still the admins' in a group, whose members'
        // menu then does not offer it.
        who: Who::AdminsInGroups,
        who_bare: Who::AdminsInGroups,
        menu: Menu::Everyone("Remind this chat of something later"),
        help: Some(HelpLine {
            order: 8,
            text: "/remind WHEN TEXT: remind this chat, e.g. /remind in 20m take the pizza out, /remind every weekday 8:30 stand-up (in a group: admins only)",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Schedule,
        name: "schedule",
        aliases: &[],
        argument: Some(Argument {
            name: "when_and_prompt",
            description: "When, then what to ask me each time: every day 8:00 plan my day",
        }),
        who: Who::AdminsInGroups,
        who_bare: Who::AdminsInGroups,
        menu: Menu::Everyone("Ask me something on a schedule"),
        help: Some(HelpLine {
            order: 9,
            text: "/schedule WHEN PROMPT: I answer PROMPT then, e.g. /schedule every day 8:00 give me the day's plan (in a group: admins only)",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Jobs,
        name: "jobs",
        aliases: &[],
        argument: Some(Argument {
            name: "cancel",
            description: "cancel N stops job N",
        }),
        who: Who::AdminsInGroups,
        // The list only reads.
        who_bare: Who::Anyone,
        menu: Menu::Everyone("This chat's reminders and scheduled tasks"),
        help: Some(HelpLine {
            order: 10,
            text: "/jobs: this chat's reminders and tasks; /jobs cancel N stops one",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Timezone,
        name: "timezone",
        aliases: &[],
        argument: Some(Argument {
            name: "name",
            description: "An IANA time zone such as Europe/Berlin",
        }),
        who: Who::AdminsInGroups,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("Show or choose this chat's time zone"),
        help: Some(HelpLine {
            order: 11,
            text: "/timezone [NAME]: the time zone this chat's times are read in, or choose one",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Memory,
        name: "memory",
        aliases: &[],
        argument: Some(Argument {
            name: "change",
            description: "forget N forgets memory N; clear forgets them all",
        }),
        // Anyone: in a group, only admins change the chat's (checked by the answer,
        // which says so).
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("What I remember here"),
        help: Some(HelpLine {
            order: 12,
            text: "/memory: what I remember about you (in a group: about this chat); /memory forget N, /memory clear",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::ForgetMe,
        name: "forgetme",
        aliases: &[],
        argument: None,
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("Erase what I keep about you"),
        help: Some(HelpLine {
            order: 13,
            text: "/forgetme: erase everything I remember about you and the text of your messages, in every chat",
        }),
        acts: true,
    },
    CommandSpec {
        command: Command::Help,
        name: "help",
        aliases: &[],
        argument: None,
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::Everyone("What I do and how to use me"),
        help: Some(HelpLine {
            order: 20,
            text: "/help: show this message",
        }),
        acts: false,
    },
    CommandSpec {
        command: Command::Prompt,
        name: "prompt",
        aliases: &[],
        argument: Some(Argument {
            name: "text",
            description: "The prompt; empty to clear it",
        }),
        // A system prompt steers every answer.
        who: Who::Admins,
        who_bare: Who::Admins,
        menu: Menu::Admins("Set this chat's own prompt (admins)"),
        help: None,
        acts: true,
    },
    CommandSpec {
        command: Command::Reset,
        name: "reset",
        aliases: &[],
        argument: None,
        who: Who::AdminsInGroups,
        who_bare: Who::AdminsInGroups,
        menu: Menu::Admins("Start a fresh conversation (admins in groups)"),
        // Told in `/new`'s line.
        help: None,
        acts: true,
    },
    CommandSpec {
        command: Command::Start,
        name: "start",
        aliases: &[],
        argument: None,
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::NotListed,
        help: None,
        acts: false,
    },
    CommandSpec {
        command: Command::Allow,
        name: "allow",
        aliases: &[],
        argument: None,
        // Access decisions admit people.
        who: Who::Admins,
        who_bare: Who::Admins,
        menu: Menu::NotListed,
        help: None,
        acts: true,
    },
    CommandSpec {
        command: Command::Deny,
        name: "deny",
        aliases: &[],
        argument: None,
        who: Who::Admins,
        who_bare: Who::Admins,
        menu: Menu::NotListed,
        help: None,
        acts: true,
    },
    CommandSpec {
        command: Command::Unknown,
        name: "unknown",
        aliases: &[],
        argument: None,
        who: Who::Anyone,
        who_bare: Who::Anyone,
        menu: Menu::NotListed,
        help: None,
        acts: false,
    },
];

impl Command {
    /// Parse a message text as a command. Adapters strip platform decorations first
    /// (Telegram's `/cmd@botname`, a leading mention); anything after the command
    /// word is ignored.
    ///
    /// A command word is `/` and a name of ASCII letters, digits and `_` (optionally
    /// `@botname`); anything else (`/usr/bin`, `/ shrug`) is a message, and so is a
    /// word of [`NOT_COMMANDS`]. A name the table does not hold is
    /// [`Command::Unknown`].
    pub fn parse(text: &str) -> Option<Command> {
        let word = text.split_whitespace().next()?;
        let name = word.strip_prefix('/')?;
        let name = name.split_once('@').map_or(name, |(name, _)| name);
        let is_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !is_name {
            return None;
        }
        let name = name.to_ascii_lowercase();
        if NOT_COMMANDS.contains(&name.as_str()) {
            return None;
        }
        let named = COMMANDS
            .iter()
            .find(|spec| spec.name == name || spec.aliases.contains(&name.as_str()));
        Some(named.map_or(Command::Unknown, |spec| spec.command))
    }

    /// The command's entry in [`COMMANDS`] (every command has exactly one; a unit
    /// test holds the table to it).
    pub fn spec(self) -> &'static CommandSpec {
        COMMANDS
            .iter()
            .find(|spec| spec.command == self)
            .expect("every command has an entry in COMMANDS")
    }

    /// Who may use the command, decided here once for every adapter: a command is
    /// answered the same way on Telegram, Discord, the http adapter and `lull chat`.
    /// `has_argument`: words follow the command (`/model NAME` picks, `/model` lists).
    pub fn who(self, has_argument: bool) -> Who {
        let spec = self.spec();
        if has_argument {
            spec.who
        } else {
            spec.who_bare
        }
    }

    /// The command word without its `/`.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Whether the command changes something, and so is claimed once per message
    /// before it acts ([`CommandSpec::acts`]).
    pub fn acts(self) -> bool {
        self.spec().acts
    }
}

/// The command lines of `/help`, in the help's order.
pub fn help_lines() -> Vec<&'static str> {
    let mut lines: Vec<HelpLine> = COMMANDS.iter().filter_map(|spec| spec.help).collect();
    lines.sort_by_key(|line| line.order);
    lines.into_iter().map(|line| line.text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_case_insensitively_with_arguments() {
        assert_eq!(Command::parse("/help"), Some(Command::Help));
        assert_eq!(Command::parse("  /RESET now"), Some(Command::Reset));
        assert_eq!(Command::parse("/start"), Some(Command::Start));
        assert_eq!(Command::parse("/usage"), Some(Command::Usage));
        assert_eq!(Command::parse("/allow telegram:1"), Some(Command::Allow));
        assert_eq!(Command::parse("/deny chat"), Some(Command::Deny));
        assert_eq!(Command::parse("/unknown"), Some(Command::Unknown));
        assert_eq!(Command::parse("/model gpt"), Some(Command::Model));
        assert_eq!(Command::parse("/stop"), Some(Command::Stop));
        assert_eq!(Command::parse("/models"), Some(Command::Unknown));
        assert_eq!(Command::parse("/new"), Some(Command::New));
        assert_eq!(Command::parse("/help@lull_bot"), Some(Command::Help));
        // Answers to a tool's approval question are messages, decided by a round.
        assert_eq!(Command::parse("/approve 3"), None);
        assert_eq!(Command::parse("/cancel 3"), None);
        assert_eq!(Command::parse("/APPROVE"), None);
        // Not command words: a path, a lone slash, an emoticon.
        assert_eq!(Command::parse("/usr/bin is a folder"), None);
        assert_eq!(Command::parse("/ shrug"), None);
        assert_eq!(Command::parse("/_/"), None);
        assert_eq!(Command::parse("help"), None);
        assert_eq!(Command::parse(""), None);
        assert_eq!(Command::parse("what does /help do?"), None);
    }

    /// Every command has one entry, and parses back to itself by its name and each
    /// alias; no word is taken twice, and the answers to an approval are none of them.
    #[test]
    fn every_entry_parses_back_to_its_command() {
        let mut words: Vec<&str> = Vec::new();
        for spec in &COMMANDS {
            let entries = COMMANDS.iter().filter(|s| s.command == spec.command);
            assert_eq!(entries.count(), 1, "{} has one entry", spec.name);
            for word in std::iter::once(&spec.name).chain(spec.aliases) {
                assert_eq!(Command::parse(&format!("/{word}")), Some(spec.command));
                assert!(!words.contains(word), "/{word} is taken twice");
                assert!(!NOT_COMMANDS.contains(word), "/{word} is not a command");
                words.push(word);
            }
        }
    }

    /// The names Telegram (`setMyCommands`: 1–32 characters `a-z 0-9 _`) and Discord
    /// (application commands and options: 1–32 lowercase characters) accept, and the
    /// descriptions both accept (Discord's 1–100 characters is the narrower).
    #[test]
    fn names_and_descriptions_fit_both_platforms() {
        let name_fits = |name: &str| {
            (1..=32).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let description_fits = |text: &str| (1..=100).contains(&text.chars().count());
        for spec in &COMMANDS {
            for word in std::iter::once(&spec.name).chain(spec.aliases) {
                assert!(name_fits(word), "{word}");
            }
            if let Menu::Everyone(description) | Menu::Admins(description) = spec.menu {
                assert!(description_fits(description), "{description}");
            }
            if let Some(argument) = spec.argument {
                assert!(name_fits(argument.name), "{}", argument.name);
                assert!(description_fits(argument.description), "{argument:?}");
            }
        }
    }

    /// A command's bare use is open to at least the people its use with words is, and
    /// a help line's order is its own.
    #[test]
    fn the_rules_are_consistent() {
        let reach = |who: Who| match who {
            Who::Anyone => 2,
            Who::AdminsInGroups => 1,
            Who::Admins => 0,
        };
        for spec in &COMMANDS {
            assert!(reach(spec.who_bare) >= reach(spec.who), "{}", spec.name);
        }
        let mut orders: Vec<u8> = COMMANDS
            .iter()
            .filter_map(|s| s.help.map(|h| h.order))
            .collect();
        orders.sort_unstable();
        orders.dedup();
        assert_eq!(orders.len(), help_lines().len());
    }

    /// The rules as they were before the table (issue 38 moved them, unchanged).
    #[test]
    fn who_and_acts_are_the_rules_of_before() {
        use Command::*;
        for command in [Start, Help, Usage, Status, Unknown] {
            assert_eq!(command.who(true), Who::Anyone);
            assert!(!command.acts());
        }
        for command in [Model, Persona] {
            assert_eq!(command.who(false), Who::Anyone);
            assert_eq!(command.who(true), Who::AdminsInGroups);
        }
        for command in [Reset, New, Stop, Retry] {
            assert_eq!(command.who(false), Who::AdminsInGroups);
        }
        for command in [Prompt, Allow, Deny] {
            assert_eq!(command.who(false), Who::Admins);
            assert_eq!(command.who(true), Who::Admins);
        }
        for command in [Reset, New, Model, Persona, Prompt, Stop, Retry, Allow, Deny] {
            assert!(command.acts(), "{command:?}");
        }
    }
}

//! Who may talk to the bot, and who runs it.
//!
//! - `LULL_ALLOWED_USERS` admits users, `LULL_ALLOWED_CHATS` every member of a group
//!   or server; the two combine.
//! - `LULL_ADMINS` names the users who may `/reset` a group, see `/usage` of others,
//!   and `/allow` or `/deny` users and chats at run time. Admins are always admitted.
//! - Run-time decisions ([`AccessRule`], kept in the database so every process sees
//!   them and they survive restarts) win over the lists: a `/deny` shuts out a user the
//!   list admits, an `/allow` admits one it does not.
//!
//! The default admits only local platforms (the console, the http adapter behind its
//! token): a bot token leaked to the world must not spend its owner's LLM credit.

use std::collections::HashSet;
use std::fmt;

use crate::domain::{Platform, Timestamp};

/// A parsed list of `LULL_ALLOWED_USERS` or `LULL_ALLOWED_CHATS`: `*` (everyone),
/// `platform:*` (everyone on a platform) or `platform:id` entries, separated by
/// commas or spaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    everyone: bool,
    platforms: HashSet<Platform>,
    ids: HashSet<(Platform, String)>,
}

impl AccessList {
    /// Whether `user_id` on `platform` is admitted by this list of users: local
    /// platforms always are.
    pub fn allows(&self, platform: Platform, user_id: &str) -> bool {
        platform.is_local() || self.contains(platform, user_id)
    }

    /// Whether the list names `id` on `platform` (or all of the platform, or everyone).
    pub fn contains(&self, platform: Platform, id: &str) -> bool {
        self.everyone
            || self.platforms.contains(&platform)
            || self.ids.contains(&(platform, id.to_owned()))
    }

    /// Whether the list admits nobody.
    pub fn is_empty(&self) -> bool {
        !self.everyone && self.platforms.is_empty() && self.ids.is_empty()
    }

    /// Whether the list admits anyone at all on `platform` (what `lull check` asks of a
    /// configured platform).
    pub fn names_any(&self, platform: Platform) -> bool {
        self.everyone
            || self.platforms.contains(&platform)
            || self.ids.iter().any(|(p, _)| *p == platform)
    }

    /// The entry an owner adds to allow this user.
    pub fn entry_for(platform: Platform, user_id: &str) -> String {
        format!("{platform}:{user_id}")
    }

    /// Parse a list, naming `variable` in errors.
    pub fn parse(s: &str, variable: &str) -> Result<Self, String> {
        let mut list = AccessList::default();
        for entry in entries(s) {
            if entry == "*" {
                list.everyone = true;
                continue;
            }
            let (platform, id) = split_entry(entry, variable, "id")?;
            if id == "*" {
                list.platforms.insert(platform);
            } else {
                list.ids.insert((platform, id.to_owned()));
            }
        }
        Ok(list)
    }

    /// The list as it is written (`*`, `platform:*`, `platform:id`), sorted.
    pub fn describe(&self) -> String {
        if self.everyone {
            return "*".into();
        }
        let mut entries: Vec<String> = self
            .platforms
            .iter()
            .map(|p| format!("{p}:*"))
            .chain(self.ids.iter().map(|(p, id)| format!("{p}:{id}")))
            .collect();
        entries.sort();
        entries.join(", ")
    }
}

impl std::str::FromStr for AccessList {
    type Err = String;

    /// A `LULL_ALLOWED_USERS` list.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AccessList::parse(s, "LULL_ALLOWED_USERS")
    }
}

fn entries(s: &str) -> impl Iterator<Item = &str> {
    s.split([',', ' ', '\n', '\t'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
}

/// `platform:id` split, its platform parsed; errors name `variable`.
fn split_entry<'a>(
    entry: &'a str,
    variable: &str,
    what: &str,
) -> Result<(Platform, &'a str), String> {
    let (platform, id) = entry
        .split_once(':')
        .ok_or_else(|| format!("{variable}: '{entry}' is not of the form platform:{what}"))?;
    let platform: Platform = platform.parse().map_err(|e| format!("{variable}: {e}"))?;
    if id.is_empty() {
        return Err(format!("{variable}: '{entry}' has no {what}"));
    }
    Ok((platform, id))
}

/// A parsed `LULL_ADMINS`: `platform:user_id` entries (no wildcards: an admin is a
/// person).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admins(HashSet<(Platform, String)>);

/// The user id the console's operator answers approvals as, in the chat that asked
/// (`Dispatcher::console_answer_approval`): an admin on every platform
/// ([`Admins::contains`]). Only the console writes it; ingest refuses an update carrying
/// it from every adapter, so nobody on a platform can speak as the operator.
pub const CONSOLE_OPERATOR: &str = "lull:console";

impl Admins {
    /// Whether `user_id` is an admin on `platform`: named in `LULL_ADMINS`, or the
    /// console's operator ([`CONSOLE_OPERATOR`]).
    pub fn contains(&self, platform: Platform, user_id: &str) -> bool {
        user_id == CONSOLE_OPERATOR || self.0.contains(&(platform, user_id.to_owned()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an admin is named on `platform`.
    pub fn any_on(&self, platform: Platform) -> bool {
        self.0.iter().any(|(p, _)| *p == platform)
    }

    /// The admins as written, sorted.
    pub fn describe(&self) -> String {
        let mut entries: Vec<String> = self.0.iter().map(|(p, id)| format!("{p}:{id}")).collect();
        entries.sort();
        entries.join(", ")
    }
}

impl std::str::FromStr for Admins {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut admins = HashSet::new();
        for entry in entries(s) {
            let (platform, id) = split_entry(entry, "LULL_ADMINS", "user_id")?;
            if id == "*" {
                return Err(format!(
                    "LULL_ADMINS: '{entry}' is a wildcard; name each admin (platform:user_id)"
                ));
            }
            admins.insert((platform, id.to_owned()));
        }
        Ok(Admins(admins))
    }
}

/// Who a run-time access decision is about: a user, or a chat (a Telegram group, a
/// Discord server or channel) whose members it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubjectKind {
    User,
    Chat,
}

impl SubjectKind {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::User => "user",
            SubjectKind::Chat => "chat",
        }
    }
}

/// A user or chat on a platform, as `/allow` and `/deny` name it: `telegram:42` (a
/// user) or `chat telegram:-100123` (a chat).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    pub platform: Platform,
    pub kind: SubjectKind,
    pub id: String,
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            SubjectKind::User => write!(f, "{}:{}", self.platform, self.id),
            SubjectKind::Chat => write!(f, "chat {}:{}", self.platform, self.id),
        }
    }
}

/// An admin's run-time decision about a subject (`/allow`, `/deny`). The latest one
/// per subject counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRule {
    pub subject: Subject,
    pub allowed: bool,
    /// The admin who decided (`platform:user_id`).
    pub set_by: String,
    pub set_at: Timestamp,
}

/// Who sent a message, as access decisions see it.
#[derive(Debug, Clone, Copy)]
pub struct Sender<'a> {
    pub platform: Platform,
    pub user_id: &'a str,
    /// The chats the message came from, most specific first (a Discord channel,
    /// then its server); empty for private chats.
    pub chats: &'a [String],
}

impl<'a> Sender<'a> {
    /// Who sent `incoming`.
    pub fn of(incoming: &'a lull_port::Incoming) -> Self {
        Sender {
            platform: incoming.conversation.platform,
            user_id: &incoming.user_id,
            chats: &incoming.chats,
        }
    }
}

/// The access settings: the two lists and the admins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub users: AccessList,
    pub chats: AccessList,
    pub admins: Admins,
}

impl Access {
    /// Whether `sender` is an admin.
    pub fn is_admin(&self, sender: Sender<'_>) -> bool {
        self.admins.contains(sender.platform, sender.user_id)
    }

    /// Whether `sender` may use the bot, given the run-time decisions `rules`: an
    /// admin always; else a decision about the user; else the user list; else a
    /// decision about the most specific of the sender's chats that has one; else the
    /// chat list.
    pub fn allows(&self, sender: Sender<'_>, rules: &[AccessRule]) -> bool {
        if self.is_admin(sender) {
            return true;
        }
        let rule = |kind: SubjectKind, id: &str| {
            rules
                .iter()
                .rev()
                .find(|r| {
                    r.subject.platform == sender.platform
                        && r.subject.kind == kind
                        && r.subject.id == id
                })
                .map(|r| r.allowed)
        };
        if let Some(allowed) = rule(SubjectKind::User, sender.user_id) {
            return allowed;
        }
        if self.users.allows(sender.platform, sender.user_id) {
            return true;
        }
        if let Some(allowed) = sender
            .chats
            .iter()
            .find_map(|chat| rule(SubjectKind::Chat, chat))
        {
            return allowed;
        }
        sender
            .chats
            .iter()
            .any(|chat| self.chats.contains(sender.platform, chat))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender<'a>(platform: Platform, user_id: &'a str, chats: &'a [String]) -> Sender<'a> {
        Sender {
            platform,
            user_id,
            chats,
        }
    }

    fn rule(platform: Platform, kind: SubjectKind, id: &str, allowed: bool) -> AccessRule {
        AccessRule {
            subject: Subject {
                platform,
                kind,
                id: id.into(),
            },
            allowed,
            set_by: "telegram:1".into(),
            set_at: Timestamp(0),
        }
    }

    #[test]
    fn default_admits_local_platforms_only() {
        let list = AccessList::default();
        assert!(list.allows(Platform::Console, "me"));
        assert!(list.allows(Platform::Http, "anyone"));
        assert!(!list.allows(Platform::Telegram, "42"));
        assert!(!list.allows(Platform::Discord, "42"));
    }

    #[test]
    fn entries_admit_users_platforms_or_everyone() {
        let list: AccessList = "telegram:42, discord:*".parse().unwrap();
        assert!(list.allows(Platform::Telegram, "42"));
        assert!(!list.allows(Platform::Telegram, "43"));
        assert!(list.allows(Platform::Discord, "7"));
        let all: AccessList = "*".parse().unwrap();
        assert!(all.allows(Platform::Telegram, "1"));
        assert_eq!(list.describe(), "discord:*, telegram:42");
    }

    #[test]
    fn bad_entries_name_the_variable() {
        for bad in ["telegram", "irc:1", "telegram:"] {
            let e = bad.parse::<AccessList>().unwrap_err();
            assert!(e.contains("LULL_ALLOWED_USERS"), "{e}");
            let e = AccessList::parse(bad, "LULL_ALLOWED_CHATS").unwrap_err();
            assert!(e.contains("LULL_ALLOWED_CHATS"), "{e}");
            let e = bad.parse::<Admins>().unwrap_err();
            assert!(e.contains("LULL_ADMINS"), "{e}");
        }
        assert!("telegram:*".parse::<Admins>().is_err());
    }

    #[test]
    fn a_chat_admits_its_members_and_the_lists_combine() {
        let access = Access {
            users: "telegram:7".parse().unwrap(),
            chats: AccessList::parse("telegram:-100, discord:555", "LULL_ALLOWED_CHATS").unwrap(),
            admins: Admins::default(),
        };
        let group = ["-100".to_owned()];
        let other = ["-200".to_owned()];
        let channel_in_server = ["9".to_owned(), "555".to_owned()];
        assert!(access.allows(sender(Platform::Telegram, "1", &group), &[]));
        assert!(!access.allows(sender(Platform::Telegram, "1", &other), &[]));
        assert!(!access.allows(sender(Platform::Telegram, "1", &[]), &[]));
        assert!(access.allows(sender(Platform::Telegram, "7", &other), &[]));
        assert!(access.allows(sender(Platform::Discord, "1", &channel_in_server), &[]));
        assert!(
            !access.allows(sender(Platform::Telegram, "1", &["555".to_owned()]), &[]),
            "ids are per platform"
        );
    }

    #[test]
    fn run_time_decisions_win_and_admins_are_always_admitted() {
        let access = Access {
            users: "telegram:7".parse().unwrap(),
            chats: AccessList::parse("discord:555", "LULL_ALLOWED_CHATS").unwrap(),
            admins: "telegram:1".parse().unwrap(),
        };
        let rules = [
            rule(Platform::Telegram, SubjectKind::User, "7", false),
            rule(Platform::Telegram, SubjectKind::User, "8", true),
            rule(Platform::Discord, SubjectKind::Chat, "9", false),
            rule(Platform::Telegram, SubjectKind::User, "1", false),
        ];
        assert!(!access.allows(sender(Platform::Telegram, "7", &[]), &rules));
        assert!(access.allows(sender(Platform::Telegram, "8", &[]), &rules));
        let channel_in_server = ["9".to_owned(), "555".to_owned()];
        assert!(
            !access.allows(sender(Platform::Discord, "2", &channel_in_server), &rules),
            "a decision about the channel beats the server's listing"
        );
        assert!(access.allows(sender(Platform::Telegram, "1", &[]), &rules));
        let later = [
            rules[0].clone(),
            rule(Platform::Telegram, SubjectKind::User, "7", true),
        ];
        assert!(
            access.allows(sender(Platform::Telegram, "7", &[]), &later),
            "the latest decision counts"
        );
    }
}

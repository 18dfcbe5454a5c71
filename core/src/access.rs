//! Who may talk to the bot (`LULL_ALLOWED_USERS`).
//!
//! The default admits only local platforms (the console, the http adapter behind its
//! token): a bot token leaked to the world must not spend its owner's LLM credit.

use std::collections::HashSet;

use crate::domain::Platform;

/// A parsed `LULL_ALLOWED_USERS`: `*` (everyone), `platform:*` (everyone on a
/// platform) or `platform:user_id` entries, separated by commas or spaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    everyone: bool,
    platforms: HashSet<Platform>,
    users: HashSet<(Platform, String)>,
}

impl AccessList {
    /// Whether `user_id` on `platform` may use the bot.
    pub fn allows(&self, platform: Platform, user_id: &str) -> bool {
        platform.is_local()
            || self.everyone
            || self.platforms.contains(&platform)
            || self.users.contains(&(platform, user_id.to_owned()))
    }

    /// The entry an owner adds to allow this user.
    pub fn entry_for(platform: Platform, user_id: &str) -> String {
        format!("{platform}:{user_id}")
    }

    /// The message an unlisted user gets.
    pub fn denial_text(platform: Platform, user_id: &str) -> String {
        format!(
            "Sorry, this bot is private. Your {platform} user id is {user_id}. If you know the owner, \
             ask them to add `{}` to LULL_ALLOWED_USERS.",
            Self::entry_for(platform, user_id)
        )
    }
}

impl std::str::FromStr for AccessList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut list = AccessList::default();
        for entry in s
            .split([',', ' ', '\n', '\t'])
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            if entry == "*" {
                list.everyone = true;
                continue;
            }
            let (platform, user) = entry.split_once(':').ok_or_else(|| {
                format!("LULL_ALLOWED_USERS: '{entry}' is not of the form platform:user_id (or *)")
            })?;
            let platform: Platform = platform
                .parse()
                .map_err(|e| format!("LULL_ALLOWED_USERS: {e}"))?;
            if user.is_empty() {
                return Err(format!("LULL_ALLOWED_USERS: '{entry}' has no user id"));
            }
            if user == "*" {
                list.platforms.insert(platform);
            } else {
                list.users.insert((platform, user.to_owned()));
            }
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn bad_entries_name_the_variable() {
        for bad in ["telegram", "irc:1", "telegram:"] {
            let e = bad.parse::<AccessList>().unwrap_err();
            assert!(e.contains("LULL_ALLOWED_USERS"), "{e}");
        }
    }
}

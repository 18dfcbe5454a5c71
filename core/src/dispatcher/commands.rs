//! Chat commands (`/help`, `/reset`, `/usage`, `/allow`, `/deny`, and those of
//! `controls`: `/model`, `/persona`, `/prompt`, `/stop`, `/status`): answered at once
//! at ingest, without the model, bypassing the debounce; a command never joins a
//! burst of messages. The answer is a notice, once per command message.

use lull_port::{Command, Incoming, Who};

use super::{Dispatcher, controls, job_commands, memory, notices};
use crate::access::{AccessList, AccessRule, Sender, Subject, SubjectKind};
use crate::domain::{Platform, Timestamp};
use crate::limits;
use crate::money::Usd;
use crate::store::{CommandClaim, ContextReset, JobKind, StoreError};
use crate::texts::{self, NoticeText};

/// Answer a command at once, without the model. `text` is the whole message (the
/// arguments of `/usage`, `/allow`, `/deny`).
pub(super) async fn answer(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    command: Command,
    text: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let settings = &dispatcher.settings;
    let admin = settings.access.is_admin(Sender::of(incoming));
    let args: Vec<&str> = text.split_whitespace().skip(1).collect();
    // A command that acts acts once per message, whoever receives it again: a late
    // redelivery finds the claim and does nothing (its answer was queued by the first).
    // (The switches: bots that act on every update; replicas that each answer theirs.)
    let unclaimed = crate::switches::no_command_claim() || crate::switches::no_command_dedupe();
    let claimed = command.acts() && !unclaimed;
    if claimed
        && !dispatcher
            .store
            .claim_command(CommandClaim {
                conversation: &incoming.conversation,
                message_id: &incoming.message_id,
                now,
            })
            .await?
    {
        tracing::debug!(conversation = %incoming.conversation, message = %incoming.message_id, "command already acted on; not again");
        return Ok(());
    }
    let acted = act(dispatcher, incoming, command, admin, text, &args, now).await;
    // An act that failed (the database busy or down) did not happen: its claim is given
    // back, so the platform's redelivery acts instead of finding it taken.
    if claimed && acted.is_err() {
        let released = dispatcher
            .store
            .release_command(&incoming.conversation, &incoming.message_id)
            .await;
        if let Err(e) = released {
            tracing::warn!(conversation = %incoming.conversation, error = %e, "a failed command keeps its claim: a redelivery will not act on it");
        }
    }
    answered(dispatcher, incoming, command, acted?, now).await
}

/// Whether the sender may use `command` ([`Command::who`], the one rule for every
/// adapter): an admin always; in a private chat its person for the commands that change
/// only that chat; the person at `lull chat`, who runs lull, for everything.
fn may_use(command: Command, incoming: &Incoming, admin: bool, has_argument: bool) -> bool {
    match command.who(has_argument) {
        Who::Anyone => true,
        Who::AdminsInGroups => admin || !incoming.is_group,
        Who::Admins => admin || incoming.conversation.platform == Platform::Console,
    }
}

/// The command's act and the notice that answers it.
async fn act(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    command: Command,
    admin: bool,
    text: &str,
    args: &[&str],
    now: Timestamp,
) -> Result<NoticeText, StoreError> {
    if !may_use(command, incoming, admin, !args.is_empty()) {
        return Ok(texts::admins_only(command.name()).into());
    }
    let answer = match command {
        Command::Start | Command::Help => texts::help_text(),
        Command::Unknown => {
            texts::unknown_command_text(text.split_whitespace().next().unwrap_or(""))
        }
        Command::Reset | Command::New => {
            reset(dispatcher, &incoming.conversation, incoming.is_group, now).await?;
            texts::RESET_TEXT.to_owned()
        }
        Command::Usage => usage(dispatcher, incoming, admin, args, now).await?,
        Command::Remind | Command::Schedule => {
            let kind = if command == Command::Remind {
                JobKind::Reminder
            } else {
                JobKind::Task
            };
            job_commands::make(dispatcher, incoming, kind, rest_of(text), now).await?
        }
        Command::Jobs => job_commands::jobs(dispatcher, incoming, args, now).await?,
        Command::Timezone => job_commands::timezone(dispatcher, incoming, args, now).await?,
        Command::Memory => memory::memory(dispatcher, incoming, args, admin).await?,
        Command::ForgetMe => memory::forget_me(dispatcher, incoming, now).await?,
        Command::Model
        | Command::Persona
        | Command::Prompt
        | Command::Stop
        | Command::Retry
        | Command::Status => {
            let rest = text
                .trim_start()
                .split_once(char::is_whitespace)
                .map_or("", |(_, rest)| rest);
            return controls::answer(dispatcher, incoming, command, rest, now).await;
        }
        Command::Allow | Command::Deny => match subject(incoming, args) {
            Ok(subject) => {
                let allowed = command == Command::Allow;
                let rule = AccessRule {
                    subject,
                    allowed,
                    set_by: AccessList::entry_for(
                        incoming.conversation.platform,
                        &incoming.user_id,
                    ),
                    set_at: now,
                };
                decide_access(dispatcher, &rule).await?;
                texts::access_set_text(&rule.subject.to_string(), allowed)
            }
            Err(why) => why,
        },
    };
    Ok(answer.into())
}

/// `/new` (or `/reset`) of `conversation`, from a chat or the console: its context
/// starts afresh, in one write that moves its version; a generation in flight here
/// stops at once (elsewhere the final check finds the version moved).
pub(super) async fn reset(
    d: &Dispatcher,
    conversation: &lull_port::ConversationRef,
    is_group: bool,
    now: Timestamp,
) -> Result<(), StoreError> {
    let reset = d
        .store
        .reset_context(ContextReset {
            conversation,
            is_group,
            holder: &d.holder,
            now,
        })
        .await?;
    controls::moved(d, reset.conversation, reset.version);
    Ok(())
}

/// Record an access decision (`/allow`, `/deny`, or the console's): stored for every
/// process, and this process's copy of the decisions dropped so it follows at once.
pub(super) async fn decide_access(d: &Dispatcher, rule: &AccessRule) -> Result<(), StoreError> {
    d.store.set_access(rule).await?;
    d.forget_access_rules();
    tracing::info!(subject = %rule.subject, allowed = rule.allowed, by = %rule.set_by, "access decision recorded");
    Ok(())
}

/// Queue a command's answer, once per command message.
async fn answered(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    command: Command,
    text: NoticeText,
    now: Timestamp,
) -> Result<(), StoreError> {
    tracing::info!(conversation = %incoming.conversation, command = command.name(), "command");
    notices::answer_message(dispatcher, incoming, text, command.name(), now).await
}

/// Whom `/allow` or `/deny` names: `platform:user_id` (or a bare user id on this
/// platform), or `chat` with `platform:chat_id` (or nothing, in a group: this group;
/// on Discord, its server).
fn subject(incoming: &Incoming, args: &[&str]) -> Result<Subject, String> {
    let platform = incoming.conversation.platform;
    let (kind, id) = match args {
        ["chat"] => match incoming.chats.last() {
            Some(chat) => (SubjectKind::Chat, chat.as_str()),
            None => return Err(texts::ACCESS_USAGE_TEXT.to_owned()),
        },
        ["chat", id] => (SubjectKind::Chat, *id),
        [id] => (SubjectKind::User, *id),
        _ => return Err(texts::ACCESS_USAGE_TEXT.to_owned()),
    };
    let (platform, id) = match id.split_once(':') {
        Some((p, id)) => (
            p.parse::<Platform>()
                .map_err(|e| texts::access_platform_text(&e))?,
            id,
        ),
        None => (platform, id),
    };
    if id.is_empty() || id == "*" {
        return Err(texts::ACCESS_USAGE_TEXT.to_owned());
    }
    Ok(Subject {
        platform,
        kind,
        id: id.to_owned(),
    })
}

/// What `/usage` answers: the sender's own use today and this month, tokens and
/// dollars, against their limits; an admin also sees the whole bot's, and asks for a
/// group's (in the group) or a user's (named).
async fn usage(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    admin: bool,
    args: &[&str],
    now: Timestamp,
) -> Result<String, StoreError> {
    let limits = &dispatcher.settings.limits;
    let tz = &limits.timezone;
    let (day, month) = (tz.day(now), tz.month(now));
    let resets = tz.show(tz.next_day(now), now);
    let (label, scope, limited) = usage_subject(incoming, admin, args);
    let store = &dispatcher.store;
    let scopes = [
        scope.clone(),
        limits::BOT_SCOPE.to_owned(),
        limits::DROPPED_SCOPE.to_owned(),
    ];
    let today = store.token_usage(&day, &scopes).await?;
    let so_far = store
        .usage_between(&tz.month_start_day(now), &day, &[scope])
        .await?[0];
    let bot_month = store
        .token_usage(&month, &[limits::BOT_MONTH_SCOPE.to_owned()])
        .await?[0];
    let line = |used, tokens, usd| texts::UsageLine { used, tokens, usd };
    let (user_tokens, user_usd) = if limited {
        (limits.user_daily_tokens, limits.user_daily_usd)
    } else {
        (0, Usd::ZERO)
    };
    let text = texts::usage_text(&texts::UsageReport {
        day: &day,
        month: &month,
        who: &label,
        today: line(today[0], Some(user_tokens), Some(user_usd)),
        this_month: line(so_far, None, None),
        bot: admin.then(|| {
            (
                line(today[1], Some(limits.daily_tokens), Some(limits.daily_usd)),
                line(bot_month, None, Some(limits.monthly_usd)),
            )
        }),
        dollars: !limits.prices.is_empty() || limits.has_dollar_budget(),
        resets: &resets,
    });
    // Admins also see what was spent on replies that never went out.
    Ok(if admin {
        format!("{text} {}", texts::dropped_usage_text(today[2].tokens))
    } else {
        text
    })
}

/// Whose use `/usage` tells of: its label, its budget scope, and whether a person's
/// own limits apply (not an admin's, not a group's). An admin names a user
/// (`telegram:42`, or an id on this platform), or asks in a group for the group's.
fn usage_subject(incoming: &Incoming, admin: bool, args: &[&str]) -> (String, String, bool) {
    let platform = incoming.conversation.platform;
    match (admin, args) {
        (true, [who]) => {
            let (p, id) = who
                .split_once(':')
                .and_then(|(p, id)| Some((p.parse::<Platform>().ok()?, id)))
                .unwrap_or((platform, who));
            (format!("{p}:{id}"), limits::user_scope(p, id), true)
        }
        (true, []) if incoming.is_group => (
            texts::USAGE_OF_THIS_GROUP.to_owned(),
            limits::conversation_scope(&incoming.conversation),
            false,
        ),
        _ => (
            texts::USAGE_OF_YOU.to_owned(),
            limits::user_scope(platform, &incoming.user_id),
            !admin,
        ),
    }
}

/// The words after the command word (`""` for none).
fn rest_of(text: &str) -> &str {
    text.trim_start()
        .split_once(char::is_whitespace)
        .map_or("", |(_, rest)| rest)
}

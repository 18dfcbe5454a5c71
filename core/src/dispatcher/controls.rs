//! The commands that change what lull does in a conversation: `/model`, `/persona`,
//! `/prompt`, `/stop`, `/retry`, and `/status`, which shows it. Answered at ingest like every
//! command; a change is written to the store in one transaction that also moves the
//! conversation's version ([`SettingStore`](crate::store::SettingStore)), so the final
//! check of a generation in flight on any process finds it stale, and this process
//! stops its own generation at once ([`Event::Moved`]).

use std::sync::Arc;
use std::time::Duration;

use lull_port::{Command, Incoming};

use super::{Dispatcher, Event};
use crate::domain::{ConversationId, ConversationRef, Timestamp, Version};
use crate::limits;
use crate::store::{
    BatchOf, RetryOutcome, RetryRequest, Setting, SettingChange, SettingOutcome, Stop, StoreError,
};
use crate::texts::{self, NoticeText};

/// How long the server's model list (`GET /models`) is kept before `/model` asks
/// again: one request per this, whatever the number of `/model` commands.
const MODEL_LIST_TTL: Duration = Duration::from_secs(300);

/// Answer `/model`, `/persona`, `/prompt`, `/stop`, `/retry` or `/status` (`rest`: the
/// text after the command word). The lists offer their picks as buttons, and `/stop`'s
/// report its waiting approvals; every other answer is a sentence.
pub(super) async fn answer(
    d: &Dispatcher,
    incoming: &Incoming,
    command: Command,
    rest: &str,
    now: Timestamp,
) -> Result<NoticeText, StoreError> {
    // Who may use each command was decided by the caller (`Command::who`).
    let arg = rest.trim();
    Ok(match command {
        Command::Model if arg.is_empty() => list_models(d, incoming).await?,
        Command::Persona if arg.is_empty() => list_personas(d, incoming).await?,
        Command::Stop => stop(d, incoming, now).await?,
        Command::Model => pick_model(d, incoming, arg, now).await?.into(),
        Command::Persona => pick_persona(d, incoming, arg, now).await?.into(),
        Command::Prompt => prompt(d, incoming, arg, now).await?.into(),
        Command::Retry => retry(d, incoming, now).await?.into(),
        _ => status(d, incoming, now).await?.into(),
    })
}

/// `/prompt TEXT` sets this conversation's own system prompt, `/prompt clear` removes
/// it, a bare `/prompt` says how.
async fn prompt(
    d: &Dispatcher,
    incoming: &Incoming,
    arg: &str,
    now: Timestamp,
) -> Result<&'static str, StoreError> {
    if arg.is_empty() {
        return Ok(texts::PROMPT_USAGE_TEXT);
    }
    let clear = arg.eq_ignore_ascii_case("clear");
    let value = (!clear).then_some(arg);
    change(d, incoming, Setting::Prompt, value, now).await?;
    Ok(if clear {
        texts::PROMPT_CLEARED_TEXT
    } else {
        texts::PROMPT_SET_TEXT
    })
}

/// `/stop`: the reply being written is dropped and the pending messages closed
/// unanswered; the answer reports what the closed batch's actions did.
async fn stop(
    d: &Dispatcher,
    incoming: &Incoming,
    now: Timestamp,
) -> Result<NoticeText, StoreError> {
    stop_chat(d, &incoming.conversation, incoming.is_group, now).await
}

/// `/stop` of `conversation`, from a chat or the console: the reply being written is
/// dropped, the pending messages closed unanswered (their ack reactions taken off);
/// the answer reports what the closed batch's actions did.
pub(super) async fn stop_chat(
    d: &Dispatcher,
    conversation: &ConversationRef,
    is_group: bool,
    now: Timestamp,
) -> Result<NoticeText, StoreError> {
    let stopped = d
        .store
        .stop_conversation(Stop {
            conversation,
            is_group,
            now,
        })
        .await?;
    moved(d, stopped.conversation, stopped.version);
    let closed = stopped.closed.len() as u64;
    tracing::info!(conversation = %stopped.conversation, closed, "stopped: pending messages closed without a reply");
    // Closed without a reply: nothing will take their ack reactions off.
    if let Some(outbound) = d.outbounds.get(&conversation.platform).cloned() {
        d.acks.answered(
            outbound,
            conversation.clone(),
            stopped.conversation,
            stopped.closed,
        );
    }
    let text = NoticeText::from(texts::stopped_text(closed));
    // Actions the closed batch took are facts: no reply will report them now.
    let Some(batch) = stopped.batch else {
        return Ok(text);
    };
    let of = BatchOf {
        conversation: stopped.conversation,
        batch,
    };
    Ok(text.followed_by(super::round::batch_report(d, of, &[]).await?))
}

/// `/retry`: the last batch is answered again, unless a reply is on its way.
async fn retry(
    d: &Dispatcher,
    incoming: &Incoming,
    now: Timestamp,
) -> Result<&'static str, StoreError> {
    let outcome = d
        .store
        .retry_last_reply(RetryRequest {
            conversation: &incoming.conversation,
            is_group: incoming.is_group,
            holder: &d.holder,
            now,
        })
        .await?;
    Ok(match outcome {
        RetryOutcome::Retried {
            conversation,
            messages,
            ..
        } => {
            tracing::info!(%conversation, messages, "answering the last batch again");
            d.wake_by(now);
            texts::RETRY_TEXT
        }
        RetryOutcome::Nothing => texts::NOTHING_TO_RETRY_TEXT,
        RetryOutcome::Busy => texts::RETRY_BUSY_TEXT,
    })
}

/// The models a conversation may pick: `LULL_MODELS`, else the server's list (read
/// at most once per [`MODEL_LIST_TTL`]). `Err`: why there is none.
pub(super) async fn offered_models(d: &Dispatcher) -> Result<Arc<Vec<String>>, String> {
    let controls = &d.settings.controls;
    if !controls.models.is_empty() {
        return Ok(Arc::new(controls.models.clone()));
    }
    d.models
        .get(MODEL_LIST_TTL, || async {
            let mut list = d.responder.models().await.map_err(|e| e.to_string())?;
            if list.is_empty() {
                return Err(texts::NO_MODELS_SERVED.to_owned());
            }
            list.sort();
            list.dedup();
            Ok(list)
        })
        .await
}

/// The model answering this conversation now.
async fn model_in_force(d: &Dispatcher, incoming: &Incoming) -> Result<String, StoreError> {
    let chosen = d
        .store
        .conversation_settings(&incoming.conversation)
        .await?;
    let controls = &d.settings.controls;
    Ok(controls
        .choices(&chosen)
        .model
        .unwrap_or_else(|| controls.default_model.clone()))
}

async fn list_models(d: &Dispatcher, incoming: &Incoming) -> Result<NoticeText, StoreError> {
    Ok(match offered_models(d).await {
        Ok(models) => texts::models_text(&models, &model_in_force(d, incoming).await?),
        Err(why) => texts::no_models_text(&why).into(),
    })
}

/// `/model NAME`, `/model N` (the Nth of the list, what a button sends) or
/// `/model default`.
async fn pick_model(
    d: &Dispatcher,
    incoming: &Incoming,
    arg: &str,
    now: Timestamp,
) -> Result<String, StoreError> {
    if arg.eq_ignore_ascii_case("default") {
        let changed = change(d, incoming, Setting::Model, None, now).await?;
        let default = &d.settings.controls.default_model;
        return Ok(texts::picked_text("model", default, changed));
    }
    let models = match offered_models(d).await {
        Ok(models) => models,
        Err(why) => return Ok(texts::no_models_text(&why)),
    };
    let Some(model) = pick(&models, arg) else {
        return Ok(texts::unknown_model_text(arg, &models));
    };
    let changed = change(d, incoming, Setting::Model, Some(model), now).await?;
    Ok(texts::picked_text("model", model, changed))
}

async fn list_personas(d: &Dispatcher, incoming: &Incoming) -> Result<NoticeText, StoreError> {
    let names: Vec<&str> = d
        .settings
        .controls
        .personas
        .keys()
        .map(String::as_str)
        .collect();
    let chosen = d
        .store
        .conversation_settings(&incoming.conversation)
        .await?;
    let in_force = chosen.persona.as_deref().filter(|p| names.contains(p));
    Ok(texts::personas_text(&names, in_force))
}

/// `/persona NAME`, `/persona N` or `/persona default`.
async fn pick_persona(
    d: &Dispatcher,
    incoming: &Incoming,
    arg: &str,
    now: Timestamp,
) -> Result<String, StoreError> {
    let names: Vec<String> = d.settings.controls.personas.keys().cloned().collect();
    if arg.eq_ignore_ascii_case("default") {
        let changed = change(d, incoming, Setting::Persona, None, now).await?;
        return Ok(texts::picked_text("persona", "default", changed));
    }
    let Some(name) = pick(&names, arg) else {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        return Ok(texts::unknown_persona_text(arg, &names));
    };
    let changed = change(d, incoming, Setting::Persona, Some(name), now).await?;
    Ok(texts::picked_text("persona", name, changed))
}

/// The entry `arg` names: its name, or its number in the list (from 1).
fn pick<'a>(list: &'a [String], arg: &str) -> Option<&'a str> {
    list.iter()
        .find(|m| m.as_str() == arg)
        .or_else(|| {
            let n: usize = arg.parse().ok()?;
            list.get(n.checked_sub(1)?)
        })
        .map(String::as_str)
}

/// Write one setting; `true` if it changed (then a generation in flight here stops).
async fn change(
    d: &Dispatcher,
    incoming: &Incoming,
    setting: Setting,
    value: Option<&str>,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let change = SettingChange {
        conversation: &incoming.conversation,
        is_group: incoming.is_group,
        setting,
        value,
        now,
    };
    change_setting(d, change).await
}

/// Write one setting as `change` says (a chat command's, or the console's); `true`
/// if it changed (then a generation in flight here stops).
pub(super) async fn change_setting(
    d: &Dispatcher,
    change: SettingChange<'_>,
) -> Result<bool, StoreError> {
    let setting = change.setting;
    let outcome = d.store.change_setting(change).await?;
    Ok(match outcome {
        SettingOutcome::Changed {
            conversation,
            version,
        } => {
            tracing::info!(%conversation, setting = setting.column(), "a conversation setting changed");
            moved(d, conversation, version);
            true
        }
        SettingOutcome::Unchanged => false,
    })
}

/// Tell this process's round in flight, if any, that its batch is stale (rounds on
/// other processes find it at their next look, and the final check refuses it anyway).
pub(super) fn moved(d: &Dispatcher, conversation: ConversationId, version: Version) {
    d.emit(Event::Moved {
        conversation,
        version,
    });
}

/// `/status`: the model and persona in force, whether messages wait for an answer,
/// the sender's tokens today, and the ids an admin needs (`/allow`, `LULL_ADMINS`).
async fn status(d: &Dispatcher, incoming: &Incoming, now: Timestamp) -> Result<String, StoreError> {
    let controls = &d.settings.controls;
    let chosen = d
        .store
        .conversation_settings(&incoming.conversation)
        .await?;
    let model = controls
        .choices(&chosen)
        .model
        .unwrap_or_else(|| controls.default_model.clone());
    let persona = chosen
        .persona
        .as_deref()
        .filter(|p| controls.personas.contains_key(*p));
    // Messages waiting for a reply (not the notice of the command just before).
    let pending = d.store.awaits_reply(&incoming.conversation).await?;
    let platform = incoming.conversation.platform;
    let day = d.settings.limits.timezone.day(now);
    let used = d
        .store
        .token_usage(&day, &[limits::user_scope(platform, &incoming.user_id)])
        .await?;
    let summary = match &d.settings.summary {
        Some(_) => {
            let summary = d.store.summary(&incoming.conversation).await?;
            let timezone = &d.settings.limits.timezone;
            Some(texts::summary_reach_text(
                summary
                    .map(|s| (s.messages, timezone.show(s.through_at, now)))
                    .as_ref()
                    .map(|(n, at)| (*n, at.as_str())),
            ))
        }
        None => None,
    };
    Ok(texts::status_text(&texts::StatusLines {
        summary,
        model: &model,
        persona,
        own_prompt: chosen.prompt.is_some(),
        pending,
        used_today: used.first().map_or(0, |u| u.tokens),
        conversation: &incoming.conversation.to_string(),
        user: &format!("{platform}:{}", incoming.user_id),
    }))
}

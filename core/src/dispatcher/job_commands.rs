//! The job commands, answered at ingest like every command: `/remind WHEN TEXT` and
//! `/schedule WHEN PROMPT` make a job (once per command message: its origin), `/jobs`
//! lists the chat's jobs, `/jobs cancel N` stops one, `/timezone [NAME]` shows or
//! chooses the zone the chat's WHENs are read in. A WHEN that cannot be read stores
//! nothing and says, in one line, what forms work.

use lull_port::Incoming;

use super::{Dispatcher, JobSettings};
use crate::domain::{ConversationRef, Timestamp};
use crate::limits::TimeZone;
use crate::schedule::{self, Schedule};
use crate::store::{JobCreated, JobKind, JobRow, NewJob, Store, StoreError};
use crate::texts;

/// `/remind` (a reminder) or `/schedule` (a task): the words after the command are
/// `WHEN TEXT`. One command message makes one job (its origin).
pub(super) async fn make(
    d: &Dispatcher,
    incoming: &Incoming,
    kind: JobKind,
    rest: &str,
    now: Timestamp,
) -> Result<String, StoreError> {
    let Some(settings) = &d.settings.jobs else {
        return Ok(texts::JOBS_OFF_TEXT.to_owned());
    };
    if rest.trim().is_empty() {
        return Ok(texts::job_usage_text(kind));
    }
    let maker = JobMaker {
        store: d.store.as_ref(),
        jobs: settings,
        tz: chat_timezone(
            d.store.as_ref(),
            &incoming.conversation,
            &d.settings.limits.timezone,
        )
        .await?,
    };
    let asked = Asked {
        conversation: &incoming.conversation,
        is_group: incoming.is_group,
        creator: &incoming.user_id,
        creator_name: &incoming.author,
        origin: format!("command/{}", incoming.message_id),
    };
    let (text, first_at) = maker.make(asked, kind, rest, now).await?;
    if let Some(first_at) = first_at {
        // It may be due sooner than the scheduler would look.
        d.job_armed(first_at);
    }
    Ok(text)
}

/// Who asks for a job, where, and what made the request (one origin, one job).
pub(super) struct Asked<'a> {
    pub(super) conversation: &'a ConversationRef,
    pub(super) is_group: bool,
    pub(super) creator: &'a str,
    pub(super) creator_name: &'a str,
    pub(super) origin: String,
}

/// Makes jobs from a WHEN and a text, for the commands and the model's tool alike.
pub(super) struct JobMaker<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) jobs: &'a JobSettings,
    /// The zone the chat's WHENs are read in.
    pub(super) tz: TimeZone,
}

impl JobMaker<'_> {
    /// Read `rest` as `WHEN TEXT` and make the job: the answer, and its first
    /// occurrence when one was made. A WHEN that cannot be read, too often, or a full
    /// chat store nothing and say why in one line.
    pub(super) async fn make(
        &self,
        asked: Asked<'_>,
        kind: JobKind,
        rest: &str,
        now: Timestamp,
    ) -> Result<(String, Option<Timestamp>), StoreError> {
        let tz = &self.tz;
        let (schedule, text) = match schedule::parse(rest, now, tz) {
            Ok(read) => read,
            Err(why) => return Ok((why.to_string(), None)),
        };
        if !schedule.interval_at_least(self.jobs.min_interval) {
            return Ok((texts::job_too_often_text(self.jobs.min_interval), None));
        }
        let Some(first_at) = schedule.first(now, tz) else {
            return Ok((texts::WHEN_PASSED_TEXT.to_owned(), None));
        };
        let job = NewJob {
            conversation: asked.conversation.clone(),
            is_group: asked.is_group,
            creator: asked.creator.to_owned(),
            creator_name: asked.creator_name.to_owned(),
            kind,
            schedule: schedule.to_stored(),
            timezone: tz.to_string(),
            text: text.trim().to_owned(),
            first_at,
            max_per_chat: self.jobs.per_chat,
            origin: asked.origin,
            now,
        };
        Ok(match self.store.create_job(job).await? {
            JobCreated::Created(job) => {
                tracing::info!(job = job.id, kind = kind.as_str(), conversation = %job.conversation, "job made");
                let made = texts::job_made_text(&line(&job, &schedule, tz, now));
                (made, Some(first_at))
            }
            JobCreated::TooMany { active } => (texts::too_many_jobs_text(active), None),
        })
    }
}

/// `/jobs` (the chat's active jobs) or `/jobs cancel N`.
pub(super) async fn jobs(
    d: &Dispatcher,
    incoming: &Incoming,
    args: &[&str],
    now: Timestamp,
) -> Result<String, StoreError> {
    if d.settings.jobs.is_none() {
        return Ok(texts::JOBS_OFF_TEXT.to_owned());
    }
    match args {
        [] => list(d.store.as_ref(), &incoming.conversation, now).await,
        [cancel, id] if cancel.eq_ignore_ascii_case("cancel") => {
            let Ok(id) = id.trim_start_matches('#').parse::<i64>() else {
                return Ok(texts::JOBS_USAGE_TEXT.to_owned());
            };
            Ok(
                match d.store.cancel_job(&incoming.conversation, id, now).await? {
                    Some(job) => {
                        tracing::info!(job = job.id, conversation = %job.conversation, "job cancelled");
                        texts::job_cancelled_text(job.id, &job.text)
                    }
                    None => texts::no_such_job_text(id),
                },
            )
        }
        _ => Ok(texts::JOBS_USAGE_TEXT.to_owned()),
    }
}

/// Cancel job `id` of `conversation`: the answer.
pub(super) async fn cancel(
    store: &dyn Store,
    conversation: &ConversationRef,
    id: i64,
    now: Timestamp,
) -> Result<String, StoreError> {
    Ok(match store.cancel_job(conversation, id, now).await? {
        Some(job) => {
            tracing::info!(job = job.id, conversation = %job.conversation, "job cancelled");
            texts::job_cancelled_text(job.id, &job.text)
        }
        None => texts::no_such_job_text(id),
    })
}

/// The chat's active jobs, one line each, times in the zone each job was made in.
pub(super) async fn list(
    store: &dyn Store,
    conversation: &ConversationRef,
    now: Timestamp,
) -> Result<String, StoreError> {
    let jobs = store.jobs_of(conversation).await?;
    if jobs.is_empty() {
        return Ok(texts::NO_JOBS_TEXT.to_owned());
    }
    let lines: Vec<String> = jobs
        .iter()
        .map(|job| match super::jobs::readable(job) {
            Ok((schedule, tz)) => line(job, &schedule, &tz, now),
            Err(_) => texts::unreadable_job_line(job.id, &job.text),
        })
        .collect();
    Ok(texts::jobs_list_text(&lines))
}

/// `/timezone` (the chat's zone) or `/timezone NAME` (choose one; `default` goes back
/// to `LULL_TIMEZONE`). Jobs made before keep their zone.
pub(super) async fn timezone(
    d: &Dispatcher,
    incoming: &Incoming,
    args: &[&str],
    now: Timestamp,
) -> Result<String, StoreError> {
    let conversation = &incoming.conversation;
    match args {
        [] => {
            let default = &d.settings.limits.timezone;
            let tz = chat_timezone(d.store.as_ref(), conversation, default).await?;
            Ok(texts::timezone_text(&tz.to_string(), &tz.show(now, now)))
        }
        [name] if name.eq_ignore_ascii_case("default") => {
            d.store.set_chat_timezone(conversation, None, now).await?;
            Ok(texts::timezone_set_text(
                &d.settings.limits.timezone.to_string(),
            ))
        }
        [name] => match name.parse::<TimeZone>() {
            Ok(tz) => {
                let name = tz.to_string();
                d.store
                    .set_chat_timezone(conversation, Some(&name), now)
                    .await?;
                Ok(texts::timezone_set_text(&name))
            }
            Err(_) => Ok(texts::unknown_timezone_text(name)),
        },
        _ => Ok(texts::TIMEZONE_USAGE_TEXT.to_owned()),
    }
}

/// The zone a chat's WHENs are read in: its `/timezone`, else `default`
/// (`LULL_TIMEZONE`). A zone stored by an older build that this one does not know falls
/// back the same way.
pub(super) async fn chat_timezone(
    store: &dyn Store,
    conversation: &ConversationRef,
    default: &TimeZone,
) -> Result<TimeZone, StoreError> {
    let chosen = store.chat_timezone(conversation).await?;
    Ok(chosen
        .and_then(|name| name.parse().ok())
        .unwrap_or_else(|| default.clone()))
}

/// One job as `/jobs` and its confirmation show it: id, kind, when, next, text.
fn line(job: &JobRow, schedule: &Schedule, tz: &TimeZone, now: Timestamp) -> String {
    let next = job.next_at.map(|at| tz.show(at, now));
    texts::job_line(
        job.id,
        job.kind,
        &schedule.describe(tz),
        next.as_deref(),
        &job.text,
    )
}

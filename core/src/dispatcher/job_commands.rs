//! The job commands, answered at ingest like every command: `/remind WHEN TEXT` and
//! `/schedule WHEN PROMPT` make a job (once per command message: its origin), `/jobs`
//! lists the chat's jobs, `/jobs cancel N` stops one, `/timezone [NAME]` shows or
//! chooses the zone the chat's WHENs are read in. A WHEN that cannot be read stores
//! nothing and says, in one line, what forms work.

use lull_port::Incoming;

use super::Dispatcher;
use crate::domain::Timestamp;
use crate::limits::TimeZone;
use crate::schedule::{self, Schedule};
use crate::store::{JobCreated, JobKind, JobRow, NewJob, StoreError};
use crate::texts;

/// `/remind` (a reminder) or `/schedule` (a task): the words after the command are
/// `WHEN TEXT`.
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
    let tz = chat_timezone(d, incoming).await?;
    let (schedule, text) = match schedule::parse(rest, now, &tz) {
        Ok(read) => read,
        Err(why) => return Ok(why.to_string()),
    };
    if !schedule.interval_at_least(settings.min_interval) {
        return Ok(texts::job_too_often_text(settings.min_interval));
    }
    let Some(first_at) = schedule.first(now, &tz) else {
        return Ok(texts::WHEN_PASSED_TEXT.to_owned());
    };
    let job = NewJob {
        conversation: incoming.conversation.clone(),
        is_group: incoming.is_group,
        creator: incoming.user_id.clone(),
        creator_name: incoming.author.clone(),
        kind,
        schedule: schedule.to_stored(),
        timezone: tz.to_string(),
        text: text.trim().to_owned(),
        first_at,
        max_per_chat: settings.per_chat,
        origin: format!("command/{}", incoming.message_id),
        now,
    };
    Ok(match d.store.create_job(job).await? {
        JobCreated::Created(job) => {
            tracing::info!(job = job.id, kind = kind.as_str(), conversation = %job.conversation, "job made");
            // It may be due sooner than the scheduler would look.
            d.wake_by(first_at);
            texts::job_made_text(&line(&job, &schedule, &tz, now))
        }
        JobCreated::TooMany { active } => texts::too_many_jobs_text(active),
    })
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
        [] => list(d, incoming, now).await,
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

/// The chat's active jobs, one line each, times in the zone each job was made in.
async fn list(d: &Dispatcher, incoming: &Incoming, now: Timestamp) -> Result<String, StoreError> {
    let jobs = d.store.jobs_of(&incoming.conversation).await?;
    if jobs.is_empty() {
        return Ok(texts::NO_JOBS_TEXT.to_owned());
    }
    let lines: Vec<String> = jobs
        .iter()
        .map(|job| match readable(job) {
            Some((schedule, tz)) => line(job, &schedule, &tz, now),
            None => texts::unreadable_job_line(job.id, &job.text),
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
            let tz = chat_timezone(d, incoming).await?;
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

/// The zone a chat's WHENs are read in: its `/timezone`, else `LULL_TIMEZONE`. A zone
/// stored by an older build that this one does not know falls back the same way.
async fn chat_timezone(d: &Dispatcher, incoming: &Incoming) -> Result<TimeZone, StoreError> {
    let chosen = d.store.chat_timezone(&incoming.conversation).await?;
    Ok(chosen
        .and_then(|name| name.parse().ok())
        .unwrap_or_else(|| d.settings.limits.timezone.clone()))
}

/// A job's schedule and zone, as stored (`None`: unreadable by this build).
fn readable(job: &JobRow) -> Option<(Schedule, TimeZone)> {
    Some((
        Schedule::from_stored(&job.schedule).ok()?,
        job.timezone.parse().ok()?,
    ))
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

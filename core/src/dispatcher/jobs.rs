//! Jobs fired: the scheduler's look fires every occurrence that is due (each once,
//! whichever process looks first: the store's compare-and-swap and occurrence key,
//! `store::JobStore::fire_job`). A reminder leaves a notice in the outbox, a task a
//! message from its creator; the ordinary rounds deliver and answer them, under the
//! conversation's lease and its final check, as any other.
//!
//! Missed occurrences (lull or its database was down) never become one message per
//! missed slot: `LULL_JOB_MISSED=once` fires one late occurrence saying how late,
//! `skip` a short notice; either way the job goes on from its next occurrence after
//! now.

use std::time::Duration;

use super::{Dispatcher, Event};
use crate::domain::Timestamp;
use crate::limits::TimeZone;
use crate::metrics as names;
use crate::schedule::{self, Schedule};
use crate::store::{Fired, Firing, JobKind, JobOutput, JobRow};
use crate::texts;

/// `LULL_JOBS_PER_CHAT`: the most active jobs a chat may have.
pub const JOBS_PER_CHAT: u32 = 25;
/// `LULL_JOB_MIN_INTERVAL`: the shortest interval of a recurring job.
pub const JOB_MIN_INTERVAL: Duration = Duration::from_secs(60);
/// How late an occurrence may fire and still count as on time (a scheduler's poll, a
/// busy database): later than this, it says how late it is.
pub(super) const LATE_AFTER: Duration = Duration::from_secs(60);
/// The most occurrences one look fires (the rest fire at the next, at once).
const FIRE_PER_LOOK: u32 = 256;

/// `LULL_JOB_MISSED`: what a job does about occurrences it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissedPolicy {
    /// One late occurrence for all the missed ones, saying how late.
    Once,
    /// A short notice; the missed ones do not fire.
    Skip,
}

/// The jobs settings (`LULL_JOBS` on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    /// `LULL_JOBS_PER_CHAT`.
    pub per_chat: u32,
    /// `LULL_JOB_MIN_INTERVAL`.
    pub min_interval: Duration,
    /// `LULL_JOB_MISSED`.
    pub missed: MissedPolicy,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            per_chat: JOBS_PER_CHAT,
            min_interval: JOB_MIN_INTERVAL,
            missed: MissedPolicy::Once,
        }
    }
}

/// Fire every occurrence due at `now`; returns when the next one is due, if any.
/// Failures are logged: the occurrence stays due and fires at the next look.
pub(super) async fn fire_due(d: &Dispatcher, now: Timestamp) -> Option<Timestamp> {
    let due = match d.store.due_jobs(now, FIRE_PER_LOOK).await {
        Ok(due) => due,
        Err(e) => {
            tracing::debug!(error = %e, "could not look for due jobs");
            return None;
        }
    };
    let full = due.due.len() as u32 >= FIRE_PER_LOOK;
    for job in &due.due {
        if let Err(e) = fire(d, job, now).await {
            tracing::warn!(job = job.id, error = %e, "could not fire a job; it fires at the next look");
        }
    }
    // A full look leaves more due now.
    if full { Some(now) } else { due.next_at }
}

/// Fire `job`'s due occurrence, once.
async fn fire(
    d: &Dispatcher,
    job: &JobRow,
    now: Timestamp,
) -> Result<(), crate::store::StoreError> {
    let Some(scheduled_at) = job.next_at else {
        return Ok(());
    };
    let (schedule, tz) = match readable(job) {
        Ok(read) => read,
        Err(why) => {
            tracing::error!(job = job.id, %why, "a job's schedule cannot be read; paused");
            return d.store.pause_job(job.id, now).await;
        }
    };
    let missed = schedule::missed(&schedule, scheduled_at, now, &tz);
    let next_at = if schedule.is_recurring() {
        missed.next
    } else {
        None
    };
    let late = scheduled_at.until(now);
    let output = output(d, job, (missed.count, late), (next_at, &tz), now);
    let firing = Firing {
        job,
        scheduled_at,
        output,
        next_at,
        holder: &d.holder,
        now,
    };
    match d.store.fire_job(firing).await? {
        Fired::Fired { due_at, .. } => {
            metrics::counter!(names::JOBS_FIRED, "kind" => job.kind.as_str()).increment(1);
            metrics::histogram!(names::JOB_LATENESS).record(late.as_secs_f64());
            tracing::info!(job = job.id, kind = job.kind.as_str(), conversation = %job.conversation, late_ms = late.as_millis() as u64, missed = missed.count.saturating_sub(1), "job fired");
            d.emit(Event::JobFired {
                conversation: job.conversation_id,
                job: job.id,
                scheduled_at,
            });
            if due_at.is_some() {
                hold_over_rate(d, job, now).await;
            }
            // Delivered (a notice) or answered (a task's message) by a round.
            d.wake_by(due_at.unwrap_or(now));
        }
        Fired::Gone => {
            tracing::debug!(
                job = job.id,
                "occurrence fired by another process, or the job was cancelled"
            );
        }
    }
    Ok(())
}

/// A task's message counts against its creator's `LULL_RATE_PER_MIN` like a message
/// they sent (admins are not limited): over it, the message waits for the hold, as
/// theirs would. A failure is logged; the message is answered as usual.
async fn hold_over_rate(d: &Dispatcher, job: &JobRow, now: Timestamp) {
    let limits = &d.settings.limits;
    if limits.rate_per_min == 0
        || d.settings
            .access
            .admins
            .contains(job.conversation.platform, &job.creator)
    {
        return;
    }
    let check = crate::store::RateCheck {
        conversation: job.conversation_id,
        user_id: &job.creator,
        rate: crate::store::RateWindow {
            max: limits.rate_per_min,
            window: crate::limits::rate_window(),
        },
        now,
    };
    match d.store.hold_over_rate(check).await {
        Ok(Some(hold)) => {
            tracing::info!(
                job = job.id,
                until = hold.until.0,
                "a task's message is over its creator's LULL_RATE_PER_MIN: held"
            );
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(job = job.id, error = %e, "could not apply the rate limit to a task; it is answered as usual")
        }
    }
}

/// The job's schedule and time zone, as stored (`Err`: why this build cannot read
/// them).
pub(super) fn readable(job: &JobRow) -> Result<(Schedule, TimeZone), String> {
    let schedule = Schedule::from_stored(&job.schedule).map_err(|e| e.to_string())?;
    let tz: TimeZone = job.timezone.parse()?;
    Ok((schedule, tz))
}

/// What the chat gets for an occurrence: the reminder's text or the task's prompt,
/// saying how late when it fires late or for missed ones (`LULL_JOB_MISSED=once`), or
/// a short notice that they were skipped (`skip`).
fn output(
    d: &Dispatcher,
    job: &JobRow,
    (count, late): (u64, Duration),
    (next_at, tz): (Option<Timestamp>, &TimeZone),
    now: Timestamp,
) -> JobOutput {
    let missed = count.saturating_sub(1);
    let is_late = late > LATE_AFTER || missed > 0;
    let skip = d.settings.jobs.as_ref().map(|j| j.missed) == Some(MissedPolicy::Skip);
    if is_late && skip {
        let next = next_at.map(|at| tz.show(at, now));
        let text = texts::job_skipped_text(job.id, &job.text, missed + 1, next.as_deref());
        return JobOutput::Notice(text);
    }
    let late = is_late.then(|| texts::late_by(late, missed));
    match job.kind {
        JobKind::Reminder => JobOutput::Notice(texts::reminder_text(&job.text, late.as_deref())),
        JobKind::Task => JobOutput::Message(texts::task_text(&job.text, late.as_deref())),
    }
}

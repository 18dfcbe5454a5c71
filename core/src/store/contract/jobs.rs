//! The jobs area of the contract: reminders and scheduled tasks as rows, their
//! occurrences as facts.
//!
//! A job is a row of its conversation (keyed by the conversation's id, so a later
//! "several bots in one instance" adds its column to conversations alone): who made
//! it, what it does (a reminder's text, a task's prompt), its schedule in a stored form
//! (`schedule::Schedule`), the time zone it is read in, and its next occurrence.
//!
//! **An occurrence is a fact.** [`JobStore::fire_job`] does, in one transaction: the
//! compare-and-swap of the job's next occurrence from the instant it fires to the next
//! one (or ends a one-shot), the occurrence row keyed by (job, scheduled instant), and
//! its output — a reminder's text as an outbox notice (its dedupe key is the
//! occurrence), a task's prompt as a message from the job's creator (its platform id
//! is the occurrence) that the ordinary round answers once. A kill before the commit
//! leaves nothing (the job is still due: it fires on the next look, by any process); a
//! kill after it leaves the fact (delivered once by the outbox). Two processes firing
//! the same occurrence at once: one compare-and-swap wins, the other finds the job
//! moved on and writes nothing.

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, HolderId, Timestamp, Version};
use crate::store::{OutboxRow, StoreError};

/// What a job does at each occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// `/remind`: its text delivered as is, without the model.
    Reminder,
    /// `/schedule`: its prompt answered by the model, as a message from its creator.
    Task,
}

impl JobKind {
    /// The stored (and metric label) form.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Reminder => "reminder",
            JobKind::Task => "task",
        }
    }

    /// The kind of a stored form.
    pub fn parse(stored: &str) -> Option<JobKind> {
        match stored {
            "reminder" => Some(JobKind::Reminder),
            "task" => Some(JobKind::Task),
            _ => None,
        }
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Fires at `next_at`.
    Active,
    /// Stopped by `/jobs cancel`; never fires again.
    Cancelled,
    /// A one-shot that fired.
    Done,
    /// Stopped by lull: its chat is no longer allowed, or the platform refused it.
    Paused,
}

impl JobState {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Active => "active",
            JobState::Cancelled => "cancelled",
            JobState::Done => "done",
            JobState::Paused => "paused",
        }
    }

    /// The state of a stored form (anything unknown reads as paused: never fired).
    pub fn parse(stored: &str) -> JobState {
        match stored {
            "active" => JobState::Active,
            "cancelled" => JobState::Cancelled,
            "done" => JobState::Done,
            _ => JobState::Paused,
        }
    }
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    pub id: i64,
    pub conversation: ConversationRef,
    /// The conversation's id in the store.
    pub conversation_id: ConversationId,
    pub is_group: bool,
    /// Who made it (a task's messages are theirs: their budget pays).
    pub creator: String,
    /// Their name, as a task's message shows it.
    pub creator_name: String,
    pub kind: JobKind,
    /// The schedule's stored form (`schedule::Schedule::to_stored`).
    pub schedule: String,
    /// The IANA time zone the schedule is read in.
    pub timezone: String,
    /// A reminder's text, or a task's prompt.
    pub text: String,
    /// The next occurrence; `None` once it will never fire again.
    pub next_at: Option<Timestamp>,
    pub state: JobState,
    pub created_at: Timestamp,
}

/// An active job's schedule as stored, for `lull check` to read back (a schedule or
/// zone this build cannot read would be paused when due).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    pub id: i64,
    pub schedule: String,
    pub timezone: String,
    pub next_at: Option<Timestamp>,
}

/// The statement both backends read [`StoredSchedule`]s with (the columns in order).
pub(crate) const STORED_SCHEDULES: &str =
    "SELECT id, schedule, timezone, next_at FROM jobs WHERE state = 'active' ORDER BY next_at, id";

/// A job to create ([`JobStore::create_job`]).
#[derive(Debug, Clone)]
pub struct NewJob {
    pub conversation: ConversationRef,
    pub is_group: bool,
    pub creator: String,
    pub creator_name: String,
    pub kind: JobKind,
    pub schedule: String,
    pub timezone: String,
    pub text: String,
    /// Its first occurrence.
    pub first_at: Timestamp,
    /// `LULL_JOBS_PER_CHAT`: the most active jobs its conversation may have.
    pub max_per_chat: u32,
    /// What made it (`command/<message id>`, `tool/<action key>`): creating the same
    /// job again from the same origin returns the first, never a second.
    pub origin: String,
    pub now: Timestamp,
}

/// What [`JobStore::create_job`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobCreated {
    /// Created now, or found created by the same origin before.
    Created(JobRow),
    /// The conversation already has `max_per_chat` active jobs: nothing created.
    TooMany { active: u32 },
}

/// The jobs due at or before `now`, at most `limit` ([`JobStore::due_jobs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueJobs {
    /// The earliest first.
    pub due: Vec<JobRow>,
    /// The earliest occurrence after `now` of an active job, if any: when to look again.
    pub next_at: Option<Timestamp>,
}

/// One occurrence to fire ([`JobStore::fire_job`]).
#[derive(Debug, Clone)]
pub struct Firing<'a> {
    /// The job, as read due.
    pub job: &'a JobRow,
    /// The occurrence: the instant it was due (the job's `next_at` when read).
    pub scheduled_at: Timestamp,
    /// What the chat gets.
    pub output: JobOutput,
    /// The occurrence after this one (`None`: the job ends).
    pub next_at: Option<Timestamp>,
    pub holder: &'a HolderId,
    pub now: Timestamp,
}

/// What an occurrence leaves in its chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutput {
    /// A notice, delivered as is (a reminder; a skipped occurrence's notice).
    Notice(String),
    /// A message from the job's creator, which a round answers (a task).
    Message(String),
}

/// What [`JobStore::fire_job`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// The occurrence is stored, with its output: a reminder's outbox row, or a task's
    /// message at this version of its conversation.
    Fired {
        outbox: Option<OutboxRow>,
        version: Option<Version>,
        due_at: Option<Timestamp>,
    },
    /// Another process fired it first, or the job was cancelled meanwhile: nothing
    /// written.
    Gone,
}

#[async_trait]
pub trait JobStore: Send + Sync + 'static {
    /// Create a job in `job.conversation`, unless the conversation already has
    /// `max_per_chat` active jobs; one origin creates one job, however often asked.
    async fn create_job(&self, job: NewJob) -> Result<JobCreated, StoreError>;

    /// The active jobs of `conversation`, by id.
    async fn jobs_of(&self, conversation: &ConversationRef) -> Result<Vec<JobRow>, StoreError>;

    /// Every chat's active jobs, the next to fire first (at most `limit`): the
    /// console's jobs page.
    async fn all_jobs(&self, limit: usize) -> Result<Vec<JobRow>, StoreError>;

    /// Cancel job `id` of `conversation` (a job of another conversation is not found):
    /// the row after it, `None` when there is no such active job.
    async fn cancel_job(
        &self,
        conversation: &ConversationRef,
        id: i64,
        now: Timestamp,
    ) -> Result<Option<JobRow>, StoreError>;

    /// The active jobs due at `now`, earliest first, at most `limit`, and when the next
    /// one after them is due.
    async fn due_jobs(&self, now: Timestamp, limit: u32) -> Result<DueJobs, StoreError>;

    /// Fire one occurrence, exactly once (the module doc).
    async fn fire_job(&self, firing: Firing<'_>) -> Result<Fired, StoreError>;

    /// Stop a job lull cannot serve any more (its chat no longer allowed, its schedule
    /// unreadable): it never fires again, and stays listed as paused.
    async fn pause_job(&self, id: i64, now: Timestamp) -> Result<(), StoreError>;

    /// How many jobs are active, for `lull_jobs_active`.
    async fn active_jobs(&self) -> Result<u64, StoreError>;

    /// The time zone `conversation` chose with `/timezone` (`None`: `LULL_TIMEZONE`).
    async fn chat_timezone(
        &self,
        conversation: &ConversationRef,
    ) -> Result<Option<String>, StoreError>;

    /// Choose `conversation`'s time zone (`None`: back to `LULL_TIMEZONE`). Jobs made
    /// before keep the zone they were made in.
    async fn set_chat_timezone(
        &self,
        conversation: &ConversationRef,
        timezone: Option<&str>,
        now: Timestamp,
    ) -> Result<(), StoreError>;
}

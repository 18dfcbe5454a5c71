//! The jobs area on SQLite: jobs as rows, an occurrence fired in one transaction.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteStore;
use super::messages::{store_message, upsert_conversation};
use super::outbox::insert_notice;
use super::sql::Context;
use crate::domain::{ConversationRef, Timestamp};
use crate::store::rules::{self, RawJob};
use crate::store::{
    DueJobs, Fired, Firing, IngestOutcome, JobCreated, JobOutput, JobRow, JobStore, NewJob,
    StoreError,
};

/// The columns a [`JobRow`] is read from, with its conversation's.
const JOB_COLUMNS: &str = "j.id, c.platform, c.key, j.conversation_id, c.is_group, j.creator,
     j.creator_name, j.kind, j.schedule, j.timezone, j.text, j.next_at, j.state, j.created_at";

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_job(&self, job: NewJob) -> Result<JobCreated, StoreError> {
        self.write("creating a job", move |tx| create(tx, &job))
            .await
    }

    async fn jobs_of(&self, conversation: &ConversationRef) -> Result<Vec<JobRow>, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            let sql = format!(
                "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
                 WHERE c.platform = ?1 AND c.key = ?2 AND j.state = 'active' ORDER BY j.id"
            );
            let mut statement = conn.prepare_cached(&sql).ctx("preparing a statement")?;
            let rows = statement
                .query_map(
                    params![conversation.platform.as_str(), conversation.key],
                    raw_job,
                )
                .ctx("reading jobs")?;
            jobs(rows.collect::<Result<Vec<_>, _>>().ctx("reading jobs")?)
        })
        .await
    }

    async fn all_jobs(&self, limit: usize) -> Result<Vec<JobRow>, StoreError> {
        self.with_conn(move |conn| {
            let sql = format!(
                "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
                 WHERE j.state = 'active' ORDER BY j.next_at IS NULL, j.next_at, j.id LIMIT ?1"
            );
            let mut statement = conn.prepare_cached(&sql).ctx("preparing a statement")?;
            let rows = statement
                .query_map(params![limit as i64], raw_job)
                .ctx("reading jobs")?;
            jobs(rows.collect::<Result<Vec<_>, _>>().ctx("reading jobs")?)
        })
        .await
    }

    async fn cancel_job(
        &self,
        conversation: &ConversationRef,
        id: i64,
        now: Timestamp,
    ) -> Result<Option<JobRow>, StoreError> {
        let conversation = conversation.clone();
        self.write("cancelling a job", move |tx| {
            // Once: only an active job of this conversation is cancelled; a job being
            // fired meanwhile either fired first (this cancels the next) or finds
            // itself cancelled (its compare-and-swap misses).
            let cancelled = tx
                .prepare_cached(
                    "UPDATE jobs SET state = 'cancelled', ended_at = ?4
                     WHERE id = ?3 AND state = 'active' AND conversation_id =
                         (SELECT id FROM conversations WHERE platform = ?1 AND key = ?2)",
                )
                .ctx("preparing a statement")?
                .execute(params![
                    conversation.platform.as_str(),
                    conversation.key,
                    id,
                    now.0
                ])
                .ctx("cancelling a job")?;
            if cancelled == 0 {
                return Ok(None);
            }
            read_job(tx, id)
        })
        .await
    }

    async fn due_jobs(&self, now: Timestamp, limit: u32) -> Result<DueJobs, StoreError> {
        self.with_conn(move |conn| {
            let sql = format!(
                "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
                 WHERE j.state = 'active' AND j.next_at <= ?1 ORDER BY j.next_at, j.id LIMIT ?2"
            );
            let mut statement = conn.prepare_cached(&sql).ctx("preparing a statement")?;
            let due = jobs(
                statement
                    .query_map(params![now.0, limit], raw_job)
                    .ctx("reading due jobs")?
                    .collect::<Result<Vec<_>, _>>()
                    .ctx("reading due jobs")?,
            )?;
            let next_at: Option<i64> = conn
                .prepare_cached(
                    "SELECT MIN(next_at) FROM jobs WHERE state = 'active' AND next_at > ?1",
                )
                .ctx("preparing a statement")?
                .query_row([now.0], |r| r.get(0))
                .ctx("reading the next job")?;
            Ok(DueJobs {
                due,
                next_at: next_at.map(Timestamp),
            })
        })
        .await
    }

    async fn fire_job(&self, firing: Firing<'_>) -> Result<Fired, StoreError> {
        let job = firing.job.clone();
        let holder = firing.holder.clone();
        let (scheduled_at, next_at, output, now) = (
            firing.scheduled_at,
            firing.next_at,
            firing.output,
            firing.now,
        );
        let policy = self.timers;
        self.write("firing a job", move |tx| {
            if !advance(tx, &job, scheduled_at, next_at, now)? {
                return Ok(Fired::Gone);
            }
            // An occurrence is a fact: keyed by (job, scheduled instant).
            let recorded = tx
                .prepare_cached(
                    "INSERT INTO job_occurrences (job_id, scheduled_at, fired_at, fired_by)
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (job_id, scheduled_at) DO NOTHING",
                )
                .ctx("preparing a statement")?
                .execute(params![job.id, scheduled_at.0, now.0, holder.as_str()])
                .ctx("recording an occurrence")?;
            if recorded == 0 && !crate::switches::no_occurrence_key() {
                return Ok(Fired::Gone);
            }
            let key = rules::occurrence_key(job.id, scheduled_at, &holder);
            store_output(tx, &job, output, key, (&holder, policy), now)
        })
        .await
    }

    async fn pause_job(&self, id: i64, now: Timestamp) -> Result<(), StoreError> {
        self.write("pausing a job", move |tx| {
            tx.prepare_cached(
                "UPDATE jobs SET state = 'paused', ended_at = ?2 WHERE id = ?1 AND state = 'active'",
            )
            .ctx("preparing a statement")?
            .execute(params![id, now.0])
            .ctx("pausing a job")?;
            Ok(())
        })
        .await
    }

    async fn active_jobs(&self) -> Result<u64, StoreError> {
        self.with_conn(|conn| {
            conn.prepare_cached("SELECT COUNT(*) FROM jobs WHERE state = 'active'")
                .ctx("preparing a statement")?
                .query_row([], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .ctx("counting jobs")
        })
        .await
    }

    async fn chat_timezone(
        &self,
        conversation: &ConversationRef,
    ) -> Result<Option<String>, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            conn.prepare_cached(
                "SELECT timezone FROM conversations WHERE platform = ?1 AND key = ?2",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![conversation.platform.as_str(), conversation.key],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
            .ctx("reading a time zone")
        })
        .await
    }

    async fn set_chat_timezone(
        &self,
        conversation: &ConversationRef,
        timezone: Option<&str>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let conversation = conversation.clone();
        let timezone = timezone.map(str::to_owned);
        self.write("choosing a time zone", move |tx| {
            let id = upsert_conversation(tx, &conversation, false, now)?;
            tx.prepare_cached("UPDATE conversations SET timezone = ?2 WHERE id = ?1")
                .ctx("preparing a statement")?
                .execute(params![id.0, timezone])
                .ctx("choosing a time zone")?;
            Ok(())
        })
        .await
    }
}

/// Create `job` unless its conversation is full; the job its origin made before, if
/// any.
fn create(tx: &Connection, job: &NewJob) -> Result<JobCreated, StoreError> {
    let conversation = upsert_conversation(tx, &job.conversation, job.is_group, job.now)?;
    // One origin, one job: a redelivered command or a tool call asked again finds it.
    let made: Option<i64> = tx
        .prepare_cached("SELECT id FROM jobs WHERE conversation_id = ?1 AND origin = ?2")
        .ctx("preparing a statement")?
        .query_row(params![conversation.0, job.origin], |r| r.get(0))
        .optional()
        .ctx("reading a job")?;
    if let Some(id) = made {
        return created(read_job(tx, id)?);
    }
    // The limit holds under the write lock: no other writer counts meanwhile.
    let active: i64 = tx
        .prepare_cached("SELECT COUNT(*) FROM jobs WHERE conversation_id = ?1 AND state = 'active'")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| r.get(0))
        .ctx("counting jobs")?;
    if active >= i64::from(job.max_per_chat) {
        return Ok(JobCreated::TooMany {
            active: active as u32,
        });
    }
    let id: i64 = tx
        .prepare_cached(
            "INSERT INTO jobs (conversation_id, creator, creator_name, kind, schedule, timezone,
                               text, next_at, origin, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) RETURNING id",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![
                conversation.0,
                job.creator,
                job.creator_name,
                job.kind.as_str(),
                job.schedule,
                job.timezone,
                job.text,
                job.first_at.0,
                job.origin,
                job.now.0
            ],
            |r| r.get(0),
        )
        .ctx("creating a job")?;
    created(read_job(tx, id)?)
}

/// A job just read in the transaction that made (or found) it.
fn created(row: Option<JobRow>) -> Result<JobCreated, StoreError> {
    row.map(JobCreated::Created).ok_or(StoreError::Backend {
        context: "creating a job",
        message: "the job was not found in the transaction that created it".into(),
    })
}

/// Move `job` from the occurrence at `scheduled_at` to `next_at` (ending a job with no
/// next one): `false` when another process fired it first or it was cancelled.
fn advance(
    tx: &Connection,
    job: &JobRow,
    scheduled_at: Timestamp,
    next_at: Option<Timestamp>,
    now: Timestamp,
) -> Result<bool, StoreError> {
    // Once per occurrence: the compare-and-swap of the next occurrence, from the
    // instant this firing read to the next one; a second firing of the same instant
    // (another process, a stale read) misses it. The counter-test's switch leaves the
    // instant unchecked.
    let unchecked = crate::switches::no_occurrence_key();
    let moved = tx
        .prepare_cached(
            "UPDATE jobs SET next_at = ?3,
                 state = CASE WHEN ?3 IS NULL THEN 'done' ELSE state END,
                 ended_at = CASE WHEN ?3 IS NULL THEN ?4 ELSE ended_at END
             WHERE id = ?1 AND (?5 OR (state = 'active' AND next_at = ?2))",
        )
        .ctx("preparing a statement")?
        .execute(params![
            job.id,
            scheduled_at.0,
            next_at.map(|t| t.0),
            now.0,
            unchecked
        ])
        .ctx("arming a job's next occurrence")?;
    Ok(moved == 1)
}

/// Job `id`, read in `tx`.
fn read_job(tx: &Connection, id: i64) -> Result<Option<JobRow>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
         WHERE j.id = ?1"
    );
    tx.prepare_cached(&sql)
        .ctx("preparing a statement")?
        .query_row([id], raw_job)
        .optional()
        .ctx("reading a job")?
        .map(rules::job_row)
        .transpose()
}

/// The raw columns of a row of [`JOB_COLUMNS`] ([`rules::job_row`] reads them).
fn raw_job(r: &Row<'_>) -> rusqlite::Result<RawJob> {
    Ok(RawJob {
        id: r.get(0)?,
        platform: r.get(1)?,
        key: r.get(2)?,
        conversation_id: r.get(3)?,
        is_group: r.get(4)?,
        creator: r.get(5)?,
        creator_name: r.get(6)?,
        kind: r.get(7)?,
        schedule: r.get(8)?,
        timezone: r.get(9)?,
        text: r.get(10)?,
        next_at: r.get(11)?,
        state: r.get(12)?,
        created_at: r.get(13)?,
    })
}

/// The jobs of rows read with [`raw_job`].
fn jobs(raw: Vec<RawJob>) -> Result<Vec<JobRow>, StoreError> {
    raw.into_iter().map(rules::job_row).collect()
}

/// What an occurrence leaves in its chat, stored in the firing's transaction: a
/// reminder's notice, or a task's message stored as ingest stores one.
fn store_output(
    tx: &Connection,
    job: &JobRow,
    output: JobOutput,
    key: String,
    (holder, policy): (&crate::domain::HolderId, crate::timing::TimerPolicy),
    now: Timestamp,
) -> Result<Fired, StoreError> {
    match output {
        JobOutput::Notice(text) => {
            let notice = rules::occurrence_notice(job, text, key);
            let outbox = insert_notice(tx, &notice, holder, now)?;
            Ok(Fired::Fired {
                outbox,
                version: None,
                due_at: None,
            })
        }
        JobOutput::Message(text) => {
            let message = rules::occurrence_message(job, text, key);
            let stored = store_message(tx, &message, (holder, policy), now)?;
            let (version, due_at) = match stored {
                IngestOutcome::Stored {
                    version, due_at, ..
                } => (Some(version), Some(due_at)),
                _ => (None, None),
            };
            Ok(Fired::Fired {
                outbox: None,
                version,
                due_at,
            })
        }
    }
}

//! The jobs area on PostgreSQL: jobs as rows, an occurrence fired in one transaction.
//!
//! Lock order, as everywhere: the conversation row first (`FOR UPDATE`, or the upsert
//! that creates it), then the job row. Times of jobs are absolute instants (the
//! schedule's); due is judged on the database's clock.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use super::clock::Now;
use super::messages::upsert_conversation;
use super::outbox::insert_notice;
use super::sql::{Tx, execute, query, query_one, query_opt};
use crate::domain::{ConversationRef, Timestamp, Version};
use crate::rhythm::Cue;
use crate::store::faults::Operation;
use crate::store::rules::{self, RawJob};
use crate::store::{
    DueJobs, Fired, Firing, JobCreated, JobOutput, JobRow, JobStore, NewJob, StoreError,
};

/// The columns a [`JobRow`] is read from, with its conversation's.
const JOB_COLUMNS: &str = "j.id, c.platform, c.key, j.conversation_id, c.is_group, j.creator,
     j.creator_name, j.kind, j.schedule, j.timezone, j.text, j.next_at, j.state, j.created_at";

#[async_trait]
impl JobStore for PostgresStore {
    async fn create_job(&self, job: NewJob) -> Result<JobCreated, StoreError> {
        transaction!(self, Operation::Other, "creating a job", |tx| {
            async {
                let now = self.now(&tx, job.now).await?;
                create(&tx, &job, now.db).await
            }
            .await
        })
    }

    async fn jobs_of(&self, conversation: &ConversationRef) -> Result<Vec<JobRow>, StoreError> {
        transaction!(self, Operation::Read, "reading jobs", |tx| {
            async {
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
                     WHERE c.platform = $1 AND c.key = $2 AND j.state = 'active' ORDER BY j.id"
                );
                let rows = query(
                    &tx,
                    &sql,
                    &[&conversation.platform.as_str(), &conversation.key],
                    "reading jobs",
                )
                .await?;
                rows.iter().map(job_row).collect::<Result<Vec<_>, _>>()
            }
            .await
        })
    }

    async fn all_jobs(&self, limit: usize) -> Result<Vec<JobRow>, StoreError> {
        transaction!(self, Operation::Read, "reading jobs", |tx| {
            async {
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
                     WHERE j.state = 'active' ORDER BY j.next_at ASC NULLS LAST, j.id LIMIT $1"
                );
                let rows = query(&tx, &sql, &[&(limit as i64)], "reading jobs").await?;
                rows.iter().map(job_row).collect::<Result<Vec<_>, _>>()
            }
            .await
        })
    }

    async fn cancel_job(
        &self,
        conversation: &ConversationRef,
        id: i64,
        now: Timestamp,
    ) -> Result<Option<JobRow>, StoreError> {
        transaction!(self, Operation::Other, "cancelling a job", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                // Once: only an active job of this conversation is cancelled; a firing
                // of it waits on the row and then misses its compare-and-swap.
                let cancelled = execute(
                    &tx,
                    "UPDATE jobs SET state = 'cancelled', ended_at = $4
                     WHERE id = $3 AND state = 'active' AND conversation_id =
                         (SELECT id FROM conversations WHERE platform = $1 AND key = $2)",
                    &[
                        &conversation.platform.as_str(),
                        &conversation.key,
                        &id,
                        &now.db.0,
                    ],
                    "cancelling a job",
                )
                .await?;
                if cancelled == 0 {
                    return Ok(None);
                }
                read_job(&tx, id).await
            }
            .await
        })
    }

    async fn due_jobs(&self, now: Timestamp, limit: u32) -> Result<DueJobs, StoreError> {
        transaction!(self, Operation::Read, "reading due jobs", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
                     WHERE j.state = 'active' AND j.next_at <= $1 ORDER BY j.next_at, j.id LIMIT $2"
                );
                let rows = query(&tx, &sql, &[&now.db.0, &i64::from(limit)], "reading due jobs")
                    .await?;
                let due = rows.iter().map(job_row).collect::<Result<Vec<_>, _>>()?;
                let next = query_one(
                    &tx,
                    "SELECT MIN(next_at) FROM jobs WHERE state = 'active' AND next_at > $1",
                    &[&now.db.0],
                    "reading the next job",
                )
                .await?;
                let next_at: Option<i64> = next.get(0);
                Ok(DueJobs {
                    due,
                    // On the caller's timeline, like every deadline handed back.
                    next_at: next_at.map(|t| now.to_caller(Timestamp(t))),
                })
            }
            .await
        })
    }

    async fn fire_job(&self, firing: Firing<'_>) -> Result<Fired, StoreError> {
        transaction!(self, Operation::Other, "firing a job", |tx| {
            async {
                let now = self.now(&tx, firing.now).await?;
                // The conversation row first: the lock order of every writer.
                query_one(
                    &tx,
                    "SELECT id FROM conversations WHERE id = $1 FOR UPDATE",
                    &[&firing.job.conversation_id.0],
                    "firing a job",
                )
                .await?;
                if !advance(&tx, &firing, now).await? || !record(&tx, &firing, now).await? {
                    return Ok(Fired::Gone);
                }
                output(self, &tx, &firing, now).await
            }
            .await
        })
    }

    async fn pause_job(&self, id: i64, now: Timestamp) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "pausing a job", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                execute(
                    &tx,
                    "UPDATE jobs SET state = 'paused', ended_at = $2 WHERE id = $1 AND state = 'active'",
                    &[&id, &now.db.0],
                    "pausing a job",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }

    async fn active_jobs(&self) -> Result<u64, StoreError> {
        transaction!(self, Operation::Read, "counting jobs", |tx| {
            async {
                let row = query_one(
                    &tx,
                    "SELECT COUNT(*) FROM jobs WHERE state = 'active'",
                    &[],
                    "counting jobs",
                )
                .await?;
                Ok(row.get::<_, i64>(0).max(0) as u64)
            }
            .await
        })
    }

    async fn chat_timezone(
        &self,
        conversation: &ConversationRef,
    ) -> Result<Option<String>, StoreError> {
        transaction!(self, Operation::Read, "reading a time zone", |tx| {
            async {
                let row = query_opt(
                    &tx,
                    "SELECT timezone FROM conversations WHERE platform = $1 AND key = $2",
                    &[&conversation.platform.as_str(), &conversation.key],
                    "reading a time zone",
                )
                .await?;
                Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
            }
            .await
        })
    }

    async fn set_chat_timezone(
        &self,
        conversation: &ConversationRef,
        timezone: Option<&str>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "choosing a time zone", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                let id = upsert_conversation(&tx, conversation, false, now.db).await?;
                execute(
                    &tx,
                    "UPDATE conversations SET timezone = $2 WHERE id = $1",
                    &[&id.0, &timezone],
                    "choosing a time zone",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }
}

/// Create `job` unless its conversation is full; the job its origin made before, if
/// any.
async fn create(tx: &Tx<'_>, job: &NewJob, now: Timestamp) -> Result<JobCreated, StoreError> {
    // The conversation row first: two creations in one chat queue here, so the
    // limit's count below is not raced.
    let conversation = upsert_conversation(tx, &job.conversation, job.is_group, now).await?;
    // One origin, one job: a redelivered command or a tool call asked again finds it.
    let made = query_opt(
        tx,
        "SELECT id FROM jobs WHERE conversation_id = $1 AND origin = $2",
        &[&conversation.0, &job.origin],
        "reading a job",
    )
    .await?;
    if let Some(made) = made {
        return created(read_job(tx, made.get(0)).await?);
    }
    let active: i64 = query_one(
        tx,
        "SELECT COUNT(*) FROM jobs WHERE conversation_id = $1 AND state = 'active'",
        &[&conversation.0],
        "counting jobs",
    )
    .await?
    .get(0);
    if active >= i64::from(job.max_per_chat) {
        return Ok(JobCreated::TooMany {
            active: active as u32,
        });
    }
    let row = query_one(
        tx,
        "INSERT INTO jobs (conversation_id, creator, creator_name, kind, schedule, timezone,
                           text, next_at, origin, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
        &[
            &conversation.0,
            &job.creator,
            &job.creator_name,
            &job.kind.as_str(),
            &job.schedule,
            &job.timezone,
            &job.text,
            &job.first_at.0,
            &job.origin,
            &now.0,
        ],
        "creating a job",
    )
    .await?;
    created(read_job(tx, row.get(0)).await?)
}

/// A job just read in the transaction that made (or found) it.
fn created(row: Option<JobRow>) -> Result<JobCreated, StoreError> {
    row.map(JobCreated::Created).ok_or(StoreError::Backend {
        context: "creating a job",
        message: "the job was not found in the transaction that created it".into(),
    })
}

/// Move the job from the occurrence at `scheduled_at` to the next one (ending a job
/// with none): `false` when another process fired it first or it was cancelled.
async fn advance(tx: &Tx<'_>, firing: &Firing<'_>, now: Now) -> Result<bool, StoreError> {
    // Once per occurrence: the compare-and-swap of the next occurrence, from the
    // instant this firing read to the next one; a second firing of the same instant
    // (another replica, a stale read) waits on the row, then misses. The
    // counter-test's switch leaves the instant unchecked.
    let unchecked = crate::switches::no_occurrence_key();
    let next_at = firing.next_at.map(|t| t.0);
    let moved = execute(
        tx,
        "UPDATE jobs SET next_at = $3,
             state = CASE WHEN $3::int8 IS NULL THEN 'done' ELSE state END,
             ended_at = CASE WHEN $3::int8 IS NULL THEN $4 ELSE ended_at END
         WHERE id = $1 AND ($5 OR (state = 'active' AND next_at = $2))",
        &[
            &firing.job.id,
            &firing.scheduled_at.0,
            &next_at,
            &now.db.0,
            &unchecked,
        ],
        "arming a job's next occurrence",
    )
    .await?;
    Ok(moved == 1)
}

/// The occurrence's row, keyed by (job, scheduled instant): `false` when it is
/// there already (unless the counter-test's switch is on).
async fn record(tx: &Tx<'_>, firing: &Firing<'_>, now: Now) -> Result<bool, StoreError> {
    // An occurrence is a fact: one row per (job, scheduled instant).
    let recorded = execute(
        tx,
        "INSERT INTO job_occurrences (job_id, scheduled_at, fired_at, fired_by)
         VALUES ($1, $2, $3, $4) ON CONFLICT (job_id, scheduled_at) DO NOTHING",
        &[
            &firing.job.id,
            &firing.scheduled_at.0,
            &now.db.0,
            &firing.holder.as_str(),
        ],
        "recording an occurrence",
    )
    .await?;
    Ok(recorded == 1 || crate::switches::no_occurrence_key())
}

/// What the occurrence leaves in its chat: a reminder's notice, or a task's message
/// (stored as ingest stores one: `lull_ingest`, in this transaction).
async fn output(
    store: &PostgresStore,
    tx: &Tx<'_>,
    firing: &Firing<'_>,
    now: Now,
) -> Result<Fired, StoreError> {
    let job = firing.job;
    let key = rules::occurrence_key(job.id, firing.scheduled_at, firing.holder);
    let text = match &firing.output {
        JobOutput::Message(text) => text,
        JobOutput::Notice(text) => {
            let notice = rules::occurrence_notice(job, text.clone(), key);
            let outbox = insert_notice(tx, &notice, firing.holder, now).await?;
            return Ok(Fired::Fired {
                outbox,
                version: None,
                due_at: None,
            });
        }
    };
    let (wait_min, wait_max) = store.timers.wait_range(Cue::of(text, 0));
    let row = query_one(
        tx,
        "SELECT o_version, o_due_at, o_now FROM lull_ingest(
             $1, $2, $3, $4, $5, $6, $7, NULL, $8, $9, $10, $11, $12, $13)",
        &[
            &job.conversation.platform.as_str(),
            &job.conversation.key,
            &job.is_group,
            &key,
            &job.creator,
            &job.creator_name,
            text,
            &firing.holder.as_str(),
            &now.fixed,
            &crate::domain::millis(wait_min),
            &crate::domain::millis(wait_max),
            &crate::domain::millis(store.timers.max_wait()),
            &i64::from(store.timers.max_batch()),
        ],
        "storing a task's message",
    )
    .await?;
    let version: Option<i64> = row.get(0);
    let due_at: Option<i64> = row.get(1);
    Ok(Fired::Fired {
        outbox: None,
        version: version.map(Version),
        due_at: due_at.map(|t| now.to_caller(Timestamp(t))),
    })
}

/// Job `id`, read in `tx`.
async fn read_job(tx: &Tx<'_>, id: i64) -> Result<Option<JobRow>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs j JOIN conversations c ON c.id = j.conversation_id
         WHERE j.id = $1"
    );
    query_opt(tx, &sql, &[&id], "reading a job")
        .await?
        .as_ref()
        .map(job_row)
        .transpose()
}

/// A [`JobRow`] of a row of [`JOB_COLUMNS`].
fn job_row(r: &Row) -> Result<JobRow, StoreError> {
    rules::job_row(RawJob {
        id: r.get(0),
        platform: r.get(1),
        key: r.get(2),
        conversation_id: r.get(3),
        is_group: r.get(4),
        creator: r.get(5),
        creator_name: r.get(6),
        kind: r.get(7),
        schedule: r.get(8),
        timezone: r.get(9),
        text: r.get(10),
        next_at: r.get(11),
        state: r.get(12),
        created_at: r.get(13),
    })
}

//! Conformance of the jobs area: a job made once per origin and within its chat's
//! limit; each occurrence fired once (its compare-and-swap, its key), with its output
//! in the same transaction; a cancelled job never fires; a chat keeps its time zone.

use super::{at, holder, http};
use crate::domain::{ConversationRef, Timestamp};
use crate::store::{
    ConversationAt, Fired, Firing, JobCreated, JobKind, JobOutput, JobRow, NewJob, Store,
};

fn new_job(chat: &ConversationRef, kind: JobKind, origin: &str, first_at: Timestamp) -> NewJob {
    NewJob {
        conversation: chat.clone(),
        is_group: false,
        creator: "u1".into(),
        creator_name: "Ann".into(),
        kind,
        schedule: "once 2023-11-14T22:13:20Z".into(),
        timezone: "UTC".into(),
        text: "water the plants".into(),
        first_at,
        max_per_chat: 3,
        origin: origin.into(),
        now: at(0),
    }
}

async fn create(store: &dyn Store, job: NewJob) -> JobRow {
    match store.create_job(job).await.expect("creating a job") {
        JobCreated::Created(row) => row,
        other => panic!("not created: {other:?}"),
    }
}

async fn fire(store: &dyn Store, job: &JobRow, next_at: Option<Timestamp>, by: &str) -> Fired {
    let holder = holder(by);
    let firing = Firing {
        job,
        scheduled_at: job.next_at.expect("an active job"),
        output: match job.kind {
            JobKind::Reminder => JobOutput::Notice(format!("⏰ {}", job.text)),
            JobKind::Task => JobOutput::Message(format!("⏰ {}", job.text)),
        },
        next_at,
        holder: &holder,
        now: at(1_100),
    };
    store.fire_job(firing).await.expect("firing a job")
}

/// One origin makes one job however often it is asked; a chat holds at most its
/// limit of active jobs; each chat lists its own.
pub async fn a_job_is_made_once_per_origin_within_the_limit(store: &dyn Store) {
    let chat = http("jobs-1");
    let first = create(
        store,
        new_job(&chat, JobKind::Reminder, "command/m1", at(1_000)),
    )
    .await;
    let again = create(
        store,
        new_job(&chat, JobKind::Reminder, "command/m1", at(9_000)),
    )
    .await;
    assert_eq!(again, first, "the same origin found its job");
    assert_eq!(first.next_at, Some(at(1_000)));
    create(
        store,
        new_job(&chat, JobKind::Task, "command/m2", at(2_000)),
    )
    .await;
    create(
        store,
        new_job(&chat, JobKind::Task, "command/m3", at(3_000)),
    )
    .await;
    let full = store
        .create_job(new_job(&chat, JobKind::Task, "command/m4", at(4_000)))
        .await
        .unwrap();
    assert_eq!(full, JobCreated::TooMany { active: 3 });
    let listed = store.jobs_of(&chat).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.windows(2).all(|w| w[0].id < w[1].id), "by id");
    assert!(store.jobs_of(&http("jobs-other")).await.unwrap().is_empty());
    assert_eq!(store.active_jobs().await.unwrap(), 3);
}

/// A reminder's occurrence is fired once: the first firing stores its notice and
/// ends the one-shot; a second firing of the same instant (another process, a stale
/// read) writes nothing.
pub async fn a_reminder_fires_once(store: &dyn Store) {
    let chat = http("jobs-2");
    let job = create(
        store,
        new_job(&chat, JobKind::Reminder, "command/r", at(1_000)),
    )
    .await;
    assert!(store.due_jobs(at(999), 10).await.unwrap().due.is_empty());
    let due = store.due_jobs(at(1_000), 10).await.unwrap();
    assert_eq!(due.due, vec![job.clone()]);
    let Fired::Fired {
        outbox: Some(row),
        version: None,
        ..
    } = fire(store, &job, None, "a").await
    else {
        panic!("the reminder did not queue its notice");
    };
    assert_eq!(row.text, "⏰ water the plants");
    assert_eq!(fire(store, &job, None, "b").await, Fired::Gone);
    let owed = store
        .due_outbox(ConversationAt {
            conversation: job.conversation_id,
            now: at(1_200),
        })
        .await
        .unwrap();
    assert_eq!(owed.len(), 1, "one notice, delivered by the next round");
    assert!(store.due_jobs(at(5_000), 10).await.unwrap().due.is_empty());
    assert!(
        store.jobs_of(&chat).await.unwrap().is_empty(),
        "a one-shot ends"
    );
}

/// A recurring job moves to its next occurrence in the firing's transaction; the old
/// instant cannot fire again, the new one fires once.
pub async fn a_recurring_job_arms_its_next_occurrence(store: &dyn Store) {
    let chat = http("jobs-3");
    let job = create(
        store,
        new_job(&chat, JobKind::Reminder, "command/e", at(1_000)),
    )
    .await;
    assert!(matches!(
        fire(store, &job, Some(at(61_000)), "a").await,
        Fired::Fired { .. }
    ));
    assert_eq!(fire(store, &job, Some(at(61_000)), "b").await, Fired::Gone);
    let due = store.due_jobs(at(2_000), 10).await.unwrap();
    assert!(due.due.is_empty());
    assert_eq!(due.next_at, Some(at(61_000)));
    let moved = store.due_jobs(at(61_000), 10).await.unwrap().due;
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].next_at, Some(at(61_000)));
    assert!(matches!(
        fire(store, &moved[0], Some(at(121_000)), "b").await,
        Fired::Fired { .. }
    ));
    assert_eq!(
        store.jobs_of(&chat).await.unwrap()[0].next_at,
        Some(at(121_000))
    );
}

/// A task's occurrence is a message from the job's creator, stored as ingest stores
/// one (the version moved, the timer armed), once.
pub async fn a_task_fires_as_a_message_from_its_creator(store: &dyn Store) {
    let chat = http("jobs-4");
    let job = create(store, new_job(&chat, JobKind::Task, "command/t", at(1_000))).await;
    let Fired::Fired {
        outbox: None,
        version: Some(version),
        due_at: Some(_),
    } = fire(store, &job, None, "a").await
    else {
        panic!("the task stored no message");
    };
    assert_eq!(fire(store, &job, None, "b").await, Fired::Gone);
    let batch = store.collect(job.conversation_id, 10).await.unwrap();
    assert_eq!(batch.v0, version);
    assert_eq!(batch.pending.len(), 1, "one message, once");
    let message = &batch.pending[0];
    assert_eq!(
        (message.user_id.as_str(), message.author.as_str()),
        ("u1", "Ann")
    );
    assert_eq!(message.text, "⏰ water the plants");
}

/// A cancelled job never fires; only an active job of the chat it belongs to is
/// cancelled.
pub async fn a_cancelled_job_never_fires(store: &dyn Store) {
    let chat = http("jobs-5");
    let job = create(
        store,
        new_job(&chat, JobKind::Reminder, "command/c", at(1_000)),
    )
    .await;
    let other = http("jobs-5-other");
    assert_eq!(
        store.cancel_job(&other, job.id, at(10)).await.unwrap(),
        None
    );
    let cancelled = store.cancel_job(&chat, job.id, at(10)).await.unwrap();
    assert_eq!(
        cancelled.map(|j| j.state),
        Some(crate::store::JobState::Cancelled)
    );
    assert_eq!(store.cancel_job(&chat, job.id, at(20)).await.unwrap(), None);
    assert!(store.due_jobs(at(2_000), 10).await.unwrap().due.is_empty());
    assert!(
        store.all_jobs(10).await.unwrap().is_empty(),
        "the console lists active jobs only"
    );
    assert_eq!(fire(store, &job, None, "a").await, Fired::Gone);
    assert_eq!(store.active_jobs().await.unwrap(), 0);
}

/// The console's jobs: every chat's active jobs, the next to fire first, at most the
/// limit asked.
pub async fn every_chats_active_jobs_are_listed_next_first(store: &dyn Store) {
    let later = create(
        store,
        new_job(&http("jobs-7a"), JobKind::Reminder, "command/l", at(5_000)),
    )
    .await;
    let sooner = create(
        store,
        new_job(&http("jobs-7b"), JobKind::Task, "command/s", at(2_000)),
    )
    .await;
    let all: Vec<i64> = store
        .all_jobs(10)
        .await
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(all, [sooner.id, later.id]);
    let first = store.all_jobs(1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].conversation, http("jobs-7b"));
}

/// A chat's time zone: none until chosen, then the chosen one, then none again.
pub async fn a_chat_keeps_its_time_zone(store: &dyn Store) {
    let chat = http("jobs-6");
    assert_eq!(store.chat_timezone(&chat).await.unwrap(), None);
    store
        .set_chat_timezone(&chat, Some("Europe/Berlin"), at(0))
        .await
        .unwrap();
    assert_eq!(
        store.chat_timezone(&chat).await.unwrap().as_deref(),
        Some("Europe/Berlin")
    );
    store.set_chat_timezone(&chat, None, at(10)).await.unwrap();
    assert_eq!(store.chat_timezone(&chat).await.unwrap(), None);
}

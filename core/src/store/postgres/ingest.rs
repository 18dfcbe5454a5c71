//! Messages that reach one process together are stored together: group commit for
//! the PostgreSQL ingest.
//!
//! A message is one call of `lull_ingest` (one round trip, one transaction). Under
//! load most of that call is the commit's WAL flush, the round trip and the server's
//! work per statement, all paid once per call, so a process keeps at most
//! [`SENDERS`] ingest call in flight: a message that finds the sender free is sent at
//! once, on its caller's task (no hop, no added latency when the load is light);
//! messages that find it busy queue, and when it finishes it takes up to
//! [`GROUP_MAX`] of them in one call, which stores each exactly as `lull_ingest`
//! does, in one transaction, taking the conversation rows in one order shared by
//! every replica (no deadlock between groups): a group of [`SETS_FROM`] or more as
//! sets (`lull_ingest_many`, schema V16, a few statements for the whole group), a
//! smaller one row by row (`lull_ingest_rows`, V15's function), whichever costs the
//! server less.
//!
//! Invariants:
//! - **No loss**: each caller gets the answer for its own message, or an error when
//!   its message may not be stored. A group that fails as a whole (a message the
//!   database refuses, a lost connection, a busy database) has rolled back: each of
//!   its messages is then tried alone, so one bad message fails alone and the others
//!   are stored. A transient failure (busy, full, the connection lost), the same for
//!   every message, is every caller's answer at once: nothing was acknowledged, the
//!   platform delivers again, and a message the failed call did commit (a connection
//!   lost after the commit) is found as a duplicate (the ingest is idempotent on the
//!   platform message id).
//! - **Order**: a caller hears "stored" only once its message is committed; messages
//!   of one conversation that wait together are stored in the order they queued.
//! - **No stranded message**: a sender that finishes hands its slot to a drain task
//!   while the queue is not empty, also when its caller stopped waiting; a queued
//!   message is always some sender's to take.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::PostgresStore;
use super::sql::{query, query_one};
use crate::domain::Timestamp;
use crate::store::StoreError;
use crate::store::faults::Operation;

/// Ingest calls one process keeps in flight: one. The server's CPU, not its disk,
/// bounds the ingest (a group's commit shares its flush anyway), and it spends less
/// per message the larger the group (`scripts/pg-ingest-cost`), so every call more
/// in flight only splits the waiting messages into smaller groups; with several
/// replicas the calls in flight add up (four replicas with four senders each sent
/// groups of about two). Measured with `cargo bench --bench perf -- --postgres-only`
/// against 2 and 4 in the same run: the most messages a second with one, two and
/// four replicas, and the shortest tail (BENCHMARKS.md).
pub(super) const SENDERS: usize = 1;
/// The most messages one call stores: a bound on the transaction's length (how long
/// its conversation rows stay locked) and on the arrays sent.
pub(super) const GROUP_MAX: usize = 64;

/// The smallest group stored as sets (`lull_ingest_many`, schema V16); a smaller one
/// is stored row by row (`lull_ingest_rows`), as the set-based statement costs the
/// server more to start than a few single stores (the migration's header has the
/// figures; `scripts/pg-ingest-cost` measures both at each size). The only place
/// the choice is made.
const SETS_FROM: usize = 4;

/// What a group's call is doing, in its errors.
const TOGETHER: &str = "storing messages together";

/// One message's arguments of `lull_ingest`, owned (a queued message outlives its
/// caller's borrow).
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub(super) platform: &'static str,
    pub(super) key: String,
    pub(super) is_group: bool,
    pub(super) message_id: String,
    pub(super) user_id: String,
    pub(super) author: String,
    pub(super) text: String,
    pub(super) media: Option<String>,
    pub(super) holder: String,
    /// The caller's clock when the caller drives time (tests); `None`: the database's.
    pub(super) fixed: Option<i64>,
    /// The range the message's wait is picked in (`TimerPolicy::wait_range`), in ms.
    pub(super) wait_min: i64,
    pub(super) wait_max: i64,
}

/// What `lull_ingest` answered for one message.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    pub(super) conversation: i64,
    /// The new version and due time; `None` for a redelivery (stored before).
    pub(super) stored: Option<(i64, i64)>,
    /// The transaction's now on the clock used.
    pub(super) now: Timestamp,
}

/// A queued message and where its answer goes.
struct Waiting {
    call: Call,
    answer: oneshot::Sender<Result<Answer, StoreError>>,
}

/// The process's ingest queue and how many senders are busy.
#[derive(Default)]
pub(super) struct Ingests {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Waiting>,
    /// Senders in flight, at most [`SENDERS`]: a caller sending its own message or a
    /// drain task.
    sending: usize,
}

impl std::fmt::Debug for Ingests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingests").finish_non_exhaustive()
    }
}

/// A sender's slot, handed on when it is dropped (also when its caller stops
/// waiting mid-call): to a drain task while messages wait, else freed.
struct Slot<'a> {
    store: &'a PostgresStore,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.store.ingests.state.lock().expect("ingest queue");
        if state.queue.is_empty() {
            state.sending -= 1;
        } else {
            // The slot stays taken: the drain task is its new holder.
            drop(state);
            tokio::spawn(drain(self.store.clone()));
        }
    }
}

impl PostgresStore {
    /// Store one message: at once when a sender is free, else with the messages that
    /// wait with it (see the module's invariants).
    pub(super) async fn ingest_call(&self, call: Call) -> Result<Answer, StoreError> {
        if !self.grouped {
            return self.ingest_alone(&call).await;
        }
        // Either the caller sends it now (a free sender, nobody waiting) or it waits.
        let queued = {
            let mut state = self.ingests.state.lock().expect("ingest queue");
            if state.sending < SENDERS && state.queue.is_empty() {
                state.sending += 1;
                Err(call)
            } else {
                let (answer, receiver) = oneshot::channel();
                state.queue.push_back(Waiting { call, answer });
                if state.sending < SENDERS {
                    state.sending += 1;
                    tokio::spawn(drain(self.clone()));
                }
                Ok(receiver)
            }
        };
        let receiver = match queued {
            Ok(receiver) => receiver,
            Err(call) => {
                let _slot = Slot { store: self };
                return self.ingest_alone(&call).await;
            }
        };
        receiver.await.unwrap_or_else(|_| {
            Err(StoreError::Pool(
                "the store stopped before the message was stored".into(),
            ))
        })
    }

    /// One message, one call of `lull_ingest`.
    pub(super) async fn ingest_alone(&self, call: &Call) -> Result<Answer, StoreError> {
        let (max_wait, max_batch) = self.ingest_limits();
        statement!(self, Operation::Intake, "storing a message", |client| {
            async {
                let row = query_one(
                    client,
                    "SELECT o_conversation, o_version, o_due_at, o_now FROM lull_ingest(
                         $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                    &[
                        &call.platform,
                        &call.key,
                        &call.is_group,
                        &call.message_id,
                        &call.user_id,
                        &call.author,
                        &call.text,
                        &call.media,
                        &call.holder,
                        &call.fixed,
                        &call.wait_min,
                        &call.wait_max,
                        &max_wait,
                        &max_batch,
                    ],
                    "storing a message",
                )
                .await?;
                Ok(answer_of(&row, 0))
            }
            .await
        })
    }

    /// Several messages, one call of `lull_ingest_many`: an answer for each, in the
    /// order given, or the error that rolled the whole call back.
    async fn ingest_together(&self, calls: &[&Call]) -> Result<Vec<Answer>, StoreError> {
        let (max_wait, max_batch) = self.ingest_limits();
        let column = |f: fn(&Call) -> &str| calls.iter().map(|c| f(c)).collect::<Vec<&str>>();
        let platforms = column(|c| c.platform);
        let keys = column(|c| &c.key);
        let ids = column(|c| &c.message_id);
        let users = column(|c| &c.user_id);
        let authors = column(|c| &c.author);
        let texts = column(|c| &c.text);
        let holders = column(|c| &c.holder);
        let groups: Vec<bool> = calls.iter().map(|c| c.is_group).collect();
        let media: Vec<Option<&str>> = calls.iter().map(|c| c.media.as_deref()).collect();
        let fixed: Vec<Option<i64>> = calls.iter().map(|c| c.fixed).collect();
        let wait_min: Vec<i64> = calls.iter().map(|c| c.wait_min).collect();
        let wait_max: Vec<i64> = calls.iter().map(|c| c.wait_max).collect();
        // The two ways of storing a group take the same arguments and answer alike.
        macro_rules! group_call {
            ($function:literal) => {
                concat!(
                    "SELECT o_index, o_conversation, o_version, o_due_at, o_now FROM ",
                    $function,
                    "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
                )
            };
        }
        let sql = if calls.len() < SETS_FROM {
            group_call!("lull_ingest_rows")
        } else {
            group_call!("lull_ingest_many")
        };
        let rows = statement!(self, Operation::Intake, TOGETHER, |client| {
            async {
                query(
                    client,
                    sql,
                    &[
                        &platforms, &keys, &groups, &ids, &users, &authors, &texts, &media,
                        &holders, &fixed, &wait_min, &wait_max, &max_wait, &max_batch,
                    ],
                    TOGETHER,
                )
                .await
            }
            .await
        })?;
        let mut answers: Vec<Option<Answer>> = vec![None; calls.len()];
        for row in &rows {
            let index = usize::try_from(row.get::<_, i32>(0) - 1).ok();
            if let Some(slot) = index.and_then(|i| answers.get_mut(i)) {
                *slot = Some(answer_of(row, 1));
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.ok_or_else(|| StoreError::Backend {
                    context: TOGETHER,
                    message: "the database answered for fewer messages than it was sent".into(),
                })
            })
            .collect()
    }

    /// `lull_ingest`'s arguments that are the same for every message of this store.
    fn ingest_limits(&self) -> (i64, i64) {
        (
            crate::domain::millis(self.timers.max_wait()),
            i64::from(self.timers.max_batch()),
        )
    }
}

/// A row of `lull_ingest` (or `lull_ingest_many`) whose columns from `first` are
/// conversation, version, due time and now.
fn answer_of(row: &tokio_postgres::Row, first: usize) -> Answer {
    let version: Option<i64> = row.get(first + 1);
    let due_at: Option<i64> = row.get(first + 2);
    Answer {
        conversation: row.get(first),
        stored: version.zip(due_at),
        now: Timestamp(row.get(first + 3)),
    }
}

/// A drain task: holds one sender slot and stores the queued messages, up to
/// [`GROUP_MAX`] a call, until none waits; then frees the slot (under the queue's
/// lock, so a message queued meanwhile is seen here or starts a drain of its own).
async fn drain(store: PostgresStore) {
    loop {
        let group: Vec<Waiting> = {
            let mut state = store.ingests.state.lock().expect("ingest queue");
            if state.queue.is_empty() {
                state.sending -= 1;
                return;
            }
            let take = state.queue.len().min(GROUP_MAX);
            state.queue.drain(..take).collect()
        };
        store.send(group).await;
    }
}

impl PostgresStore {
    /// Store a group and answer each of its callers (a caller that stopped waiting is
    /// skipped: its message is stored all the same).
    async fn send(&self, group: Vec<Waiting>) {
        if group.len() == 1 {
            let one = group.into_iter().next().expect("one message");
            let answer = self.ingest_alone(&one.call).await;
            let _ = one.answer.send(answer);
            return;
        }
        let calls: Vec<&Call> = group.iter().map(|w| &w.call).collect();
        match self.ingest_together(&calls).await {
            Ok(answers) => {
                for (waiting, answer) in group.into_iter().zip(answers) {
                    let _ = waiting.answer.send(Ok(answer));
                }
            }
            Err(error) if error.is_transient() => {
                // Busy, full or unreachable (after the call's own retries): the same
                // for every message of the group, so each caller hears it now instead
                // of after one more bounded call per message.
                for waiting in group {
                    let _ = waiting.answer.send(Err(error.clone()));
                }
            }
            Err(error) => {
                // Refused as a whole: each message alone, so only a message the
                // database refuses fails (and every caller hears about its own).
                tracing::debug!(
                    messages = group.len(),
                    %error,
                    "storing messages together failed; storing each alone"
                );
                for waiting in group {
                    let answer = self.ingest_alone(&waiting.call).await;
                    let _ = waiting.answer.send(answer);
                }
            }
        }
    }
}

//! The scheduler: sleeps until the earliest deadline, starts rounds for due
//! conversations, and on shutdown lets rounds in flight finish within the grace
//! period.
//!
//! It wakes on its own notify (a timer armed by this process, a round that ended), on
//! the store's announcement of a timer armed by another process (PostgreSQL's
//! `LISTEN`), at the next deadline the store reports (on this process's timeline: the
//! store decides what is due, on its own clock), and at least every `poll_every`
//! (timers armed by other processes, leases of crashed processes that expired). Between those it
//! sleeps: an idle process makes one small query per poll interval.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Dispatcher, round};
use crate::domain::{ConversationId, Timestamp};
use crate::metrics as names;
use crate::store::{StoreError, WorkQuery};

/// Conversations taken per scheduler pass.
const BATCH_LIMIT: usize = 256;
/// After an unexpected round failure, wait this long before trying that
/// conversation again.
const COOL_DOWN: std::time::Duration = std::time::Duration::from_secs(1);
/// With nothing happening in this process, the pending gauge is read every this many
/// polls (what other processes change shows within them); after any event here, at
/// the next poll.
const GAUGE_QUIET_POLLS: u32 = 10;

/// The scheduler of one process: which rounds run here, and which wait.
pub(super) struct Scheduler {
    dispatcher: Arc<Dispatcher>,
    /// Conversations with a round running in this process, so the scheduler does not
    /// start a second one that would only contend for the lease. A std mutex: held
    /// for a set operation, never across an await.
    in_flight: Mutex<HashSet<ConversationId>>,
    /// Conversations whose last round failed unexpectedly, not retried before the
    /// given time (so a persistent error cannot spin the scheduler).
    cooling: Mutex<HashMap<ConversationId, Timestamp>>,
    /// Rounds running at once (`max_rounds`).
    round_slots: Semaphore,
}

/// Removes a conversation from the in-flight set when its round ends, however it ends.
struct InFlight<'a> {
    scheduler: &'a Scheduler,
    conversation: ConversationId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.scheduler
            .in_flight
            .lock()
            .expect("in-flight set poisoned")
            .remove(&self.conversation);
        self.scheduler.dispatcher.wake.notify_one();
    }
}

/// The pending-conversations gauge's pace: read again only after something happened
/// here (or, for other processes' work, every `GAUGE_QUIET_POLLS` polls), so an idle
/// process makes one database call a poll.
struct Gauge {
    at: Timestamp,
    quiet_at: Timestamp,
    emitted: u64,
}

impl Default for Gauge {
    /// Read at the first look.
    fn default() -> Self {
        Gauge {
            at: Timestamp(0),
            quiet_at: Timestamp(0),
            emitted: 0,
        }
    }
}

impl Gauge {
    /// Read the gauge if it is time to.
    async fn read(&mut self, dispatcher: &Dispatcher) {
        let settings = &dispatcher.settings;
        let now = dispatcher.clock.now();
        // Read before the gauge, so an event during the read brings another.
        let emitted = dispatcher.events_emitted.load(Ordering::Relaxed);
        if now < self.at || (emitted == self.emitted && now < self.quiet_at) {
            return;
        }
        self.at = now.plus(settings.poll_every);
        self.quiet_at = now.plus(settings.poll_every * GAUGE_QUIET_POLLS);
        self.emitted = emitted;
        if let Ok(pending) = dispatcher.store.pending_conversations().await {
            metrics::gauge!(names::PENDING_CONVERSATIONS).set(pending as f64);
        }
        if dispatcher.settings.jobs.is_some()
            && let Ok(active) = dispatcher.store.active_jobs().await
        {
            metrics::gauge!(names::JOBS_ACTIVE).set(active as f64);
        }
    }
}

impl Scheduler {
    pub(super) fn new(dispatcher: Arc<Dispatcher>) -> Arc<Self> {
        let round_slots = Semaphore::new(dispatcher.settings.max_rounds.max(1));
        Arc::new(Self {
            dispatcher,
            in_flight: Mutex::default(),
            cooling: Mutex::default(),
            round_slots,
        })
    }

    /// Run until `shutdown` fires, then let rounds in flight finish within
    /// `shutdown_grace`; rounds still running after it are stopped (their generations
    /// and sends cancelled, their outbox rows kept) and hand their leases back, so
    /// another process takes over at once. Then the work beside the rounds stops
    /// (`background`). Returns within the grace period plus the time a stopped round
    /// needs to release its lease, plus `background::FINISH_WITHIN`.
    pub(super) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let dispatcher = &self.dispatcher;
        let query = WorkQuery {
            platforms: dispatcher.platforms(),
            holder: dispatcher.holder.clone(),
            handoff: dispatcher.settings.poll_every,
            limit: BATCH_LIMIT,
        };
        tracing::info!(holder = %dispatcher.holder, platforms = ?query.platforms, "scheduler started");
        let rounds = TaskTracker::new();
        let hard_stop = CancellationToken::new();
        let mut gauge = Gauge::default();
        // Timers armed by other processes, announced by a store shared across hosts.
        let armed_elsewhere = dispatcher.store.wake_ups();
        loop {
            let wake_at = self.look(&query, &rounds, &hard_stop).await;
            gauge.read(dispatcher).await;
            // From here on, only work due before `wake_at` wakes it early.
            dispatcher.sleeping_until.store(wake_at.0, Ordering::SeqCst);
            tokio::select! {
                () = dispatcher.wake.notified() => {}
                () = announced(armed_elsewhere.as_deref()) => {}
                // Counted from now, not from the look's start: a slow look must not
                // add its own length to the sleep.
                () = tokio::time::sleep(dispatcher.clock.now().until(wake_at)) => {}
                () = shutdown.cancelled() => break,
            }
            dispatcher.sleeping_until.store(i64::MAX, Ordering::SeqCst);
        }
        self.drain(&rounds, &hard_stop).await;
        dispatcher.background.stop().await;
        tracing::info!("scheduler stopped");
    }

    /// Look for due work once and start its rounds; returns when to look next.
    async fn look(
        self: &Arc<Self>,
        query: &WorkQuery,
        rounds: &TaskTracker,
        hard_stop: &CancellationToken,
    ) -> Timestamp {
        let dispatcher = &self.dispatcher;
        let now = dispatcher.clock.now();
        let mut wake_at = now.plus(dispatcher.settings.poll_every);
        // While it looks it wakes by `wake_at` at the latest, so only work armed
        // meanwhile that is due before that (which the look may not see) wakes it
        // again: not every message stored during the look, which under a steady load
        // would chain looks back to back.
        dispatcher.sleeping_until.store(wake_at.0, Ordering::SeqCst);
        match dispatcher.store.due_work(query, now).await {
            Ok(work) => {
                for conversation in work.ready {
                    self.start_round(conversation, now, rounds, hard_stop);
                }
                if let Some(next) = work.next_at {
                    wake_at = wake_at.min(next);
                }
            }
            // A failing database is reported once per change by the store.
            Err(e @ (StoreError::Damaged(_) | StoreError::Full | StoreError::Io(_))) => {
                tracing::debug!(error = %e, "could not look for due work");
            }
            Err(e) => tracing::warn!(error = %e, "could not look for due work"),
        }
        if dispatcher.settings.jobs.is_some() {
            wake_at = wake_at.min(self.jobs(now).await);
        }
        super::retention::sweep_when_due(dispatcher, now);
        wake_at
    }

    /// Fire the jobs due at `now`, when it is time to look for them (the earliest job
    /// read last time, or a poll since: not at every look for a message's timer); when
    /// to look next. A job made by this process meanwhile brings the look forward
    /// (`Dispatcher::job_armed`); one made by another is seen within a poll.
    async fn jobs(&self, now: Timestamp) -> Timestamp {
        let dispatcher = &self.dispatcher;
        let due_by = Timestamp(dispatcher.jobs_due_by.load(Ordering::SeqCst));
        if now < due_by {
            return due_by;
        }
        let poll = now.plus(dispatcher.settings.poll_every);
        let next = super::jobs::fire_due(dispatcher, now)
            .await
            .map_or(poll, |next| next.min(poll));
        // A job made here while this look ran (`job_armed` lowered the value read
        // above) keeps its time: only the value this look read is replaced.
        let _ = dispatcher.jobs_due_by.compare_exchange(
            due_by.0,
            next.0,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        next
    }

    /// Shutdown: rounds in flight finish within `shutdown_grace`, then the hard stop
    /// cancels the rest, and they hand their leases back.
    async fn drain(&self, rounds: &TaskTracker, hard_stop: &CancellationToken) {
        let settings = &self.dispatcher.settings;
        self.dispatcher.draining.cancel();
        rounds.close();
        let in_flight = rounds.len();
        if in_flight > 0 {
            tracing::info!(
                in_flight,
                grace_ms = settings.shutdown_grace.as_millis() as u64,
                "waiting for rounds in flight"
            );
        }
        if tokio::time::timeout(settings.shutdown_grace, rounds.wait())
            .await
            .is_err()
        {
            tracing::warn!("grace period over: stopping rounds and releasing their leases");
            hard_stop.cancel();
            rounds.wait().await;
        }
    }

    fn start_round(
        self: &Arc<Self>,
        conversation: ConversationId,
        now: Timestamp,
        rounds: &TaskTracker,
        hard_stop: &CancellationToken,
    ) {
        {
            let mut cooling = self.cooling.lock().expect("cooling map poisoned");
            if cooling.get(&conversation).is_some_and(|until| *until > now) {
                return;
            }
            cooling.remove(&conversation);
        }
        if !self
            .in_flight
            .lock()
            .expect("in-flight set poisoned")
            .insert(conversation)
        {
            return;
        }
        let this = self.clone();
        let stop = hard_stop.clone();
        rounds.spawn(async move {
            let _in_flight = InFlight {
                scheduler: &this,
                conversation,
            };
            // A round still waiting for a slot at the hard stop never starts.
            let _slot = tokio::select! {
                slot = this.round_slots.acquire() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return,
                },
                () = stop.cancelled() => return,
            };
            if round::run(&this.dispatcher, conversation, &stop)
                .await
                .is_err()
            {
                let until = this.dispatcher.clock.now().plus(COOL_DOWN);
                this.cooling
                    .lock()
                    .expect("cooling map poisoned")
                    .insert(conversation, until);
            }
        });
    }
}

/// Completes when a store that announces timers armed by other processes announces
/// one; never for a store that announces none (the poll finds them).
async fn announced(wake_ups: Option<&tokio::sync::Notify>) {
    match wake_ups {
        Some(wake_ups) => wake_ups.notified().await,
        None => std::future::pending().await,
    }
}

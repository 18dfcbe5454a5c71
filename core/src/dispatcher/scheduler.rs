//! The scheduler: sleeps until the earliest deadline, starts rounds for due
//! conversations, and on shutdown lets rounds in flight finish within the grace
//! period.
//!
//! It wakes on its own notify (a timer armed by this process, a round that ended), at
//! the next deadline the store reports, and at least every `poll_every` (timers armed
//! by other processes, leases of crashed processes that expired). Between those it
//! sleeps: an idle process makes one small query per poll interval.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Dispatcher;
use super::round::RoundEnd;
use crate::domain::{ConversationId, Timestamp};
use crate::metrics as names;
use crate::store::{StoreError, WorkQuery};

/// Conversations taken per scheduler pass.
const BATCH_LIMIT: usize = 256;
/// After an unexpected round failure, wait this long before trying that
/// conversation again.
const COOL_DOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// Removes a conversation from the in-flight set when its round ends, however it ends.
struct InFlight<'a> {
    dispatcher: &'a Dispatcher,
    conversation: ConversationId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.dispatcher
            .in_flight
            .lock()
            .expect("in-flight set poisoned")
            .remove(&self.conversation);
        self.dispatcher.wake.notify_one();
    }
}

impl Dispatcher {
    /// Run the scheduler until `shutdown` fires, then let rounds in flight finish
    /// within `shutdown_grace`; rounds still running after it are stopped (their
    /// generations and sends cancelled, their outbox rows kept) and hand their leases
    /// back, so another process takes over at once. Returns within the grace period
    /// plus the time a stopped round needs to release its lease.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let query = WorkQuery {
            platforms: self.platforms(),
            holder: self.holder.clone(),
            handoff: self.settings.poll_every,
            limit: BATCH_LIMIT,
        };
        tracing::info!(holder = %self.holder, platforms = ?query.platforms, "scheduler started");
        let rounds = TaskTracker::new();
        let hard_stop = CancellationToken::new();
        let mut gauge_at = Timestamp(0);
        loop {
            let now = self.clock.now();
            let mut wake_at = now.plus(self.settings.poll_every);
            match self.store.due_work(&query, now).await {
                Ok(work) => {
                    for conversation in work.ready {
                        self.start_round(conversation, now, &rounds, &hard_stop);
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
            if now >= gauge_at {
                gauge_at = now.plus(self.settings.poll_every);
                if let Ok(pending) = self.store.pending_conversations().await {
                    metrics::gauge!(names::PENDING_CONVERSATIONS).set(pending as f64);
                }
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(now.until(wake_at)) => {}
                () = shutdown.cancelled() => break,
            }
        }
        rounds.close();
        let in_flight = rounds.len();
        if in_flight > 0 {
            tracing::info!(
                in_flight,
                grace_ms = self.settings.shutdown_grace.as_millis() as u64,
                "waiting for rounds in flight"
            );
        }
        if tokio::time::timeout(self.settings.shutdown_grace, rounds.wait())
            .await
            .is_err()
        {
            tracing::warn!("grace period over: stopping rounds and releasing their leases");
            hard_stop.cancel();
            rounds.wait().await;
        }
        tracing::info!("scheduler stopped");
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
                dispatcher: &this,
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
            let end = this.round(conversation, &stop).await;
            if end == RoundEnd::Failed {
                let until = this.clock.now().plus(COOL_DOWN);
                this.cooling
                    .lock()
                    .expect("cooling map poisoned")
                    .insert(conversation, until);
            }
        });
    }
}

//! Delivering outbox rows through the platform adapter, part by part, under the
//! conversation's lease.
//!
//! - A delivered part is a fact: its sent-mark is written before anything else is sent
//!   or waited for (the next part, a retry's wait), or with the release of the lease
//!   (one write instead of two for the last part), and retried until it is written,
//!   the lease kept and renewed meanwhile. So a failed write never turns into a second
//!   delivery, and the window in which a crash could send a part twice (on platforms
//!   without an idempotency key) is one send plus one small write, never a wait.
//! - Every failed attempt (error, timeout, rate limit) is recorded in the row (count,
//!   error, next attempt time) before the next attempt, so neither a crash nor another
//!   process retries sooner than the backoff allows or loses count.
//! - A send never outlives the lease that covers it, nor the hard stop of shutdown:
//!   it does not start with little validity left ([`LeaseKeeper::ready_to_send`]), it
//!   is raced against both and dropped, and the row stays for the next holder.
//! - A row is given up (dead-lettered: `failed_at`, one ERROR line,
//!   `lull_replies_failed_total`) when the platform refuses it, or when it is still
//!   failing at the platform's deadline ([`Outbound::max_age`]).

use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::interrupt::Interrupt;
use super::lease_keeper::{FACT_BACKOFF, LeaseKeeper, loud};
use super::{Dispatcher, Event};
use crate::domain::{ConversationId, Timestamp};
use crate::metrics as names;
use crate::store::{OutboxDeferral, OutboxFailure, OutboxKind, OutboxRow, PartSent};
use crate::timing::DELIVERY_BACKOFF;
use lull_port::{Outbound, OutgoingPart, QuickReply, SendError};

/// Send attempts for one part within a round before the row is deferred.
const SEND_ATTEMPTS: u32 = 4;
/// The longest wait sat out within a round (under the lease); longer ones defer the
/// row to a later round.
const MAX_INLINE_WAIT: Duration = Duration::from_secs(60);

/// How one part's delivery ended.
enum PartResult {
    Sent,
    /// Failing for now; the row waits for its next attempt time.
    Deferred,
    /// Given up: the row is dead-lettered.
    GaveUp,
}

/// Delivery of a conversation's outbox under its lease.
pub(super) struct Delivery<'a> {
    dispatcher: &'a Dispatcher,
    conversation: ConversationId,
    keeper: &'a LeaseKeeper,
    stop: &'a CancellationToken,
    /// The part delivered last whose mark is not written yet: written before the next
    /// send or wait ([`Delivery::flush_mark`]), or with the release of the lease. A std
    /// mutex: held to copy or swap a value, never across an await.
    last_sent: Mutex<Option<PartSent>>,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Try again at this time.
    At(Timestamp),
    /// Give the row up, for this reason.
    GiveUp(String),
}

/// The retry rule for a failed delivery, a pure function of its inputs: a refusal is
/// final; otherwise the next attempt comes after the backoff for `attempts` failed
/// attempts (or the wait the platform asked for), but a row with a deadline
/// (`created_at + max_age`) is tried one last time at it and given up after it. A
/// platform that asks to wait past the deadline is not tried sooner than it asked: the
/// row is given up at once.
pub(crate) fn next_attempt(
    error: &SendError,
    attempts: u32,
    created_at: Timestamp,
    max_age: Option<Duration>,
    now: Timestamp,
) -> Retry {
    let wait = match error {
        SendError::Permanent(_) => return Retry::GiveUp("the platform refused it".into()),
        SendError::RetryAfter(wait) => *wait,
        SendError::Transient(_) => DELIVERY_BACKOFF.delay(attempts),
    };
    let at = now.plus(wait);
    let Some(max_age) = max_age else {
        return Retry::At(at);
    };
    let deadline = created_at.plus(max_age);
    let age = humantime::format_duration(Duration::from_secs(max_age.as_secs()));
    if now >= deadline {
        Retry::GiveUp(format!("still failing after {attempts} attempts in {age}"))
    } else if at <= deadline {
        Retry::At(at)
    } else if matches!(error, SendError::RetryAfter(_)) {
        Retry::GiveUp(format!(
            "asked to wait {}s, past its deadline ({age} after the reply)",
            wait.as_secs()
        ))
    } else {
        Retry::At(deadline)
    }
}

impl<'a> Delivery<'a> {
    pub(super) fn new(
        dispatcher: &'a Dispatcher,
        conversation: ConversationId,
        keeper: &'a LeaseKeeper,
        stop: &'a CancellationToken,
    ) -> Self {
        Self {
            dispatcher,
            conversation,
            keeper,
            stop,
            last_sent: Mutex::new(None),
        }
    }

    /// The last part delivered whose mark is still to be written (with the release of
    /// the lease).
    pub(super) fn take_last_sent(&self) -> Option<PartSent> {
        self.last_sent.lock().expect("last-sent poisoned").take()
    }

    /// Write the mark of the part delivered last, if it is not written yet: before
    /// anything else is sent or waited for. Retried until written; if the lease is
    /// lost or the hard stop comes first, the mark stays for the release, which
    /// retries it too.
    async fn flush_mark(&self) -> Result<(), Interrupt> {
        let d = self.dispatcher;
        let Some(sent) = *self.last_sent.lock().expect("last-sent poisoned") else {
            return Ok(());
        };
        let mut failures = 0;
        loop {
            let written = d.store.mark_sent(sent, d.clock.now()).await;
            let error = match written {
                Ok(()) => {
                    let mut last = self.last_sent.lock().expect("last-sent poisoned");
                    if *last == Some(sent) {
                        *last = None;
                    }
                    return Ok(());
                }
                Err(error) => error,
            };
            failures += 1;
            if loud(failures) {
                tracing::warn!(conversation = %self.conversation, outbox = %sent.outbox, parts = sent.parts_sent, failures, error = %error, "could not record a delivered part yet; retrying before anything else is sent");
            }
            tokio::select! {
                () = tokio::time::sleep(FACT_BACKOFF.delay(failures)) => {}
                () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
                () = self.stop.cancelled() => return Err(Interrupt::Stopped),
            }
        }
    }

    /// Deliver `rows` (a conversation's outbox rows, oldest first). A row that cannot
    /// be delivered now is deferred and holds back the rows behind it.
    pub(super) async fn deliver(&self, rows: Vec<OutboxRow>) -> Result<(), Interrupt> {
        let d = self.dispatcher;
        for row in rows {
            let Some(outbound) = d.outbounds.get(&row.conversation.platform).cloned() else {
                continue;
            };
            self.deliver_row(&row, outbound.as_ref()).await?;
            // Delivered or given up: the ack reactions of its messages come off.
            d.acks.answered(
                outbound,
                row.conversation.clone(),
                self.conversation,
                row.covers.clone(),
            );
        }
        Ok(())
    }

    async fn deliver_row(&self, row: &OutboxRow, outbound: &dyn Outbound) -> Result<(), Interrupt> {
        let d = self.dispatcher;
        let conversation = self.conversation;
        let parts = outbound.split(&row.text);
        let count = parts.len();
        let mut attempts = row.attempts;
        // The answers a notice offers (an approval question, a pick of a listed model
        // or persona), as stored with it when it was built, under its last part, where
        // the question ends; a reply offers none.
        let quick_replies: &[QuickReply] = match row.kind {
            OutboxKind::Notice => &row.quick_replies,
            OutboxKind::Reply => &[],
        };
        for (index, text) in parts.iter().enumerate().skip(row.parts_sent as usize) {
            if self.keeper.is_lost() {
                return Err(Interrupt::LeaseLost);
            }
            let part = OutgoingPart {
                conversation: &row.conversation,
                outbox_id: row.id,
                created_at: row.created_at,
                stored_at: row.stored_at,
                kind: row.kind,
                index,
                count,
                text,
                reply_to: row.reply_to.as_deref(),
                covers: &row.covers,
                quick_replies: if index + 1 == count {
                    quick_replies
                } else {
                    &[]
                },
            };
            match self.send_part(row, outbound, &part, &mut attempts).await? {
                PartResult::Sent => {
                    // Marked before the next send or wait (`flush_mark`), or with the
                    // release: the window in which a crash could send a part twice is
                    // one send and one small write.
                    let sent = PartSent {
                        outbox: row.id,
                        parts_sent: (index + 1) as u32,
                        done: index + 1 == count,
                    };
                    let before = self
                        .last_sent
                        .lock()
                        .expect("last-sent poisoned")
                        .replace(sent);
                    // The counter-test's switch: the mark before this one is written
                    // now, once, after this part's send (and dropped if that fails).
                    if let Some(before) = before
                        && crate::switches::defer_marks()
                    {
                        d.store.mark_sent(before, d.clock.now()).await?;
                    }
                }
                PartResult::Deferred => return Err(Interrupt::Deferred),
                PartResult::GaveUp => return Ok(()),
            }
        }
        if row.kind == OutboxKind::Reply {
            metrics::counter!(names::REPLIES_SENT).increment(1);
        }
        tracing::debug!(%conversation, outbox = %row.id, parts = count, kind = row.kind.as_str(), "delivered");
        d.emit(Event::Delivered {
            conversation,
            outbox: row.id,
        });
        Ok(())
    }

    /// One part, with a few attempts inside the round while the waits are short (the
    /// lease is renewed meanwhile, so a slow send is never taken for a crash). Every
    /// failed attempt is recorded before the next one; `attempts` counts them for the
    /// row.
    async fn send_part(
        &self,
        row: &OutboxRow,
        outbound: &dyn Outbound,
        part: &OutgoingPart<'_>,
        attempts: &mut u32,
    ) -> Result<PartResult, Interrupt> {
        let d = self.dispatcher;
        let (conversation, keeper, stop) = (self.conversation, self.keeper, self.stop);
        if !crate::switches::defer_marks() {
            self.flush_mark().await?;
        }
        for attempt in 1..=SEND_ATTEMPTS {
            // A send starts only with validity to spare, and never outlives the lease
            // nor the hard stop: the future is dropped (the request abandoned) and the
            // row stays for the next holder.
            let ready = tokio::select! {
                biased;
                () = stop.cancelled() => return Err(Interrupt::Stopped),
                ready = keeper.ready_to_send() => ready,
            };
            if !ready {
                return Err(Interrupt::LeaseLost);
            }
            let sent = tokio::select! {
                biased;
                () = keeper.lost() => return Err(Interrupt::LeaseLost),
                () = stop.cancelled() => return Err(Interrupt::Stopped),
                sent = outbound.send(part) => sent,
            };
            let error = match sent {
                Ok(()) => return Ok(PartResult::Sent),
                Err(error) => error,
            };
            *attempts += 1;
            let now = d.clock.now();
            let retry_at =
                match next_attempt(&error, *attempts, row.created_at, outbound.max_age(), now) {
                    Retry::At(at) => at,
                    Retry::GiveUp(why) => {
                        self.dead_letter(row, &error, *attempts, &why, now).await?;
                        return Ok(PartResult::GaveUp);
                    }
                };
            // No secret reaches the database, whatever an adapter's error quoted.
            d.store
                .defer_outbox(OutboxDeferral {
                    id: row.id,
                    retry_at,
                    error: &lull_port::secrets::redact(error.to_string()),
                    now,
                })
                .await?;
            let wait = now.until(retry_at);
            tracing::warn!(
                %conversation,
                outbox = %row.id,
                attempts = *attempts,
                error = %error,
                retry_in_ms = wait.as_millis() as u64,
                "delivery attempt failed"
            );
            // Stopping: no inline wait; the row is delivered after the next start (or
            // by another process).
            if attempt == SEND_ATTEMPTS || wait > MAX_INLINE_WAIT || d.draining.is_cancelled() {
                return Ok(PartResult::Deferred);
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = d.draining.cancelled() => return Ok(PartResult::Deferred),
                () = keeper.lost() => return Err(Interrupt::LeaseLost),
                () = stop.cancelled() => return Err(Interrupt::Stopped),
            }
        }
        Ok(PartResult::Deferred)
    }

    /// Dead-letter a row: recorded as failed for good, reported once.
    async fn dead_letter(
        &self,
        row: &OutboxRow,
        error: &SendError,
        attempts: u32,
        why: &str,
        now: Timestamp,
    ) -> Result<(), Interrupt> {
        let error = lull_port::secrets::redact(error.to_string());
        let d = self.dispatcher;
        d.store
            .fail_outbox(OutboxFailure {
                id: row.id,
                error: &error,
                now,
            })
            .await?;
        if row.kind == OutboxKind::Reply {
            metrics::counter!(names::REPLIES_FAILED).increment(1);
        }
        tracing::error!(
            conversation = %row.conversation,
            reply_id = row.id.0,
            kind = row.kind.as_str(),
            attempts,
            error,
            "gave up delivering a {}: {why}",
            row.kind.as_str()
        );
        d.emit(Event::DeadLettered {
            conversation: self.conversation,
            outbox: row.id,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn transient() -> SendError {
        SendError::Transient("HTTP 500".into())
    }

    #[test]
    fn a_refusal_is_final_whatever_the_deadline() {
        let refused = SendError::Permanent("blocked".into());
        assert!(matches!(
            next_attempt(&refused, 1, Timestamp(0), None, Timestamp(0)),
            Retry::GiveUp(_)
        ));
    }

    #[test]
    fn without_a_deadline_failures_back_off_for_ever() {
        let now = Timestamp(1_000_000_000);
        match next_attempt(&transient(), 30, Timestamp(0), None, now) {
            // Capped at five minutes, less a quarter of jitter.
            Retry::At(at) => assert!(now.until(at) >= Duration::from_secs(225)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            next_attempt(
                &SendError::RetryAfter(Duration::from_secs(3)),
                1,
                Timestamp(0),
                None,
                now
            ),
            Retry::At(now.plus(Duration::from_secs(3)))
        );
    }

    #[test]
    fn the_last_attempt_is_at_the_deadline_and_then_the_row_is_given_up() {
        let created = Timestamp(1_000_000);
        let deadline = created.plus(DAY);
        // Far from the deadline: the backoff.
        match next_attempt(&transient(), 1, created, Some(DAY), created) {
            Retry::At(at) => assert!(created.until(at) <= Duration::from_millis(312)),
            other => panic!("{other:?}"),
        }
        // A backoff that would pass the deadline is cut to it.
        let late = deadline.0 - 1000;
        assert_eq!(
            next_attempt(&transient(), 20, created, Some(DAY), Timestamp(late)),
            Retry::At(deadline)
        );
        // At or after the deadline: given up.
        for now in [deadline, deadline.plus(Duration::from_secs(5))] {
            match next_attempt(&transient(), 21, created, Some(DAY), now) {
                Retry::GiveUp(why) => assert!(why.contains("1day"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
        // A rate limit past the deadline is not cut short: given up.
        assert!(matches!(
            next_attempt(
                &SendError::RetryAfter(Duration::from_secs(3600)),
                3,
                created,
                Some(DAY),
                Timestamp(late)
            ),
            Retry::GiveUp(_)
        ));
    }
}

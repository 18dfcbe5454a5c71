//! Delivering outbox rows through the platform adapter, part by part, under the
//! conversation's lease.
//!
//! Each part is marked sent right after the platform accepts it, in its own short
//! transaction: the window in which a crash could send a part twice (on platforms
//! without an idempotency key) is one send plus one small write.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::round::Interrupt;
use super::{Dispatcher, Event, LeaseKeeper};
use crate::domain::ConversationId;
use crate::metrics as names;
use crate::platform::{Outbound, OutgoingPart, SendError};
use crate::store::{OutboxKind, OutboxRow};
use crate::timing::failure_backoff;

/// Send attempts for one part within a round before the row is deferred.
const SEND_ATTEMPTS: u32 = 4;
/// The longest rate-limit wait sat out within a round; longer ones defer the row.
const MAX_INLINE_WAIT: Duration = Duration::from_secs(60);

/// How one part's delivery ended.
enum PartResult {
    Sent,
    Defer(String),
    Refused(String),
}

impl Dispatcher {
    /// Deliver every due outbox row of a conversation, oldest first. A row that
    /// cannot be delivered now is deferred and holds back the rows behind it.
    pub(crate) async fn deliver_due(
        &self,
        conversation: ConversationId,
        keeper: &LeaseKeeper,
        stop: &CancellationToken,
    ) -> Result<(), Interrupt> {
        let rows = self
            .store
            .due_outbox(conversation, self.clock.now())
            .await?;
        for row in rows {
            let Some(outbound) = self.outbounds.get(&row.conversation.platform).cloned() else {
                continue;
            };
            self.deliver_row(conversation, &row, outbound.as_ref(), keeper, stop)
                .await?;
        }
        Ok(())
    }

    async fn deliver_row(
        &self,
        conversation: ConversationId,
        row: &OutboxRow,
        outbound: &dyn Outbound,
        keeper: &LeaseKeeper,
        stop: &CancellationToken,
    ) -> Result<(), Interrupt> {
        let parts = outbound.split(&row.text);
        let count = parts.len();
        for (index, text) in parts.iter().enumerate().skip(row.parts_sent as usize) {
            if keeper.is_lost() {
                return Err(Interrupt::LeaseLost);
            }
            let part = OutgoingPart {
                conversation: &row.conversation,
                outbox_id: row.id,
                kind: row.kind,
                index,
                count,
                text,
                reply_to: row.reply_to.as_deref(),
                covers: &row.covers,
            };
            match self.send_part(outbound, &part, keeper, stop).await? {
                PartResult::Sent => {
                    let done = index + 1 == count;
                    self.store
                        .mark_sent(row.id, (index + 1) as u32, done, self.clock.now())
                        .await?;
                }
                PartResult::Defer(error) => {
                    let retry_at = self.clock.now().plus(failure_backoff(row.attempts + 1));
                    tracing::warn!(%conversation, outbox = %row.id, error, "delivery deferred");
                    // No secret reaches the database, whatever an adapter's error quoted.
                    let error = crate::secrets::redact(error);
                    self.store.defer_outbox(row.id, retry_at, &error).await?;
                    return Err(Interrupt::Deferred);
                }
                PartResult::Refused(error) => {
                    tracing::error!(%conversation, outbox = %row.id, error, "the platform refused a reply; giving up on it");
                    let error = crate::secrets::redact(error);
                    self.store
                        .fail_outbox(row.id, &error, self.clock.now())
                        .await?;
                    return Ok(());
                }
            }
        }
        if row.kind == OutboxKind::Reply {
            metrics::counter!(names::REPLIES_SENT).increment(1);
        }
        tracing::debug!(%conversation, outbox = %row.id, parts = count, kind = row.kind.as_str(), "delivered");
        self.emit(Event::Delivered {
            conversation,
            outbox: row.id,
        });
        Ok(())
    }

    /// One part, with a few retries inside the round (the lease is renewed meanwhile,
    /// so a slow send is never taken for a crash).
    async fn send_part(
        &self,
        outbound: &dyn Outbound,
        part: &OutgoingPart<'_>,
        keeper: &LeaseKeeper,
        stop: &CancellationToken,
    ) -> Result<PartResult, Interrupt> {
        let mut last_error = String::new();
        for attempt in 1..=SEND_ATTEMPTS {
            let wait = match outbound.send(part).await {
                Ok(()) => return Ok(PartResult::Sent),
                Err(SendError::Permanent(e)) => return Ok(PartResult::Refused(e)),
                Err(SendError::RetryAfter(wait)) if wait > MAX_INLINE_WAIT => {
                    return Ok(PartResult::Defer(format!("rate limited for {wait:?}")));
                }
                Err(SendError::RetryAfter(wait)) => {
                    last_error = format!("rate limited for {wait:?}");
                    wait
                }
                Err(SendError::Transient(e)) => {
                    last_error = e;
                    Duration::from_millis(250 << attempt)
                }
            };
            if attempt == SEND_ATTEMPTS {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = keeper.lost() => return Err(Interrupt::LeaseLost),
                () = stop.cancelled() => return Err(Interrupt::Stopped),
            }
        }
        Ok(PartResult::Defer(last_error))
    }
}

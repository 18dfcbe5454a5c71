//! Retention (`LULL_RETENTION_DAYS`): the texts of answered messages and delivered
//! replies older than the retention are removed, their rows kept (tombstones keep
//! counters, covers and the final check). Off the hot path: beside the rounds, in
//! small batches with a pause between them, on one process at a time (the retention
//! lease); a pending message, an undelivered row, a summary and a memory are never
//! touched (`store::SummaryStore::expire_texts`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Dispatcher;
use super::lease_keeper;
use crate::domain::{LeaseKey, Timestamp};
use crate::metrics as names;
use crate::store::{Expired, Expiry, StoreError};

/// How often a process sweeps (the first look after its start sweeps at once).
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// The most rows of each kind one batch removes: one short transaction.
pub(crate) const BATCH: u32 = 500;
/// The pause between batches, so ingest and rounds are never queued behind a sweep.
const PAUSE: Duration = Duration::from_millis(20);

/// Start a sweep beside the rounds when one is due here (and retention is on).
pub(super) fn sweep_when_due(d: &Arc<Dispatcher>, now: Timestamp) {
    let Some(retention) = d.settings.retention else {
        return;
    };
    let due_by = d.retention_due_by.load(Ordering::SeqCst);
    if now.0 < due_by {
        return;
    }
    let next = now.plus(SWEEP_EVERY).0;
    if d.retention_due_by
        .compare_exchange(due_by, next, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let dispatcher = d.clone();
    d.background.finish(async move {
        match sweep(&dispatcher, retention).await {
            Ok(Some(removed)) if removed.total() > 0 => {
                tracing::info!(
                    messages = removed.messages,
                    replies = removed.replies,
                    overheard = removed.overheard,
                    "retention: removed old texts"
                );
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "retention: the sweep stopped; it goes on at the next")
            }
        }
    });
}

/// One sweep under the retention lease: batches until none is left; `None` when
/// another process holds the lease (it sweeps).
async fn sweep(d: &Dispatcher, retention: Duration) -> Result<Option<Expired>, StoreError> {
    let Some(keeper) = lease_keeper::claim(d, LeaseKey::Retention).await? else {
        return Ok(None);
    };
    let mut removed = Expired::default();
    let swept = loop {
        if keeper.is_lost() {
            break Ok(());
        }
        let now = d.clock.now();
        let lease = keeper.lease();
        let batch = match d
            .store
            .expire_texts(Expiry {
                lease: &lease,
                before: Timestamp(now.0.saturating_sub(retention.as_millis() as i64)),
                batch: BATCH,
                now,
            })
            .await
        {
            Ok(batch) => batch,
            Err(StoreError::LeaseLost(_)) => break Ok(()),
            Err(e) => break Err(e),
        };
        for (kind, n) in [
            ("message", batch.messages),
            ("reply", batch.replies),
            ("overheard", batch.overheard),
        ] {
            if n > 0 {
                metrics::counter!(names::RETENTION_REMOVED, "kind" => kind).increment(n);
            }
        }
        removed.messages += batch.messages;
        removed.replies += batch.replies;
        removed.overheard += batch.overheard;
        if batch.total() == 0 {
            break Ok(());
        }
        tokio::time::sleep(PAUSE).await;
    };
    keeper.release().await;
    swept.map(|()| Some(removed))
}

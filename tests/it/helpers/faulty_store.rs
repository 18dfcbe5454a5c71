//! A store wrapper that injects faults: renewals that report success without
//! renewing (a frozen process that believes it holds its lease), and writes that fail
//! as a locked or full database would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lull_core::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseKey, OutboxId, Platform, Timestamp,
    Version,
};
use lull_core::store::{
    Batch, CommitOutcome, DueWork, IngestOutcome, MessageEdit, NewMessage, NewNotice, NewReply,
    OutboxRow, RecentConversation, SqliteStore, Store, StoreError, WorkQuery,
};

pub struct FaultyStore {
    inner: SqliteStore,
    /// Renewals succeed without touching the database.
    pub freeze_renewals: AtomicBool,
    /// Ingest fails as if the database were locked.
    pub busy_ingest: AtomicBool,
    /// Ingest fails as if the disk were full.
    pub full_ingest: AtomicBool,
    /// Calls of `ingest` and `edit`, failed ones included.
    pub ingest_calls: AtomicUsize,
}

impl FaultyStore {
    pub fn new(inner: SqliteStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            freeze_renewals: AtomicBool::new(false),
            busy_ingest: AtomicBool::new(false),
            full_ingest: AtomicBool::new(false),
            ingest_calls: AtomicUsize::new(0),
        })
    }

    fn ingest_fault(&self) -> Result<(), StoreError> {
        self.ingest_calls.fetch_add(1, Ordering::SeqCst);
        if self.busy_ingest.load(Ordering::SeqCst) {
            return Err(StoreError::Busy);
        }
        if self.full_ingest.load(Ordering::SeqCst) {
            return Err(StoreError::Full);
        }
        Ok(())
    }
}

#[async_trait]
impl Store for FaultyStore {
    async fn ingest(
        &self,
        m: NewMessage,
        h: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        self.ingest_fault()?;
        self.inner.ingest(m, h, now).await
    }
    async fn edit(
        &self,
        e: MessageEdit,
        h: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        self.ingest_fault()?;
        self.inner.edit(e, h, now).await
    }
    async fn enqueue_notice(
        &self,
        n: NewNotice,
        h: &HolderId,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.inner.enqueue_notice(n, h, now).await
    }
    async fn reset_context(
        &self,
        c: &ConversationRef,
        is_group: bool,
        h: &HolderId,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.reset_context(c, is_group, h, now).await
    }
    async fn due_work(&self, q: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError> {
        self.inner.due_work(q, now).await
    }
    async fn claim_lease(
        &self,
        k: &LeaseKey,
        h: &HolderId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Lease>, StoreError> {
        self.inner.claim_lease(k, h, ttl, now).await
    }
    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        if self.freeze_renewals.load(Ordering::SeqCst) {
            return Ok(lease.clone());
        }
        self.inner.renew_lease(lease, ttl, now).await
    }
    async fn release_lease(&self, l: &Lease) -> Result<(), StoreError> {
        self.inner.release_lease(l).await
    }
    async fn collect(&self, c: ConversationId, h: usize) -> Result<Batch, StoreError> {
        self.inner.collect(c, h).await
    }
    async fn commit_reply(
        &self,
        l: &Lease,
        b: &Batch,
        r: NewReply,
        now: Timestamp,
    ) -> Result<CommitOutcome, StoreError> {
        self.inner.commit_reply(l, b, r, now).await
    }
    async fn give_up(
        &self,
        l: &Lease,
        b: &Batch,
        n: &str,
        now: Timestamp,
    ) -> Result<Option<OutboxId>, StoreError> {
        self.inner.give_up(l, b, n, now).await
    }
    async fn disarm_idle_timer(
        &self,
        l: &Lease,
        v: Version,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.disarm_idle_timer(l, v, now).await
    }
    async fn record_failure(
        &self,
        l: &Lease,
        r: Timestamp,
        now: Timestamp,
    ) -> Result<u32, StoreError> {
        self.inner.record_failure(l, r, now).await
    }
    async fn due_outbox(
        &self,
        c: ConversationId,
        now: Timestamp,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.inner.due_outbox(c, now).await
    }
    async fn mark_sent(
        &self,
        id: OutboxId,
        parts: u32,
        done: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.inner.mark_sent(id, parts, done, now).await
    }
    async fn defer_outbox(&self, id: OutboxId, r: Timestamp, e: &str) -> Result<(), StoreError> {
        self.inner.defer_outbox(id, r, e).await
    }
    async fn fail_outbox(&self, id: OutboxId, e: &str, now: Timestamp) -> Result<(), StoreError> {
        self.inner.fail_outbox(id, e, now).await
    }
    async fn is_settled(&self, c: &ConversationRef) -> Result<Option<bool>, StoreError> {
        self.inner.is_settled(c).await
    }
    async fn recent_conversations(
        &self,
        p: Platform,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<RecentConversation>, StoreError> {
        self.inner.recent_conversations(p, since, limit).await
    }
    async fn pending_conversations(&self) -> Result<u64, StoreError> {
        self.inner.pending_conversations().await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

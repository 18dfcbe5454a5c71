//! One test body for every [`Store`] backend: the contract checked from the outside,
//! through the trait alone, so SQLite and PostgreSQL answer to the same checks.
//!
//! A backend's tests run every check with [`store_conformance!`](crate::store_conformance),
//! given an async function that opens a fresh, empty store with the timer policy it is
//! handed ([`policy`]):
//!
//! ```ignore
//! async fn open(timers: TimerPolicy) -> Box<dyn Store> { /* a fresh database */ }
//! lull_core::store_conformance!(open);
//! ```
//!
//! Time is an argument of every store call, so the checks use their own timeline
//! ([`at`]) and never sleep. Exists only in builds with the `conformance` feature.

use std::time::Duration;

use super::{
    AccessRule, Batch, Charged, CommitOutcome, DueWork, Exchange, IngestOutcome, MessageEdit,
    NewMessage, NewNotice, NewReply, OutboxKind, OutboxRow, PartSent, RateHold, RateWindow,
    RecentConversation, Reservation, ScopeCharge, Store, StoreError, Subject, TokenCharge,
    WorkQuery,
};
use crate::access::SubjectKind;
use crate::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseKey, OutboxId, Platform, Said,
    Timestamp, Version,
};
use crate::timing::TimerPolicy;
use lull_port::{Media, MediaKind};

mod wallet;
pub use wallet::*;

/// Runs every conformance check as its own `#[tokio::test]`, each on a fresh store
/// opened by `$open`: a path to an `async fn(TimerPolicy) -> S` where `S`
/// dereferences to a [`Store`] (a `Box`, an `Arc`, or a guard that also keeps a
/// temporary folder alive). The calling crate depends on tokio.
#[macro_export]
macro_rules! store_conformance {
    ($open:path) => {
        $crate::store_conformance!(@checks $open, each);
    };
    // `$open` returns an `Option`: `None` skips the check (a backend whose server is
    // not installed here).
    (optional $open:path) => {
        $crate::store_conformance!(@checks $open, each_optional);
    };
    (@checks $open:path, $each:ident) => {
        $crate::store_conformance!(@$each $open;
            ingest_is_idempotent,
            media_are_stored_with_their_message,
            a_transcript_is_stored_once_under_the_lease,
            ingest_bumps_the_version_and_arms_the_capped_timer,
            edits_change_only_pending_messages,
            a_lease_is_claimed_by_compare_and_swap,
            a_lease_is_renewed_and_released,
            fencing_refuses_a_replaced_holder,
            fencing_refuses_an_earlier_claim_of_the_same_holder,
            a_commit_answers_the_batch,
            a_newer_message_makes_the_reply_stale,
            the_cap_forces_a_stale_reply_out,
            a_forced_reply_leaves_an_edited_message_pending,
            giving_up_covers_each_message_once,
            a_timer_with_pending_messages_is_never_disarmed,
            the_outbox_is_delivered_in_order,
            failures_back_off_and_reset_starts_afresh,
            due_work_hands_timers_off_between_holders,
            due_work_leaves_leased_conversations_alone,
            due_work_includes_undelivered_outbox_rows,
            recent_conversations_resume_after_the_last_stored_message,
            settled_and_pending_conversations,
            ping_answers_on_a_sound_store,
            a_round_is_claimed_with_what_it_works_on,
            an_outbox_row_is_stored_at_one_time_in_every_read,
            the_last_part_is_recorded_with_the_release,
            a_rate_limit_holds_the_conversation_until_the_window_has_room,
            edits_count_in_the_rate_window,
            a_token_charge_is_all_or_nothing_and_fenced,
            concurrent_token_charges_never_pass_a_budget,
            charges_naming_their_scopes_in_any_order_never_deadlock,
            a_refused_charge_without_a_hold_holds_nothing,
            an_abandoned_reservation_is_given_back_at_the_next_claim_on_its_day,
            a_settled_reservation_is_not_given_back,
            held_out_messages_are_covered_by_their_notice_with_the_reply,
            a_stale_reply_stores_no_held_out_notice,
            an_access_decision_replaces_the_earlier_one,
        );
    };
    (@each $open:path; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $check() {
                let store = $open($crate::store::conformance::policy()).await;
                $crate::store::conformance::$check(&*store).await;
            }
        )*
    };
    (@each_optional $open:path; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $check() {
                let Some(store) = $open($crate::store::conformance::policy()).await else {
                    return;
                };
                $crate::store::conformance::$check(&*store).await;
            }
        )*
    };
}

/// The timer policy every check assumes: a 1 s debounce, a 4 s cap, a batch of 4.
pub fn policy() -> TimerPolicy {
    TimerPolicy::new(ms(1000), ms(4000), 4).expect("the conformance policy is valid")
}

/// The lease lifetime the checks claim with.
const TTL: Duration = Duration::from_secs(10);

/// The checks' timeline: `n` milliseconds after their epoch.
pub fn at(n: u64) -> Timestamp {
    Timestamp(1_700_000_000_000).plus(ms(n))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn holder(name: &str) -> HolderId {
    HolderId::new(name)
}

fn http(key: &str) -> ConversationRef {
    ConversationRef::new(Platform::Http, key)
}

fn message(conversation: ConversationRef, id: &str) -> NewMessage {
    NewMessage {
        conversation,
        is_group: false,
        message_id: id.into(),
        user_id: "u1".into(),
        author: "Ann".into(),
        text: format!("text of {id}"),
        media: Vec::new(),
    }
}

fn reply(text: &str) -> NewReply {
    NewReply {
        text: text.into(),
        usage: None,
        llm_ms: 1,
        held_out: Vec::new(),
    }
}

/// Ingest a message that must be stored: its conversation, version and timer deadline.
async fn stored(
    store: &dyn Store,
    message: NewMessage,
    by: &HolderId,
    now: Timestamp,
) -> (ConversationId, Version, Timestamp) {
    let id = message.message_id.clone();
    match store.ingest(message, by, now).await {
        Ok(IngestOutcome::Stored {
            conversation,
            version,
            due_at,
        }) => (conversation, version, due_at),
        other => panic!("message {id} was not stored: {other:?}"),
    }
}

async fn claim(store: &dyn Store, key: &LeaseKey, by: &HolderId, now: Timestamp) -> Option<Lease> {
    store
        .claim_lease(key, by, TTL, now)
        .await
        .expect("claiming a lease")
}

async fn claimed(
    store: &dyn Store,
    conversation: ConversationId,
    by: &HolderId,
    now: Timestamp,
) -> Lease {
    claim(store, &LeaseKey::Conversation(conversation), by, now)
        .await
        .unwrap_or_else(|| panic!("the lease on {conversation} is free at {now:?}"))
}

async fn collect(store: &dyn Store, conversation: ConversationId) -> Batch {
    store
        .collect(conversation, 10)
        .await
        .expect("collecting a batch")
}

/// A round about to generate: the messages `ids` stored in `conversation` by `by`,
/// 100 ms apart from 0, then the lease claimed by `by` at `claim_at` and the batch
/// collected.
async fn round(
    store: &dyn Store,
    conversation: &ConversationRef,
    by: &HolderId,
    ids: &[&str],
    claim_at: Timestamp,
) -> (ConversationId, Lease, Batch) {
    let mut id = None;
    for (n, message_id) in (0..).zip(ids) {
        let message = message(conversation.clone(), message_id);
        id = Some(stored(store, message, by, at(100 * n)).await.0);
    }
    let id = id.expect("a round has messages");
    let lease = claimed(store, id, by, claim_at).await;
    (id, lease, collect(store, id).await)
}

fn pending_ids(batch: &Batch) -> Vec<&str> {
    batch
        .pending
        .iter()
        .map(|m| m.message_id.as_str())
        .collect()
}

async fn committed(
    store: &dyn Store,
    lease: &Lease,
    batch: &Batch,
    text: &str,
    now: Timestamp,
) -> (OutboxId, bool) {
    match store.commit_reply(lease, batch, reply(text), now).await {
        Ok(CommitOutcome::Committed { outbox, forced, .. }) => (outbox.id, forced),
        other => panic!("the reply {text:?} was not committed: {other:?}"),
    }
}

/// Commit a reply that must be refused as stale: the version the conversation is at.
async fn stale(store: &dyn Store, lease: &Lease, batch: &Batch, now: Timestamp) -> Version {
    match store.commit_reply(lease, batch, reply("stale"), now).await {
        Ok(CommitOutcome::Stale { version }) => version,
        other => panic!("the reply was not stale: {other:?}"),
    }
}

fn lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost(_))),
        "{what}: expected LeaseLost, got {result:?}"
    );
}

fn query(by: &HolderId, limit: usize) -> WorkQuery {
    WorkQuery {
        platforms: vec![Platform::Http],
        holder: by.clone(),
        handoff: ms(500),
        limit,
    }
}

async fn due(store: &dyn Store, query: &WorkQuery, now: Timestamp) -> DueWork {
    store.due_work(query, now).await.expect("finding due work")
}

/// No duplicate: a redelivered update is not stored or counted again; the same
/// platform id in another conversation is another message.
pub async fn ingest_is_idempotent(store: &dyn Store) {
    let a = holder("a");
    let (id, version, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    assert_eq!(version, Version(1));
    let again = store.ingest(message(http("c1"), "m1"), &a, at(10)).await;
    assert_eq!(
        again.unwrap(),
        IngestOutcome::Duplicate { conversation: id },
        "a redelivered message is a duplicate"
    );
    let batch = collect(store, id).await;
    assert_eq!(
        batch.v0,
        Version(1),
        "a redelivery does not bump the version"
    );
    assert_eq!(pending_ids(&batch), ["m1"]);
    let (other, version, _) = stored(store, message(http("c2"), "m1"), &a, at(20)).await;
    assert_ne!(other, id, "another conversation");
    assert_eq!(version, Version(1));
}

/// Media references are stored with their message, in the same transaction, and
/// come back with the pending batch, in order; a message without media has none, and
/// an edit of the caption keeps them.
pub async fn media_are_stored_with_their_message(store: &dyn Store) {
    let a = holder("a");
    let image = |reference: &str, size: Option<u64>, mime: Option<&str>| Media {
        kind: MediaKind::Image,
        reference: reference.into(),
        size,
        mime: mime.map(str::to_owned),
        duration_secs: None,
    };
    let media = vec![
        image("file-1", Some(1234), Some("image/jpeg")),
        image("https://cdn.example/a.png?ex=1&is=2", None, None),
    ];
    let photo = NewMessage {
        text: "[image] [image] what is this?".into(),
        media: media.clone(),
        ..message(http("c1"), "m1")
    };
    let (id, _, _) = stored(store, photo, &a, at(0)).await;
    stored(store, message(http("c1"), "m2"), &a, at(10)).await;
    let edit = MessageEdit {
        conversation: http("c1"),
        message_id: "m1".into(),
        text: "[image] [image] and now?".into(),
    };
    assert!(matches!(
        store.edit(edit, &a, at(20)).await.unwrap(),
        IngestOutcome::Stored { .. }
    ));
    let batch = collect(store, id).await;
    assert_eq!(pending_ids(&batch), ["m1", "m2"]);
    assert_eq!(batch.pending[0].media, media, "stored with the message");
    assert_eq!(batch.pending[0].text, "[image] [image] and now?");
    assert!(batch.pending[1].media.is_empty(), "text has no media");
}

/// A transcript is written under the conversation's lease (a replaced holder's write
/// is refused), once (a second write keeps the first), and comes back with the
/// pending message and in history.
pub async fn a_transcript_is_stored_once_under_the_lease(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let voice = NewMessage {
        text: "[voice message]".into(),
        media: vec![Media {
            kind: MediaKind::Voice,
            reference: "voice-1".into(),
            size: Some(4000),
            mime: Some("audio/ogg".into()),
            duration_secs: Some(3),
        }],
        ..message(http("c1"), "m1")
    };
    let (id, _, _) = stored(store, voice, &a, at(0)).await;
    let row = collect(store, id).await.pending[0].row;
    let key = LeaseKey::Conversation(id);
    let old = store
        .claim_lease(&key, &a, TTL, at(100))
        .await
        .unwrap()
        .unwrap();
    // The lease expires and b takes over: a's late write is fenced off.
    let new = store
        .claim_lease(&key, &b, TTL, at(100).plus(TTL))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store
            .store_transcript(&old, row, "from a", at(100).plus(TTL))
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    let now = at(200).plus(TTL);
    assert!(
        store
            .store_transcript(&new, row, "hello there", now)
            .await
            .unwrap()
    );
    assert!(
        !store
            .store_transcript(&new, row, "again", now)
            .await
            .unwrap(),
        "stored once"
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.pending[0].transcript.as_deref(), Some("hello there"));
    assert_eq!(batch.pending[0].said(), "[voice message]: hello there");
    assert_eq!(batch.pending[0].media[0].duration_secs, Some(3));
    let committed = store
        .commit_reply(&new, &batch, reply("hi"), now)
        .await
        .unwrap();
    assert!(matches!(committed, CommitOutcome::Committed { .. }));
    stored(store, message(http("c1"), "m2"), &a, now.plus(ms(10))).await;
    let batch = collect(store, id).await;
    assert_eq!(
        batch.history[0].user[0].text, "[voice message]: hello there",
        "history carries the transcript"
    );
}

/// Each message bumps the version and re-arms the timer to `now + debounce`, never
/// past `first pending + max_wait`; a full batch is due at once.
pub async fn ingest_bumps_the_version_and_arms_the_capped_timer(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, version, due_at) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    assert_eq!((version, due_at), (Version(1), at(1000)), "debounced");
    let (_, version, due_at) = stored(store, message(c1.clone(), "m2"), &a, at(500)).await;
    assert_eq!((version, due_at), (Version(2), at(1500)), "re-armed");
    let (_, version, due_at) = stored(store, message(c1.clone(), "m3"), &a, at(3500)).await;
    assert_eq!(
        (version, due_at),
        (Version(3), at(4000)),
        "capped at the first pending message + max_wait"
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.v0, Version(3));
    assert_eq!(
        batch.timer.map(|t| (t.due_at, t.attempts)),
        Some((at(4000), 0))
    );
    assert_eq!(batch.oldest_pending_at(), Some(at(0)));
    let (_, _, due_at) = stored(store, message(c1, "m4"), &a, at(3600)).await;
    assert_eq!(due_at, at(3600), "a full batch is due at once");
}

/// An edit of a pending message replaces its text and counts as a new message; an
/// edit that changes nothing, of an unknown message or of an answered one is ignored.
pub async fn edits_change_only_pending_messages(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let edit = |id: &str, text: &str| MessageEdit {
        conversation: c1.clone(),
        message_id: id.into(),
        text: text.into(),
    };
    let (id, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    assert_eq!(
        store.edit(edit("m1", "edited"), &a, at(500)).await.unwrap(),
        IngestOutcome::Stored {
            conversation: id,
            version: Version(2),
            due_at: at(1500),
        },
        "an edit bumps the version and re-arms the timer"
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.v0, Version(2));
    assert_eq!(batch.pending.len(), 1, "an edit is not another message");
    assert_eq!(batch.pending[0].text, "edited");
    for (ignored, why) in [
        (edit("m1", "edited"), "an unchanged text"),
        (edit("m9", "who?"), "an unknown message"),
        (
            MessageEdit {
                conversation: http("nowhere"),
                ..edit("m1", "x")
            },
            "an unknown conversation",
        ),
    ] {
        assert_eq!(
            store.edit(ignored, &a, at(600)).await.unwrap(),
            IngestOutcome::EditIgnored,
            "{why}"
        );
    }
    let lease = claimed(store, id, &a, at(1500)).await;
    committed(store, &lease, &batch, "answer", at(1500)).await;
    assert_eq!(
        store
            .edit(edit("m1", "too late"), &a, at(1600))
            .await
            .unwrap(),
        IngestOutcome::EditIgnored,
        "an answered message"
    );
    let after = collect(store, id).await;
    assert_eq!(after.v0, Version(2));
    assert!(after.pending.is_empty() && after.timer.is_none());
}

/// Exclusive: a lease is claimed only while free or expired, and every claim bumps
/// the fencing token.
pub async fn a_lease_is_claimed_by_compare_and_swap(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, _, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let key = LeaseKey::Conversation(id);
    let first = claim(store, &key, &a, at(0)).await.expect("a free lease");
    assert_eq!((&first.key, &first.holder), (&key, &a));
    assert_eq!(first.expires_at, at(0).plus(TTL));
    assert!(
        claim(store, &key, &b, at(1)).await.is_none(),
        "a live lease is not claimable"
    );
    assert!(
        claim(store, &key, &a, at(1)).await.is_none(),
        "not even by its holder"
    );
    let second = claim(store, &key, &b, first.expires_at)
        .await
        .expect("an expired lease is claimable");
    assert!(second.token > first.token, "fencing tokens only grow");
    let poller = LeaseKey::Poller(Platform::Telegram, 0);
    let polling = claim(store, &poller, &a, at(2)).await;
    assert!(
        polling.is_some(),
        "leases of other resources are independent"
    );
    assert!(claim(store, &poller, &b, at(3)).await.is_none());
    let shard = LeaseKey::Poller(Platform::Telegram, 1);
    assert!(
        claim(store, &shard, &b, at(3)).await.is_some(),
        "each shard of a platform has a lease of its own"
    );
    assert!(claim(store, &shard, &a, at(4)).await.is_none());
    let slot = LeaseKey::Replica(Platform::Telegram, 1);
    assert!(
        claim(store, &slot, &a, at(4)).await.is_some(),
        "a replica slot is no shard's lease"
    );
    assert!(claim(store, &slot, &b, at(5)).await.is_none());
}

/// A renewal extends only the live holder's lease; a release frees it at once, and
/// never frees a lease taken over since.
pub async fn a_lease_is_renewed_and_released(store: &dyn Store) {
    let (a, b, c) = (holder("a"), holder("b"), holder("c"));
    let (id, _, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let key = LeaseKey::Conversation(id);
    let lease = claimed(store, id, &a, at(0)).await;
    let renewed = store.renew_lease(&lease, TTL, at(5000)).await.unwrap();
    assert_eq!(renewed.expires_at, at(5000).plus(TTL));
    assert_eq!(renewed.token, lease.token, "a renewal is no new claim");
    assert!(
        claim(store, &key, &b, lease.expires_at).await.is_none(),
        "a renewed lease outlives its first expiry"
    );
    store
        .release_lease(&renewed, None, renewed.expires_at)
        .await
        .unwrap();
    let taken = claim(store, &key, &b, at(5001))
        .await
        .expect("a released lease is claimable at once");
    assert!(taken.token > renewed.token);
    lost(
        store.renew_lease(&renewed, TTL, at(5002)).await,
        "renewing a lease taken over",
    );
    store
        .release_lease(&renewed, None, renewed.expires_at)
        .await
        .unwrap();
    assert!(
        claim(store, &key, &c, at(5003)).await.is_none(),
        "releasing a lost lease leaves the new holder's alone"
    );
    store.renew_lease(&taken, TTL, at(5004)).await.unwrap();
    lost(
        store.renew_lease(&taken, TTL, at(60_000)).await,
        "renewing an expired lease",
    );
}

/// Exclusive: the fencing token, not the holder's name, decides. A process whose
/// lease expired and that claimed the conversation again (a stalled round and a new
/// one in the same process) holds a new token; writes under the old one are refused.
pub async fn fencing_refuses_an_earlier_claim_of_the_same_holder(store: &dyn Store) {
    let a = holder("a");
    let (id, old, batch) = round(store, &http("c1"), &a, &["m1"], at(0)).await;
    let new = claimed(store, id, &a, old.expires_at).await;
    assert!(new.token > old.token, "every claim bumps the token");
    let now = old.expires_at.plus(ms(1));
    lost(
        store.renew_lease(&old, TTL, now).await,
        "a renewal under the earlier token",
    );
    lost(
        store.commit_reply(&old, &batch, reply("late"), now).await,
        "a commit under the earlier token",
    );
    lost(
        store.record_failure(&old, at(60_000), now).await,
        "a failure recorded under the earlier token",
    );
    committed(store, &new, &batch, "fresh", now).await;
}

/// Fencing: a holder whose lease expired and was taken over writes nothing; the new
/// holder's commit goes through. An expired lease nobody took is no lease either.
pub async fn fencing_refuses_a_replaced_holder(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, old, batch) = round(store, &c1, &a, &["m1"], at(0)).await;
    let new = claimed(store, id, &b, old.expires_at).await;
    let now = old.expires_at.plus(ms(1));
    lost(
        store.commit_reply(&old, &batch, reply("late"), now).await,
        "a commit of the replaced holder",
    );
    lost(
        store.give_up(&old, &batch, "late", now).await,
        "a give-up of the replaced holder",
    );
    lost(
        store.record_failure(&old, at(60_000), now).await,
        "a failure recorded by the replaced holder",
    );
    lost(
        store.disarm_idle_timer(&old, batch.v0, now).await,
        "a timer disarmed by the replaced holder",
    );
    let untouched = collect(store, id).await;
    assert_eq!(pending_ids(&untouched), ["m1"]);
    assert_eq!(untouched.timer.map(|t| t.attempts), Some(0));
    assert!(store.due_outbox(id, now).await.unwrap().is_empty());
    let (outbox, forced) = committed(store, &new, &untouched, "fresh", now).await;
    assert!(!forced);
    assert_eq!(store.due_outbox(id, now).await.unwrap()[0].id, outbox);

    stored(store, message(c1, "m2"), &a, now).await;
    let batch = collect(store, id).await;
    lost(
        store
            .commit_reply(&new, &batch, reply("expired"), new.expires_at)
            .await,
        "a commit under an expired lease",
    );
}

/// The final check: nothing new since the batch was collected → the reply is stored,
/// covers the batch, the batch is answered and the timer goes. The next batch carries
/// the exchange as history.
pub async fn a_commit_answers_the_batch(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1100)).await;
    assert_eq!(
        (batch.v0, pending_ids(&batch)),
        (Version(2), vec!["m1", "m2"])
    );
    let (outbox, forced) = committed(store, &lease, &batch, "answer", at(1200)).await;
    assert!(!forced);
    let after = collect(store, id).await;
    assert!(
        after.pending.is_empty() && after.timer.is_none(),
        "{after:?}"
    );
    let rows = store.due_outbox(id, at(1200)).await.unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (row.id, row.kind, row.text.as_str()),
        (outbox, OutboxKind::Reply, "answer")
    );
    assert_eq!(
        (row.conversation.clone(), row.reply_to.as_deref()),
        (c1.clone(), Some("m2"))
    );
    assert_eq!(row.covers, ["m1", "m2"]);
    assert_eq!(
        (row.parts_sent, row.attempts, row.created_at),
        (0, 0, at(1200))
    );

    stored(store, message(c1, "m3"), &a, at(2000)).await;
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m3"]);
    assert_eq!(
        next.history,
        [Exchange {
            user: vec![
                Said::new("Ann", "text of m1"),
                Said::new("Ann", "text of m2")
            ],
            reply: "answer".into(),
        }]
    );
}

/// Fresh: a message that arrived during generation makes the reply stale before the
/// cap: nothing is stored, the timer stays, and the next round answers everything.
pub async fn a_newer_message_makes_the_reply_stale(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(1000)).await;
    stored(store, message(c1, "m2"), &a, at(1200)).await;
    assert_eq!(stale(store, &lease, &batch, at(1300)).await, Version(2));
    assert!(store.due_outbox(id, at(1300)).await.unwrap().is_empty());
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m1", "m2"]);
    assert!(next.timer.is_some(), "the timer stays armed");
    committed(store, &lease, &next, "both", at(1400)).await;
    let rows = store.due_outbox(id, at(1400)).await.unwrap();
    assert_eq!(rows[0].covers, ["m1", "m2"]);
}

/// The cap: once the oldest message of the batch has waited `max_wait`, a stale reply
/// is delivered, covering only the batch; the newer messages keep a timer whose cap
/// counts from the oldest of them.
pub async fn the_cap_forces_a_stale_reply_out(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(1000)).await;
    stored(store, message(c1.clone(), "m2"), &a, at(3000)).await;
    let (_, _, due_at) = stored(store, message(c1, "m3"), &a, at(3900)).await;
    assert_eq!(due_at, at(4000), "capped from m1");
    let (outbox, forced) = committed(store, &lease, &batch, "forced", at(4000)).await;
    assert!(forced, "the cap forced it");
    assert_eq!(store.due_outbox(id, at(4000)).await.unwrap()[0].id, outbox);
    assert_eq!(
        store.due_outbox(id, at(4000)).await.unwrap()[0].covers,
        ["m1"]
    );
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m2", "m3"]);
    assert_eq!(
        next.timer.map(|t| t.due_at),
        Some(at(4900)),
        "debounced from m3, capped from m2 (7000), no longer from m1"
    );
}

/// No duplicate: a reply the cap forces out does not cover a message edited since it
/// was collected (the edit made it pending again); if every one was edited, the reply
/// is stale.
pub async fn a_forced_reply_leaves_an_edited_message_pending(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let edit = |text: &str| MessageEdit {
        conversation: c1.clone(),
        message_id: "m2".into(),
        text: text.into(),
    };
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1100)).await;
    store.edit(edit("m2, edited"), &a, at(3000)).await.unwrap();
    let (_, forced) = committed(store, &lease, &batch, "forced", at(4000)).await;
    assert!(forced);
    assert_eq!(
        store.due_outbox(id, at(4000)).await.unwrap()[0].covers,
        ["m1"]
    );
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m2"]);
    assert_eq!(next.pending[0].text, "m2, edited");

    store.edit(edit("m2, again"), &a, at(4100)).await.unwrap();
    assert_eq!(
        stale(store, &lease, &next, at(4200)).await,
        Version(4),
        "every collected message was edited since"
    );
}

/// Giving up covers every message still pending up to `v0`, each at most once, as a
/// notice that never enters the history; a newer message keeps its timer.
pub async fn giving_up_covers_each_message_once(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1100)).await;
    stored(store, message(c1, "m3"), &a, at(1200)).await;
    let notice = store
        .give_up(&lease, &batch, "too long", at(1300))
        .await
        .unwrap()
        .expect("m1 and m2 were pending");
    assert_eq!(
        store
            .give_up(&lease, &batch, "again", at(1300))
            .await
            .unwrap(),
        None,
        "nothing is given up twice"
    );
    let rows = store.due_outbox(id, at(1300)).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0], notice, "give_up returns the row it stored");
    assert_eq!(rows[0].kind, OutboxKind::Notice);
    assert_eq!(
        (rows[0].text.as_str(), rows[0].reply_to.as_deref()),
        ("too long", Some("m2"))
    );
    assert_eq!(rows[0].covers, ["m1", "m2"]);
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m3"]);
    assert!(next.timer.is_some(), "m3 keeps its timer");
    assert!(
        next.history.is_empty(),
        "a notice is no history: {:?}",
        next.history
    );
}

/// A timer is disarmed only when nothing is pending.
pub async fn a_timer_with_pending_messages_is_never_disarmed(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    store
        .disarm_idle_timer(&lease, batch.v0, at(1000))
        .await
        .unwrap();
    assert!(collect(store, id).await.timer.is_some());
}

/// Notices are queued at most once per key; delivery keeps outbox order (a row
/// waiting for its retry holds back the rows behind it), records parts without going
/// backwards, and a sent or given-up row is never due again.
pub async fn the_outbox_is_delivered_in_order(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    let notice = |text: &str, key: &str| NewNotice {
        conversation: c1.clone(),
        is_group: false,
        text: text.into(),
        reply_to: None,
        dedupe_key: key.into(),
    };
    assert!(
        store
            .enqueue_notice(notice("first", "k1"), &a, at(10))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .enqueue_notice(notice("first", "k1"), &a, at(15))
            .await
            .unwrap()
            .is_none(),
        "at most one notice per key"
    );
    assert!(
        store
            .enqueue_notice(notice("second", "k2"), &a, at(20))
            .await
            .unwrap()
            .is_some()
    );
    let texts =
        |rows: &[OutboxRow]| -> Vec<String> { rows.iter().map(|r| r.text.clone()).collect() };
    let rows = store.due_outbox(id, at(20)).await.unwrap();
    assert_eq!(texts(&rows), ["first", "second"]);
    assert!(
        rows.iter()
            .all(|r| r.kind == OutboxKind::Notice && r.covers.is_empty())
    );
    let (first, second) = (rows[0].id, rows[1].id);

    store
        .defer_outbox(first, at(1000), "timed out")
        .await
        .unwrap();
    assert!(
        store.due_outbox(id, at(999)).await.unwrap().is_empty(),
        "the head waits for its retry, and the rows behind it wait too"
    );
    let rows = store.due_outbox(id, at(1000)).await.unwrap();
    assert_eq!(texts(&rows), ["first", "second"]);
    assert_eq!(rows[0].attempts, 1, "the failed attempt is counted");

    store.mark_sent(first, 2, false, at(1000)).await.unwrap();
    store.mark_sent(first, 1, false, at(1001)).await.unwrap();
    let rows = store.due_outbox(id, at(1001)).await.unwrap();
    assert_eq!(rows[0].parts_sent, 2, "parts sent never go backwards");
    store.mark_sent(first, 3, true, at(1002)).await.unwrap();
    store.defer_outbox(first, at(9000), "late").await.unwrap();
    store.fail_outbox(first, "late", at(1003)).await.unwrap();
    let rows = store.due_outbox(id, at(1003)).await.unwrap();
    assert_eq!(texts(&rows), ["second"], "a sent row is done");

    store
        .fail_outbox(second, "refused", at(1004))
        .await
        .unwrap();
    store.defer_outbox(second, at(1005), "again").await.unwrap();
    assert!(
        store.due_outbox(id, at(10_000)).await.unwrap().is_empty(),
        "a given-up row is never tried again"
    );
}

/// A round's claim, in one transaction: the compare-and-swap of a lease, the batch
/// (as `collect` reads it) and the rows owed (as `due_outbox`); a row waiting for its
/// retry holds back what the round would commit; another holder is refused.
pub async fn a_round_is_claimed_with_what_it_works_on(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(1000)).await;
    let (reply, _) = committed(store, &lease, &batch, "first answer", at(1000)).await;
    store
        .defer_outbox(reply, at(5000), "timed out")
        .await
        .unwrap();
    store.release_lease(&lease, None, at(1000)).await.unwrap();
    stored(store, message(c1.clone(), "m2"), &a, at(1100)).await;

    let claimed = store
        .claim_round(id, &b, ms(3000), 10, at(2000))
        .await
        .unwrap()
        .expect("the lease is free");
    assert_eq!(claimed.lease.holder, b);
    assert_eq!(pending_ids(&claimed.batch), ["m2"]);
    assert_eq!(claimed.batch.v0, collect(store, id).await.v0);
    assert_eq!(
        claimed.batch.history.len(),
        1,
        "the first exchange is history"
    );
    assert!(
        claimed.owed.is_empty() && claimed.held_back,
        "the deferred reply is not due, and holds back what comes after it"
    );
    assert!(
        store
            .claim_round(id, &a, ms(3000), 10, at(2001))
            .await
            .unwrap()
            .is_none(),
        "exclusive: a live lease refuses another claim"
    );
    store
        .release_lease(&claimed.lease, None, at(2002))
        .await
        .unwrap();
    let later = store
        .claim_round(id, &a, ms(3000), 10, at(5000))
        .await
        .unwrap()
        .expect("released");
    assert!(
        later.lease.token > claimed.lease.token,
        "fencing tokens grow"
    );
    assert_eq!(later.owed, store.due_outbox(id, at(5000)).await.unwrap());
    assert_eq!(later.owed.len(), 1);
    assert_eq!(later.owed[0].id, reply);
    assert!(!later.held_back);
}

/// An outbox row names itself alike in every read: its `stored_at` (its creation
/// time exactly as stored, which a webhook's `webhook-id` is made of) is the same in
/// the row `commit_reply` returns, in the rows `claim_round` owes and in those
/// `due_outbox` returns, attempt after attempt, however far apart the callers'
/// clocks are. The calls pass times that jump about (a second, a quarter of an hour,
/// a day): on the database's clock (a PostgreSQL test runs this body so, with the
/// callers three years behind it) each read translates `created_at` by its own
/// offset, and `stored_at` must not move.
pub async fn an_outbox_row_is_stored_at_one_time_in_every_read(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let outbox = match store
        .commit_reply(&lease, &batch, reply("answer"), at(1000))
        .await
    {
        Ok(CommitOutcome::Committed { outbox, .. }) => outbox,
        other => panic!("the reply was not committed: {other:?}"),
    };
    let stored_at = outbox.stored_at;
    store.release_lease(&lease, None, at(1000)).await.unwrap();
    let mut reads = vec![("commit_reply", outbox)];
    let due_outbox = async |now: Timestamp| {
        let rows = store.due_outbox(id, now).await.expect("reading the outbox");
        assert_eq!(rows.len(), 1, "the reply is owed at {now:?}: {rows:?}");
        rows.into_iter().next().unwrap()
    };
    reads.push(("due_outbox", due_outbox(at(1000)).await));
    // A failed attempt; the retry reads the row again.
    store
        .defer_outbox(reads[0].1.id, at(3000), "timed out")
        .await
        .unwrap();
    reads.push(("due_outbox after a retry", due_outbox(at(3000)).await));
    let claimed = store
        .claim_round(id, &b, TTL, 10, at(900_000))
        .await
        .unwrap()
        .expect("the lease was released");
    assert_eq!(claimed.owed.len(), 1, "{:?}", claimed.owed);
    reads.push(("claim_round", claimed.owed[0].clone()));
    store
        .release_lease(&claimed.lease, None, at(900_000))
        .await
        .unwrap();
    reads.push(("due_outbox a day later", due_outbox(at(86_400_000)).await));
    for (read, row) in &reads {
        assert_eq!(row.id, reads[0].1.id, "{read}");
        assert_eq!(
            row.stored_at, stored_at,
            "{read} reads the row as stored at {:?}, commit_reply said {stored_at:?} (created_at {:?} vs {:?})",
            row.stored_at, row.created_at, reads[0].1.created_at,
        );
    }
}

/// The last part a round delivered is recorded with the release of its lease; it is
/// recorded even when the lease was lost meanwhile (a delivered part is a fact), and a
/// lost lease stays with its new holder.
pub async fn the_last_part_is_recorded_with_the_release(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let (reply, _) = committed(store, &lease, &batch, "answer", at(1000)).await;
    let sent = |parts_sent, done| PartSent {
        outbox: reply,
        parts_sent,
        done,
    };
    store
        .release_lease(&lease, Some(sent(1, false)), at(1100))
        .await
        .unwrap();
    assert_eq!(
        store.due_outbox(id, at(1100)).await.unwrap()[0].parts_sent,
        1
    );
    let again = claimed(store, id, &a, at(1200)).await;
    // The lease expires and another holder takes it before the release.
    let taker = claimed(store, id, &b, again.expires_at).await;
    store
        .release_lease(&again, Some(sent(2, true)), again.expires_at)
        .await
        .unwrap();
    assert!(
        store
            .due_outbox(id, again.expires_at)
            .await
            .unwrap()
            .is_empty(),
        "the last part was recorded though the lease was lost"
    );
    lost(
        store
            .claim_lease(&LeaseKey::Conversation(id), &a, ms(3000), again.expires_at)
            .await
            .map(|l| l.ok_or(StoreError::LeaseLost(LeaseKey::Conversation(id))))
            .and_then(|r| r),
        "the taker still holds it",
    );
    let _ = taker;
}

/// A failed generation backs the timer off (a new message does not cut the backoff
/// short); `/reset` clears the backoff, makes the timer due now for the holder that
/// took the command, and hides the earlier exchanges from the history.
pub async fn failures_back_off_and_reset_starts_afresh(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(1000)).await;
    committed(store, &lease, &batch, "answer", at(1000)).await;
    store
        .release_lease(&lease, None, lease.expires_at)
        .await
        .unwrap();

    stored(store, message(c1.clone(), "m2"), &a, at(2000)).await;
    let lease = claimed(store, id, &a, at(3000)).await;
    assert_eq!(collect(store, id).await.history.len(), 1);
    let retry_at = at(60_000);
    assert_eq!(
        store
            .record_failure(&lease, retry_at, at(3000))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .record_failure(&lease, retry_at, at(3100))
            .await
            .unwrap(),
        2
    );
    store
        .release_lease(&lease, None, lease.expires_at)
        .await
        .unwrap();
    let (_, _, due_at) = stored(store, message(c1.clone(), "m3"), &a, at(3200)).await;
    assert_eq!(
        due_at, retry_at,
        "a new message does not cut the backoff short"
    );
    let timer = collect(store, id).await.timer.expect("armed");
    assert_eq!((timer.due_at, timer.attempts), (retry_at, 2));

    store.reset_context(&c1, false, &b, at(4000)).await.unwrap();
    let fresh = collect(store, id).await;
    assert_eq!(
        pending_ids(&fresh),
        ["m2", "m3"],
        "pending messages are kept"
    );
    assert!(fresh.history.is_empty(), "{:?}", fresh.history);
    let timer = fresh.timer.expect("armed");
    assert_eq!((timer.due_at, timer.attempts), (at(4000), 0));
    assert_eq!(
        due(store, &query(&b, 10), at(4000)).await.ready,
        [id],
        "due at once for the holder that took /reset"
    );
}

/// A process's own timers are due at once; another's only a hand-off later; other
/// platforms' timers never; the earliest future deadline is reported; `limit` holds.
pub async fn due_work_hands_timers_off_between_holders(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let none = store
        .due_work(
            &WorkQuery {
                platforms: Vec::new(),
                ..query(&a, 10)
            },
            at(0),
        )
        .await
        .unwrap();
    assert_eq!(none, DueWork::default(), "no platform, no work");
    let (mine, _, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let (theirs, _, _) = stored(store, message(http("c2"), "m1"), &b, at(0)).await;
    let telegram = ConversationRef::new(Platform::Telegram, "t1");
    stored(store, message(telegram, "m1"), &a, at(0)).await;

    let early = due(store, &query(&a, 10), at(999)).await;
    assert_eq!((early.ready, early.next_at), (vec![], Some(at(1000))));
    let own = due(store, &query(&a, 10), at(1000)).await;
    assert_eq!(own.ready, [mine], "own timers at once");
    assert_eq!(
        own.next_at,
        Some(at(1500)),
        "the other's after the hand-off"
    );
    assert_eq!(due(store, &query(&b, 10), at(1000)).await.ready, [theirs]);
    let both = due(store, &query(&a, 10), at(1500)).await;
    assert_eq!(both.ready, [mine, theirs], "earliest first; only http");
    assert_eq!(both.next_at, None);
    assert_eq!(due(store, &query(&a, 1), at(1500)).await.ready, [mine]);
}

/// A due conversation under a live lease is left alone until the lease expires (that
/// moment is the next deadline) or is released.
pub async fn due_work_leaves_leased_conversations_alone(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (leased, _, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let (free, _, _) = stored(store, message(http("c2"), "m1"), &a, at(100)).await;
    let lease = claimed(store, leased, &b, at(1000)).await;
    let work = due(store, &query(&a, 10), at(1100)).await;
    assert_eq!(work.ready, [free]);
    assert_eq!(
        work.next_at,
        Some(lease.expires_at),
        "free again when it expires"
    );
    assert_eq!(
        due(store, &query(&a, 10), lease.expires_at).await.ready,
        [leased, free],
        "an expired lease excludes no one"
    );
    store
        .release_lease(&lease, None, lease.expires_at)
        .await
        .unwrap();
    assert_eq!(
        due(store, &query(&a, 10), at(1200)).await.ready,
        [leased, free]
    );
}

/// No loss: a committed reply not yet delivered is due work (for its owner at once,
/// for others after the hand-off, and for no one while a lease is live on it).
pub async fn due_work_includes_undelivered_outbox_rows(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, batch) = round(store, &http("c1"), &b, &["m1"], at(1000)).await;
    let (outbox, _) = committed(store, &lease, &batch, "answer", at(1000)).await;
    let leased = due(store, &query(&b, 10), at(1000)).await;
    assert!(leased.ready.is_empty(), "the holder is delivering it");
    store
        .release_lease(&lease, None, lease.expires_at)
        .await
        .unwrap();
    assert_eq!(
        due(store, &query(&b, 10), at(1000)).await.ready,
        [id],
        "its owner at once"
    );
    let other = due(store, &query(&a, 10), at(1000)).await;
    assert_eq!((other.ready, other.next_at), (vec![], Some(at(1500))));
    assert_eq!(due(store, &query(&a, 10), at(1500)).await.ready, [id]);
    store.mark_sent(outbox, 1, true, at(1600)).await.unwrap();
    assert_eq!(
        due(store, &query(&a, 10), at(1600)).await,
        DueWork::default()
    );
}

/// Conversations of a platform with a message stored since a moment, most recent
/// first, each with the platform id of the message stored last (not the largest id).
pub async fn recent_conversations_resume_after_the_last_stored_message(store: &dyn Store) {
    let a = holder("a");
    stored(store, message(http("c1"), "m9"), &a, at(0)).await;
    stored(store, message(http("c1"), "m10"), &a, at(300)).await;
    let group = NewMessage {
        is_group: true,
        ..message(http("g1"), "x1")
    };
    stored(store, group, &a, at(200)).await;
    stored(
        store,
        message(ConversationRef::new(Platform::Telegram, "t1"), "7"),
        &a,
        at(250),
    )
    .await;
    let recent = |platform, since, limit| store.recent_conversations(platform, since, limit);
    let entry = |key: &str, is_group, last: &str| RecentConversation {
        conversation: http(key),
        is_group,
        last_message_id: last.into(),
    };
    assert_eq!(
        recent(Platform::Http, at(100), 10).await.unwrap(),
        [entry("c1", false, "m10"), entry("g1", true, "x1")]
    );
    assert_eq!(
        recent(Platform::Http, at(250), 10).await.unwrap(),
        [entry("c1", false, "m10")]
    );
    assert_eq!(
        recent(Platform::Http, at(0), 1).await.unwrap(),
        [entry("c1", false, "m10")]
    );
    assert_eq!(
        recent(Platform::Telegram, at(0), 10).await.unwrap().len(),
        1
    );
    assert!(
        recent(Platform::Discord, at(0), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A conversation is settled with nothing pending, no timer and nothing undelivered;
/// the pending count counts conversations waiting for a reply.
pub async fn settled_and_pending_conversations(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    assert_eq!(store.is_settled(&c1).await.unwrap(), None, "unknown");
    assert_eq!(store.pending_conversations().await.unwrap(), 0);
    let (id, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    stored(store, message(http("c2"), "m1"), &a, at(0)).await;
    assert_eq!(store.pending_conversations().await.unwrap(), 2);
    assert_eq!(store.is_settled(&c1).await.unwrap(), Some(false), "pending");
    let lease = claimed(store, id, &a, at(1000)).await;
    let batch = collect(store, id).await;
    let (outbox, _) = committed(store, &lease, &batch, "answer", at(1000)).await;
    assert_eq!(store.pending_conversations().await.unwrap(), 1);
    assert_eq!(
        store.is_settled(&c1).await.unwrap(),
        Some(false),
        "undelivered"
    );
    store.mark_sent(outbox, 1, true, at(1100)).await.unwrap();
    assert_eq!(store.is_settled(&c1).await.unwrap(), Some(true));
}

/// A sound store answers the health check, before and after it holds data.
pub async fn ping_answers_on_a_sound_store(store: &dyn Store) {
    store.ping().await.expect("an empty store");
    stored(store, message(http("c1"), "m1"), &holder("a"), at(0)).await;
    store.ping().await.expect("a store with data");
}

/// Rate limit: past `max` messages of one user within the window (across their
/// conversations on the platform; other users and platforms apart), the
/// conversation's timer is held until the oldest message past the limit leaves the
/// window; a hold in force is kept, later messages do not arm the timer sooner, and
/// the held messages stay pending; `/reset` does not end the hold.
pub async fn a_rate_limit_holds_the_conversation_until_the_window_has_room(store: &dyn Store) {
    let a = holder("a");
    let rate = RateWindow {
        max: 2,
        window: ms(60_000),
    };
    let (c1, c2) = (http("c1"), http("c2"));
    let (id1, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    assert_eq!(
        store.hold_over_rate(id1, "u1", rate, at(0)).await.unwrap(),
        None
    );
    let (id2, _, _) = stored(store, message(c2.clone(), "m2"), &a, at(1000)).await;
    assert_eq!(
        store
            .hold_over_rate(id2, "u1", rate, at(1000))
            .await
            .unwrap(),
        None,
        "two messages are within a limit of two"
    );
    let mut other = message(c1.clone(), "m-other");
    other.user_id = "u2".into();
    stored(store, other, &a, at(1500)).await;
    assert_eq!(
        store
            .hold_over_rate(id1, "u2", rate, at(1500))
            .await
            .unwrap(),
        None,
        "another user counts apart"
    );
    let (_, _, _) = stored(store, message(c1.clone(), "m3"), &a, at(2000)).await;
    let hold = store
        .hold_over_rate(id1, "u1", rate, at(2000))
        .await
        .unwrap();
    assert_eq!(
        hold,
        Some(RateHold {
            until: at(60_000),
            began: true
        }),
        "the third message holds until the first leaves the window"
    );
    let timer = collect(store, id1).await.timer.expect("armed");
    assert_eq!(timer.due_at, at(60_000));
    let (_, _, due_at) = stored(store, message(c1.clone(), "m4"), &a, at(3000)).await;
    assert_eq!(
        due_at,
        at(60_000),
        "a later message does not cut the hold short"
    );
    assert_eq!(
        store
            .hold_over_rate(id1, "u1", rate, at(3000))
            .await
            .unwrap(),
        Some(RateHold {
            until: at(60_000),
            began: false
        }),
        "the hold in force is kept, not extended"
    );
    assert_eq!(
        pending_ids(&collect(store, id1).await),
        ["m1", "m-other", "m3", "m4"]
    );
    store.reset_context(&c1, false, &a, at(3500)).await.unwrap();
    let timer = collect(store, id1).await.timer.expect("armed");
    assert_eq!(timer.due_at, at(60_000), "/reset is no way around a hold");
    let query = query(&a, 10);
    assert!(
        !due(store, &query, at(59_999)).await.ready.contains(&id1),
        "held"
    );
    assert!(due(store, &query, at(60_000)).await.ready.contains(&id1));
    let mut telegram = message(ConversationRef::new(Platform::Telegram, "t1"), "m5");
    telegram.is_group = false;
    let (id3, _, _) = stored(store, telegram, &a, at(4000)).await;
    assert_eq!(
        store
            .hold_over_rate(id3, "u1", rate, at(4000))
            .await
            .unwrap(),
        None,
        "the same user id on another platform counts apart"
    );
}

/// An applied edit counts in its author's rate window as a message does (it makes a
/// generation in flight stale just the same): one message edited twice is three in
/// the window. An edit that is ignored (the text unchanged) counts for nothing.
pub async fn edits_count_in_the_rate_window(store: &dyn Store) {
    let a = holder("a");
    let rate = RateWindow {
        max: 2,
        window: ms(60_000),
    };
    let c1 = http("c1");
    let (id, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    let edit = |text: &str| MessageEdit {
        conversation: c1.clone(),
        message_id: "m1".into(),
        text: text.into(),
    };
    let hold = async |now: Timestamp| store.hold_over_rate(id, "u1", rate, now).await.unwrap();
    assert!(matches!(
        store.edit(edit("first edit"), &a, at(100)).await.unwrap(),
        IngestOutcome::Stored { .. }
    ));
    assert_eq!(hold(at(100)).await, None, "a message and an edit: two");
    assert_eq!(
        store.edit(edit("first edit"), &a, at(150)).await.unwrap(),
        IngestOutcome::EditIgnored
    );
    assert_eq!(
        hold(at(150)).await,
        None,
        "an ignored edit counts for nothing"
    );
    assert!(matches!(
        store.edit(edit("second edit"), &a, at(200)).await.unwrap(),
        IngestOutcome::Stored { .. }
    ));
    assert_eq!(
        hold(at(200)).await,
        Some(RateHold {
            until: at(60_000),
            began: true
        }),
        "the second edit is the third in the window: held until the message leaves it"
    );
    assert_eq!(
        collect(store, id).await.timer.expect("armed").due_at,
        at(60_000)
    );
}

fn scope(name: &str, tokens: i64, limit: Option<u64>) -> ScopeCharge {
    ScopeCharge {
        scope: name.into(),
        tokens,
        limit,
    }
}

fn charge(scopes: Vec<ScopeCharge>) -> TokenCharge {
    TokenCharge {
        day: "2026-12-01".into(),
        scopes,
        hold_until: Some(at(86_400_000)),
        reservation: Reservation::None,
    }
}

async fn usage(store: &dyn Store, day: &str, scopes: &[&str]) -> Vec<u64> {
    let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
    store
        .token_usage(day, &scopes)
        .await
        .expect("reading usage")
}

/// Budgets: a charge adds to every scope or to none; one that would pass a scope's
/// limit charges nothing and holds the conversation until `hold_until`; a give-back
/// is not checked and never goes below zero; days count apart; a charge under a lost
/// lease is refused (fenced like the final check).
pub async fn a_token_charge_is_all_or_nothing_and_fenced(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, lease, _) = round(store, &c1, &a, &["m1"], at(1000)).await;
    let first = charge(vec![
        scope("user:http:u1", 600, Some(1000)),
        scope("bot", 600, Some(5000)),
    ]);
    assert_eq!(
        store.charge_tokens(&lease, &first, at(1000)).await.unwrap(),
        Charged::Charged
    );
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot", "nobody"]).await,
        [600, 600, 0]
    );
    let over = charge(vec![
        scope("bot", 500, Some(5000)),
        scope("user:http:u1", 500, Some(1000)),
    ]);
    assert_eq!(
        store.charge_tokens(&lease, &over, at(1100)).await.unwrap(),
        Charged::Over {
            scope: "user:http:u1".into(),
            used: 600,
            limit: 1000
        }
    );
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [600, 600],
        "nothing of a refused charge is added"
    );
    let timer = collect(store, id).await.timer.expect("armed");
    assert_eq!(timer.due_at, at(86_400_000), "held until the budget resets");
    let give_back = charge(vec![scope("user:http:u1", -700, Some(1000))]);
    assert_eq!(
        store
            .charge_tokens(&lease, &give_back, at(1200))
            .await
            .unwrap(),
        Charged::Charged
    );
    assert_eq!(usage(store, "2026-12-01", &["user:http:u1"]).await, [0]);
    assert_eq!(
        usage(store, "2026-12-02", &["bot"]).await,
        [0],
        "days count apart"
    );

    let taker = claimed(store, id, &b, lease.expires_at).await;
    lost(
        store
            .charge_tokens(&lease, &first, lease.expires_at.plus(ms(1)))
            .await,
        "a charge of the replaced holder",
    );
    assert_eq!(usage(store, "2026-12-01", &["bot"]).await, [600]);
    let _ = taker;
}

/// Budgets: charges of several holders at once (each under its own conversation's
/// lease) never take a shared scope past its limit together, and none is lost.
pub async fn concurrent_token_charges_never_pass_a_budget(store: &dyn Store) {
    let mut leases = Vec::new();
    for n in 0..6 {
        let by = holder(&format!("h{n}"));
        let (_, lease, _) = round(store, &http(&format!("c{n}")), &by, &["m1"], at(1000)).await;
        leases.push(lease);
    }
    let each = charge(vec![
        scope("user:http:u1", 400, Some(1000)),
        scope("bot", 400, None),
    ]);
    let results = futures_util::future::join_all(
        leases
            .iter()
            .map(|lease| store.charge_tokens(lease, &each, at(1500))),
    )
    .await;
    let charged = results
        .into_iter()
        .filter(|r| matches!(r, Ok(Charged::Charged)))
        .count();
    assert_eq!(charged, 2, "two charges of 400 fit a budget of 1000");
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [800, 800]
    );
}

/// Access decisions: one per subject, the latest replacing the earlier; users and
/// chats with the same id are different subjects.
pub async fn an_access_decision_replaces_the_earlier_one(store: &dyn Store) {
    assert!(store.access_rules().await.unwrap().is_empty());
    let rule = |kind, allowed, set_at| AccessRule {
        subject: Subject {
            platform: Platform::Telegram,
            kind,
            id: "42".into(),
        },
        allowed,
        set_by: "telegram:1".into(),
        set_at,
    };
    store
        .set_access(&rule(SubjectKind::User, true, at(0)))
        .await
        .unwrap();
    store
        .set_access(&rule(SubjectKind::Chat, true, at(10)))
        .await
        .unwrap();
    store
        .set_access(&rule(SubjectKind::User, false, at(20)))
        .await
        .unwrap();
    let rules = store.access_rules().await.unwrap();
    assert_eq!(
        rules,
        [
            rule(SubjectKind::Chat, true, at(10)),
            rule(SubjectKind::User, false, at(20))
        ]
    );
}

#[cfg(test)]
mod tests {
    /// Every check is run: each `pub async fn` of this module is named in
    /// `store_conformance!`, the only place that runs them.
    #[test]
    fn the_macro_runs_every_check() {
        let source = concat!(
            include_str!("conformance.rs"),
            include_str!("conformance/wallet.rs")
        );
        let (macro_body, checks) = source
            .split_once("/// The timer policy every check assumes")
            .expect("the macro comes first");
        let missing: Vec<&str> = checks
            .split("\npub async fn ")
            .skip(1)
            .filter_map(|rest| rest.split_once('(').map(|(name, _)| name))
            .filter(|name| !macro_body.contains(&format!("{name},")))
            .collect();
        assert!(missing.is_empty(), "checks never run: {missing:?}");
    }
}

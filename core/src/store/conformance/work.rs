//! Conformance of the work area: due work between holders, settled conversations, health.

use super::{
    at, claimed, collect, committed, due, holder, http, mark, message, query, release, round,
    stored,
};
use crate::domain::{ConversationRef, Platform};
use crate::store::{DueWork, Store, WorkQuery};

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
    release(store, &lease, lease.expires_at).await;
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
    release(store, &lease, lease.expires_at).await;
    assert_eq!(
        due(store, &query(&b, 10), at(1000)).await.ready,
        [id],
        "its owner at once"
    );
    let other = due(store, &query(&a, 10), at(1000)).await;
    assert_eq!((other.ready, other.next_at), (vec![], Some(at(1500))));
    assert_eq!(due(store, &query(&a, 10), at(1500)).await.ready, [id]);
    mark(store, outbox, 1, true, at(1600)).await;
    assert_eq!(
        due(store, &query(&a, 10), at(1600)).await,
        DueWork::default()
    );
}

/// A conversation is settled with nothing pending, no timer and nothing undelivered;
/// it awaits a reply only while a message is pending; the pending count counts
/// conversations waiting for a reply.
pub async fn settled_and_pending_conversations(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    assert_eq!(store.is_settled(&c1).await.unwrap(), None, "unknown");
    assert!(!store.awaits_reply(&c1).await.unwrap());
    assert_eq!(store.pending_conversations().await.unwrap(), 0);
    let (id, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    stored(store, message(http("c2"), "m1"), &a, at(0)).await;
    assert_eq!(store.pending_conversations().await.unwrap(), 2);
    assert_eq!(store.is_settled(&c1).await.unwrap(), Some(false), "pending");
    assert!(store.awaits_reply(&c1).await.unwrap(), "pending");
    let lease = claimed(store, id, &a, at(1000)).await;
    let batch = collect(store, id).await;
    let (outbox, _) = committed(store, &lease, &batch, "answer", at(1000)).await;
    assert_eq!(store.pending_conversations().await.unwrap(), 1);
    assert_eq!(
        store.is_settled(&c1).await.unwrap(),
        Some(false),
        "undelivered"
    );
    assert!(
        !store.awaits_reply(&c1).await.unwrap(),
        "answered, only the delivery is left"
    );
    mark(store, outbox, 1, true, at(1100)).await;
    assert_eq!(store.is_settled(&c1).await.unwrap(), Some(true));
}

/// A sound store answers the health check, before and after it holds data.
pub async fn ping_answers_on_a_sound_store(store: &dyn Store) {
    store.ping().await.expect("an empty store");
    stored(store, message(http("c1"), "m1"), &holder("a"), at(0)).await;
    store.ping().await.expect("a store with data");
}

//! The dispatcher's promises, shown on real SQLite files: one reply per burst, stale
//! replies dropped, the cap, exclusivity across dispatchers, crash recovery, fencing,
//! idempotent ingest, and the counter-test that shows the lease is what prevents
//! duplicates. The exclusivity tests (a burst over two dispatchers and its
//! counter-test, a crashed holder, fencing) run on PostgreSQL too.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lull_core::dispatcher::{Accepted, Event};
use lull_core::domain::{ConversationRef, HolderId, LeaseKey, Platform};
use lull_core::store::{
    ConversationAt, FaultPlan, GiveUp, LeaseClaim, LeaseRenewal, MessageEdit, NewMessage, NewReply,
    PartSent, ReplyCommit, SqliteStore, StoreError, StoredBy, prelude::*,
};
use lull_core::timing::TimerPolicy;
use lull_port::SendError;

use crate::helpers::{
    Backend, CountingEcho, GatedResponder, Leases, Node, TestDb, db, ms, settings, temp_db,
    wait_event,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_gets_one_reply_covering_every_message() {
    let db = temp_db();
    let echo = CountingEcho::new(0);
    let node = Node::start(
        &db.path,
        settings(300, 3000, 3000),
        echo.clone(),
        Leases::Enforced,
    );
    for (i, text) in ["alpha", "bravo", "charlie"].iter().enumerate() {
        node.send("c1", &format!("m{i}"), text).await;
    }
    let replies = node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    assert!(
        replies[0].text.contains("alpha\nbravo\ncharlie"),
        "{}",
        replies[0].text
    );
    assert_eq!(replies[0].covers, ["m0", "m1", "m2"]);
    // Give a second reply every chance to appear, then check the database.
    wait_settled(&node, "c1").await;
    assert_eq!(node.outbound.replies().len(), 1);
    assert_eq!(
        echo.calls.load(Ordering::SeqCst),
        1,
        "one model call per burst"
    );
    let verdict = db::check(&db.path);
    assert_eq!(
        (verdict.duplicates, verdict.lost, verdict.stale),
        (0, 0, 0),
        "{verdict:?}"
    );
}

/// Test 2: a message that arrives while the model is generating makes that reply
/// stale; it is dropped and one reply covering everything is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_during_generation_drops_the_stale_reply() {
    let db = temp_db();
    let (responder, mut started) = GatedResponder::new();
    let node = Node::start(
        &db.path,
        settings(100, 5000, 3000),
        responder.clone(),
        Leases::Enforced,
    );
    let mut events = node.events();

    node.send("c1", "m1", "what is the capital of France?")
        .await;
    assert_eq!(
        started.recv().await,
        Some(1),
        "first generation covers one message"
    );
    node.send("c1", "m2", "and of Italy?").await;
    responder.open(1);
    let (v0, version) = wait_event(&mut events, Duration::from_secs(10), |e| match e {
        Event::DroppedStale { v0, version, .. } => Some((*v0, *version)),
        _ => None,
    })
    .await;
    assert_eq!((v0.0, version.0), (1, 2));

    assert_eq!(
        started.recv().await,
        Some(2),
        "the next round covers both messages"
    );
    responder.open(1);
    let replies = node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    assert!(
        replies[0].text.contains("France?\nand of Italy?"),
        "{}",
        replies[0].text
    );
    wait_settled(&node, "c1").await;
    assert_eq!(
        node.outbound.replies().len(),
        1,
        "the stale reply was never delivered"
    );
    assert_eq!(
        db::replies(&db.path).len(),
        1,
        "the stale reply was never stored"
    );
    assert_eq!(responder.calls.load(Ordering::SeqCst), 2);
}

/// Test 3: a user who never pauses still gets replies at most `max_wait` plus
/// generation time apart, and no message is left uncovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_never_pauses_is_answered_within_the_cap() {
    let db = temp_db();
    let (debounce, max_wait, generation) = (1000, 3000, 200);
    let node = Node::start(
        &db.path,
        settings(debounce, max_wait, 3000),
        CountingEcho::new(generation),
        Leases::Enforced,
    );
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(20) {
        node.send("c1", &format!("m{sent}"), &format!("message {sent}"))
            .await;
        sent += 1;
        tokio::time::sleep(ms(300)).await;
    }
    wait_settled(&node, "c1").await;

    let verdict = db::check(&db.path);
    assert_eq!(verdict.messages, sent);
    assert_eq!(
        (verdict.duplicates, verdict.lost, verdict.stale),
        (0, 0, 0),
        "{verdict:?}"
    );
    let replies = db::replies(&db.path);
    let messages = db::messages(&db.path);
    assert!(
        replies.iter().any(|r| r.forced),
        "the cap must have forced replies out"
    );
    // Generous slack for scheduling on a shared machine: the property is the cap, not
    // the speed.
    let slack = 1500;
    for reply in &replies {
        let oldest = messages
            .iter()
            .filter(|m| reply.covers.contains(&m.message_id))
            .map(|m| m.received_at)
            .min()
            .unwrap();
        let waited = reply.created_at - oldest;
        assert!(
            waited <= (max_wait + generation + slack) as i64,
            "reply {} came {waited} ms after its oldest message",
            reply.id
        );
    }
    let sent_times: Vec<Instant> = node.outbound.replies().iter().map(|d| d.at).collect();
    for pair in sent_times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap <= ms(max_wait + generation + slack),
            "replies {gap:?} apart"
        );
    }
    // Far fewer model calls than messages, far more than one.
    assert!(
        (5..=12).contains(&replies.len()),
        "{} replies for {sent} messages",
        replies.len()
    );
}

/// Test 4 (first half) and the shape of the counter-test: two dispatchers on one
/// database, a burst spread over both. `None`: the backend is not installed here.
async fn burst_over_two_dispatchers(backend: Backend, leases: Leases) -> Option<db::Verdict> {
    let db = TestDb::new(backend)?;
    let a = Node::on(
        &db,
        settings(200, 3000, 3000),
        CountingEcho::new(600),
        leases,
    )
    .await;
    let b = Node::on(
        &db,
        settings(200, 3000, 3000),
        CountingEcho::new(600),
        leases,
    )
    .await;
    for i in 0..6 {
        let node = if i % 2 == 0 { &a } else { &b };
        node.send("burst", &format!("m{i}"), &format!("part {i}"))
            .await;
    }
    wait_settled(&a, "burst").await;
    // Let a straggling duplicate round (possible only without leases) finish.
    tokio::time::sleep(ms(1500)).await;
    wait_settled(&a, "burst").await;
    Some(db::check(&db))
}

async fn two_dispatchers_answer_a_burst_once(backend: Backend) {
    let Some(verdict) = burst_over_two_dispatchers(backend, Leases::Enforced).await else {
        return;
    };
    assert_eq!(verdict.messages, 6);
    assert_eq!(verdict.replies, 1, "{verdict:?}");
    assert_eq!(
        (verdict.duplicates, verdict.lost, verdict.stale),
        (0, 0, 0),
        "{verdict:?}"
    );
}
crate::on_both_backends!(
    two_dispatchers_answer_a_burst_once,
    super::two_dispatchers_answer_a_burst_once
);

/// Test 7, the counter-test: the same burst with the lease checks switched off must
/// produce a duplicate. If it did not, the test above would prove nothing.
async fn counter_test_without_leases_the_burst_is_answered_twice(backend: Backend) {
    let Some(verdict) = burst_over_two_dispatchers(backend, Leases::Disabled).await else {
        return;
    };
    println!("{backend:?}: {verdict:?}");
    assert!(
        verdict.duplicates > 0,
        "without leases a duplicate was expected: {verdict:?}"
    );
}
crate::on_both_backends!(
    counter_test_without_leases_the_burst_is_answered_twice,
    super::counter_test_without_leases_the_burst_is_answered_twice
);

/// Test 4 (second half): a dispatcher dies holding the lease mid-generation; the
/// other answers once the lease has expired. Nothing lost, nothing doubled.
async fn a_crashed_holder_is_replaced_after_the_lease_expires(backend: Backend) {
    let Some(db) = TestDb::new(backend) else {
        return;
    };
    let ttl = 1500;
    let (stuck, mut started) = GatedResponder::new();
    let a = Node::on(
        &db,
        settings(100, 3000, ttl),
        stuck.clone(),
        Leases::Enforced,
    )
    .await;
    let mut a_events = a.events();

    a.send("c1", "m1", "first").await;
    a.send("c1", "m2", "second").await;
    let token = wait_event(&mut a_events, Duration::from_secs(10), |e| match e {
        Event::Claimed { token, .. } => Some(*token),
        _ => None,
    })
    .await;
    assert_eq!(started.recv().await, Some(2));
    // The second dispatcher joins while the first holds the lease mid-generation.
    let b_echo = CountingEcho::new(0);
    let b = Node::on(
        &db,
        settings(100, 3000, ttl),
        b_echo.clone(),
        Leases::Enforced,
    )
    .await;
    let crashed_at = Instant::now();
    a.crash();

    let replies = b.outbound.wait_replies(1, Duration::from_secs(15)).await;
    let took = crashed_at.elapsed();
    assert!(
        took >= ms(ttl) - ms(700),
        "the other dispatcher must wait for the lease to expire (took {took:?})"
    );
    assert_eq!(replies[0].covers, ["m1", "m2"]);
    wait_settled(&b, "c1").await;
    let verdict = db::check(&db);
    assert_eq!(
        (verdict.replies, verdict.duplicates, verdict.lost),
        (1, 0, 0),
        "{verdict:?}"
    );
    assert!(
        db::replies(&db)[0].token > token.0,
        "the new holder has a larger token"
    );
    assert_eq!(b_echo.calls.load(Ordering::SeqCst), 1);
}
crate::on_both_backends!(
    a_crashed_holder_is_replaced_after_the_lease_expires,
    super::a_crashed_holder_is_replaced_after_the_lease_expires
);

/// A holder that committed its reply but died before delivering it: the outbox row is
/// delivered by the other dispatcher after the lease expires, without a second model
/// call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_reply_is_delivered_after_its_holder_crashes() {
    let db = temp_db();
    let a_echo = CountingEcho::new(0);
    let a = Node::start(
        &db.path,
        settings(100, 3000, 1500),
        a_echo.clone(),
        Leases::Enforced,
    );
    a.outbound.hang.store(true, Ordering::SeqCst);
    let mut a_events = a.events();

    a.send("c1", "m1", "hello").await;
    wait_event(&mut a_events, Duration::from_secs(10), |e| match e {
        Event::Committed { .. } => Some(()),
        _ => None,
    })
    .await;
    let b_echo = CountingEcho::new(0);
    let b = Node::start(
        &db.path,
        settings(100, 3000, 1500),
        b_echo.clone(),
        Leases::Enforced,
    );
    a.crash();

    let replies = b.outbound.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["m1"]);
    wait_settled(&b, "c1").await;
    assert_eq!(b.outbound.replies().len(), 1);
    assert_eq!(a_echo.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        b_echo.calls.load(Ordering::SeqCst),
        0,
        "recovery delivers, it does not regenerate"
    );
    let verdict = db::check(&db.path);
    assert_eq!(
        (verdict.replies, verdict.duplicates, verdict.lost),
        (1, 0, 0),
        "{verdict:?}"
    );
}

/// A send never outlives the lease that covers it: a send still hanging when another
/// holder takes the conversation over is dropped at the next renewal, and nothing is
/// recorded against the row: it stays as it was for the next holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_send_is_abandoned_when_its_lease_is_lost() {
    let db = temp_db();
    let node = Node::start(
        &db.path,
        settings(100, 3000, 600),
        CountingEcho::new(0),
        Leases::Enforced,
    );
    node.outbound.hang.store(true, Ordering::SeqCst);
    let mut events = node.events();
    node.send("c1", "m1", "hello").await;
    let conversation = wait_event(&mut events, Duration::from_secs(10), |e| match e {
        Event::Committed { conversation, .. } => Some(*conversation),
        _ => None,
    })
    .await;
    // Another holder takes the lease (as after an expiry the holder missed).
    let far = lull_core::clock::Clock::now(&lull_core::clock::SystemClock).0 + 60_000;
    rusqlite::Connection::open(&db.path)
        .unwrap()
        .execute(
            "UPDATE leases SET holder = 'another', token = token + 1, expires_at = ?1
             WHERE conversation_id = ?2",
            rusqlite::params![far, conversation.0],
        )
        .unwrap();
    wait_event(&mut events, Duration::from_secs(5), |e| match e {
        Event::LeaseLost { .. } => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(
        db::count(
            &db.path,
            "SELECT COUNT(*) FROM outbox WHERE attempts = 0 AND sent_at IS NULL AND failed_at IS NULL"
        ),
        1,
        "the row is left as it was, for the next holder"
    );
    assert!(node.outbound.all().is_empty());
}

/// A platform outage: the reply is retried within the round, then deferred with a
/// backoff (no busy loop), and a later reply waits behind it so the outbox order
/// holds. A permanent refusal gives up on that row only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_deliveries_are_deferred_in_order_without_spinning() {
    let db = temp_db();
    let node = Node::start(
        &db.path,
        settings(100, 3000, 3000),
        CountingEcho::new(0),
        Leases::Enforced,
    );
    let mut events = node.events();
    // Four attempts fail within the first round, the fifth in the next one.
    node.outbound
        .fail(5, SendError::Transient("connection reset".into()));
    node.send("c1", "m1", "first").await;
    let deferred_at = Instant::now();
    wait_event(&mut events, Duration::from_secs(10), |e| match e {
        Event::Committed { .. } => Some(()),
        _ => None,
    })
    .await;
    // A second burst is answered while the first reply still waits for the platform.
    tokio::time::sleep(ms(800)).await;
    node.send("c1", "m2", "second").await;
    let replies = node.outbound.wait_replies(2, Duration::from_secs(20)).await;
    assert!(
        deferred_at.elapsed() >= ms(3000),
        "the row was retried with backoff"
    );
    assert_eq!(replies[0].covers, ["m1"], "outbox order holds");
    assert_eq!(replies[1].covers, ["m2"]);
    assert_eq!(node.outbound.attempts.load(Ordering::SeqCst), 7);
    assert_eq!(
        db::count(
            &db.path,
            "SELECT attempts FROM outbox WHERE kind = 'reply' ORDER BY id LIMIT 1"
        ),
        5,
        "every failed attempt is recorded in the row"
    );
    let mut claims = 0;
    while let Ok(event) = events.try_recv() {
        claims += matches!(event, Event::Claimed { .. }) as usize;
    }
    assert!(
        claims <= 6,
        "{claims} rounds: the scheduler must not spin on a deferred row"
    );

    // A permanent refusal drops that row and lets the next one through.
    node.outbound.fail(
        1,
        SendError::Permanent("bot was blocked by the user".into()),
    );
    node.send("c1", "m3", "third").await;
    wait_settled(&node, "c1").await;
    node.send("c1", "m4", "fourth").await;
    let replies = node.outbound.wait_replies(3, Duration::from_secs(10)).await;
    assert_eq!(replies[2].covers, ["m4"]);
    assert_eq!(
        db::count(
            &db.path,
            "SELECT COUNT(*) FROM outbox WHERE failed_at IS NOT NULL"
        ),
        1
    );
}

/// Test 5: a redelivered platform message is stored and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_platform_message_is_counted_once() {
    let db = temp_db();
    let node = Node::start(
        &db.path,
        settings(200, 3000, 3000),
        CountingEcho::new(0),
        Leases::Enforced,
    );
    let first = node.send("c1", "42", "hello").await;
    assert!(
        matches!(first, Accepted::Stored { version, .. } if version.0 == 1),
        "{first:?}"
    );
    assert_eq!(node.send("c1", "42", "hello").await, Accepted::Duplicate);
    let replies = node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    assert!(
        replies[0].text.starts_with("[echo] 1 message:"),
        "{}",
        replies[0].text
    );
    // Redelivered after the reply: still nothing new.
    assert_eq!(node.send("c1", "42", "hello").await, Accepted::Duplicate);
    wait_settled(&node, "c1").await;
    assert_eq!(db::count(&db.path, "SELECT COUNT(*) FROM messages"), 1);
    assert_eq!(db::count(&db.path, "SELECT version FROM conversations"), 1);
    assert_eq!(node.outbound.replies().len(), 1);
}

/// Test 6, at the store: a holder whose lease expired and was taken over cannot
/// commit, and the new holder can.
async fn fencing_refuses_a_commit_from_a_replaced_holder(backend: Backend) {
    let Some(db) = TestDb::new(backend) else {
        return;
    };
    let policy = TimerPolicy::new(ms(10), ms(10_000), 20).unwrap();
    let store = db.open(policy, Leases::Enforced, None).await;
    let conversation = ConversationRef::new(Platform::Http, "c1");
    let clock = lull_core::clock::SystemClock;
    use lull_core::clock::Clock;
    let stored = store
        .ingest(
            NewMessage {
                conversation: conversation.clone(),
                is_group: false,
                message_id: "m1".into(),
                user_id: "u".into(),
                author: "U".into(),
                text: "hi".into(),
                media: Vec::new(),
            },
            &HolderId::new("ingest"),
            clock.now(),
        )
        .await
        .unwrap();
    let id = match stored {
        lull_core::store::IngestOutcome::Stored { conversation, .. } => conversation,
        other => panic!("{other:?}"),
    };
    let key = LeaseKey::Conversation(id);
    let old = store
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &HolderId::new("old"),
            ttl: ms(100),
            now: clock.now(),
        })
        .await
        .unwrap()
        .expect("free lease");
    assert!(
        store
            .claim_lease(LeaseClaim {
                key: &key,
                holder: &HolderId::new("new"),
                ttl: ms(100),
                now: clock.now()
            })
            .await
            .unwrap()
            .is_none(),
        "a live lease cannot be claimed"
    );
    let batch = store.collect(id, 10).await.unwrap();
    tokio::time::sleep(ms(150)).await;
    let new = store
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &HolderId::new("new"),
            ttl: ms(10_000),
            now: clock.now(),
        })
        .await
        .unwrap()
        .expect("expired lease is claimable");
    assert!(new.token > old.token, "fencing tokens only grow");

    let reply = |text: &str| NewReply {
        text: text.into(),
        usage: None,
        llm_ms: 1,
        held_out: Vec::new(),
        memories: Default::default(),
    };
    let refused = store
        .commit_reply(ReplyCommit {
            lease: &old,
            batch: &batch,
            reply: reply("late"),
            now: clock.now(),
        })
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    assert!(matches!(
        store
            .renew_lease(LeaseRenewal {
                lease: &old,
                ttl: ms(100),
                now: clock.now()
            })
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    let batch = store.collect(id, 10).await.unwrap();
    store
        .commit_reply(ReplyCommit {
            lease: &new,
            batch: &batch,
            reply: reply("fresh"),
            now: clock.now(),
        })
        .await
        .unwrap();
    let replies = db::replies(&db);
    assert_eq!(replies.len(), 1);
    assert_eq!(
        (replies[0].text.as_str(), replies[0].token),
        ("fresh", new.token.0)
    );
}
crate::on_both_backends!(
    fencing_refuses_a_commit_from_a_replaced_holder,
    super::fencing_refuses_a_commit_from_a_replaced_holder
);

/// Giving up on a batch, at the store: fenced like a commit; the notice covers the
/// messages still pending up to v0 (not one edited since, not one newer), each
/// message at most once; a newer message keeps its timer and is answered next, and
/// the notice never enters the history. The invariant checker counts a message
/// covered by a delivered give-up notice as answered, and one covered twice as a
/// duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_is_fenced_and_covers_each_message_once() {
    let db = temp_db();
    let policy = TimerPolicy::new(ms(10), ms(10_000), 20).unwrap();
    let store = SqliteStore::open(&db.path, policy).unwrap();
    let conversation = ConversationRef::new(Platform::Http, "c1");
    let clock = lull_core::clock::SystemClock;
    use lull_core::clock::Clock;
    let holder = HolderId::new("ingest");
    let ingest = |id: &'static str| {
        let message = NewMessage {
            conversation: conversation.clone(),
            is_group: false,
            message_id: id.into(),
            user_id: "u".into(),
            author: "U".into(),
            text: format!("text of {id}"),
            media: Vec::new(),
        };
        let (store, holder) = (&store, &holder);
        async move {
            match store.ingest(message, holder, clock.now()).await.unwrap() {
                lull_core::store::IngestOutcome::Stored { conversation, .. } => conversation,
                other => panic!("{other:?}"),
            }
        }
    };
    ingest("m1").await;
    let id = ingest("m2").await;
    let key = LeaseKey::Conversation(id);
    let old = store
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &HolderId::new("old"),
            ttl: ms(100),
            now: clock.now(),
        })
        .await
        .unwrap()
        .unwrap();
    let batch = store.collect(id, 10).await.unwrap();
    assert_eq!(batch.pending.len(), 2);
    // After the batch was collected: m2 is edited, m3 arrives.
    let edit = MessageEdit {
        conversation: conversation.clone(),
        message_id: "m2".into(),
        text: "m2, edited".into(),
    };
    store
        .edit(
            edit,
            StoredBy {
                holder: &holder,
                now: clock.now(),
            },
        )
        .await
        .unwrap();
    ingest("m3").await;
    tokio::time::sleep(ms(150)).await;
    let new = store
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &HolderId::new("new"),
            ttl: ms(10_000),
            now: clock.now(),
        })
        .await
        .unwrap()
        .unwrap();
    let refused = store
        .give_up(GiveUp {
            lease: &old,
            batch: &batch,
            notice: "too long",
            quick_replies: &[],
            now: clock.now(),
        })
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    let notice = store
        .give_up(GiveUp {
            lease: &new,
            batch: &batch,
            notice: "too long",
            quick_replies: &[],
            now: clock.now(),
        })
        .await
        .unwrap()
        .expect("m1 was pending");
    assert_eq!(
        store
            .give_up(GiveUp {
                lease: &new,
                batch: &batch,
                notice: "again",
                quick_replies: &[],
                now: clock.now()
            })
            .await
            .unwrap(),
        None,
        "nothing is given up twice"
    );
    let give_ups = db::give_ups(&db.path);
    assert_eq!(give_ups.len(), 1);
    assert_eq!(
        give_ups[0].covers,
        ["m1"],
        "only what is still pending up to v0"
    );
    assert_eq!(
        db::count(&db.path, "SELECT COUNT(*) FROM timers"),
        1,
        "m2 and m3 keep theirs"
    );
    let outbox = store
        .due_outbox(ConversationAt {
            conversation: id,
            now: clock.now(),
        })
        .await
        .unwrap();
    assert_eq!(
        outbox[0].covers,
        ["m1"],
        "receivers see what the notice ended"
    );

    // The next round answers m2 and m3; the notice is no part of its history.
    let batch = store.collect(id, 10).await.unwrap();
    let pending: Vec<&str> = batch
        .pending
        .iter()
        .map(|m| m.message_id.as_str())
        .collect();
    assert_eq!(pending, ["m2", "m3"]);
    assert!(batch.history.is_empty(), "{:?}", batch.history);
    let reply = NewReply {
        text: "answer".into(),
        usage: None,
        llm_ms: 1,
        held_out: Vec::new(),
        memories: Default::default(),
    };
    let committed = store
        .commit_reply(ReplyCommit {
            lease: &new,
            batch: &batch,
            reply,
            now: clock.now(),
        })
        .await
        .unwrap();
    let lull_core::store::CommitOutcome::Committed { outbox: reply, .. } = committed else {
        panic!("{committed:?}");
    };
    for row in [&notice, &reply] {
        store
            .mark_sent(
                PartSent {
                    outbox: row.id,
                    parts_sent: 1,
                    done: true,
                },
                clock.now(),
            )
            .await
            .unwrap();
    }
    let verdict = db::check(&db.path);
    assert_eq!(
        (
            verdict.replies,
            verdict.give_ups,
            verdict.duplicates,
            verdict.lost,
            verdict.stale
        ),
        (1, 1, 0, 0, 0),
        "{verdict:?}"
    );
    // The checker can fail: a message covered by both a reply and a notice is a
    // duplicate.
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    conn.execute(
        "INSERT INTO reply_covers (outbox_id, message_id)
         SELECT ?1, id FROM messages WHERE platform_message_id = 'm3'",
        [notice.id.0],
    )
    .unwrap();
    assert_eq!(db::check(&db.path).duplicates, 1);
}

/// Test 6, end to end: a holder that believes it still holds its lease (its
/// renewals silently stop reaching the database, like a process frozen by the OS)
/// is replaced; its reply is refused by the fence and only the new holder's reply is
/// delivered.
async fn fencing_stops_a_frozen_holder_end_to_end(backend: Backend) {
    let Some(db) = TestDb::new(backend) else {
        return;
    };
    let ttl = 900;
    let settings = settings(100, 5000, ttl);
    let frozen = Arc::new(FaultPlan::default());
    frozen.freeze_renewals(true);
    let frozen_store = db
        .open(settings.timers, Leases::Enforced, Some(frozen))
        .await;
    let (slow, mut started) = GatedResponder::new();
    let a = Node::start_with_store(frozen_store, settings.clone(), slow.clone());
    let mut a_events = a.events();

    a.send("c1", "m1", "hello").await;
    assert_eq!(started.recv().await, Some(1));
    let b = Node::on(&db, settings, CountingEcho::new(0), Leases::Enforced).await;
    // B takes over once A's lease expires and answers.
    let replies = b.outbound.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["m1"]);
    // A finishes its generation late; the fence refuses its commit.
    slow.open(1);
    wait_event(&mut a_events, Duration::from_secs(10), |e| match e {
        Event::LeaseLost { .. } => Some(()),
        _ => None,
    })
    .await;
    wait_settled(&b, "c1").await;
    assert!(
        a.outbound.replies().is_empty(),
        "the replaced holder delivered nothing"
    );
    let verdict = db::check(&db);
    assert_eq!(
        (
            verdict.replies,
            verdict.duplicates,
            verdict.lost,
            verdict.token_regressions
        ),
        (1, 0, 0, 0),
        "{verdict:?}"
    );
}
crate::on_both_backends!(
    fencing_stops_a_frozen_holder_end_to_end,
    super::fencing_stops_a_frozen_holder_end_to_end
);

/// Wait until a conversation has nothing pending and nothing undelivered.
pub(crate) async fn wait_settled(node: &Node, key: &str) {
    let conversation = ConversationRef::new(Platform::Http, key);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if node
            .dispatcher
            .store()
            .is_settled(&conversation)
            .await
            .unwrap()
            == Some(true)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "conversation {key} did not settle"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

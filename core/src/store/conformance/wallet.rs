//! The wallet's part of the contract: charges that never deadlock, reservations kept in
//! the database (given back when their round was abandoned), and notices that answer
//! the messages of a group member over budget in the commit's transaction.

use super::*;
use crate::store::HeldOut;

/// A group message of `user` in `conversation`.
fn group_message(conversation: &ConversationRef, id: &str, user: &str) -> NewMessage {
    NewMessage {
        is_group: true,
        user_id: user.into(),
        author: format!("Name of {user}"),
        ..message(conversation.clone(), id)
    }
}

/// A charge that is part of a round's reservation.
fn reservation(scopes: Vec<ScopeCharge>, reservation: Reservation) -> TokenCharge {
    TokenCharge {
        reservation,
        ..charge(scopes)
    }
}

/// Budgets: charges of several holders at once that name the same scopes in
/// different orders (a reservation checks the user's and the bot's budgets, a settle
/// checks none) all go through, and none waits for a deadlock to be detected: the
/// rows are locked in one order.
pub async fn charges_naming_their_scopes_in_any_order_never_deadlock(store: &dyn Store) {
    let mut leases = Vec::new();
    for n in 0..8 {
        let by = holder(&format!("h{n}"));
        let (_, lease, _) = round(store, &http(&format!("d{n}")), &by, &["m1"], at(1000)).await;
        leases.push(lease);
    }
    let reserve = charge(vec![
        scope("user:http:u1", 10, Some(1_000_000)),
        scope("conversation:http:d", 10, None),
        scope("bot", 10, Some(1_000_000)),
    ]);
    let settle = TokenCharge {
        hold_until: None,
        ..charge(vec![
            scope("user:http:u1", 10, None),
            scope("conversation:http:d", 10, None),
            scope("bot", 10, None),
        ])
    };
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let results =
            futures_util::future::join_all(leases.iter().enumerate().map(|(n, lease)| {
                let charge = if n % 2 == 0 { &reserve } else { &settle };
                store.charge_tokens(lease, charge, at(1500))
            }))
            .await;
        slowest = slowest.max(started.elapsed());
        for result in results {
            assert_eq!(result.expect("no charge fails"), Charged::Charged);
        }
    }
    assert!(
        slowest < Duration::from_millis(900),
        "a round of charges took {slowest:?}: one waited for deadlock detection (1 s)"
    );
    assert_eq!(
        usage(
            store,
            "2026-12-01",
            &["user:http:u1", "conversation:http:d", "bot"]
        )
        .await,
        [400, 400, 400]
    );
}

/// Budgets: a refused charge without `hold_until` charges nothing and leaves the
/// conversation's timer as it was (the round answers the rest of a group).
pub async fn a_refused_charge_without_a_hold_holds_nothing(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let before = batch.timer.expect("armed");
    let over = TokenCharge {
        hold_until: None,
        ..charge(vec![scope("user:http:u1", 500, Some(100))])
    };
    assert_eq!(
        store.charge_tokens(&lease, &over, at(1100)).await.unwrap(),
        Charged::Over {
            scope: "user:http:u1".into(),
            used: 0,
            limit: 100
        }
    );
    assert_eq!(collect(store, id).await.timer, Some(before), "not held");
    assert_eq!(usage(store, "2026-12-01", &["user:http:u1"]).await, [0]);
}

/// Budgets: every reservation expires. A reservation whose round never settled (its
/// lease lost, a stop, a crash) is given back when the conversation is next claimed,
/// on the day it was made, whatever day the claim falls on; what was spent apart
/// from it stays, and nothing is given back twice.
pub async fn an_abandoned_reservation_is_given_back_at_the_next_claim_on_its_day(
    store: &dyn Store,
) {
    let (a, b, c) = (holder("a"), holder("b"), holder("c"));
    let (id, lease, _) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let spent = charge(vec![
        scope("user:http:u1", 100, None),
        scope("bot", 100, None),
    ]);
    store.charge_tokens(&lease, &spent, at(1000)).await.unwrap();
    let reserved = reservation(
        vec![
            scope("user:http:u1", 500, Some(1000)),
            scope("bot", 500, Some(5000)),
        ],
        Reservation::Reserve,
    );
    assert_eq!(
        store
            .charge_tokens(&lease, &reserved, at(1100))
            .await
            .unwrap(),
        Charged::Charged
    );
    let next_day = TokenCharge {
        day: "2026-12-02".into(),
        ..charge(vec![scope("bot", 50, None)])
    };
    store
        .charge_tokens(&lease, &next_day, at(1100))
        .await
        .unwrap();
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [600, 600]
    );

    // The holder is gone; the next claim (a day later) gives the reservation back.
    let later = lease.expires_at.plus(Duration::from_secs(86_400));
    let claimed = store
        .claim_round(id, &b, TTL, 10, later)
        .await
        .unwrap()
        .expect("the lease expired");
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [100, 100],
        "given back on the day it was reserved for"
    );
    assert_eq!(usage(store, "2026-12-02", &["bot"]).await, [50]);

    store
        .release_lease(&claimed.lease, None, later)
        .await
        .unwrap();
    store
        .claim_round(id, &c, TTL, 10, later)
        .await
        .unwrap()
        .expect("released");
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [100, 100],
        "nothing is given back twice"
    );
}

/// Budgets: a settled reservation is what was spent; the next claim gives nothing
/// back.
pub async fn a_settled_reservation_is_not_given_back(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, _) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let reserved = reservation(
        vec![scope("user:http:u1", 500, Some(1000))],
        Reservation::Reserve,
    );
    store
        .charge_tokens(&lease, &reserved, at(1100))
        .await
        .unwrap();
    let settled = reservation(vec![scope("user:http:u1", -300, None)], Reservation::Settle);
    store
        .charge_tokens(&lease, &settled, at(1200))
        .await
        .unwrap();
    assert_eq!(usage(store, "2026-12-01", &["user:http:u1"]).await, [200]);
    store
        .claim_round(id, &b, TTL, 10, lease.expires_at)
        .await
        .unwrap()
        .expect("the lease expired");
    assert_eq!(usage(store, "2026-12-01", &["user:http:u1"]).await, [200]);
}

/// The batch of `batch` without the messages of `user`, and the notice that answers
/// those instead.
fn without(batch: &Batch, user: &str) -> (Batch, HeldOut) {
    let (theirs, rest): (Vec<_>, Vec<_>) = batch
        .pending
        .iter()
        .cloned()
        .partition(|m| m.user_id == user);
    let held = HeldOut {
        rows: theirs.iter().map(|m| m.row).collect(),
        text: format!("{user}: not enough left"),
        reply_to: theirs.last().map(|m| m.message_id.clone()),
    };
    (
        Batch {
            pending: rest,
            ..batch.clone()
        },
        held,
    )
}

/// No loss, no duplicate, one member over budget: a reply that leaves a member's
/// messages out stores, in its transaction, the notice that covers them; the batch is
/// answered, every message covered once, and the notice follows the reply.
pub async fn held_out_messages_are_covered_by_their_notice_with_the_reply(store: &dyn Store) {
    let a = holder("a");
    let group = http("g1");
    let mut id = None;
    for (n, (message_id, user)) in (0..).zip([("m1", "u1"), ("m2", "u2"), ("m3", "u1")]) {
        let message = group_message(&group, message_id, user);
        id = Some(stored(store, message, &a, at(100 * n)).await.0);
    }
    let id = id.unwrap();
    let lease = claimed(store, id, &a, at(1100)).await;
    let batch = collect(store, id).await;
    let (answered, held) = without(&batch, "u1");
    let outcome = store
        .commit_reply(
            &lease,
            &answered,
            NewReply {
                held_out: vec![held],
                ..reply("answer to u2")
            },
            at(1200),
        )
        .await
        .unwrap();
    let CommitOutcome::Committed {
        outbox, notices, ..
    } = outcome
    else {
        panic!("committed: {outcome:?}");
    };
    assert_eq!(outbox.covers, ["m2"]);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        (
            notices[0].kind,
            notices[0].text.as_str(),
            notices[0].reply_to.as_deref()
        ),
        (OutboxKind::Notice, "u1: not enough left", Some("m3"))
    );
    assert_eq!(notices[0].covers, ["m1", "m3"]);
    let rows = store.due_outbox(id, at(1200)).await.unwrap();
    let ids: Vec<OutboxId> = rows.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        [outbox.id, notices[0].id],
        "the notice follows the reply"
    );
    let next = collect(store, id).await;
    assert!(pending_ids(&next).is_empty(), "every message is answered");
    assert_eq!(next.timer, None);
}

/// A stale reply stores none of its held-out notices: the member's messages stay
/// pending with the rest, for the next round to decide again.
pub async fn a_stale_reply_stores_no_held_out_notice(store: &dyn Store) {
    let a = holder("a");
    let group = http("g1");
    let mut id = None;
    for (n, (message_id, user)) in (0..).zip([("m1", "u1"), ("m2", "u2")]) {
        let message = group_message(&group, message_id, user);
        id = Some(stored(store, message, &a, at(100 * n)).await.0);
    }
    let id = id.unwrap();
    let lease = claimed(store, id, &a, at(1100)).await;
    let batch = collect(store, id).await;
    stored(store, group_message(&group, "m3", "u2"), &a, at(1150)).await;
    let (answered, held) = without(&batch, "u1");
    let outcome = store
        .commit_reply(
            &lease,
            &answered,
            NewReply {
                held_out: vec![held],
                ..reply("stale")
            },
            at(1200),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, CommitOutcome::Stale { .. }),
        "{outcome:?}"
    );
    assert!(store.due_outbox(id, at(1200)).await.unwrap().is_empty());
    assert_eq!(pending_ids(&collect(store, id).await), ["m1", "m2", "m3"]);
}

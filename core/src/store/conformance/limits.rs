//! Conformance of the limits area: the rate hold, the token wallet (charges that never
//! deadlock, reservations kept in the database, notices for members over budget), and
//! access decisions.

use std::time::Duration;

use super::{
    TTL, at, claimed, collect, due, holder, http, lost, message, ms, owed, pending_ids, query,
    release, reply, round, stored,
};
use crate::access::SubjectKind;
use crate::domain::{ConversationId, ConversationRef, Lease, OutboxId, Platform, Timestamp};
use crate::store::{
    AccessRule, BUSY_RETRY, Batch, Charged, CommitOutcome, ContextReset, HeldOut, IngestOutcome,
    LeaseCharge, MessageEdit, NewMessage, NewReply, OutboxKind, Period, RateCheck, RateHold,
    RateWindow, ReplyCommit, Reservation, RoundClaim, ScopeCharge, Store, StoreError, StoredBy,
    Subject, TokenCharge, Unit, Used,
};

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
    assert_eq!(rate_hold(store, id1, "u1", rate, at(0)).await, None);
    let (id2, _, _) = stored(store, message(c2.clone(), "m2"), &a, at(1000)).await;
    assert_eq!(
        rate_hold(store, id2, "u1", rate, at(1000)).await,
        None,
        "two messages are within a limit of two"
    );
    let mut other = message(c1.clone(), "m-other");
    other.user_id = "u2".into();
    stored(store, other, &a, at(1500)).await;
    assert_eq!(
        rate_hold(store, id1, "u2", rate, at(1500)).await,
        None,
        "another user counts apart"
    );
    let (_, _, _) = stored(store, message(c1.clone(), "m3"), &a, at(2000)).await;
    let hold = rate_hold(store, id1, "u1", rate, at(2000)).await;
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
        rate_hold(store, id1, "u1", rate, at(3000)).await,
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
    store
        .reset_context(ContextReset {
            conversation: &c1,
            is_group: false,
            holder: &a,
            now: at(3500),
        })
        .await
        .unwrap();
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
        rate_hold(store, id3, "u1", rate, at(4000)).await,
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
    let hold = async |now: Timestamp| rate_hold(store, id, "u1", rate, now).await;
    assert!(matches!(
        store
            .edit(
                edit("first edit"),
                StoredBy {
                    holder: &a,
                    now: at(100)
                }
            )
            .await
            .unwrap(),
        IngestOutcome::Stored { .. }
    ));
    assert_eq!(hold(at(100)).await, None, "a message and an edit: two");
    assert_eq!(
        store
            .edit(
                edit("first edit"),
                StoredBy {
                    holder: &a,
                    now: at(150)
                }
            )
            .await
            .unwrap(),
        IngestOutcome::EditIgnored
    );
    assert_eq!(
        hold(at(150)).await,
        None,
        "an ignored edit counts for nothing"
    );
    assert!(matches!(
        store
            .edit(
                edit("second edit"),
                StoredBy {
                    holder: &a,
                    now: at(200)
                }
            )
            .await
            .unwrap(),
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

/// The rate hold after a message of `user_id` was stored in `conversation` at `now`.
async fn rate_hold(
    store: &dyn Store,
    conversation: ConversationId,
    user_id: &str,
    rate: RateWindow,
    now: Timestamp,
) -> Option<RateHold> {
    let check = RateCheck {
        conversation,
        user_id,
        rate,
        now,
    };
    store
        .hold_over_rate(check)
        .await
        .expect("applying the rate limit")
}

/// `charge` under `lease` at `now`.
async fn charged(
    store: &dyn Store,
    lease: &Lease,
    charge: &TokenCharge,
    now: Timestamp,
) -> Result<Charged, StoreError> {
    store
        .charge_tokens(LeaseCharge { lease, charge, now })
        .await
}

fn scope(name: &str, tokens: i64, limit: Option<u64>) -> ScopeCharge {
    ScopeCharge::tokens(name, tokens, limit)
}

fn charge(scopes: Vec<ScopeCharge>) -> TokenCharge {
    TokenCharge {
        day: "2026-12-01".into(),
        scopes,
        hold_until: Some(at(86_400_000)),
        reservation: Reservation::None,
    }
}

pub(super) async fn usage(store: &dyn Store, day: &str, scopes: &[&str]) -> Vec<u64> {
    spending(store, day, scopes)
        .await
        .into_iter()
        .map(|u| u.tokens)
        .collect()
}

/// What `scopes` used on `day` (or in a month, `2026-12`), tokens and dollars.
pub(super) async fn spending(store: &dyn Store, day: &str, scopes: &[&str]) -> Vec<Used> {
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
        charged(store, &lease, &first, at(1000)).await.unwrap(),
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
        charged(store, &lease, &over, at(1100)).await.unwrap(),
        Charged::Over {
            scope: "user:http:u1".into(),
            used: 600,
            limit: 1000,
            unit: Unit::Tokens,
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
        charged(store, &lease, &give_back, at(1200)).await.unwrap(),
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
        charged(store, &lease, &first, lease.expires_at.plus(ms(1))).await,
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
            .map(|lease| charged(store, lease, &each, at(1500))),
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
                charged(store, lease, charge, at(1500))
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
        charged(store, &lease, &over, at(1100)).await.unwrap(),
        Charged::Over {
            scope: "user:http:u1".into(),
            used: 0,
            limit: 100,
            unit: Unit::Tokens,
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
    charged(store, &lease, &spent, at(1000)).await.unwrap();
    let reserved = reservation(
        vec![
            scope("user:http:u1", 500, Some(1000)),
            scope("bot", 500, Some(5000)),
        ],
        Reservation::Reserve,
    );
    assert_eq!(
        charged(store, &lease, &reserved, at(1100)).await.unwrap(),
        Charged::Charged
    );
    let next_day = TokenCharge {
        day: "2026-12-02".into(),
        ..charge(vec![scope("bot", 50, None)])
    };
    charged(store, &lease, &next_day, at(1100)).await.unwrap();
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [600, 600]
    );

    // The holder is gone; the next claim (a day later) gives the reservation back.
    let later = lease.expires_at.plus(Duration::from_secs(86_400));
    let claimed = store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &b,
            ttl: TTL,
            history: 10,
            summaries: true,
            now: later,
        })
        .await
        .unwrap()
        .expect("the lease expired");
    assert_eq!(
        usage(store, "2026-12-01", &["user:http:u1", "bot"]).await,
        [100, 100],
        "given back on the day it was reserved for"
    );
    assert_eq!(usage(store, "2026-12-02", &["bot"]).await, [50]);

    release(store, &claimed.lease, later).await;
    store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &c,
            ttl: TTL,
            history: 10,
            summaries: true,
            now: later,
        })
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
    charged(store, &lease, &reserved, at(1100)).await.unwrap();
    let settled = reservation(vec![scope("user:http:u1", -300, None)], Reservation::Settle);
    charged(store, &lease, &settled, at(1200)).await.unwrap();
    assert_eq!(usage(store, "2026-12-01", &["user:http:u1"]).await, [200]);
    store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &b,
            ttl: TTL,
            history: 10,
            summaries: true,
            now: lease.expires_at,
        })
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
        .commit_reply(ReplyCommit {
            lease: &lease,
            batch: &answered,
            reply: NewReply {
                held_out: vec![held],
                ..reply("answer to u2")
            },
            now: at(1200),
        })
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
    let rows = owed(store, id, at(1200)).await;
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
        .commit_reply(ReplyCommit {
            lease: &lease,
            batch: &answered,
            reply: NewReply {
                held_out: vec![held],
                ..reply("stale")
            },
            now: at(1200),
        })
        .await
        .unwrap();
    assert!(
        matches!(outcome, CommitOutcome::Stale { .. }),
        "{outcome:?}"
    );
    assert!(owed(store, id, at(1200)).await.is_empty());
    assert_eq!(pending_ids(&collect(store, id).await), ["m1", "m2", "m3"]);
}

/// A scope charging `tokens` and `cost` nano-dollars, with a dollar limit.
fn priced(
    name: &str,
    period: Period,
    tokens: i64,
    cost: i64,
    cost_limit: Option<u64>,
) -> ScopeCharge {
    ScopeCharge {
        period,
        cost,
        cost_limit,
        ..ScopeCharge::tokens(name, tokens, None)
    }
}

/// Money: dollars are charged beside tokens, each budget against its own total, the
/// bot's month on its own row (`2026-12`, read back by month and not among the days);
/// a charge past a dollar budget adds nothing and says which; an abandoned round's
/// reserved dollars are given back at the next claim, from the month's row too; six
/// concurrent charges fit a dollar budget exactly as tokens do.
pub async fn dollars_are_charged_checked_and_given_back_like_tokens(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, _) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let reserve = |cost: i64| {
        reservation(
            vec![
                priced("user:http:u1", Period::Day, 10, cost, Some(1_000)),
                priced("month:bot", Period::Month, 10, cost, Some(5_000)),
            ],
            Reservation::Reserve,
        )
    };
    assert_eq!(
        charged(store, &lease, &reserve(600), at(1000))
            .await
            .unwrap(),
        Charged::Charged
    );
    assert_eq!(
        charged(store, &lease, &reserve(500), at(1100))
            .await
            .unwrap(),
        Charged::Over {
            scope: "user:http:u1".into(),
            used: 600,
            limit: 1_000,
            unit: Unit::Usd,
        },
        "600 + 500 nano-dollars pass a budget of 1000"
    );
    let used = spending(store, "2026-12", &["month:bot"]).await;
    assert_eq!(
        (used[0].tokens, used[0].cost.0),
        (10, 600),
        "the month's row"
    );
    assert_eq!(
        spending(store, "2026-12-01", &["month:bot", "user:http:u1"]).await[1]
            .cost
            .0,
        600
    );
    let between = store
        .usage_between(
            "2026-12-01",
            "2026-12-31",
            &["user:http:u1".into(), "month:bot".into()],
        )
        .await
        .unwrap();
    assert_eq!(
        (between[0].cost.0, between[1].cost.0),
        (600, 0),
        "a range of days sums the days and never reads a month's row"
    );

    // The round is abandoned: the next claim gives back its dollars, month included.
    let later = lease.expires_at.plus(Duration::from_secs(60));
    store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &b,
            ttl: TTL,
            history: 10,
            summaries: true,
            now: later,
        })
        .await
        .unwrap()
        .expect("the lease expired");
    let used = spending(store, "2026-12-01", &["user:http:u1"]).await;
    assert_eq!(used[0].cost.0, 0, "the reserved dollars are given back");
    assert_eq!(
        spending(store, "2026-12", &["month:bot"]).await[0].cost.0,
        0
    );

    // Six charges of 400 at once against a month's budget of 1000: two fit.
    let mut leases = Vec::new();
    for n in 0..6 {
        let by = holder(&format!("m{n}"));
        let (_, lease, _) = round(store, &http(&format!("d{n}")), &by, &["m1"], at(1000)).await;
        leases.push(lease);
    }
    let each = charge(vec![priced(
        "month:bot",
        Period::Month,
        1,
        400,
        Some(1_000),
    )]);
    let results = futures_util::future::join_all(
        leases
            .iter()
            .map(|lease| charged(store, lease, &each, at(1500))),
    )
    .await;
    let fitted = results
        .into_iter()
        .filter(|r| matches!(r, Ok(Charged::Charged)))
        .count();
    assert_eq!(fitted, 2, "two charges of 400 fit a budget of 1000");
    assert_eq!(
        spending(store, "2026-12", &["month:bot"]).await[0].cost.0,
        800
    );
}

/// Budgets: a reservation refused only because another round's reservation is not
/// settled yet is `Busy`, not over: nothing is charged and the conversation waits
/// [`BUSY_RETRY`], not until the budget resets; once the other settles for less, it
/// fits. A budget truly spent is still `Over`.
pub async fn a_reservation_crowded_out_by_open_reservations_waits_a_moment(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (_, first, _) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let (id, second, _) = round(store, &http("c2"), &b, &["m1"], at(1000)).await;
    let reserve = |tokens| {
        reservation(
            vec![scope("user:http:u1", tokens, Some(1000))],
            Reservation::Reserve,
        )
    };
    assert_eq!(
        charged(store, &first, &reserve(600), at(1000))
            .await
            .unwrap(),
        Charged::Charged
    );
    assert_eq!(
        charged(store, &second, &reserve(600), at(1100))
            .await
            .unwrap(),
        Charged::Busy {
            scope: "user:http:u1".into()
        }
    );
    assert_eq!(usage(store, "2026-12-01", &["user:http:u1"]).await, [600]);
    let timer = collect(store, id).await.timer.expect("armed");
    assert_eq!(
        timer.due_at,
        at(1100).plus(BUSY_RETRY),
        "held a moment, not until the budget resets"
    );
    // The first settles for 300 of its 600: the second fits now.
    let settle = reservation(vec![scope("user:http:u1", -300, None)], Reservation::Settle);
    charged(store, &first, &settle, at(1200)).await.unwrap();
    assert_eq!(
        charged(store, &second, &reserve(600), at(1300))
            .await
            .unwrap(),
        Charged::Charged
    );
    // 900 of 1000 used or reserved, and the second's own reservation does not count
    // as another's: a third 600 is over, the budget's own verdict.
    assert!(matches!(
        charged(store, &second, &reserve(600), at(1400))
            .await
            .unwrap(),
        Charged::Over { used: 900, .. }
    ));
}

//! Conformance of the outbox area: delivery order, the row's stored time, and the
//! quick replies a notice is stored with.

use lull_port::QuickReply;

use super::{TTL, at, committed, holder, http, mark, message, owed, release, reply, round, stored};
use crate::domain::Timestamp;
use crate::store::{
    CommitOutcome, ConversationAt, Enqueue, NewNotice, OutboxDeferral, OutboxFailure, OutboxKind,
    OutboxRow, ReplyCommit, RoundClaim, Store,
};

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
        quick_replies: Vec::new(),
        dedupe_key: key.into(),
    };
    assert!(
        store
            .enqueue_notice(Enqueue {
                notice: notice("first", "k1"),
                holder: &a,
                now: at(10)
            })
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .enqueue_notice(Enqueue {
                notice: notice("first", "k1"),
                holder: &a,
                now: at(15)
            })
            .await
            .unwrap()
            .is_none(),
        "at most one notice per key"
    );
    assert!(
        store
            .enqueue_notice(Enqueue {
                notice: notice("second", "k2"),
                holder: &a,
                now: at(20)
            })
            .await
            .unwrap()
            .is_some()
    );
    let texts =
        |rows: &[OutboxRow]| -> Vec<String> { rows.iter().map(|r| r.text.clone()).collect() };
    let rows = owed(store, id, at(20)).await;
    assert_eq!(texts(&rows), ["first", "second"]);
    assert!(
        rows.iter()
            .all(|r| r.kind == OutboxKind::Notice && r.covers.is_empty())
    );
    let (first, second) = (rows[0].id, rows[1].id);

    store
        .defer_outbox(OutboxDeferral {
            id: first,
            retry_at: at(1000),
            error: "timed out",
            now: at(20),
        })
        .await
        .unwrap();
    assert!(
        owed(store, id, at(999)).await.is_empty(),
        "the head waits for its retry, and the rows behind it wait too"
    );
    let rows = owed(store, id, at(1000)).await;
    assert_eq!(texts(&rows), ["first", "second"]);
    assert_eq!(rows[0].attempts, 1, "the failed attempt is counted");

    mark(store, first, 2, false, at(1000)).await;
    mark(store, first, 1, false, at(1001)).await;
    let rows = owed(store, id, at(1001)).await;
    assert_eq!(rows[0].parts_sent, 2, "parts sent never go backwards");
    mark(store, first, 3, true, at(1002)).await;
    store
        .defer_outbox(OutboxDeferral {
            id: first,
            retry_at: at(9000),
            error: "late",
            now: at(1002),
        })
        .await
        .unwrap();
    store
        .fail_outbox(OutboxFailure {
            id: first,
            error: "late",
            now: at(1003),
        })
        .await
        .unwrap();
    let rows = owed(store, id, at(1003)).await;
    assert_eq!(texts(&rows), ["second"], "a sent row is done");

    store
        .fail_outbox(OutboxFailure {
            id: second,
            error: "refused",
            now: at(1004),
        })
        .await
        .unwrap();
    store
        .defer_outbox(OutboxDeferral {
            id: second,
            retry_at: at(1005),
            error: "again",
            now: at(1004),
        })
        .await
        .unwrap();
    assert!(
        owed(store, id, at(10_000)).await.is_empty(),
        "a given-up row is never tried again"
    );
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
        .commit_reply(ReplyCommit {
            lease: &lease,
            batch: &batch,
            reply: reply("answer"),
            now: at(1000),
        })
        .await
    {
        Ok(CommitOutcome::Committed { outbox, .. }) => outbox,
        other => panic!("the reply was not committed: {other:?}"),
    };
    let stored_at = outbox.stored_at;
    release(store, &lease, at(1000)).await;
    let mut reads = vec![("commit_reply", outbox)];
    let due_outbox = async |now: Timestamp| {
        let rows = store
            .due_outbox(ConversationAt {
                conversation: id,
                now,
            })
            .await
            .expect("reading the outbox");
        assert_eq!(rows.len(), 1, "the reply is owed at {now:?}: {rows:?}");
        rows.into_iter().next().unwrap()
    };
    reads.push(("due_outbox", due_outbox(at(1000)).await));
    // A failed attempt (its retry due at once); the retry reads the row again.
    store
        .defer_outbox(OutboxDeferral {
            id: reads[0].1.id,
            retry_at: at(3000),
            error: "timed out",
            now: at(3000),
        })
        .await
        .unwrap();
    reads.push(("due_outbox after a retry", due_outbox(at(3000)).await));
    let claimed = store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &b,
            ttl: TTL,
            history: 10,
            summaries: true,
            now: at(900_000),
        })
        .await
        .unwrap()
        .expect("the lease was released");
    assert_eq!(claimed.owed.len(), 1, "{:?}", claimed.owed);
    reads.push(("claim_round", claimed.owed[0].clone()));
    release(store, &claimed.lease, at(900_000)).await;
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

/// A notice is stored with the quick replies it offers, in their order, and every read
/// of the row (the row `enqueue_notice` returns, `due_outbox`, a claim's owed rows)
/// hands them back as they were given; a notice offering none and a reply have none.
pub async fn a_notice_keeps_its_quick_replies(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(0)).await;
    let offered = vec![
        QuickReply {
            label: "Approve".into(),
            text: "/approve 12".into(),
        },
        QuickReply {
            label: "a \"quoted\" ünïcode label".into(),
            text: "/cancel 12".into(),
        },
    ];
    let notice = |key: &str, quick_replies: Vec<QuickReply>| NewNotice {
        conversation: c1.clone(),
        is_group: false,
        text: "I'd like to run t. Answer /approve 12 or /cancel 12.".into(),
        reply_to: None,
        quick_replies,
        dedupe_key: key.into(),
    };
    for (key, quick_replies) in [("asks", offered.clone()), ("tells", Vec::new())] {
        let queued = store
            .enqueue_notice(Enqueue {
                notice: notice(key, quick_replies.clone()),
                holder: &a,
                now: at(10),
            })
            .await
            .unwrap()
            .expect("queued");
        assert_eq!(queued.quick_replies, quick_replies, "{key}");
    }
    committed(store, &lease, &batch, "answer", at(20)).await;
    release(store, &lease, at(20)).await;
    let offers = |rows: &[OutboxRow]| -> Vec<Vec<QuickReply>> {
        rows.iter().map(|r| r.quick_replies.clone()).collect()
    };
    let expected = vec![offered.clone(), Vec::new(), Vec::new()];
    let rows = owed(store, id, at(30)).await;
    assert_eq!(rows[2].kind, OutboxKind::Reply);
    assert_eq!(offers(&rows), expected, "due_outbox");
    let claimed = store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &b,
            ttl: TTL,
            history: 10,
            summaries: true,
            now: at(40),
        })
        .await
        .unwrap()
        .expect("the lease was released");
    assert_eq!(offers(&claimed.owed), expected, "claim_round");
}

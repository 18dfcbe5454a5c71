//! Conformance of the rounds area: the claim, the final check, the cap, give-ups,
//! transcripts, failures.

use lull_port::{Media, MediaKind};

use super::{
    TTL, at, claimed, collect, committed, due, holder, http, message, ms, owed, pending_ids, query,
    release, reply, round, stale, stored,
};
use crate::domain::{LeaseKey, Said, Version};
use crate::store::{
    CommitOutcome, ContextReset, Exchange, GiveUp, IdleDisarm, LeaseClaim, MessageEdit, NewMessage,
    OutboxDeferral, OutboxKind, ReplyCommit, RoundClaim, RoundFailure, Store, StoreError, StoredBy,
    TranscriptWrite,
};

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
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &a,
            ttl: TTL,
            now: at(100),
        })
        .await
        .unwrap()
        .unwrap();
    // The lease expires and b takes over: a's late write is fenced off.
    let new = store
        .claim_lease(LeaseClaim {
            key: &key,
            holder: &b,
            ttl: TTL,
            now: at(100).plus(TTL),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store
            .store_transcript(TranscriptWrite {
                lease: &old,
                message: row,
                transcript: "from a",
                now: at(100).plus(TTL)
            })
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    let now = at(200).plus(TTL);
    assert!(
        store
            .store_transcript(TranscriptWrite {
                lease: &new,
                message: row,
                transcript: "hello there",
                now
            })
            .await
            .unwrap()
    );
    assert!(
        !store
            .store_transcript(TranscriptWrite {
                lease: &new,
                message: row,
                transcript: "again",
                now
            })
            .await
            .unwrap(),
        "stored once"
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.pending[0].transcript.as_deref(), Some("hello there"));
    assert_eq!(batch.pending[0].said(), "[voice message]: hello there");
    assert_eq!(batch.pending[0].media[0].duration_secs, Some(3));
    let committed = store
        .commit_reply(ReplyCommit {
            lease: &new,
            batch: &batch,
            reply: reply("hi"),
            now,
        })
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
    let rows = owed(store, id, at(1200)).await;
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
                Said::new("Ann", "text of m1."),
                Said::new("Ann", "text of m2.")
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
    assert!(owed(store, id, at(1300)).await.is_empty());
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m1", "m2"]);
    assert!(next.timer.is_some(), "the timer stays armed");
    committed(store, &lease, &next, "both", at(1400)).await;
    let rows = owed(store, id, at(1400)).await;
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
    assert_eq!(owed(store, id, at(4000)).await[0].id, outbox);
    assert_eq!(owed(store, id, at(4000)).await[0].covers, ["m1"]);
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
    store
        .edit(
            edit("m2, edited"),
            StoredBy {
                holder: &a,
                now: at(3000),
            },
        )
        .await
        .unwrap();
    let (_, forced) = committed(store, &lease, &batch, "forced", at(4000)).await;
    assert!(forced);
    assert_eq!(owed(store, id, at(4000)).await[0].covers, ["m1"]);
    let next = collect(store, id).await;
    assert_eq!(pending_ids(&next), ["m2"]);
    assert_eq!(next.pending[0].text, "m2, edited");

    store
        .edit(
            edit("m2, again"),
            StoredBy {
                holder: &a,
                now: at(4100),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        stale(store, &lease, &next, at(4200)).await,
        Version(4),
        "every collected message was edited since"
    );
}

/// Giving up covers every message still pending up to `v0`, each at most once, as a
/// notice that never enters the history, with the quick replies it offers; a newer
/// message keeps its timer.
pub async fn giving_up_covers_each_message_once(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1100)).await;
    stored(store, message(c1, "m3"), &a, at(1200)).await;
    let approve = [lull_port::QuickReply {
        label: "Approve".into(),
        text: "/approve 4".into(),
    }];
    let notice = store
        .give_up(GiveUp {
            lease: &lease,
            batch: &batch,
            notice: "too long",
            quick_replies: &approve,
            now: at(1300),
        })
        .await
        .unwrap()
        .expect("m1 and m2 were pending");
    assert_eq!(
        store
            .give_up(GiveUp {
                lease: &lease,
                batch: &batch,
                notice: "again",
                quick_replies: &[],
                now: at(1300)
            })
            .await
            .unwrap(),
        None,
        "nothing is given up twice"
    );
    let rows = owed(store, id, at(1300)).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0], notice, "give_up returns the row it stored");
    assert_eq!(rows[0].kind, OutboxKind::Notice);
    assert_eq!(
        (rows[0].text.as_str(), rows[0].reply_to.as_deref()),
        ("too long", Some("m2"))
    );
    assert_eq!(rows[0].covers, ["m1", "m2"]);
    assert_eq!(rows[0].quick_replies, approve);
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
        .disarm_idle_timer(IdleDisarm {
            lease: &lease,
            v0: batch.v0,
            now: at(1000),
        })
        .await
        .unwrap();
    assert!(collect(store, id).await.timer.is_some());
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
        .defer_outbox(OutboxDeferral {
            id: reply,
            retry_at: at(5000),
            error: "timed out",
            now: at(1000),
        })
        .await
        .unwrap();
    release(store, &lease, at(1000)).await;
    stored(store, message(c1.clone(), "m2"), &a, at(1100)).await;

    let claimed = store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &b,
            ttl: ms(3000),
            history: 10,
            summaries: true,
            now: at(2000),
        })
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
            .claim_round(RoundClaim {
                conversation: id,
                holder: &a,
                ttl: ms(3000),
                history: 10,
                summaries: true,
                now: at(2001)
            })
            .await
            .unwrap()
            .is_none(),
        "exclusive: a live lease refuses another claim"
    );
    release(store, &claimed.lease, at(2002)).await;
    let later = store
        .claim_round(RoundClaim {
            conversation: id,
            holder: &a,
            ttl: ms(3000),
            history: 10,
            summaries: true,
            now: at(5000),
        })
        .await
        .unwrap()
        .expect("released");
    assert!(
        later.lease.token > claimed.lease.token,
        "fencing tokens grow"
    );
    assert_eq!(later.owed, owed(store, id, at(5000)).await);
    assert_eq!(later.owed.len(), 1);
    assert_eq!(later.owed[0].id, reply);
    assert!(!later.held_back);
}

/// A failed generation backs the timer off (a new message does not cut the backoff
/// short); `/reset` clears the backoff, makes the timer due now for the holder that
/// took the command, and hides the earlier exchanges from the history.
pub async fn failures_back_off_and_reset_starts_afresh(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(1000)).await;
    committed(store, &lease, &batch, "answer", at(1000)).await;
    release(store, &lease, lease.expires_at).await;

    stored(store, message(c1.clone(), "m2"), &a, at(2000)).await;
    let lease = claimed(store, id, &a, at(3000)).await;
    assert_eq!(collect(store, id).await.history.len(), 1);
    let retry_at = at(60_000);
    assert_eq!(
        store
            .record_failure(RoundFailure {
                lease: &lease,
                retry_at,
                now: at(3000)
            })
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .record_failure(RoundFailure {
                lease: &lease,
                retry_at,
                now: at(3100)
            })
            .await
            .unwrap(),
        2
    );
    release(store, &lease, lease.expires_at).await;
    let (_, _, due_at) = stored(store, message(c1.clone(), "m3"), &a, at(3200)).await;
    assert_eq!(
        due_at, retry_at,
        "a new message does not cut the backoff short"
    );
    let timer = collect(store, id).await.timer.expect("armed");
    assert_eq!((timer.due_at, timer.attempts), (retry_at, 2));

    store
        .reset_context(ContextReset {
            conversation: &c1,
            is_group: false,
            holder: &b,
            now: at(4000),
        })
        .await
        .unwrap();
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

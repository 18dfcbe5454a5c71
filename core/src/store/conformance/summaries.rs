//! Conformance of the summaries area: a summary is stored under its lease only if it
//! covers more, in the same context, and a round reads it with the exchanges after
//! it; retention removes old texts of answered messages and delivered replies only.

use super::{at, claim, committed, holder, http, mark, release, round, stored};
use crate::domain::{ConversationId, LeaseKey, Timestamp};
use crate::store::{Expiry, NewSummary, RoundClaim, Store, SummaryStored};

/// A conversation of three committed exchanges (m1, m2, m3), each delivered at
/// `at(2_000 + n)`; its id.
async fn three_exchanges(store: &dyn Store, key: &str) -> ConversationId {
    let chat = http(key);
    let by = holder("p1");
    let mut id = None;
    for (n, m) in ["m1", "m2", "m3"].into_iter().enumerate() {
        let t = 1_000 * (n as u64 + 1) * 10;
        let (conversation, lease, batch) = round(store, &chat, &by, &[m], at(t)).await;
        let (outbox, _) = committed(store, &lease, &batch, &format!("reply {m}"), at(t + 1)).await;
        mark(store, outbox, 1, true, at(t + 2)).await;
        release(store, &lease, at(t + 3)).await;
        id = Some(conversation);
    }
    id.expect("three rounds")
}

fn summary_of(
    conversation: ConversationId,
    picture: &crate::store::SummaryPicture,
    n: usize,
) -> NewSummary {
    let last = &picture.exchanges[n - 1];
    NewSummary {
        conversation,
        context_version: picture.context_version,
        through_reply: last.reply,
        through_message: last.newest_message,
        through_at: last.newest_at,
        messages: n as u64,
        text: format!("summary of {n}"),
        model: "m".into(),
        usage: None,
        picture_newest_message: last.newest_message,
    }
}

/// Stored only under its lease, only if it covers more, never after a `/new`; a
/// round then reads it and the exchanges after it only.
pub async fn a_summary_is_stored_under_its_lease_only_if_it_covers_more(store: &dyn Store) {
    let conversation = three_exchanges(store, "sum-1").await;
    let key = LeaseKey::Summary(conversation);
    let picture = store
        .summary_picture(conversation, 100)
        .await
        .expect("picture");
    assert_eq!(picture.exchanges.len(), 3);
    assert_eq!(picture.previous, None);
    let lease = claim(store, &key, &holder("p1"), at(100_000))
        .await
        .expect("lease");
    let two = summary_of(conversation, &picture, 2);
    let now = at(100_001);
    assert_eq!(
        store.store_summary(&lease, &two, now).await.unwrap(),
        SummaryStored::Stored
    );
    // The same coverage again, or less: superseded.
    assert_eq!(
        store
            .store_summary(&lease, &summary_of(conversation, &picture, 1), now)
            .await
            .unwrap(),
        SummaryStored::Superseded
    );
    // A maker whose lease expired and was taken stores nothing.
    let taken = claim(store, &key, &holder("p2"), at(200_000))
        .await
        .expect("taken over");
    assert_eq!(
        store
            .store_summary(&lease, &summary_of(conversation, &picture, 3), at(200_001))
            .await
            .unwrap(),
        SummaryStored::Fenced
    );
    // A round reads the summary, then only the exchange after it.
    let batch = claimed_batch(store, conversation, at(200_002)).await;
    assert_eq!(
        batch.summary.as_ref().map(|s| s.text.as_str()),
        Some("summary of 2")
    );
    let replies: Vec<&str> = batch.history.iter().map(|e| e.reply.as_str()).collect();
    assert_eq!(replies, ["reply m3"]);
    // The next picture starts after it.
    let next = store.summary_picture(conversation, 100).await.unwrap();
    assert_eq!(next.previous.as_ref().map(|s| s.messages), Some(2));
    assert_eq!(next.exchanges.len(), 1);
    assert_eq!(
        store
            .summary(&http("sum-1"))
            .await
            .unwrap()
            .map(|s| s.through_reply),
        Some(two.through_reply)
    );
    // After `/new`, a summary of the old context is never stored, nor read.
    store
        .reset_context(crate::store::ContextReset {
            conversation: &http("sum-1"),
            is_group: false,
            holder: &holder("p3"),
            now: at(200_003),
        })
        .await
        .expect("a reset");
    assert_eq!(
        store
            .store_summary(&taken, &summary_of(conversation, &picture, 3), at(200_004))
            .await
            .unwrap(),
        SummaryStored::Reset
    );
    assert_eq!(store.summary(&http("sum-1")).await.unwrap(), None);
}

/// A round's claim of `conversation` by `by` at `now`, reading summaries.
async fn claim_reading_summaries(
    store: &dyn Store,
    conversation: ConversationId,
    by: &crate::domain::HolderId,
    now: Timestamp,
) -> crate::store::Claimed {
    store
        .claim_round(RoundClaim {
            conversation,
            holder: by,
            ttl: std::time::Duration::from_secs(30),
            history: 10,
            summaries: true,
            now,
        })
        .await
        .expect("claiming")
        .expect("free")
}

/// The batch a round claiming `conversation` reads, with summaries (one more
/// message stored first: a batch with nothing pending reads no history).
async fn claimed_batch(
    store: &dyn Store,
    conversation: ConversationId,
    now: Timestamp,
) -> crate::store::Batch {
    let by = holder("reader");
    let claimed = claim_reading_summaries(store, conversation, &by, now).await;
    release(store, &claimed.lease, now).await;
    let chat = claimed.batch.conversation.clone();
    stored(store, super::message(chat, "m-next"), &by, now).await;
    claim_reading_summaries(store, conversation, &by, Timestamp(now.0 + 1))
        .await
        .batch
}

/// Retention: under its lease only; answered messages' and delivered replies' texts
/// go (rows stay), a pending message's and an undelivered reply's never.
pub async fn retention_removes_old_answered_and_delivered_texts_only(store: &dyn Store) {
    let conversation = three_exchanges(store, "ret-1").await;
    let chat = http("ret-1");
    let by = holder("p1");
    // An answered message whose reply is not delivered, then a pending message.
    let (_, lease, batch) = round(store, &chat, &by, &["u1"], at(50_000)).await;
    committed(store, &lease, &batch, "undelivered reply", at(50_001)).await;
    release(store, &lease, at(50_002)).await;
    stored(store, super::message(chat.clone(), "p1"), &by, at(50_003)).await;
    let key = LeaseKey::Retention;
    let retention = claim(store, &key, &by, at(60_000))
        .await
        .expect("retention lease");
    let mut removed = 0;
    loop {
        let batch = store
            .expire_texts(Expiry {
                lease: &retention,
                before: at(60_000),
                batch: 2,
                now: at(60_001),
            })
            .await
            .expect("expiring");
        if batch.total() == 0 {
            break;
        }
        removed += batch.messages + batch.replies;
    }
    // m1..m3 and u1 (answered), and the three delivered replies.
    assert_eq!(removed, 7);
    // The pending message keeps its text, the undelivered reply too (owed by the
    // next round), and no delivered reply is left for the history.
    let claimed = claim_reading_summaries(store, conversation, &by, at(60_010)).await;
    let pending: Vec<(&str, &str)> = claimed
        .batch
        .pending
        .iter()
        .map(|m| (m.message_id.as_str(), m.text.as_str()))
        .collect();
    assert_eq!(pending, [("p1", "text of p1.")]);
    // The history: only the exchange whose reply still has its text (undelivered).
    let history: Vec<&str> = claimed
        .batch
        .history
        .iter()
        .map(|e| e.reply.as_str())
        .collect();
    assert_eq!(history, ["undelivered reply"]);
    let owed: Vec<&str> = claimed.owed.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(owed, ["undelivered reply"]);
    // Without the lease, nothing.
    let other = holder("p2");
    assert!(
        store
            .expire_texts(Expiry {
                lease: &crate::domain::Lease {
                    holder: other,
                    ..retention.clone()
                },
                before: at(60_000),
                batch: 2,
                now: at(60_002),
            })
            .await
            .is_err()
    );
}

/// `/forgetme` while a summary is being made: it is not stored (the person's words
/// never come back through it); the summary of a newer exchange is.
pub async fn a_summary_made_before_forgetme_is_not_stored(store: &dyn Store) {
    let conversation = three_exchanges(store, "sum-forget").await;
    let chat = http("sum-forget");
    let key = LeaseKey::Summary(conversation);
    let picture = store.summary_picture(conversation, 100).await.unwrap();
    let lease = claim(store, &key, &holder("p1"), at(100_000))
        .await
        .expect("lease");
    store
        .erase_person(crate::domain::Platform::Http, "u1", at(100_001))
        .await
        .expect("erasing");
    assert_eq!(
        store
            .store_summary(&lease, &summary_of(conversation, &picture, 2), at(100_002))
            .await
            .unwrap(),
        SummaryStored::Fenced
    );
    assert_eq!(store.summary(&chat).await.unwrap(), None);
    // A newer exchange: the next summary (made from the tombstoned texts) is stored.
    let by = holder("p1");
    let (_, round_lease, batch) = round(store, &chat, &by, &["m4"], at(200_000)).await;
    let (outbox, _) = committed(store, &round_lease, &batch, "reply m4", at(200_001)).await;
    mark(store, outbox, 1, true, at(200_002)).await;
    release(store, &round_lease, at(200_003)).await;
    let picture = store.summary_picture(conversation, 100).await.unwrap();
    let lease = claim(store, &key, &by, at(300_000))
        .await
        .expect("lease again");
    let all = picture.exchanges.len();
    assert_eq!(
        store
            .store_summary(
                &lease,
                &summary_of(conversation, &picture, all),
                at(300_001)
            )
            .await
            .unwrap(),
        SummaryStored::Stored
    );
}

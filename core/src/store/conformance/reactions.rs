//! Conformance of the reactions area: an ack reaction is claimed once per pending
//! burst (also by concurrent claims), only for a pending message, and taken once.

use super::{at, committed, holder, http, message, round, stored};
use crate::domain::ConversationId;
use crate::store::{AckOf, AcksCovered, Store};

/// Whether this claim of the ack on `message_id` of `conversation` won it.
async fn claims_ack(store: &dyn Store, conversation: ConversationId, message_id: &str) -> bool {
    let ack = AckOf {
        conversation,
        message_id,
    };
    store.claim_ack(ack).await.expect("claiming an ack")
}

/// Whether the ack on `message_id` of `conversation` is still claimed and not taken.
async fn is_open(store: &dyn Store, conversation: ConversationId, message_id: &str) -> bool {
    let ack = AckOf {
        conversation,
        message_id,
    };
    store.ack_open(ack).await.expect("reading an ack")
}

/// The first message of a burst claims its ack, the others do not; once the burst is
/// answered the next message starts a burst that claims its own; a delivered reply
/// takes the ack of the message it covers once.
pub async fn an_ack_is_claimed_once_per_burst_and_taken_once(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1", "m2"], at(1000)).await;
    assert!(claims_ack(store, id, "m1").await, "the burst's first");
    assert!(!claims_ack(store, id, "m2").await, "one per burst");
    assert!(!claims_ack(store, id, "m1").await, "claimed once");
    assert!(is_open(store, id, "m1").await);
    assert!(!is_open(store, id, "m2").await);
    committed(store, &lease, &batch, "reply", at(1100)).await;
    stored(store, message(http("c1"), "m3"), &a, at(1200)).await;
    assert!(
        claims_ack(store, id, "m3").await,
        "a new burst claims its own"
    );
    let covers = ["m1".to_owned(), "m2".to_owned()];
    assert_eq!(
        store
            .take_acks(AcksCovered {
                conversation: id,
                covers: &covers
            })
            .await
            .unwrap(),
        ["m1"]
    );
    assert!(
        store
            .take_acks(AcksCovered {
                conversation: id,
                covers: &covers
            })
            .await
            .unwrap()
            .is_empty()
    );
    assert!(!is_open(store, id, "m1").await, "taken");
    assert!(is_open(store, id, "m3").await, "the next burst's stays");
}

/// A message already answered (the reply was quicker than the claim) owes no
/// reaction; an unknown message neither.
pub async fn an_answered_message_claims_no_ack(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    committed(store, &lease, &batch, "reply", at(1100)).await;
    assert!(!claims_ack(store, id, "m1").await);
    assert!(!claims_ack(store, id, "nope").await);
    assert!(!is_open(store, id, "m1").await);
}

/// Claims of one burst at once (two processes storing its messages) claim it once.
pub async fn concurrent_claims_of_one_burst_claim_once(store: &dyn Store) {
    let a = holder("a");
    for n in 0..4 {
        let conversation = http(&format!("c{n}"));
        let mut id = None;
        for m in ["m1", "m2", "m3"] {
            id = Some(
                stored(store, message(conversation.clone(), m), &a, at(0))
                    .await
                    .0,
            );
        }
        let id = id.unwrap();
        let (one, two, three) = tokio::join!(
            store.claim_ack(AckOf {
                conversation: id,
                message_id: "m1"
            }),
            store.claim_ack(AckOf {
                conversation: id,
                message_id: "m2"
            }),
            store.claim_ack(AckOf {
                conversation: id,
                message_id: "m3"
            }),
        );
        let claims = [one.unwrap(), two.unwrap(), three.unwrap()];
        assert_eq!(claims.iter().filter(|c| **c).count(), 1, "{claims:?}");
    }
}

//! Conformance of the reactions area: an ack reaction is claimed once per pending
//! burst (also by concurrent claims), only for a pending message, and taken once.

use super::{at, committed, holder, http, message, round, stored};
use crate::store::Store;
use crate::store::{AckOf, AcksCovered};

/// The first message of a burst claims its ack, the others do not; once the burst is
/// answered the next message starts a burst that claims its own; a delivered reply
/// takes the ack of the message it covers once.
pub async fn an_ack_is_claimed_once_per_burst_and_taken_once(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1", "m2"], at(1000)).await;
    assert!(
        store
            .claim_ack(AckOf {
                conversation: id,
                message_id: "m1"
            })
            .await
            .unwrap(),
        "the burst's first"
    );
    assert!(
        !store
            .claim_ack(AckOf {
                conversation: id,
                message_id: "m2"
            })
            .await
            .unwrap(),
        "one per burst"
    );
    assert!(
        !store
            .claim_ack(AckOf {
                conversation: id,
                message_id: "m1"
            })
            .await
            .unwrap(),
        "claimed once"
    );
    assert!(
        store
            .ack_open(AckOf {
                conversation: id,
                message_id: "m1"
            })
            .await
            .unwrap()
    );
    assert!(
        !store
            .ack_open(AckOf {
                conversation: id,
                message_id: "m2"
            })
            .await
            .unwrap()
    );
    committed(store, &lease, &batch, "reply", at(1100)).await;
    stored(store, message(http("c1"), "m3"), &a, at(1200)).await;
    assert!(
        store
            .claim_ack(AckOf {
                conversation: id,
                message_id: "m3"
            })
            .await
            .unwrap(),
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
    assert!(
        !store
            .ack_open(AckOf {
                conversation: id,
                message_id: "m1"
            })
            .await
            .unwrap(),
        "taken"
    );
    assert!(
        store
            .ack_open(AckOf {
                conversation: id,
                message_id: "m3"
            })
            .await
            .unwrap(),
        "the next burst's stays"
    );
}

/// A message already answered (the reply was quicker than the claim) owes no
/// reaction; an unknown message neither.
pub async fn an_answered_message_claims_no_ack(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    committed(store, &lease, &batch, "reply", at(1100)).await;
    assert!(
        !store
            .claim_ack(AckOf {
                conversation: id,
                message_id: "m1"
            })
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_ack(AckOf {
                conversation: id,
                message_id: "nope"
            })
            .await
            .unwrap()
    );
    assert!(
        !store
            .ack_open(AckOf {
                conversation: id,
                message_id: "m1"
            })
            .await
            .unwrap()
    );
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

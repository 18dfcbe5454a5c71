//! Conformance of the overheard area: group context is kept once per platform
//! message, bounded per conversation, never pending, and forgotten by a reset.

use super::{at, collect, due, holder, http, message, query, stored};
use crate::domain::{ConversationId, Said, Version};
use crate::store::{ContextReset, OverheardMessage, OverheardQuery, Overhearing, Store};

/// The newest `limit` overheard messages of `conversation`, oldest first.
async fn heard(store: &dyn Store, conversation: ConversationId, limit: usize) -> Vec<Said> {
    let query = OverheardQuery {
        conversation,
        limit,
    };
    store
        .overheard(query)
        .await
        .expect("reading overheard messages")
}

fn overheard(key: &str, id: &str, author: &str) -> OverheardMessage {
    OverheardMessage {
        conversation: http(key),
        message_id: id.into(),
        user_id: format!("user-{author}"),
        author: author.into(),
        text: format!("text of {id}"),
    }
}

/// Kept with its author, a redelivery once, the newest `keep` only, oldest first;
/// no version, no timer, nothing pending.
pub async fn overheard_messages_are_kept_once_and_bounded(store: &dyn Store) {
    assert!(
        store
            .overhear(Overhearing {
                message: overheard("g", "o1", "Ann"),
                keep: 3,
                now: at(10)
            })
            .await
            .unwrap()
    );
    assert!(
        !store
            .overhear(Overhearing {
                message: overheard("g", "o1", "Ann"),
                keep: 3,
                now: at(11)
            })
            .await
            .unwrap(),
        "a redelivery is kept once"
    );
    for (n, id) in ["o2", "o3", "o4", "o5"].into_iter().enumerate() {
        let kept = store
            .overhear(Overhearing {
                message: overheard("g", id, "Bob"),
                keep: 3,
                now: at(20 + n as u64),
            })
            .await
            .unwrap();
        assert!(kept);
    }
    let (id, version, _) = stored(store, message(http("g"), "m1"), &holder("a"), at(100)).await;
    assert_eq!(version, Version(1), "overheard messages bump no version");
    assert_eq!(
        heard(store, id, 10).await,
        vec![
            Said::new("Bob", "text of o3"),
            Said::new("Bob", "text of o4"),
            Said::new("Bob", "text of o5"),
        ],
        "the newest three, oldest first"
    );
    assert_eq!(
        heard(store, id, 2).await,
        vec![
            Said::new("Bob", "text of o4"),
            Said::new("Bob", "text of o5")
        ]
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.pending.len(), 1, "never pending: {:?}", batch.pending);
}

/// A conversation that was only overheard has no due work and no timer; another
/// conversation's context is its own.
pub async fn overheard_messages_arm_no_timer(store: &dyn Store) {
    let a = holder("a");
    store
        .overhear(Overhearing {
            message: overheard("g1", "o1", "Ann"),
            keep: 5,
            now: at(10),
        })
        .await
        .unwrap();
    store
        .overhear(Overhearing {
            message: overheard("g2", "o1", "Bob"),
            keep: 5,
            now: at(10),
        })
        .await
        .unwrap();
    let work = due(store, &query(&a, 10), at(1_000_000)).await;
    assert!(work.ready.is_empty(), "nothing due: {work:?}");
    assert_eq!(work.next_at, None, "no timer armed");
    let (id, version, _) = stored(store, message(http("g1"), "m1"), &a, at(100)).await;
    assert_eq!(version, Version(1));
    assert_eq!(
        heard(store, id, 5).await,
        vec![Said::new("Ann", "text of o1")],
        "each conversation its own"
    );
}

/// `/reset` (and `/new`) forget the group context; what is overheard afterwards is
/// kept again.
pub async fn a_reset_forgets_overheard_messages(store: &dyn Store) {
    let a = holder("a");
    store
        .overhear(Overhearing {
            message: overheard("g", "o1", "Ann"),
            keep: 5,
            now: at(10),
        })
        .await
        .unwrap();
    let (id, _, _) = stored(store, message(http("g"), "m1"), &a, at(20)).await;
    store
        .reset_context(ContextReset {
            conversation: &http("g"),
            is_group: true,
            holder: &a,
            now: at(30),
        })
        .await
        .unwrap();
    assert!(heard(store, id, 5).await.is_empty());
    store
        .overhear(Overhearing {
            message: overheard("g", "o2", "Bob"),
            keep: 5,
            now: at(40),
        })
        .await
        .unwrap();
    assert_eq!(
        heard(store, id, 5).await,
        vec![Said::new("Bob", "text of o2")]
    );
}

//! Conformance: the rhythm area. A committed reply teaches its conversation's rhythm
//! in its own transaction; ingest arms the timer with the wait the rhythm allows.

use super::*;
use crate::rhythm::Rhythm;
use crate::store::{LeaseRelease, Typing};

/// Answer the messages `ids`, stored at the times `times`, with one committed reply
/// `after` ms after the last of them.
async fn answer(
    store: &dyn Store,
    conversation: &ConversationRef,
    ids: &[&str],
    times: &[u64],
    after: u64,
) -> ConversationId {
    let a = holder("a");
    let mut id = None;
    for (message_id, t) in ids.iter().zip(times) {
        let message = message(conversation.clone(), message_id);
        id = Some(stored(store, message, &a, at(*t)).await.0);
    }
    let id = id.expect("a burst has messages");
    let end = at(times.last().copied().unwrap_or(0) + after);
    let lease = claimed(store, id, &a, end).await;
    let batch = collect(store, id).await;
    committed(store, &lease, &batch, "answer", end).await;
    store
        .release_lease(LeaseRelease {
            lease: &lease,
            last_sent: None,
            now: end,
        })
        .await
        .expect("releasing");
    id
}

/// Each committed reply teaches the rhythm: the gaps inside its burst, and the gap to
/// the burst before when that one was answered too early (less than a window apart);
/// a stale reply teaches nothing.
pub async fn a_commit_teaches_the_rhythm_of_its_burst(store: &dyn Store) {
    let c1 = http("c1");
    let id = answer(store, &c1, &["m1", "m2"], &[0, 600], 1000).await;
    let learned = store.rhythm(id).await.unwrap();
    assert_eq!(
        learned,
        Rhythm {
            bursts: 1,
            gap_ms: 600,
            multi_permille: 1000,
            last_at: Some(at(600)),
        }
    );
    // A newer message makes the reply stale: nothing learned.
    let a = holder("a");
    stored(store, message(c1.clone(), "m3"), &a, at(1700)).await;
    let lease = claimed(store, id, &a, at(2800)).await;
    let batch = collect(store, id).await;
    stored(store, message(c1.clone(), "m4"), &a, at(2900)).await;
    stale(store, &lease, &batch, at(3000)).await;
    assert_eq!(store.rhythm(id).await.unwrap(), learned, "a stale reply");
    release(store, &lease, at(3000)).await;
    // m3 came 1100 ms after m2 (more than a window of 1000): a burst of its own; m4
    // 1200 ms after m3, inside this burst.
    let lease = claimed(store, id, &a, at(4000)).await;
    let batch = collect(store, id).await;
    committed(store, &lease, &batch, "answer", at(4000)).await;
    let learned = store.rhythm(id).await.unwrap();
    assert_eq!(
        (learned.bursts, learned.gap_ms, learned.last_at),
        (2, 900, Some(at(2900))),
        "{learned:?}"
    );
    // Unknown conversations have learned nothing.
    assert_eq!(
        store.rhythm(ConversationId(9999)).await.unwrap(),
        Rhythm::default()
    );
}

/// With adaptive waiting, ingest arms the full window until the rhythm is known, the
/// shortest wait once the conversation has shown only complete messages, the full
/// window again for a message whose thought goes on (a trailing ":"), and never past
/// the cap.
pub async fn ingest_arms_the_wait_the_rhythm_allows(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let id = answer(store, &c1, &["m1"], &[0], 1000).await;
    let (_, _, due_at) = stored(store, message(c1.clone(), "m2"), &a, at(20_000)).await;
    assert_eq!(
        due_at,
        at(21_000),
        "one burst is not a rhythm yet: the full window"
    );
    let lease = claimed(store, id, &a, at(21_000)).await;
    let batch = collect(store, id).await;
    committed(store, &lease, &batch, "answer", at(21_000)).await;
    release(store, &lease, at(21_000)).await;
    let (_, _, due_at) = stored(store, message(c1.clone(), "m3"), &a, at(40_000)).await;
    assert_eq!(due_at, at(40_200), "complete messages: the shortest wait");
    let lease = claimed(store, id, &a, at(40_300)).await;
    let batch = collect(store, id).await;
    committed(store, &lease, &batch, "answer", at(40_300)).await;
    release(store, &lease, at(40_300)).await;
    let mut unfinished = message(c1.clone(), "m4");
    unfinished.text = "here is what I mean:".into();
    let (_, _, due_at) = stored(store, unfinished, &a, at(60_000)).await;
    assert_eq!(due_at, at(61_000), "an unfinished thought: the full window");
    for (n, t) in [(5, 62_000), (6, 63_500)] {
        let mut more = message(c1.clone(), &format!("m{n}"));
        more.text = "and:".into();
        let (_, _, due_at) = stored(store, more, &a, at(t)).await;
        assert_eq!(due_at, at(t + 1000).min(at(64_000)), "never past the cap");
    }
}

/// A typing author holds the conversation's timer until `now + hold`, never past the
/// cap and never sooner than it was due; someone else typing, a conversation with
/// nothing pending, or an unknown one change nothing.
pub async fn a_typing_author_holds_the_timer_never_past_the_cap(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, _, due_at) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    assert_eq!(due_at, at(1000));
    let extend = |user: &'static str, hold: u64, now: u64| {
        let c1 = c1.clone();
        async move {
            store
                .extend_timer(Typing {
                    conversation: &c1,
                    user_id: user,
                    hold: ms(hold),
                    now: at(now),
                })
                .await
                .expect("extending a timer")
        }
    };
    assert_eq!(extend("u2", 2000, 500).await, None, "not the author");
    assert_eq!(
        collect(store, id).await.timer.map(|t| t.due_at),
        Some(at(1000))
    );
    assert_eq!(extend("u1", 2000, 500).await, Some(at(2500)), "held");
    assert_eq!(extend("u1", 100, 600).await, Some(at(2500)), "never sooner");
    assert_eq!(
        extend("u1", 10_000, 700).await,
        Some(at(4000)),
        "never past the cap"
    );
    assert_eq!(
        collect(store, id).await.timer.map(|t| t.due_at),
        Some(at(4000))
    );
    let unknown = http("nobody");
    assert_eq!(
        store
            .extend_timer(Typing {
                conversation: &unknown,
                user_id: "u1",
                hold: ms(2000),
                now: at(800)
            })
            .await
            .unwrap(),
        None
    );
    let lease = claimed(store, id, &a, at(4000)).await;
    let batch = collect(store, id).await;
    committed(store, &lease, &batch, "answer", at(4000)).await;
    assert_eq!(extend("u1", 2000, 4100).await, None, "nothing pending");
}

/// With adaptive waiting, a conversation that types in fragments gets its learned
/// waits: the first wait for a message that starts a burst, the burst window once a
/// burst is under way, each the one [`Waits::pick`](crate::rhythm::Waits::pick) makes
/// from the stored rhythm (so a backend that picks in SQL picks as the Rust does).
pub async fn ingest_picks_the_burst_window_inside_a_burst(store: &dyn Store) {
    let c1 = http("c1");
    let policy = adaptive_policy();
    let mut id = None;
    // Four bursts of fragments 300 ms apart, then five complete messages: a rhythm in
    // between, whose first wait is shorter than its burst window.
    for n in 0..9u64 {
        let t = n * 20_000;
        let ids = [format!("a{n}"), format!("b{n}")];
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (ids, times) = if n < 4 {
            (&ids[..], &[t, t + 300][..])
        } else {
            (&ids[..1], &[t][..])
        };
        id = Some(answer(store, &c1, ids, times, 1000).await);
    }
    let rhythm = store.rhythm(id.unwrap()).await.unwrap();
    let waits = policy.waits_of(&rhythm);
    assert!(waits.is_some(), "nine bursts: a known rhythm {rhythm:?}");
    let (min, max) = (policy.min_debounce(), policy.debounce());
    let (first, burst) = (
        crate::rhythm::Waits::pick(waits, 1, min, max),
        crate::rhythm::Waits::pick(waits, 2, min, max),
    );
    assert!(
        first < burst,
        "a rhythm that tells the two apart: {rhythm:?}"
    );
    let a = holder("a");
    let (_, _, due_at) = stored(store, message(c1.clone(), "c0"), &a, at(200_000)).await;
    assert_eq!(due_at, at(200_000).plus(first), "the first wait {waits:?}");
    let (_, _, due_at) = stored(store, message(c1.clone(), "c1"), &a, at(200_100)).await;
    assert_eq!(
        due_at,
        at(200_100).plus(burst),
        "the burst window {waits:?}"
    );
}

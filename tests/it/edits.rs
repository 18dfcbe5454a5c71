//! Edits meet the cap: an edit is a new message for the version counter, so it must
//! never leave a message covered by two replies, even when the cap forces a reply out
//! that was generated before the edit.

use std::time::Duration;

use lull_core::dispatcher::{Accepted, Event};
use lull_port::{Content, IncomingKind};

use crate::dispatcher::wait_settled;
use crate::helpers::{
    GatedResponder, Leases, Node, db, message, ms, settings, temp_db, wait_event,
};

/// The cap forces out a reply generated before one of its messages was edited. That
/// reply covers only what was unchanged; the edited message is pending again and gets
/// a reply of its own (to its new text). The invariant checker finds no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_under_the_cap_is_answered_once() {
    let db = temp_db();
    let max_wait = 600;
    let (responder, mut started) = GatedResponder::new();
    // The final check's forced path: with cancellation on, the edit (before the
    // cap) would stop this generation at once (`overtaken::`); here it must finish.
    let mut settings = settings(100, max_wait, 3000);
    settings.cancel_overtaken = false;
    let node = Node::start(&db.path, settings, responder.clone(), Leases::Enforced);
    let mut events = node.events();
    node.send("c1", "m1", "what is 2+2?").await;
    node.send("c1", "m2", "and in binary?").await;
    assert_eq!(started.recv().await, Some(2), "one generation for both");

    let mut edit = message("c1", "m1", "what is 3+3?");
    edit.kind = IncomingKind::Edit;
    assert!(matches!(
        node.dispatcher.ingest(edit).await.unwrap(),
        Accepted::Stored { .. }
    ));
    // The cap is a rule about time: let the oldest message wait it out before the
    // generation finishes, so the final check must force the reply out.
    let oldest = db::messages(&db.path)
        .iter()
        .map(|m| m.received_at)
        .min()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(ms((oldest + max_wait as i64 - now).max(0) as u64 + 100)).await;
    responder.open(1);
    let forced = wait_event(&mut events, Duration::from_secs(10), |e| match e {
        Event::Committed { forced, .. } => Some(*forced),
        _ => None,
    })
    .await;
    assert!(forced, "the cap forced the reply out");

    // The edited message is answered again, on its own, with its new text.
    assert_eq!(started.recv().await, Some(1));
    responder.open(1);
    let replies = node.outbound.wait_replies(2, Duration::from_secs(10)).await;
    wait_settled(&node, "c1").await;
    let verdict = db::check(&db.path);
    assert_eq!(
        (
            verdict.replies,
            verdict.duplicates,
            verdict.lost,
            verdict.stale
        ),
        (2, 0, 0, 0),
        "{verdict:?}"
    );
    assert_eq!(
        replies[0].covers,
        ["m2"],
        "the forced reply covers what was unchanged"
    );
    assert_eq!(replies[1].covers, ["m1"]);
    assert!(replies[1].text.contains("3+3"), "{}", replies[1].text);
    // An edit of a message answered by now changes nothing.
    let mut late = message("c1", "m1", "what is 4+4?");
    late.kind = IncomingKind::Edit;
    late.content = Content::Text("what is 4+4?".into());
    assert_eq!(
        node.dispatcher.ingest(late).await.unwrap(),
        Accepted::EditIgnored
    );
}

/// Edits count in `LULL_RATE_PER_MIN` as messages do (each applied edit makes the
/// batch stale as a new message does, so unlimited edits could keep every generation
/// from being answered): with a limit of 2 a minute, one message edited twice holds
/// the conversation, and the user is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_count_in_the_rate_limit() {
    let db = temp_db();
    let mut settings = settings(5000, 10_000, 3000);
    settings.limits.rate_per_min = 2;
    let (responder, _started) = GatedResponder::new();
    let node = Node::start(&db.path, settings, responder, Leases::Enforced);
    let mut events = node.events();
    node.send("c1", "m1", "hello").await;
    for text in ["hello?", "hello??"] {
        let mut edit = message("c1", "m1", text);
        edit.kind = IncomingKind::Edit;
        let accepted = node.dispatcher.ingest(edit).await.unwrap();
        assert!(matches!(accepted, Accepted::Stored { .. }), "{accepted:?}");
    }
    let limited = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Ok(Event::Limited { reason, until, .. }) => break (reason, until),
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await;
    let held_until = db::count(&db.path, "SELECT COALESCE(MAX(held_until), 0) FROM timers");
    println!("after a message and two edits: limited {limited:?}, timer held until {held_until}");
    let (reason, until) = limited.expect("the second edit is the third in the window");
    assert_eq!(reason, "rate");
    assert_eq!(held_until, until.0, "the conversation's timer is held");
}

//! What happens to each kind of inbound update: bad input is refused with a clear
//! error and nothing stored, a database that cannot write refuses without losing what
//! it had, edits and commands, unreadable messages, unlisted users, and a model that
//! fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lull_core::dispatcher::{Accepted, Event, IngestError};
use lull_core::domain::Platform;
use lull_core::llm::echo::{EchoDelay, EchoResponder};
use lull_core::llm::{Generation, LlmError, Partial, Prompt, Responder};
use lull_core::store::{FaultPlan, SqliteStore};
use lull_port::{Content, IncomingKind};

use crate::dispatcher::wait_settled;
use crate::helpers::{
    CountingEcho, GatedResponder, Leases, Node, db, message, settings, temp_db, wait_event,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_huge_messages_are_refused_and_nothing_is_stored() {
    let db = temp_db();
    let node = Node::start(
        &db.path,
        settings(100, 3000, 3000),
        CountingEcho::new(0),
        Leases::Enforced,
    );
    for empty in ["", "   \n\t "] {
        let refused = node.dispatcher.ingest(message("c1", "e", empty)).await;
        assert!(matches!(refused, Err(IngestError::Empty)), "{refused:?}");
    }
    let huge = "x".repeat(lull_core::dispatcher::MAX_MESSAGE_CHARS + 1);
    let refused = node
        .dispatcher
        .ingest(message("c1", "h", &huge))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("too long"), "{refused}");
    assert_eq!(db::count(&db.path, "SELECT COUNT(*) FROM messages"), 0);
    // The longest accepted message goes through.
    let longest = "y".repeat(lull_core::dispatcher::MAX_MESSAGE_CHARS);
    assert!(matches!(
        node.send("c1", "ok", &longest).await,
        Accepted::Stored { .. }
    ));
    node.outbound.wait_replies(1, Duration::from_secs(10)).await;
}

/// A locked or full database refuses the message (so the adapter does not
/// acknowledge it and the platform redelivers it) and loses nothing stored before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_cannot_write_refuses_without_losing_anything() {
    let db = temp_db();
    let settings = settings(100, 3000, 3000);
    let faults = Arc::new(FaultPlan::default());
    let store = SqliteStore::open(&db.path, settings.timers)
        .unwrap()
        .with_faults(faults.clone());
    let (responder, mut started) = GatedResponder::new();
    let node = Node::start_with_store(Arc::new(store), settings, responder.clone());
    node.send("c1", "m1", "kept").await;
    assert_eq!(started.recv().await, Some(1));

    faults.busy_intake(true);
    let busy = node
        .dispatcher
        .ingest(message("c1", "m2", "refused"))
        .await
        .unwrap_err();
    assert!(matches!(busy, IngestError::NotStored(_)), "{busy:?}");
    assert!(busy.to_string().contains("busy"), "{busy}");
    faults.busy_intake(false);
    faults.full_intake(true);
    let full = node
        .dispatcher
        .ingest(message("c1", "m2", "refused"))
        .await
        .unwrap_err();
    assert!(full.to_string().contains("full"), "{full}");
    faults.full_intake(false);

    responder.open(10);
    let replies = node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    assert_eq!(replies[0].covers, ["m1"]);
    // The platform redelivers the refused message; now it is stored and answered.
    assert!(matches!(
        node.send("c1", "m2", "redelivered").await,
        Accepted::Stored { .. }
    ));
    let replies = node.outbound.wait_replies(2, Duration::from_secs(10)).await;
    assert_eq!(replies[1].covers, ["m2"]);
}

/// An edit of a message that is being answered makes that reply stale; the edited
/// text is what gets answered, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_during_generation_yields_one_reply_to_the_edited_text() {
    let db = temp_db();
    let (responder, mut started) = GatedResponder::new();
    let node = Node::start(
        &db.path,
        settings(100, 5000, 3000),
        responder.clone(),
        Leases::Enforced,
    );
    let mut events = node.events();
    node.send("c1", "m1", "what is 2+2?").await;
    assert_eq!(started.recv().await, Some(1));
    let mut edit = message("c1", "m1", "what is 3+3?");
    edit.kind = IncomingKind::Edit;
    assert!(
        matches!(node.dispatcher.ingest(edit.clone()).await.unwrap(), Accepted::Stored { version, .. } if version.0 == 2)
    );
    responder.open(1);
    wait_event(&mut events, Duration::from_secs(10), |e| {
        matches!(e, Event::DroppedStale { .. }).then_some(())
    })
    .await;
    assert_eq!(started.recv().await, Some(1));
    responder.open(1);
    let replies = node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    assert!(
        replies[0].text.contains("3+3") && !replies[0].text.contains("2+2"),
        "{}",
        replies[0].text
    );
    wait_settled(&node, "c1").await;
    // An edit of an answered message changes nothing.
    edit.content = Content::Text("what is 4+4?".into());
    assert_eq!(
        node.dispatcher.ingest(edit).await.unwrap(),
        Accepted::EditIgnored
    );
    assert_eq!(node.outbound.replies().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_messages_get_a_short_notice_once() {
    let db = temp_db();
    let echo = CountingEcho::new(0);
    let node = Node::start(
        &db.path,
        settings(100, 3000, 3000),
        echo.clone(),
        Leases::Enforced,
    );
    let mut sticker = message("c1", "s1", "");
    sticker.content = Content::Unsupported("sticker".into());
    assert_eq!(
        node.dispatcher.ingest(sticker.clone()).await.unwrap(),
        Accepted::Unsupported
    );
    // Redelivered: no second notice.
    assert_eq!(
        node.dispatcher.ingest(sticker).await.unwrap(),
        Accepted::Unsupported
    );
    wait_settled(&node, "c1").await;
    let sent = node.outbound.all();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert!(sent[0].text.contains("only read text") && sent[0].text.contains("sticker"));
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_user_is_told_once_and_nothing_reaches_the_model() {
    let db = temp_db();
    let echo = CountingEcho::new(0);
    let mut restricted = settings(100, 3000, 3000);
    restricted.access.users = "telegram:1".parse().unwrap();
    let store = Arc::new(SqliteStore::open(&db.path, restricted.timers).unwrap());
    let node = Node::start_on(Platform::Telegram, store, restricted, echo.clone());
    let from = |user: &str, id: &str, text: &str| {
        let mut m = message("chat", id, text);
        m.conversation.platform = Platform::Telegram;
        m.user_id = user.into();
        m
    };
    for (id, text) in [("1", "hi"), ("2", "hello?"), ("3", "/help")] {
        assert_eq!(
            node.dispatcher.ingest(from("2", id, text)).await.unwrap(),
            Accepted::Denied
        );
    }
    // The listed user is answered.
    assert!(matches!(
        node.dispatcher.ingest(from("1", "4", "hi")).await.unwrap(),
        Accepted::Stored { .. }
    ));
    node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    let sent = node.outbound.all();
    let notices: Vec<_> = sent
        .iter()
        .filter(|d| d.kind == lull_core::store::OutboxKind::Notice)
        .collect();
    assert_eq!(notices.len(), 1, "one notice for three messages: {sent:#?}");
    assert!(
        notices[0].text.contains("telegram:2") && notices[0].text.contains("LULL_ALLOWED_USERS")
    );
    assert_eq!(
        echo.calls.load(Ordering::SeqCst),
        1,
        "only the listed user reached the model"
    );
    assert_eq!(
        db::count(&db.path, "SELECT COUNT(*) FROM messages"),
        1,
        "nothing of the unlisted user is stored"
    );
}

/// Fails a given number of calls, then replies like echo.
struct FlakyResponder {
    failures_left: AtomicUsize,
    calls: AtomicUsize,
}

#[async_trait]
impl Responder for FlakyResponder {
    fn name(&self) -> &'static str {
        "flaky"
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(LlmError::Status {
                status: 503,
                message: "overloaded".into(),
                retry_after: None,
            });
        }
        EchoResponder::new(EchoDelay::fixed(0))
            .respond(prompt, partial)
            .await
    }
}

/// The model fails twice: the user is told once, the messages stay pending, and the
/// next successful reply covers all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_model_notifies_once_and_loses_nothing() {
    let db = temp_db();
    let responder = Arc::new(FlakyResponder {
        failures_left: AtomicUsize::new(2),
        calls: AtomicUsize::new(0),
    });
    let node = Node::start(
        &db.path,
        settings(100, 3000, 3000),
        responder.clone(),
        Leases::Enforced,
    );
    let mut events = node.events();
    node.send("c1", "m1", "hello?").await;
    wait_event(&mut events, Duration::from_secs(10), |e| match e {
        Event::GenerationFailed { attempts: 1, .. } => Some(()),
        _ => None,
    })
    .await;
    node.send("c1", "m2", "anyone?").await;
    let replies = node.outbound.wait_replies(1, Duration::from_secs(20)).await;
    assert_eq!(replies[0].covers, ["m1", "m2"]);
    wait_settled(&node, "c1").await;
    let notices: Vec<_> = node
        .outbound
        .all()
        .into_iter()
        .filter(|d| d.kind == lull_core::store::OutboxKind::Notice)
        .collect();
    assert_eq!(
        notices.len(),
        1,
        "told once, not once per attempt: {notices:#?}"
    );
    assert!(notices[0].text.contains("kept your messages"));
    assert_eq!(responder.calls.load(Ordering::SeqCst), 3);
    let verdict = db::check(&db.path);
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_is_answered_without_waiting_for_the_window() {
    let db = temp_db();
    let mut quick = settings(5_000, 20_000, 3000);
    quick.timers = lull_core::timing::TimerPolicy::new(
        Duration::from_millis(5_000),
        Duration::from_millis(20_000),
        3,
    )
    .unwrap();
    let node = Node::start(&db.path, quick, CountingEcho::new(0), Leases::Enforced);
    let started = std::time::Instant::now();
    for i in 0..3 {
        node.send("c1", &format!("m{i}"), "x").await;
    }
    let replies = node.outbound.wait_replies(1, Duration::from_secs(4)).await;
    assert_eq!(replies[0].covers.len(), 3);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "did not wait for the 5 s debounce"
    );
}

//! An overtaken generation is stopped at once: when a newer message is stored while
//! a reply is being written, the model request is dropped (on this process through
//! the event bus, on another at its next look) and the covering round starts,
//! instead of the old reply running to its end only to be dropped. Not at the cap: a
//! forced round finishes. Each case has its counter-case with the cancellation off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lull_core::dispatcher::{DispatchSettings, Event};
use lull_core::llm::{Generation, LlmError, Partial, Prompt, Responder};

use crate::helpers::{Leases, Node, settings, temp_db, wait_event};

/// A model that takes `delay` per reply and counts the requests it started, finished
/// and saw dropped before their end (the client gave up: the stream closed).
struct SlowModel {
    delay: Duration,
    started: AtomicUsize,
    finished: AtomicUsize,
    dropped: AtomicUsize,
    dropped_at: std::sync::Mutex<Vec<Instant>>,
}

impl SlowModel {
    fn new(delay: Duration) -> Arc<Self> {
        Arc::new(SlowModel {
            delay,
            started: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            dropped_at: std::sync::Mutex::new(Vec::new()),
        })
    }
}

impl SlowModel {
    /// How long after `at` the first request was dropped, if one was.
    fn first_drop_after(&self, at: Instant) -> Option<Duration> {
        let dropped = self.dropped_at.lock().unwrap();
        dropped.first().map(|dropped| dropped.duration_since(at))
    }
}

/// Counts a request dropped before its end.
struct Unfinished<'a>(&'a SlowModel, bool);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.dropped.fetch_add(1, Ordering::SeqCst);
            self.0.dropped_at.lock().unwrap().push(Instant::now());
        }
    }
}

#[async_trait]
impl Responder for SlowModel {
    fn name(&self) -> &'static str {
        "slow"
    }

    async fn respond(&self, prompt: &Prompt, _partial: &Partial) -> Result<Generation, LlmError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let mut guard = Unfinished(self, false);
        tokio::time::sleep(self.delay).await;
        guard.1 = true;
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(Generation::text(
            format!("[slow] {}", prompt.user_turn()),
            None,
        ))
    }
}

async fn wait_started(model: &SlowModel, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while model.started.load(Ordering::SeqCst) < n {
        assert!(
            Instant::now() < deadline,
            "the model was not asked {n} time(s)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn with_cancel(mut settings: DispatchSettings, cancel: bool) -> DispatchSettings {
    settings.cancel_overtaken = cancel;
    settings
}

/// One process: a message stored while the reply to the first is written stops that
/// generation (the request is dropped) and one reply covers both; how many requests
/// ran to their end, and how long after the newer message the request was dropped.
async fn one_process(cancel: bool) -> (usize, usize, Option<Duration>, String) {
    let db = temp_db();
    let model = SlowModel::new(Duration::from_secs(3));
    let node = Node::start(
        &db.path,
        with_cancel(settings(100, 20_000, 3000), cancel),
        model.clone(),
        Leases::Enforced,
    );
    node.send("c", "1", "first").await;
    wait_started(&model, 1).await;
    let newer_at = Instant::now();
    node.send("c", "2", "second").await;
    let replies = node.outbound.wait_replies(1, Duration::from_secs(20)).await;
    let dropped_after = model.first_drop_after(newer_at);
    (
        model.finished.load(Ordering::SeqCst),
        model.dropped.load(Ordering::SeqCst),
        dropped_after,
        replies[0].text.clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_generation_stops_at_once_and_one_reply_covers_both() {
    let (finished, dropped, after, reply) = one_process(true).await;
    println!("same process: the overtaken request was dropped {after:?} after the newer message");
    assert_eq!(reply, "[slow] first\nsecond");
    assert_eq!(
        (finished, dropped),
        (1, 1),
        "the overtaken request was dropped, not finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_without_cancelling_the_overtaken_generation_runs_to_its_end() {
    let (finished, dropped, _, reply) = one_process(false).await;
    assert_eq!(reply, "[slow] first\nsecond");
    assert_eq!(
        (finished, dropped),
        (2, 0),
        "without cancelling, the stale request ran to its end"
    );
}

/// Two processes on one database: the newer message reaches the other process; the
/// generating one finds it at its next look and stops.
async fn two_processes(cancel: bool) -> (usize, usize, Option<Duration>) {
    let db = temp_db();
    let model = SlowModel::new(Duration::from_secs(3));
    let a = Node::start(
        &db.path,
        with_cancel(settings(100, 20_000, 3000), cancel),
        model.clone(),
        Leases::Enforced,
    );
    let idle = SlowModel::new(Duration::from_secs(3));
    let b = Node::start(
        &db.path,
        with_cancel(settings(100, 20_000, 3000), cancel),
        idle.clone(),
        Leases::Enforced,
    );
    a.send("c", "1", "first").await;
    wait_started(&model, 1).await;
    let newer_at = Instant::now();
    b.send("c", "2", "second").await;
    let deadline = Instant::now() + Duration::from_secs(25);
    while a.outbound.replies().len() + b.outbound.replies().len() < 1 {
        assert!(Instant::now() < deadline, "no reply");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let replies: Vec<_> = a
        .outbound
        .replies()
        .into_iter()
        .chain(b.outbound.replies())
        .collect();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].text, "[slow] first\nsecond");
    let dropped_after = model.first_drop_after(newer_at);
    (
        model.finished.load(Ordering::SeqCst) + idle.finished.load(Ordering::SeqCst),
        model.dropped.load(Ordering::SeqCst),
        dropped_after,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_generation_on_another_process_stops_at_its_next_look() {
    let (finished, dropped, after) = two_processes(true).await;
    println!(
        "other process: the overtaken request was dropped {after:?} after the newer message (poll 50 ms)"
    );
    assert_eq!((finished, dropped), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_another_process_without_cancelling_runs_to_its_end() {
    let (finished, dropped, _) = two_processes(false).await;
    assert_eq!((finished, dropped), (2, 0));
}

/// At the cap a round is forced: a newer message does not stop it, its reply goes
/// out, and the newer message is answered next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_round_at_the_cap_is_not_cancelled() {
    let db = temp_db();
    let model = SlowModel::new(Duration::from_millis(1500));
    // The cap (max wait 1 s) passes while the first reply is written.
    let node = Node::start(
        &db.path,
        settings(100, 1000, 3000),
        model.clone(),
        Leases::Enforced,
    );
    let mut events = node.events();
    node.send("c", "1", "first").await;
    wait_started(&model, 1).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    node.send("c", "2", "second").await;
    let forced = wait_event(&mut events, Duration::from_secs(10), |e| match e {
        Event::Committed { forced, .. } => Some(*forced),
        Event::GenerationCancelled { .. } => Some(false),
        _ => None,
    })
    .await;
    assert!(forced, "the first round was forced, not cancelled");
    let replies = node.outbound.wait_replies(2, Duration::from_secs(20)).await;
    assert_eq!(replies[0].text, "[slow] first");
    assert_eq!(replies[1].text, "[slow] second");
    assert_eq!(model.dropped.load(Ordering::SeqCst), 0);
}

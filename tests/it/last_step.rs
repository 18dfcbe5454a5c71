//! The last step of a round holds: a delivered part is a fact, recorded even when the
//! write after the send fails (the database locked past its busy timeout) or the
//! process is killed in a later wait (a 429), so it is never delivered again. Each
//! scenario runs twice: as built, and with the protection switched off by a test-only
//! switch (`LULL_TEST_DEFER_MARKS=1`: the mark waits in memory for the next write and
//! is dropped when that write fails, as before), which must deliver twice.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::http_api::start_with;
use crate::support::db;
use crate::support::fakes::telegram::{Fault, TelegramFake, text_message};
use crate::support::fakes::webhook::Webhook;
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The store's busy timeout is 5 s: a lock held longer makes the write after the send
/// fail once.
const LOCK_HELD: Duration = Duration::from_millis(6500);

/// A reply accepted by the webhook, and at once the database locked (by "another
/// process") past the busy timeout, so the write recording the delivery fails once.
/// How many times the sender saw the reply accepted, after waiting past the lease's
/// expiry (when a reply read as unsent would be delivered again).
async fn locked_right_after_the_send(defer_marks: bool) -> usize {
    let webhook = Webhook::start().await;
    let db_path: Arc<std::sync::Mutex<Option<PathBuf>>> = Arc::default();
    let once = Arc::new(AtomicBool::new(false));
    {
        let db_path = db_path.clone();
        webhook.before_answer(Arc::new(move |_| {
            if !once.swap(true, Ordering::SeqCst) {
                let path = db_path.lock().unwrap().clone().expect("the database");
                db::hold_write_lock(&path, LOCK_HELD);
            }
        }));
    }
    let mut env = vec![("LULL_LEASE_TTL_MS", "9000"), ("LULL_POLL_MS", "200")];
    if defer_marks {
        env.push(("LULL_TEST_DEFER_MARKS", "1"));
    }
    let app = start_with(webhook, &env).await;
    *db_path.lock().unwrap() = Some(app.db());
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    let reply = app.webhook.wait_replies(1, SECS(15)).await[0].reply_id;
    // Past the lock, the lease's expiry and a poll: a reply read as unsent by then has
    // been delivered again.
    tokio::time::sleep(SECS(14)).await;
    let answered = app.webhook.times_answered(reply);
    println!(
        "defer_marks={defer_marks}: reply {reply} seen accepted {answered} time(s); POSTs {}",
        app.webhook.requests()
    );
    if !defer_marks {
        let verdict = db::settled(&app.db(), SECS(10)).await;
        assert_eq!(
            (verdict.replies, verdict.duplicates, verdict.lost),
            (1, 0, 0),
            "{verdict:?}"
        );
        assert!(
            app.lull.logs().contains("retrying"),
            "the failed write was retried:\n{}",
            app.lull.logs()
        );
    }
    answered
}

/// Before: the sent-mark waited in memory for the lease's release; the release failed
/// (locked) and the mark was dropped; after the TTL the reply went out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_recorded_while_the_database_is_locked_is_not_repeated() {
    assert_eq!(locked_right_after_the_send(false).await, 1);
}

/// Its counter-test: with the mark deferred and dropped on a failed write, the same
/// run delivers the reply twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_a_deferred_mark_is_dropped_and_the_reply_delivered_twice() {
    assert_eq!(locked_right_after_the_send(true).await, 2);
}

/// A two-part Telegram reply: the first part accepted, the second answered 429 with
/// `retry_after`, and the process killed while it waits. After the restart, how many
/// times the first part was sent.
async fn killed_during_a_429_wait(defer_marks: bool) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let mut extra = vec![("LULL_LEASE_TTL_MS", "3000"), ("LULL_STREAM", "off")];
    if defer_marks {
        extra.push(("LULL_TEST_DEFER_MARKS", "1"));
    }
    let begun = Instant::now();
    let mut lull = LullProcess::start(
        dir.path(),
        "lull",
        &["run"],
        &crate::telegram::env(dir.path(), &fake, &extra),
    );
    crate::telegram::wait_polling(&fake, begun).await;
    let chat = 4301;
    let text: String = (0..150)
        .map(|i| format!("Line {i}: a long message in two parts.\n"))
        .collect();
    fake.fail("sendMessage", Fault::Pass, 1);
    fake.fail("sendMessage", Fault::TooManyRequests(6), 1);
    fake.push_message(text_message(chat, chat, text.trim_end()));
    fake.wait_for("the 429", SECS(20), |f| {
        (!f.faulted("sendMessage").is_empty()).then_some(())
    })
    .await;
    // In the middle of the 6 s wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    lull.kill9();
    lull.restart();
    let last_line = "Line 149:";
    fake.wait_for("the second part", SECS(30), |f| {
        f.sent_to(chat)
            .iter()
            .any(|s| s.text.contains(last_line))
            .then_some(())
    })
    .await;
    tokio::time::sleep(SECS(1)).await;
    let sent = fake.sent_to(chat);
    let first_parts = sent.iter().filter(|s| s.text.contains("Line 0:")).count();
    println!(
        "defer_marks={defer_marks}: {} message(s) sent, the first part {first_parts} time(s)",
        sent.len()
    );
    if !defer_marks {
        assert_eq!(sent.len(), 2, "two parts, once each");
        let verdict = db::settled(&dir.path().join("lull.db"), SECS(10)).await;
        assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
    }
    first_parts
}

/// Before: the first part's mark waited in memory through the second part's 429 wait;
/// a kill there lost it, and the first part was sent again after the restart (a second
/// visible message on Telegram).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_a_429_wait_does_not_send_the_delivered_part_again() {
    assert_eq!(killed_during_a_429_wait(false).await, 1);
}

/// Its counter-test: with the mark deferred, the first part is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_a_kill_during_a_429_wait_with_deferred_marks_sends_twice() {
    assert_eq!(killed_during_a_429_wait(true).await, 2);
}

/// The checker's own ground: a sender that stops waiting (lull's time limit, a lost
/// lease) well before the answer closes the connection, and the webhook then records
/// no answer for it, so "seen accepted" counts only acceptances the sender saw. (Near
/// the limit the two race: the stress checker takes only quick answers as seen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_counts_an_answer_only_if_the_sender_still_waited() {
    use crate::support::fakes::webhook::Answer;
    let webhook = Webhook::start().await;
    webhook.script([Answer::Slow(Duration::from_millis(1500)), Answer::Ok]);
    let body = serde_json::json!({
        "conversation": "c", "text": "t", "covers": ["1"], "reply_id": 7, "kind": "reply"
    });
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(
        impatient
            .post(&webhook.url)
            .json(&body)
            .send()
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(webhook.received().len(), 1, "accepted at once");
    assert_eq!(webhook.times_answered(7), 0, "but the sender never saw it");
    let patient = reqwest::Client::new();
    let answer = patient.post(&webhook.url).json(&body).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(webhook.times_answered(7), 1);
}

/// The stress checker's rule on the same ground: a reply sent again after a quick
/// acceptance is a double delivery; one sent again after an acceptance answered near
/// the sender's limit (which the sender may not have seen) is not, nor one sent again
/// after a break (a kill) between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stress_checker_counts_a_resend_only_after_an_acceptance_seen() {
    use crate::support::fakes::webhook::Answer;
    use crate::support::stress::double_deliveries;
    let webhook = Webhook::start().await;
    webhook.script([
        Answer::Ok,
        Answer::Status(500),
        Answer::Slow(Duration::from_millis(300)),
        Answer::Ok,
        Answer::Ok,
        Answer::Ok,
    ]);
    let client = reqwest::Client::new();
    let post = |reply: i64| {
        let body = serde_json::json!({
            "conversation": "c", "text": "t", "covers": ["1"], "reply_id": reply, "kind": "reply"
        });
        client.post(&webhook.url).json(&body).send()
    };
    // Seen, then sent again (refused this time): a double delivery.
    post(7).await.unwrap();
    post(7).await.unwrap();
    // Answered 300 ms after it arrived: not taken as seen.
    post(8).await.unwrap();
    post(8).await.unwrap();
    // Seen, then a kill, then sent again: the window no holder can close.
    post(9).await.unwrap();
    let kill = Instant::now();
    post(9).await.unwrap();
    let doubled: Vec<i64> = double_deliveries(&webhook, &[(kill, kill)])
        .into_iter()
        .map(|(reply, _, _)| reply)
        .collect();
    assert_eq!(doubled, [7]);
    assert_eq!(
        double_deliveries(&webhook, &[]).len(),
        2,
        "without the kill, 9 too"
    );
}

/// Two `lull run` processes on one PostgreSQL database; A reaches it through a proxy
/// that goes silent (no reset, no error) while A's webhook POST is in flight (the
/// receiver answers it slowly). B takes the conversation over once A's lease expired
/// and delivers the reply. How many times a sender saw the reply accepted.
async fn frozen_path_during_a_slow_send(unbounded: bool) -> Option<usize> {
    use crate::support::fakes::webhook::Answer;
    use crate::support::freeze_proxy::FreezeProxy;
    let database = crate::support::postgres::fresh_database()?;
    let proxy = FreezeProxy::for_postgres(&database);
    let webhook = Webhook::start().await;
    // Longer than the lease's TTL and B's take-over, shorter than the store's
    // client-side deadline of a call (10 s): with sends unbounded, A's POST completes
    // after B delivered, while A's renewal still hangs.
    webhook.script([Answer::Slow(SECS(6))]);
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", "200".into()),
        ("LULL_LEASE_TTL_MS", "3000".into()),
        ("LULL_POLL_MS", "200".into()),
        ("RUST_LOG", "info".into()),
    ];
    if unbounded {
        env.push(("LULL_TEST_UNBOUNDED_SENDS", "1".into()));
    }
    let with_url = |url: String| {
        let mut env = env.clone();
        env.push(("DATABASE_URL", url));
        env
    };
    let mut a = LullProcess::start(dir.path(), "a", &["run"], &with_url(proxy.url(&database)));
    a.wait_healthy(SECS(20)).await;
    let client = reqwest::Client::new();
    let posted = crate::support::process::post_message(&client, &a.base_url(), "c", "1", "hello")
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    webhook.wait_requests(1, SECS(15)).await;
    proxy.freeze();
    let frozen_at = Instant::now();
    let mut b = LullProcess::start(dir.path(), "b", &["run"], &with_url(database.clone()));
    b.wait_healthy(SECS(20)).await;
    let reply = webhook.wait_replies(1, SECS(5)).await[0].reply_id;
    // Past A's slow answer: a send that outlived its lease has been seen accepted.
    tokio::time::sleep_until((frozen_at + SECS(8)).into()).await;
    let answered = webhook.times_answered(reply);
    println!(
        "unbounded_sends={unbounded}: reply {reply} seen accepted {answered} time(s); POSTs {}",
        webhook.requests()
    );
    proxy.thaw();
    if !unbounded {
        assert!(
            a.logs().contains("did not answer before the lease expired"),
            "{}",
            a.logs()
        );
        let verdict = db::settled(&db::Postgres(database.clone()), SECS(10)).await;
        assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
    }
    drop((a, b));
    Some(answered)
}

/// Before: A's renewal hung on the silent socket with no deadline of its own, so A's
/// slow POST went on after its lease expired; B claimed and delivered, then A's POST
/// completed: two acceptances of one reply. Now A's lease counts as lost when its local
/// validity ends, and the POST in flight is dropped before B can claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_never_outlives_its_lease_when_the_database_path_goes_silent() {
    if let Some(answered) = frozen_path_during_a_slow_send(false).await {
        assert_eq!(answered, 1);
    }
}

/// Its counter-test: with renewals and sends unbounded (`LULL_TEST_UNBOUNDED_SENDS`),
/// the reply is seen accepted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_unbounded_sends_outlive_the_lease_and_deliver_twice() {
    if let Some(answered) = frozen_path_during_a_slow_send(true).await {
        assert_eq!(answered, 2);
    }
}

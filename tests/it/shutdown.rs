//! SIGTERM: the reply in flight is delivered within the grace period (or, when the
//! grace period ends first, the lease is handed back), the process exits 0, and a
//! second process answers what was left at once instead of after the lease TTL. The
//! grace period is a hard limit: a hung model, a webhook that never answers or a
//! client that never finishes its request does not keep the process alive.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::support::db;
use crate::support::fakes::webhook::{Answer, Webhook};
use crate::support::process::{LullProcess, post_message};

/// What may pass between the end of the grace period and the exit: generous, a hang
/// detector and not a performance assertion.
const MARGIN: Duration = Duration::from_secs(3);

async fn start(
    dir: &std::path::Path,
    name: &str,
    webhook: &Webhook,
    extra: &[(&str, &str)],
) -> LullProcess {
    let mut env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", "100".into()),
        // A long TTL: a takeover that is quick proves the lease was released.
        ("LULL_LEASE_TTL_MS", "30000".into()),
        ("LULL_POLL_MS", "200".into()),
        ("RUST_LOG", "info".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let mut lull = LullProcess::start(dir, name, &["run"], &env);
    lull.wait_healthy(Duration::from_secs(20)).await;
    lull
}

/// Post a message to conversation `c`; it is stored.
async fn post(lull: &LullProcess, id: &str, text: &str) {
    let response = post_message(&reqwest::Client::new(), &lull.base_url(), "c", id, text)
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_reply_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut a = start(dir.path(), "a", &webhook, &[("LULL_ECHO_DELAY_MS", "1500")]).await;
    post(&a, "1", "hello").await;
    db::wait_for_lease(&dir.path().join("lull.db"), None, Duration::from_secs(10)).await;
    let signalled = Instant::now();
    a.signal("TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        a.logs()
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "exited within the grace period"
    );
    let replies = webhook.replies();
    assert_eq!(
        replies.len(),
        1,
        "the reply in flight was delivered before exiting"
    );
    assert_eq!(replies[0].covers, ["1"]);
    let verdict = db::check(&dir.path().join("lull.db"));
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_grace_period_ends_first_the_lease_is_released_for_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut a = start(
        dir.path(),
        "a",
        &webhook,
        &[
            ("LULL_ECHO_DELAY_MS", "20000"),
            ("LULL_SHUTDOWN_GRACE_MS", "500"),
        ],
    )
    .await;
    post(&a, "1", "hello").await;
    db::wait_for_lease(&dir.path().join("lull.db"), None, Duration::from_secs(10)).await;
    let signalled = Instant::now();
    a.signal("TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        a.logs()
    );
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_millis(500) + MARGIN,
        "a hung model kept the process {took:?} after SIGTERM (grace 500 ms)"
    );
    assert!(
        webhook.replies().is_empty(),
        "the interrupted generation delivered nothing"
    );
    assert_eq!(
        db::count(
            &dir.path().join("lull.db"),
            "SELECT COUNT(*) FROM leases WHERE holder IS NOT NULL"
        ),
        0,
        "the lease was handed back"
    );

    // A second process answers at once, not after the 30 s TTL.
    let started = Instant::now();
    let b = start(dir.path(), "b", &webhook, &[]).await;
    let replies = webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(replies[0].covers, ["1"]);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stored_before_a_stop_are_answered_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut a = start(
        dir.path(),
        "a",
        &webhook,
        &[("LULL_DEBOUNCE_MS", "5000"), ("LULL_MAX_WAIT_MS", "20000")],
    )
    .await;
    post(&a, "1", "before the restart").await;
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(webhook.replies().is_empty());
    let _b = start(dir.path(), "b", &webhook, &[]).await;
    let replies = webhook.wait_replies(1, Duration::from_secs(20)).await;
    assert_eq!(replies[0].covers, ["1"]);
}

/// A webhook that never answers and a client that never finishes its request: after
/// SIGTERM the process still exits within the grace period plus a margin (before: the
/// send was not cancelled and kept it alive until the webhook timeout). The cancelled
/// send leaves the reply in the outbox, the lease is handed back, and a restarted
/// process delivers it under the same `webhook-id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_a_hard_limit_with_a_hung_webhook_and_a_slow_client() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("lull.db");
    let webhook = Webhook::start().await;
    webhook.otherwise(Answer::Hang);
    let grace = Duration::from_millis(1000);
    let mut a = start(
        dir.path(),
        "a",
        &webhook,
        &[
            ("LULL_SHUTDOWN_GRACE_MS", "1000"),
            ("LULL_WEBHOOK_TIMEOUT_MS", "60000"),
        ],
    )
    .await;
    post(&a, "1", "hello").await;
    let hung = webhook.wait_requests(1, Duration::from_secs(15)).await;
    // A client that sends half a request and then nothing.
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", a.port))
        .await
        .unwrap();
    slow.write_all(
        b"POST /api/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"conv",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let signalled = Instant::now();
    a.signal("TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        a.logs()
    );
    let took = signalled.elapsed();
    println!("exit {took:?} after SIGTERM (grace {grace:?}) with a hung webhook");
    assert!(
        took < grace + MARGIN,
        "exit took {took:?} after SIGTERM with a grace of {grace:?}:\n{}",
        a.logs()
    );
    drop(slow);
    assert_eq!(
        db::count(
            &db_path,
            "SELECT COUNT(*) FROM outbox WHERE kind = 'reply' AND sent_at IS NULL AND failed_at IS NULL"
        ),
        1,
        "the reply stays in the outbox"
    );
    assert_eq!(
        db::count(
            &db_path,
            "SELECT COUNT(*) FROM leases WHERE holder IS NOT NULL"
        ),
        0,
        "the lease was handed back"
    );

    webhook.otherwise(Answer::Ok);
    let _b = start(dir.path(), "b", &webhook, &[]).await;
    let replies = webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["1"]);
    assert_eq!(
        replies[0].webhook_id, hung[0].webhook_id,
        "the same webhook-id"
    );
    let verdict = db::settled(&db_path, Duration::from_secs(10)).await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
}

/// A clean stop leaves a complete database file: on SIGTERM the write-ahead log is
/// checkpointed into `lull.db` and truncated, so the main file copied alone (as an
/// operator copies it after `docker compose stop`, without `-wal` and `-shm`) has
/// every message and reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_the_database_file_alone_has_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("lull.db");
    let webhook = Webhook::start().await;
    let mut a = start(dir.path(), "a", &webhook, &[]).await;
    for (id, text) in [("1", "hello"), ("2", "are you there"), ("3", "bye")] {
        post(&a, id, text).await;
    }
    let verdict = db::settled(&db_path, Duration::from_secs(15)).await;
    assert_eq!((verdict.messages, verdict.lost), (3, 0), "{verdict:?}");
    a.signal("TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        a.logs()
    );
    let size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
    println!(
        "after SIGTERM: lull.db {} bytes, lull.db-wal {} bytes",
        size(&db_path),
        size(&dir.path().join("lull.db-wal"))
    );

    let copy = tempfile::tempdir().unwrap();
    let copied = copy.path().join("lull.db");
    std::fs::copy(&db_path, &copied).unwrap();
    let conn = rusqlite::Connection::open(&copied).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
    let messages = count("SELECT COUNT(*) FROM messages");
    let sent = count("SELECT COUNT(*) FROM outbox WHERE kind = 'reply' AND sent_at IS NOT NULL");
    println!("lull.db copied alone: messages {messages:?}, sent replies {sent:?}");
    assert_eq!(
        messages.ok(),
        Some(3),
        "the main file alone has every message"
    );
    assert_eq!(
        sent.ok(),
        Some(verdict.replies as i64),
        "and every delivered reply"
    );
}

/// A receiver that keeps failing (503) when the stop begins: the round in flight does
/// not sit out its retry waits (before: up to three more attempts, a second and more
/// of the grace), it leaves the reply in the outbox for the next start and exits at
/// once; the restarted process delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_is_not_retried_once_the_stop_begins() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("lull.db");
    let webhook = Webhook::start().await;
    webhook.otherwise(Answer::Status(503));
    let mut a = start(dir.path(), "a", &webhook, &[]).await;
    post(&a, "1", "hello").await;
    webhook.wait_requests(1, Duration::from_secs(15)).await;
    a.signal("TERM");
    let at_signal = webhook.requests();
    assert_eq!(
        a.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        a.logs()
    );
    assert_eq!(
        webhook.requests(),
        at_signal,
        "no delivery attempt after the stop began:\n{}",
        a.logs()
    );
    assert_eq!(
        db::count(
            &db_path,
            "SELECT COUNT(*) FROM outbox WHERE kind = 'reply' AND sent_at IS NULL AND failed_at IS NULL"
        ),
        1,
        "the reply stays in the outbox"
    );
    webhook.otherwise(Answer::Ok);
    let _b = start(dir.path(), "b", &webhook, &[]).await;
    let replies = webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["1"]);
    let verdict = db::settled(&db_path, Duration::from_secs(10)).await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
}

//! SIGTERM: the reply in flight is delivered within the grace period (or, when the
//! grace period ends first, the lease is handed back), the process exits 0, and a
//! second process answers what was left at once instead of after the lease TTL.

use std::time::{Duration, Instant};

use crate::support::db;
use crate::support::process::{LullProcess, post_message};
use crate::support::webhook::Webhook;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_reply_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut a = start(dir.path(), "a", &webhook, &[("LULL_ECHO_DELAY_MS", "1500")]).await;
    let client = reqwest::Client::new();
    post_message(&client, &a.base_url(), "c", "1", "hello")
        .await
        .unwrap();
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
    let client = reqwest::Client::new();
    post_message(&client, &a.base_url(), "c", "1", "hello")
        .await
        .unwrap();
    db::wait_for_lease(&dir.path().join("lull.db"), None, Duration::from_secs(10)).await;
    a.signal("TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        a.logs()
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
    let client = reqwest::Client::new();
    post_message(&client, &a.base_url(), "c", "1", "before the restart")
        .await
        .unwrap();
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(webhook.replies().is_empty());
    let _b = start(dir.path(), "b", &webhook, &[]).await;
    let replies = webhook.wait_replies(1, Duration::from_secs(20)).await;
    assert_eq!(replies[0].covers, ["1"]);
}

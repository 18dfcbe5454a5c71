//! Webhook delivery through a real `lull run`: Standard Webhooks headers and
//! signatures, every failed attempt recorded and retried under one `webhook-id`, the
//! dead letter at `LULL_WEBHOOK_MAX_AGE`, and the verification snippet of docs/http-adapter.md run
//! against a real delivery.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::http_api::{Running, refused_at_start, start_with};
use crate::support::db;
use crate::support::fakes::webhook::{Answer, Request, Webhook};

/// A Standard Webhooks secret (24 random bytes) and another one.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER_SECRET: &str = "whsec_3mZ0jJ9Sx1ReA4mfpi6cL0ciQh2k3rvA";

/// The outbox row of the first reply: attempts, error, sent, failed.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    attempts: i64,
    error: Option<String>,
    sent: bool,
    failed: bool,
}

fn reply_row(app: &Running) -> Row {
    db::open(&app.db())
        .query_row(
            "SELECT attempts, error, sent_at IS NOT NULL, failed_at IS NOT NULL
             FROM outbox WHERE kind = 'reply' ORDER BY id LIMIT 1",
            [],
            |r| {
                Ok(Row {
                    attempts: r.get(0)?,
                    error: r.get(1)?,
                    sent: r.get(2)?,
                    failed: r.get(3)?,
                })
            },
        )
        .unwrap()
}

fn webhook_ids(requests: &[Request]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            r.webhook_id
                .clone()
                .expect("every request has a webhook-id")
        })
        .collect()
}

/// Before: one 4xx marked the reply failed for good. Now it is a failed attempt like
/// any other: recorded, retried, and the reply arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_then_success_is_one_delivery_with_the_attempts_recorded() {
    let webhook = Webhook::start().await;
    webhook.script([Answer::Status(400), Answer::Status(404)]);
    let app = start_with(webhook, &[]).await;
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    let replies = app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["1"]);
    let verdict = db::settled(&app.db(), Duration::from_secs(5)).await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
    let requests = app.webhook.request_log();
    assert_eq!(requests.len(), 3, "two refusals, then the delivery");
    let ids = webhook_ids(&requests);
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "one webhook-id: {ids:?}"
    );
    let row = reply_row(&app);
    assert_eq!(
        (row.attempts, row.sent, row.failed),
        (2, true, false),
        "{row:?}"
    );
    assert!(row.error.unwrap().contains("404"), "the last error is kept");
    assert_eq!(app.metric("lull_replies_failed_total").await, 0.0);
    assert_eq!(app.metric("lull_replies_sent_total").await, 1.0);
}

/// Before: the 10 s timeout fired, the attempt was not recorded and the POST was
/// repeated. Now every timed-out attempt is recorded before the next one, every POST
/// of the reply carries the same `webhook-id`, and a receiver deduplicating on it
/// shows the reply once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_slower_than_the_timeout_sees_one_webhook_id_and_shows_the_reply_once() {
    let webhook = Webhook::start().await;
    let slow = Answer::Slow(Duration::from_millis(1500));
    webhook.script([slow, slow]);
    let app = start_with(webhook, &[("LULL_WEBHOOK_TIMEOUT_MS", "300")]).await;
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    // The second POST is made only after the first attempt was recorded.
    app.webhook.wait_requests(2, Duration::from_secs(15)).await;
    assert!(reply_row(&app).attempts >= 1, "recorded before the retry");
    let requests = app.webhook.wait_requests(3, Duration::from_secs(15)).await;
    let verdict = db::settled(&app.db(), Duration::from_secs(10)).await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
    let row = reply_row(&app);
    assert_eq!((row.attempts, row.sent), (2, true), "{row:?}");
    assert!(row.error.unwrap().contains("did not answer within 300 ms"));
    let ids = webhook_ids(&requests);
    assert_eq!(ids.len(), 3);
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "one webhook-id: {ids:?}"
    );
    assert_eq!(
        app.webhook.replies().len(),
        3,
        "the slow receiver got it three times"
    );
    assert_eq!(app.webhook.shown().len(), 1, "and shows it once");
}

/// A reply still failing at `LULL_WEBHOOK_MAX_AGE` is given up: `failed_at`, one
/// ERROR line naming the conversation and reply, `lull_replies_failed_total` 1, and
/// no request after it. The conversation is not blocked by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_failing_past_its_max_age_is_dead_lettered_once() {
    let webhook = Webhook::start().await;
    webhook.otherwise(Answer::Status(503));
    let app = start_with(webhook, &[("LULL_WEBHOOK_MAX_AGE", "2s")]).await;
    assert_eq!(app.metric("lull_replies_failed_total").await, 0.0);
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reply_row_exists_and(&app, |row| row.failed) {
        assert!(
            Instant::now() < deadline,
            "not given up: {:?}",
            reply_row(&app)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let requests = app.webhook.requests();
    let row = reply_row(&app);
    assert_eq!(
        row.attempts as usize, requests,
        "every attempt recorded: {row:?}"
    );
    assert!(requests >= 3, "retried until the deadline: {requests}");
    assert!(!row.sent && row.error.unwrap().contains("503"));
    assert_eq!(app.metric("lull_replies_failed_total").await, 1.0);
    assert_eq!(app.metric("lull_replies_sent_total").await, 0.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(app.webhook.requests(), requests, "nothing is retried after");
    let errors = app.lull.error_lines("gave up");
    assert_eq!(errors.len(), 1, "{}", app.lull.logs());
    assert!(
        errors[0].contains("http:c") && errors[0].contains("reply_id=1"),
        "{}",
        errors[0]
    );
    // The next reply of the conversation goes through.
    app.webhook.otherwise(Answer::Ok);
    assert_eq!(app.post("c", "2", "again").await.0, 202);
    let replies = app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["2"]);
}

fn reply_row_exists_and(app: &Running, check: impl Fn(&Row) -> bool) -> bool {
    db::count(
        &app.db(),
        "SELECT COUNT(*) FROM outbox WHERE kind = 'reply'",
    ) > 0
        && check(&reply_row(app))
}

/// A 429 is waited out for as long as `Retry-After` says, and counts as an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_honours_retry_after() {
    let webhook = Webhook::start().await;
    webhook.script([Answer::RetryAfter(2)]);
    let app = start_with(webhook, &[]).await;
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    let requests = app.webhook.request_log();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_millis(1900), "waited {waited:?}");
    db::settled(&app.db(), Duration::from_secs(5)).await;
    assert_eq!(reply_row(&app).attempts, 1);
}

/// The receiver's check, written in the test fake apart from lull's signer: with the
/// right secret every request verifies; with another one none does, nothing is
/// accepted, and lull keeps retrying (a 401 is a failed attempt). The secret never
/// reaches the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_verify_with_the_secret_and_fail_with_another() {
    let app = start_with(
        Webhook::signed(SECRET).await,
        &[("LULL_WEBHOOK_SECRET", SECRET)],
    )
    .await;
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    let replies = app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["1"]);
    let request = &app.webhook.request_log()[0];
    assert_eq!(request.signature_ok, Some(true), "{request:?}");
    assert_eq!(request.content_type.as_deref(), Some("application/json"));
    let id = request.webhook_id.as_deref().unwrap();
    assert!(
        id.starts_with("msg_") && !id.contains('.'),
        "webhook-id {id}"
    );
    let timestamp: u64 = request.timestamp.as_deref().unwrap().parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(timestamp) <= 10, "unix seconds: {timestamp}");
    assert!(request.signature.as_deref().unwrap().starts_with("v1,"));

    let wrong = start_with(
        Webhook::signed(OTHER_SECRET).await,
        &[("LULL_WEBHOOK_SECRET", SECRET)],
    )
    .await;
    assert_eq!(wrong.post("c", "1", "hello").await.0, 202);
    let requests = wrong
        .webhook
        .wait_requests(2, Duration::from_secs(15))
        .await;
    assert!(requests.iter().all(|r| r.signature_ok == Some(false)));
    assert!(wrong.webhook.received().is_empty(), "nothing accepted");
    assert!(reply_row(&wrong).attempts >= 1);
    assert!(!reply_row(&wrong).sent);
    for logs in [app.lull.logs(), wrong.lull.logs()] {
        assert!(!logs.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "{logs}");
    }
}

/// Unsigned without a secret: a signing receiver refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_requests_are_unsigned() {
    let app = start_with(Webhook::signed(SECRET).await, &[]).await;
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    let requests = app.webhook.wait_requests(1, Duration::from_secs(15)).await;
    assert_eq!(requests[0].signature, None);
    assert!(requests[0].webhook_id.is_some() && requests[0].timestamp.is_some());
}

/// A malformed secret stops `lull run` at start with a message naming the variable,
/// and without the secret in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_secret_is_refused_at_start() {
    for secret in [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_MfKQ9r8GK!qrTwjUPD8ILPZIo2LaLaSw",
        "whsec_c2hvcnQ=",
    ] {
        let (code, logs) = refused_at_start(&[("LULL_WEBHOOK_SECRET", secret.into())]);
        assert_eq!(code, Some(2), "{secret}: {logs}");
        assert!(logs.contains("LULL_WEBHOOK_SECRET"), "{logs}");
        assert!(
            !logs.contains("MfKQ9r8GK") && !logs.contains("c2hvcnQ"),
            "{logs}"
        );
    }
}

/// The Python verification snippet of docs/http-adapter.md, run with `python3` against a real
/// signed delivery: it accepts it, and refuses a wrong secret, a changed body and a
/// stale timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_python_snippet_verifies_a_real_delivery() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        crate::support::skip::skipped("the README's Python snippet", "python3 is not installed");
        return;
    }
    let readme = include_str!("../../docs/http-adapter.md");
    let snippet = readme
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/http-adapter.md has a ```python block");
    let app = start_with(
        Webhook::signed(SECRET).await,
        &[("LULL_WEBHOOK_SECRET", SECRET)],
    )
    .await;
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    let request = &app.webhook.request_log()[0];
    assert_eq!(request.signature_ok, Some(true));
    let delivery = json!({
        "secret": SECRET,
        "other_secret": OTHER_SECRET,
        "headers": {
            "webhook-id": request.webhook_id,
            "webhook-timestamp": request.timestamp,
            "webhook-signature": request.signature,
        },
        "body": String::from_utf8(request.body.clone()).unwrap(),
    });
    let driver = r#"
import json, sys
d = json.load(open(sys.argv[1]))
body = d["body"].encode()
h = d["headers"]
assert verify(d["secret"], h, body), "a real delivery verifies"
assert not verify(d["other_secret"], h, body), "another secret does not"
assert not verify(d["secret"], h, body.replace(b"hello", b"hellO")), "a changed body does not"
old = dict(h, **{"webhook-timestamp": str(int(h["webhook-timestamp"]) - 3600)})
assert not verify(d["secret"], old, body), "an old timestamp does not"
print("verified")
"#;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("verify.py");
    std::fs::write(&script, format!("{snippet}\n{driver}")).unwrap();
    let data = dir.path().join("delivery.json");
    std::fs::write(&data, delivery.to_string()).unwrap();
    let output = std::process::Command::new("python3")
        .arg(&script)
        .arg(&data)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("verified"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

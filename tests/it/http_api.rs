//! The HTTP surface of a real `lull run`: health, metrics that move with traffic, the
//! http adapter's validation and auth, and webhook retries.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Backend, TestDb};
use crate::support::db;
use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, free_port, post_message};

/// A `lull run` with the http adapter on, its webhook and database.
pub(crate) struct Running {
    pub dir: tempfile::TempDir,
    pub lull: LullProcess,
    pub webhook: Webhook,
    pub client: reqwest::Client,
}

impl Running {
    pub(crate) fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("lull.db")
    }

    pub(crate) async fn post(&self, conversation: &str, id: &str, text: &str) -> (u16, Value) {
        let r = post_message(&self.client, &self.lull.base_url(), conversation, id, text)
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn post_raw(&self, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}/api/messages", self.lull.base_url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn metric(&self, name: &str) -> f64 {
        self.lull
            .metrics()
            .await
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(f64::NAN)
    }
}

async fn start(extra: &[(&str, &str)]) -> Running {
    start_with(Webhook::start().await, extra).await
}

/// `lull run` posting to `webhook`, with `extra` environment on top of short timings.
pub(crate) async fn start_with(webhook: Webhook, extra: &[(&str, &str)]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", "200".into()),
        ("LULL_MAX_WAIT_MS", "5000".into()),
        ("RUST_LOG", "info".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    lull.wait_healthy(Duration::from_secs(20)).await;
    Running {
        dir,
        lull,
        webhook,
        client: reqwest::Client::new(),
    }
}

/// `/healthz` and `/metrics` answer, and the counters move by exactly what a scripted
/// exchange should cause; the invariant checker reads the same story from the
/// database. On both backends: the real binary with `DATABASE_URL=sqlite:…` and
/// `DATABASE_URL=postgres://…`.
async fn health_and_metrics_follow_a_scripted_exchange(backend: Backend) {
    let Some(database) = TestDb::new(backend) else {
        return;
    };
    let app = start(&[
        ("DATABASE_URL", &database.url()),
        ("LULL_ECHO_DELAY_MS", "1000"),
    ])
    .await;
    let health: Value = reqwest::get(format!("{}/healthz", app.lull.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        health,
        json!({"status": "ok", "database": "ok", "adapters": {"http": "up"},
               "web": {"fetch": "on", "search": "off"}})
    );
    assert_eq!(app.metric("lull_messages_ingested_total").await, 0.0);
    assert_eq!(app.metric("lull_replies_sent_total").await, 0.0);

    // A burst of three (one of them redelivered) gets one reply.
    for (id, text) in [
        ("1", "alpha"),
        ("2", "bravo"),
        ("2", "bravo"),
        ("3", "charlie"),
    ] {
        assert_eq!(app.post("first", id, text).await.0, 202);
    }
    let replies = app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies[0].covers, ["1", "2", "3"]);

    // A message arriving during generation: the first generation is stopped (the
    // newer message overtook it) and its reply never written.
    assert_eq!(app.post("second", "a", "question").await.0, 202);
    db::wait_for_lease(&database, Some("second"), Duration::from_secs(10)).await;
    assert_eq!(app.post("second", "b", "follow-up").await.0, 202);
    let replies = app.webhook.wait_replies(2, Duration::from_secs(15)).await;
    assert_eq!(replies[1].covers, ["a", "b"]);

    // Gauges and counters are read once the pending gauge had a poll to update (a
    // loaded machine may take more than one poll interval).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = app.lull.metrics().await.unwrap();
        let settled = m.get("lull_pending_conversations") == Some(&0.0);
        if settled || std::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let get = |name: &str| m.get(name).copied().unwrap_or(f64::NAN);
    assert_eq!(get("lull_messages_ingested_total"), 5.0, "{m:#?}");
    assert_eq!(get("lull_replies_sent_total"), 2.0);
    assert_eq!(get("lull_replies_dropped_stale_total"), 1.0);
    assert_eq!(get("lull_generations_cancelled_total"), 1.0);
    assert_eq!(get("lull_llm_requests_total{outcome=\"ok\"}"), 2.0);
    assert_eq!(get("lull_llm_requests_total{outcome=\"cancelled\"}"), 1.0);
    assert_eq!(get("lull_batch_messages_count"), 2.0);
    assert_eq!(get("lull_batch_messages_sum"), 5.0);
    assert_eq!(get("lull_llm_seconds_count"), 3.0);
    assert_eq!(get("lull_lease_contended_total"), 0.0);
    assert_eq!(get("lull_pending_conversations"), 0.0);
    let verdict = db::settled(&database, Duration::from_secs(10)).await;
    assert_eq!(
        (
            verdict.messages,
            verdict.replies,
            verdict.duplicates,
            verdict.lost,
            verdict.stale
        ),
        (5, 2, 0, 0, 0),
        "{verdict:?}"
    );
}
crate::on_both_backends!(
    health_and_metrics_follow_a_scripted_exchange,
    super::health_and_metrics_follow_a_scripted_exchange
);

/// Bad input gets a 4xx with a message saying what is wrong, and the process keeps
/// serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly_and_the_process_keeps_serving() {
    let app = start(&[]).await;
    let cases: Vec<(reqwest::Body, u16, &str)> = vec![
        ("{not json".into(), 400, "malformed JSON"),
        (
            r#"{"conversation":"c","user":"u","id":"1"}"#.into(),
            400,
            "missing field `text`",
        ),
        (
            r#"{"conversation":"c","user":"u","text":"   ","id":"1"}"#.into(),
            400,
            "`text` is empty",
        ),
        (
            r#"{"conversation":"","user":"u","text":"hi","id":"1"}"#.into(),
            400,
            "`conversation` must not be empty",
        ),
        (
            r#"{"conversation":"c","user":"u","text":"hi","id":null}"#.into(),
            400,
            "`id` must be",
        ),
        (r#"[1,2,3]"#.into(), 400, "invalid message"),
        (
            json!({"conversation":"c","user":"u","text":"x".repeat(20_000),"id":"2"})
                .to_string()
                .into(),
            413,
            "too long",
        ),
    ];
    for (body, status, message) in cases {
        let (got, json) = app.post_raw(body).await;
        assert_eq!(got, status, "{json}");
        let error = json["error"].as_str().unwrap_or_default();
        assert!(error.contains(message), "expected '{message}' in {json}");
    }
    // A 10 MB body: the server answers 413 as soon as it sees the length (and may
    // close the connection before the client finished writing, so use a raw socket).
    let (status, body) = raw_post(app.lull.port, &vec![b'a'; 10 * 1024 * 1024]).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("too large"), "{body}");
    assert_eq!(
        db::count(&app.db(), "SELECT COUNT(*) FROM messages"),
        0,
        "nothing was stored"
    );
    // Still serving.
    assert_eq!(app.post("c", "ok", "hello").await.0, 202);
    let replies = app.webhook.wait_replies(1, Duration::from_secs(10)).await;
    assert_eq!(replies[0].covers, ["ok"]);
}

/// POST a body over a plain socket, reading the response even if the server stops
/// reading the body early.
async fn raw_post(port: u16, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST /api/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let body = body.to_vec();
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&body).await;
    });
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut response)).await;
    writing.abort();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// `7` and `"7"` are two ids, each given back in `covers` with the JSON type it was
/// sent with; integers that do not fit 64 bits, floats, booleans and null are refused
/// (before, numbers went through `f64`, so two large ids became one "duplicate").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_keep_their_json_type_and_ids_that_could_collide_are_refused() {
    let app = start(&[]).await;
    let message =
        |id: &str| format!(r#"{{"conversation":"c","user":"u","text":"a message","id":{id}}}"#);
    for id in [
        "7",
        r#""7""#,
        "18446744073709551615",
        "-9223372036854775808",
    ] {
        let (status, body) = app.post_raw(message(id)).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (202, Some("stored")),
            "{id}: {body}"
        );
    }
    let replies = app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(
        replies[0].body["covers"],
        json!([7, "7", 18446744073709551615u64, i64::MIN]),
        "ids come back exactly as sent"
    );
    for id in [
        "18446744073709551616",
        "18446744073709551617",
        "1.5",
        "7.0",
        "1e3",
        "true",
        "null",
        r#""""#,
        "[7]",
    ] {
        let (status, body) = app.post_raw(message(id)).await;
        assert_eq!(status, 400, "{id}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("`id`"),
            "{id}: {body}"
        );
    }
    assert_eq!(db::count(&app.db(), "SELECT COUNT(*) FROM messages"), 4);
}

/// `conversation`, `user` and `id` are at most 256 bytes, `name` at most 128; longer
/// ones are refused with a message naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identifiers_have_a_length_limit() {
    let app = start(&[]).await;
    let long = |n: usize| "é".repeat(n / 2) + &"x".repeat(n % 2);
    let body = |conversation: &str, user: &str, id: &str, name: &str| {
        json!({"conversation": conversation, "user": user, "text": "hi", "id": id, "name": name})
            .to_string()
    };
    let cases = [
        (body(&long(257), "u", "1", "n"), "`conversation`"),
        (body(&"c".repeat(200_000), "u", "1", "n"), "`conversation`"),
        (body("c", &long(257), "1", "n"), "`user`"),
        (body("c", "u", &long(257), "n"), "`id`"),
        (body("c", "u", "1", &long(129)), "`name`"),
    ];
    for (request, field) in cases {
        let (status, json) = app.post_raw(request).await;
        assert_eq!(status, 400, "{field}: {json}");
        let error = json["error"].as_str().unwrap();
        assert!(
            error.contains(field) && error.contains("bytes"),
            "{field}: {error}"
        );
    }
    assert_eq!(db::count(&app.db(), "SELECT COUNT(*) FROM messages"), 0);
    let (status, json) = app
        .post_raw(body(&long(256), &long(256), &long(256), &long(128)))
        .await;
    assert_eq!(status, 202, "the limits themselves are accepted: {json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_is_required_when_set() {
    let app = start(&[("LULL_HTTP_TOKEN", "s3cret-token")]).await;
    assert_eq!(app.post("c", "1", "hi").await.0, 401);
    let wrong = app
        .client
        .post(format!("{}/api/messages", app.lull.base_url()))
        .bearer_auth("guess")
        .json(&json!({"conversation":"c","user":"u","text":"hi","id":"1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let right = app
        .client
        .post(format!("{}/api/messages", app.lull.base_url()))
        .bearer_auth("s3cret-token")
        .json(&json!({"conversation":"c","user":"u","text":"hi","id":"1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status().as_u16(), 202);
    // The scheme name is case-insensitive (RFC 9110).
    for (n, scheme) in ["bearer", "BEARER"].into_iter().enumerate() {
        let response = app
            .client
            .post(format!("{}/api/messages", app.lull.base_url()))
            .header("authorization", format!("{scheme} s3cret-token"))
            .json(&json!({"conversation":"c","user":"u","text":"hi","id": n + 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 202, "{scheme}");
    }
    app.webhook.wait_replies(1, Duration::from_secs(10)).await;
    assert!(
        !app.lull.logs().contains("s3cret-token"),
        "the token never appears in logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_without_a_token_is_refused_at_start() {
    let (code, logs) = refused_at_start(&[("LULL_HTTP_ADDR", format!("0.0.0.0:{}", free_port()))]);
    assert_eq!(code, Some(2), "{logs}");
    assert!(logs.contains("LULL_HTTP_TOKEN"), "{logs}");
}

/// `lull run` with the http adapter and `extra` environment, expected to stop at
/// start: its exit code and logs.
pub(crate) fn refused_at_start(extra: &[(&str, String)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", "http://127.0.0.1:9/replies".into()),
    ];
    env.extend(extra.iter().cloned());
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    (lull.wait_exit(Duration::from_secs(10)), lull.logs())
}

/// A failing webhook is retried with backoff; the reply arrives once, under one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_webhook_is_retried_until_it_accepts() {
    let app = start(&[]).await;
    app.webhook.fail_next(2);
    assert_eq!(app.post("c", "1", "hello").await.0, 202);
    let replies = app.webhook.wait_replies(1, Duration::from_secs(15)).await;
    assert_eq!(replies.len(), 1);
    assert_eq!(app.webhook.requests(), 3, "two failures, then success");
    assert_eq!(replies[0].text, "[echo] 1 message:\nhello");
    assert!(replies[0].reply_id > 0);
}

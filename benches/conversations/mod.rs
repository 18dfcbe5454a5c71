//! Long conversations and retention (issue 41), against the release binary:
//!
//! - the characters (and tokens, estimated at four characters a token, as lull's own
//!   estimate does for ASCII) sent to the model over one conversation of
//!   `messages` one-message bursts: the window alone (`LULL_SUMMARY=off`), the window
//!   with summaries (chat requests and summary requests), and, computed from the same
//!   messages, the whole history every time (a bot without a window). The chat model
//!   answers a fixed 300-character reply, the summary model a fixed 1,200-character
//!   summary (the 300 words its instructions allow): the worst case of a summary;
//! - retention on a database of `rows` answered messages and as many delivered
//!   replies, all older than `LULL_RETENTION_DAYS=1`: texts removed per second, and
//!   ingest latency (4 clients) while the sweep runs against the same ingest without
//!   retention, measured in the same run on the same file.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fakes::openai::{Behavior, FakeOpenAi, Recorded};
use crate::{Bot, Table, far_timers, now_ms, percentile, post_text};

const SUMMARIZER: &str = "summarizer";

/// A message of about 100 characters, different for each `i`.
fn message(i: usize) -> String {
    format!(
        "Message {i}: about the plan for week {} we said {} items at {} each, ok?",
        i % 52,
        i * 7 % 100,
        i * 13 % 1000
    )
}

/// What the requests of one run carried.
#[derive(Debug, Default)]
struct Sent {
    chat_requests: usize,
    chat_chars: usize,
    summary_requests: usize,
    summary_chars: usize,
    /// The system message's characters (for the whole-history computation).
    system_chars: usize,
}

fn chars(request: &Recorded) -> usize {
    request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match &m["content"] {
            Value::String(s) => s.chars().count(),
            other => other.to_string().chars().count(),
        })
        .sum()
}

/// One conversation of `messages` bursts, with summaries on or off.
async fn conversation(messages: usize, summaries: bool, reply: &str) -> Sent {
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::Content(reply.to_owned()));
    model.route_model(SUMMARIZER, Behavior::Content("s".repeat(1200)));
    let bot = Bot::start(&[
        ("LULL_LLM", "openai".into()),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("LULL_SUMMARY", if summaries { "on" } else { "off" }.into()),
        ("LULL_SUMMARY_MODEL", SUMMARIZER.into()),
        ("LULL_TOOLS", "off".into()),
        ("LULL_STREAM", "off".into()),
        ("LULL_DEBOUNCE", "fixed".into()),
        ("LULL_DEBOUNCE_MS", "20".into()),
    ])
    .await;
    for i in 0..messages {
        assert_eq!(
            post_text(&bot, "long", &format!("m{i}"), &message(i)).await,
            202
        );
        bot.webhook
            .wait_replies(i + 1, Duration::from_secs(30))
            .await;
    }
    // The last summary, if one was asked for, lands.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sent = Sent::default();
    for request in model.requests() {
        if request.body["model"] == SUMMARIZER {
            sent.summary_requests += 1;
            sent.summary_chars += chars(&request);
        } else {
            if sent.chat_requests == 0 {
                sent.system_chars = request.body["messages"][0]["content"]
                    .as_str()
                    .map_or(0, |s| s.chars().count());
            }
            sent.chat_requests += 1;
            sent.chat_chars += chars(&request);
        }
    }
    assert_eq!(sent.chat_requests, messages, "one request per burst");
    sent
}

/// The tokens rows (order 100–105).
pub(crate) async fn summary_rows(table: &mut Table, messages: usize) {
    let reply = "r".repeat(300);
    let window = conversation(messages, false, &reply).await;
    let summarised = conversation(messages, true, &reply).await;
    // A bot that sends the whole history every time: request k carries the system
    // prompt, the k earlier messages and replies, and message k.
    let whole: usize = (0..messages)
        .map(|k| {
            window.system_chars
                + (0..k)
                    .map(|j| message(j).chars().count() + reply.len())
                    .sum::<usize>()
                + message(k).chars().count()
        })
        .sum();
    let tokens = |chars: usize| chars.div_ceil(4) as f64;
    let setting = format!("{messages} messages, LULL_HISTORY_MESSAGES=20");
    table.record(
        100,
        &format!("long conversation: tokens sent, window only (LULL_SUMMARY=off), {setting}"),
        "tokens",
        tokens(window.chat_chars),
        "",
    );
    table.record(
        101,
        &format!("long conversation: tokens sent, window and summaries (chat + summary requests), {setting}"),
        "tokens",
        tokens(summarised.chat_chars + summarised.summary_chars),
        &format!(
            "of which summary requests: {} tokens in {}",
            tokens(summarised.summary_chars),
            summarised.summary_requests
        ),
    );
    table.record(
        102,
        &format!(
            "long conversation: tokens sent, the whole history every time (no window), {setting}"
        ),
        "tokens",
        tokens(whole),
        "computed from the same messages",
    );
    table.record(
        103,
        "long conversation: summaries with / window only (tokens)",
        "×",
        tokens(summarised.chat_chars + summarised.summary_chars) / tokens(window.chat_chars),
        "",
    );
}

/// Fill the SQLite file at `db` (migrated, no process on it) with `rows` answered
/// messages in conversations of 100, each with a delivered reply, ten days old.
fn fill(db: &std::path::Path, rows: usize) {
    let mut conn = rusqlite::Connection::open(db).unwrap();
    let old = now_ms() - 10 * 86_400_000;
    let tx = conn.transaction().unwrap();
    let text = "t".repeat(100);
    let reply = "r".repeat(300);
    for c in 0..rows.div_ceil(100) {
        tx.execute(
            "INSERT INTO conversations (platform, key, version, answered_version, created_at)
             VALUES ('http', ?1, 100, 100, ?2)",
            rusqlite::params![format!("old-{c}"), old],
        )
        .unwrap();
        let conversation = tx.last_insert_rowid();
        for v in 1..=100.min(rows - c * 100) as i64 {
            tx.execute(
                "INSERT INTO messages (conversation_id, platform_message_id, user_id, author, text, version, received_at)
                 VALUES (?1, ?2, 'u1', 'u1', ?3, ?4, ?5)",
                rusqlite::params![conversation, format!("m{v}"), text, v, old],
            )
            .unwrap();
            let message = tx.last_insert_rowid();
            tx.execute(
                "INSERT INTO outbox (conversation_id, kind, text, version, owner, created_at, parts_sent, next_attempt_at, sent_at)
                 VALUES (?1, 'reply', ?2, ?3, 'bench', ?4, 1, ?4, ?4)",
                rusqlite::params![conversation, reply, v, old],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO reply_covers (outbox_id, message_id) VALUES (?1, ?2)",
                rusqlite::params![tx.last_insert_rowid(), message],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// Post to `bot` from 4 clients until `until` is set (at least `min` messages); the
/// latencies in milliseconds, sorted.
async fn ingest_until(bot: &Arc<Bot>, until: Arc<AtomicBool>, min: usize, tag: &str) -> Vec<f64> {
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..4 {
        let (bot, until, tag) = (bot.clone(), until.clone(), tag.to_owned());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while !until.load(Ordering::SeqCst) || latencies.len() < min / 4 {
                let took = bot
                    .post(&format!("{tag}-{client}-{}", i % 100), &format!("m{i}"))
                    .await;
                latencies.push(took.as_secs_f64() * 1000.0);
                i += 1;
            }
            latencies
        });
    }
    let mut all = Vec::new();
    while let Some(part) = tasks.join_next().await {
        all.extend(part.unwrap());
    }
    all.sort_by(f64::total_cmp);
    all
}

/// The retention rows (order 110–115).
pub(crate) async fn retention_rows(table: &mut Table, rows: usize) {
    // A migrated file, filled while no process is on it.
    let (dir, webhook) = Bot::start(&[]).await.stop();
    fill(&dir.path().join("lull.db"), rows);
    // Ingest without retention: the baseline, on the same file.
    let bot = Arc::new(Bot::start_in(dir, webhook, &far_timers()).await);
    let stop = Arc::new(AtomicBool::new(true));
    let baseline = ingest_until(&bot, stop, 2000, "base").await;
    let (dir, webhook) = Arc::into_inner(bot).unwrap().stop();
    // With retention: the sweep starts at the process's first look.
    let mut env = far_timers();
    env.push(("LULL_RETENTION_DAYS", "1".into()));
    // Counted from before the start: the sweep may begin before the process answers
    // its health check (a rate on the low side, never the high).
    let started = Instant::now();
    let bot = Arc::new(Bot::start_in(dir, webhook, &env).await);
    let done = Arc::new(AtomicBool::new(false));
    let ingest = tokio::spawn({
        let (bot, done) = (bot.clone(), done.clone());
        async move { ingest_until(&bot, done, 0, "during").await }
    });
    let removed = |metrics: &std::collections::BTreeMap<String, f64>, kind: &str| {
        metrics
            .get(&format!("lull_retention_removed_total{{kind=\"{kind}\"}}"))
            .copied()
            .unwrap_or(0.0)
    };
    let took = loop {
        let metrics = bot.lull.metrics().await.unwrap_or_default();
        if removed(&metrics, "message") >= rows as f64 && removed(&metrics, "reply") >= rows as f64
        {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "retention never finished"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    done.store(true, Ordering::SeqCst);
    let during = ingest.await.unwrap();
    let texts = 2 * rows;
    table.record(
        110,
        &format!(
            "retention: texts removed per second ({rows} messages + {rows} replies, batches of 500)"
        ),
        "rows/s",
        texts as f64 / took.as_secs_f64(),
        &format!("the sweep took {:.1} s", took.as_secs_f64()),
    );
    for (order, p) in [(111, 50.0), (112, 99.0)] {
        table.record(
            order,
            &format!("retention: ingest p{p} while it runs, 4 clients"),
            "ms",
            percentile(&during, p),
            &format!("without retention: {:.2} ms", percentile(&baseline, p)),
        );
    }
    drop(bot);
}

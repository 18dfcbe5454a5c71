//! The fault table: every defect the hardening issue listed, provoked through the real
//! `lull` binary against loopback fakes of Telegram, the model server and a webhook,
//! with what the user sees afterwards. One row per fault; the test prints the table
//! (`cargo test --test it fault_table -- --nocapture`).
//!
//! Each row asserts the guarantee it is about (and the invariant checker where
//! messages are answered), so a regression fails the row that names it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::health::damage;
use crate::support::db;
use crate::support::fakes::openai::{Behavior, FakeOpenAi, Server};
use crate::support::fakes::telegram::{TelegramFake, edited, mention, text_message};
use crate::support::fakes::webhook::{Answer, Webhook};
use crate::support::process::LullProcess;

const WAIT: Duration = Duration::from_secs(20);

/// One row of the table.
struct Row {
    fault: &'static str,
    saw: String,
}

/// A `lull run` in a folder of its own with whatever it talks to.
struct Bot {
    dir: tempfile::TempDir,
    lull: LullProcess,
}

impl Bot {
    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    async fn post(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let response = reqwest::Client::new()
            .post(format!("{}/api/messages", self.lull.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or_default())
    }

    async fn say(&self, conversation: &str, id: &str, text: &str) -> u16 {
        self.post(json!({"conversation": conversation, "user": "u", "text": text, "id": id}))
            .await
            .0
    }
}

async fn start(extra: &[(&'static str, String)]) -> Bot {
    let dir = tempfile::tempdir().unwrap();
    let mut env: Vec<(&'static str, String)> = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_ALLOWED_USERS", "*".into()),
        ("LULL_DEBOUNCE_MS", "100".into()),
        ("LULL_MAX_WAIT_MS", "3000".into()),
        ("LULL_POLL_MS", "200".into()),
        ("RUST_LOG", "info".into()),
    ];
    for (key, value) in extra {
        env.retain(|(k, _)| k != key);
        env.push((key, value.clone()));
    }
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    if !extra.iter().any(|(k, _)| *k == "TELEGRAM_BOT_TOKEN") {
        lull.wait_healthy(WAIT).await;
    }
    Bot { dir, lull }
}

fn no_duplicate_no_loss(verdict: &db::Verdict) {
    assert_eq!(
        (verdict.duplicates, verdict.lost, verdict.stale),
        (0, 0, 0),
        "{verdict:?}"
    );
}

fn one_line(text: &str) -> String {
    let line = text.replace('\n', " / ");
    if line.chars().count() > 70 {
        format!("{}…", line.chars().take(70).collect::<String>())
    } else {
        line
    }
}

/// 1. An edit during generation, before the cap: the generation is stopped (the
///    edit overtook it) and one reply covers the edited burst. (The cap's forced
///    reply is `edits::an_edit_under_the_cap_is_answered_once`, cancellation off.)
async fn edit_under_the_cap() -> Row {
    let telegram = TelegramFake::start().await;
    let bot = start(&[
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("LULL_ECHO_DELAY_MS", "1500".into()),
        ("LULL_MAX_WAIT_MS", "5000".into()),
        // "typing…" (not a draft) in the private chat: it shows when generation starts.
        ("LULL_STREAM", "off".into()),
    ])
    .await;
    let chat = 5101;
    let first = text_message(chat, chat, "alpha");
    telegram.push_message(first.clone());
    telegram.push_message(text_message(chat, chat, "bravo"));
    telegram
        .wait_for("generation started", WAIT, |f| {
            f.actions().iter().any(|a| a.chat_id == chat).then_some(())
        })
        .await;
    telegram.push("edited_message", edited(&first, "alpha, edited"));
    let sent = telegram.wait_sent(chat, 1, WAIT).await;
    let verdict = db::settled(&bot.db(), WAIT).await;
    no_duplicate_no_loss(&verdict);
    assert_eq!(verdict.replies, 1, "{verdict:?}");
    assert_eq!(sent[0].text, "[echo] 2 messages:\nalpha, edited\nbravo");
    Row {
        fault: "edit during generation (before the cap)",
        saw: format!(
            "the generation stopped; one reply covering the edit: «{}»",
            one_line(&sent[0].text)
        ),
    }
}

/// 2. `/reset` as a group's first message.
async fn reset_first_in_a_group() -> Row {
    let telegram = TelegramFake::start().await;
    let _bot = start(&[
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("LULL_LLM", "echo".into()),
        // In a group only an admin may /reset.
        ("LULL_ADMINS", "telegram:77".into()),
    ])
    .await;
    let group = -5102;
    telegram.push_message(mention(group, 77, "/reset"));
    telegram.wait_sent(group, 1, WAIT).await;
    telegram.push_message(mention(group, 77, "hello all"));
    let sent = telegram.wait_sent(group, 2, WAIT).await;
    assert!(
        sent[1].text.contains("User77: hello all"),
        "{}",
        sent[1].text
    );
    Row {
        fault: "/reset as a group's first message",
        saw: format!(
            "«{}», then «{}» (author names kept)",
            one_line(&sent[0].text),
            one_line(&sent[1].text)
        ),
    }
}

/// 3. The model refuses the batch as longer than its context.
async fn model_refuses_as_too_long() -> Row {
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::ContextLength(Server::OpenAi));
    let webhook = Webhook::start().await;
    let bot = start(&[
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_eq!(bot.say("c", "1", &"word ".repeat(3000)).await, 202);
    webhook
        .wait_until_received(WAIT, |r| r.kind == "notice" && r.covers == ["1"])
        .await;
    model.fallback(Behavior::Answer);
    assert_eq!(bot.say("c", "2", "a short question").await, 202);
    let replies = webhook.wait_replies(1, WAIT).await;
    assert_eq!(replies[0].covers, ["2"]);
    let verdict = db::settled(&bot.db(), WAIT).await;
    no_duplicate_no_loss(&verdict);
    let notice = webhook
        .received()
        .into_iter()
        .find(|r| r.kind == "notice")
        .unwrap();
    Row {
        fault: "model answers 400 context_length_exceeded",
        saw: format!(
            "{} model calls, one notice «{}»; the next message answered",
            model.requests().len() - 1,
            one_line(&notice.text)
        ),
    }
}

/// 4. The webhook refuses a delivery with a 4xx.
async fn webhook_4xx() -> Row {
    let webhook = Webhook::start().await;
    webhook.script([Answer::Status(404)]);
    let bot = start(&[
        ("LULL_LLM", "echo".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    bot.say("c", "1", "hello").await;
    let replies = webhook.wait_replies(1, WAIT).await;
    db::settled(&bot.db(), WAIT).await;
    let attempts = db::count(
        &bot.db(),
        "SELECT attempts FROM outbox WHERE kind = 'reply'",
    );
    assert_eq!((replies.len(), attempts), (1, 1));
    Row {
        fault: "webhook answers 404 once",
        saw: "the reply, once, on the retry (1 failed attempt recorded)".into(),
    }
}

/// 5. The webhook answers slower than lull's time limit.
async fn webhook_too_slow() -> Row {
    let webhook = Webhook::start().await;
    webhook.script([Answer::Slow(Duration::from_millis(1500))]);
    let bot = start(&[
        ("LULL_LLM", "echo".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_WEBHOOK_TIMEOUT_MS", "400".into()),
    ])
    .await;
    bot.say("c", "1", "hello").await;
    webhook.wait_replies(2, WAIT).await;
    db::settled(&bot.db(), WAIT).await;
    let ids: Vec<_> = webhook
        .replies()
        .into_iter()
        .map(|r| r.webhook_id.unwrap())
        .collect();
    assert_eq!(ids[0], ids[1], "one webhook-id for both POSTs");
    assert_eq!(webhook.shown().len(), 1);
    Row {
        fault: "webhook answers after LULL_WEBHOOK_TIMEOUT_MS",
        saw: format!("2 POSTs with the same webhook-id {}; shown once", ids[0]),
    }
}

/// 6. The database file is damaged while lull runs.
async fn damaged_database() -> Row {
    let webhook = Webhook::start().await;
    let bot = start(&[
        ("LULL_LLM", "echo".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    for i in 0..10 {
        bot.say(&format!("c{i}"), "1", &"x".repeat(3000)).await;
    }
    webhook.wait_replies(10, WAIT).await;
    db::settled(&bot.db(), WAIT).await;
    damage(&bot.db());
    let refused = bot.say("new", "1", "hello").await;
    let health = reqwest::get(format!("{}/healthz", bot.lull.base_url()))
        .await
        .unwrap();
    assert_eq!((refused, health.status().as_u16()), (503, 503));
    let reports = bot
        .lull
        .logs()
        .lines()
        .filter(|l| l.contains("the database is failing"))
        .count();
    assert_eq!(reports, 1);
    Row {
        fault: "database file damaged while running",
        saw: "message refused with 503 (send again); /healthz 503, logged once".into(),
    }
}

/// 7. The model answers with 2 MB of text.
async fn huge_answer() -> Row {
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::Content("lorem ipsum dolor\n\n".repeat(100_000)));
    let webhook = Webhook::start().await;
    let bot = start(&[
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    bot.say("c", "1", "write a lot").await;
    let replies = webhook.wait_replies(1, WAIT).await;
    let chars = replies[0].text.chars().count();
    assert!(chars <= 16_000, "{chars}");
    assert!(
        replies[0].text.ends_with("characters]"),
        "{}",
        replies[0].text
    );
    Row {
        fault: "model answers 2 MB",
        saw: format!("one reply of {chars} characters ending «[… reply cut at 16000 characters]»"),
    }
}

/// 8. The model server echoes the `Authorization` header in its error.
async fn key_echoed_by_the_server() -> Row {
    let key = "sk-fault-table-0123456789abcdef";
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::EchoAuthorization(401));
    let webhook = Webhook::start().await;
    let bot = start(&[
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_API_KEY", key.into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    bot.say("c", "1", "hello").await;
    webhook
        .wait_until_received(WAIT, |r| r.kind == "notice")
        .await;
    db::settled(&bot.db(), WAIT).await;
    let logs = bot.lull.logs();
    assert!(logs.contains("OPENAI_API_KEY"), "{logs}");
    assert!(
        !logs.contains(key) && !logs.contains("0123456789abcdef"),
        "{logs}"
    );
    let notice = &webhook.received()[0];
    assert!(!notice.text.contains(key));
    Row {
        fault: "model server echoes the Authorization header (401)",
        saw: format!(
            "notice «{}»; the log names OPENAI_API_KEY, never the key",
            one_line(&notice.text)
        ),
    }
}

/// 9. SIGTERM while a webhook send hangs.
async fn shutdown_with_a_hung_send() -> Row {
    let webhook = Webhook::start().await;
    webhook.script([Answer::Hang]);
    let mut bot = start(&[
        ("LULL_LLM", "echo".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_SHUTDOWN_GRACE_MS", "1000".into()),
    ])
    .await;
    bot.say("c", "1", "hello").await;
    webhook.wait_requests(1, WAIT).await;
    let signalled = Instant::now();
    bot.lull.signal("TERM");
    assert_eq!(bot.lull.wait_exit(WAIT), Some(0));
    let took = signalled.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    bot.lull.restart();
    bot.lull.wait_healthy(WAIT).await;
    webhook.wait_replies(1, WAIT).await;
    let verdict = db::settled(&bot.db(), WAIT).await;
    no_duplicate_no_loss(&verdict);
    Row {
        fault: "SIGTERM while a webhook send hangs (grace 1 s)",
        saw: format!(
            "exit after {:.1} s; the reply delivered by the next process",
            took.as_secs_f64()
        ),
    }
}

/// 10. Telegram rejects the bot token.
async fn rejected_token() -> Row {
    let telegram = TelegramFake::start().await;
    let mut bot = start(&[
        (
            "TELEGRAM_BOT_TOKEN",
            "5102:wrong-token-for-the-fault-table".into(),
        ),
        ("TELEGRAM_API_URL", telegram.url.clone()),
    ])
    .await;
    let code = bot.lull.wait_exit(WAIT);
    assert!(matches!(code, Some(c) if c != 0), "{code:?}");
    let logs = bot.lull.logs();
    let line = logs
        .lines()
        .rev()
        .find(|l| l.contains("TELEGRAM_BOT_TOKEN"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(!logs.contains("wrong-token-for-the-fault-table"));
    Row {
        fault: "Telegram answers 401 to the bot token",
        saw: format!("exit {}: «{}»", code.unwrap(), one_line(line.trim())),
    }
}

/// 11. Identifiers the http adapter used to confuse.
async fn http_identifiers() -> Row {
    let webhook = Webhook::start().await;
    let bot = start(&[
        ("LULL_LLM", "echo".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    let message =
        |id: serde_json::Value| json!({"conversation": "c", "user": "u", "text": "hi", "id": id});
    let (a, _) = bot.post(message(json!(7))).await;
    let (b, body) = bot.post(message(json!("7"))).await;
    assert_eq!((a, b, body["status"].as_str()), (202, 202, Some("stored")));
    let (big, _) = bot
        .post(json!({"conversation": "c", "user": "u", "text": "hi", "id": 1e20}))
        .await;
    let (long, _) = bot
        .post(json!({"conversation": "c".repeat(300), "user": "u", "text": "hi", "id": 1}))
        .await;
    assert_eq!((big, long), (400, 400));
    Row {
        fault: "http ids: 7 vs \"7\", 1e20, a 300-byte conversation",
        saw: "7 and \"7\" both stored; the others refused with 400 naming the field".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_table() {
    let mut rows = Vec::new();
    rows.push(edit_under_the_cap().await);
    rows.push(reset_first_in_a_group().await);
    rows.push(model_refuses_as_too_long().await);
    rows.push(webhook_4xx().await);
    rows.push(webhook_too_slow().await);
    rows.push(damaged_database().await);
    rows.push(huge_answer().await);
    rows.push(key_echoed_by_the_server().await);
    rows.push(shutdown_with_a_hung_send().await);
    rows.push(rejected_token().await);
    rows.push(http_identifiers().await);
    println!("| # | fault | what the user saw |\n| --- | --- | --- |");
    for (i, row) in rows.iter().enumerate() {
        println!("| {} | {} | {} |", i + 1, row.fault, row.saw);
    }
}

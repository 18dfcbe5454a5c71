//! The OpenAI-compatible client against a scripted fake server: every failure mode
//! ends with the user seeing one reply (or one notice and, later, one reply), nothing
//! lost or doubled; a prompt too long is sent again smaller, and a refused request
//! ends its batch instead of stalling the conversation; the exact message list; token
//! accounting; replies cut to their limit; the key kept secret.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::db;
use crate::support::fakes::openai::{Behavior, FakeOpenAi, Server};
use crate::support::fakes::telegram::{TelegramFake, text_message};
use crate::support::fakes::webhook::{Received, Webhook};
use crate::support::process::{LullProcess, post_message};

const KEY: &str = "sk-test-very-secret-key";

struct Bot {
    dir: tempfile::TempDir,
    lull: LullProcess,
    webhook: Webhook,
    model: FakeOpenAi,
    client: reqwest::Client,
}

impl Bot {
    async fn start(extra: &[(&str, &str)]) -> Bot {
        let dir = tempfile::tempdir().unwrap();
        let webhook = Webhook::start().await;
        let model = FakeOpenAi::start().await;
        let mut env = vec![
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("OPENAI_BASE_URL", model.base_url.clone()),
            ("OPENAI_API_KEY", KEY.into()),
            ("OPENAI_MODEL", "fake-model".into()),
            ("LULL_DEBOUNCE_MS", "200".into()),
            ("LULL_MAX_WAIT_MS", "5000".into()),
            ("RUST_LOG", "debug".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
        lull.wait_healthy(Duration::from_secs(20)).await;
        Bot {
            dir,
            lull,
            webhook,
            model,
            client: reqwest::Client::new(),
        }
    }

    async fn say(&self, conversation: &str, id: &str, text: &str) {
        let r = post_message(&self.client, &self.lull.base_url(), conversation, id, text)
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }

    async fn say_in_group(&self, conversation: &str, id: &str, name: &str, text: &str) {
        let r = self
            .client
            .post(format!("{}/api/messages", self.lull.base_url()))
            .json(
                &json!({ "conversation": conversation, "user": name.to_lowercase(), "name": name,
                           "text": text, "id": id, "group": true }),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }

    fn notices(&self) -> usize {
        self.notice_list().len()
    }

    fn notice_list(&self) -> Vec<Received> {
        self.webhook.notices()
    }

    /// Once settled: exactly `replies` replies and `give_ups` give-up notices, and
    /// every invariant holds (no duplicate, no loss, fresh, tokens growing).
    async fn assert_invariants(&self, replies: usize, give_ups: usize) {
        let v = self.verdict().await;
        assert_eq!(
            (
                v.replies,
                v.give_ups,
                v.duplicates,
                v.lost,
                v.stale,
                v.token_regressions
            ),
            (replies, give_ups, 0, 0, 0, 0),
            "{v:?}"
        );
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    /// The database's verdict once nothing is pending or undelivered.
    async fn verdict(&self) -> db::Verdict {
        db::settled(&self.dir.path().join("lull.db"), Duration::from_secs(20)).await
    }
}

/// Each transient failure is retried within the round; the user sees exactly one
/// reply and no notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_and_answered_once() {
    let bot = Bot::start(&[("LULL_LLM_TIMEOUT_MS", "800")]).await;
    let cases = [
        ("server-error", Behavior::Status(500)),
        ("unavailable", Behavior::Status(503)),
        ("malformed", Behavior::Malformed),
        ("empty", Behavior::Empty),
        ("dropped", Behavior::Drop),
        ("slow", Behavior::Slow(Duration::from_secs(3))),
    ];
    for (n, (case, behavior)) in cases.into_iter().enumerate() {
        let before = bot.model.requests().len();
        bot.model.script([behavior]);
        bot.say(case, "1", &format!("question about {case}")).await;
        let replies = bot
            .webhook
            .wait_replies(n + 1, Duration::from_secs(20))
            .await;
        let reply = replies.last().unwrap();
        assert_eq!(reply.conversation, case);
        assert_eq!(
            reply.text,
            format!("[model] question about {case}"),
            "{case}"
        );
        assert_eq!(
            bot.model.requests().len() - before,
            2,
            "{case}: one failure, one retry"
        );
    }
    assert_eq!(
        bot.notices(),
        0,
        "no notice for failures that a retry fixed"
    );
    assert_eq!(bot.webhook.replies().len(), 6);
    let verdict = bot.verdict().await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
    // Every request carried the key; no log line did.
    assert!(
        bot.model
            .requests()
            .iter()
            .all(|r| r.authorization.as_deref() == Some(&format!("Bearer {KEY}")))
    );
    assert!(
        !bot.lull.logs().contains(KEY),
        "the API key leaked into the logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let bot = Bot::start(&[]).await;
    bot.model.script([Behavior::RateLimited(2)]);
    bot.say("c", "1", "hello").await;
    bot.webhook.wait_replies(1, Duration::from_secs(20)).await;
    let requests = bot.model.requests();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].at - requests[0].at;
    assert!(
        waited >= Duration::from_secs(2),
        "retried after {waited:?}, Retry-After said 2 s"
    );
    assert_eq!(bot.notices(), 0);
}

/// A refused request (401: the key; 404: the model or URL) is never retried: one
/// request per batch, an ERROR naming the setting to fix, the user told once with an
/// honest text (not "can't reach"), and the batch ended, so the next message is
/// answered. Nothing is lost or answered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_not_retried_and_ends_its_batch() {
    let bot = Bot::start(&[]).await;
    for (n, (status, setting)) in [(401, "OPENAI_API_KEY"), (404, "OPENAI_MODEL")]
        .into_iter()
        .enumerate()
    {
        let conversation = format!("refused-{status}");
        bot.model.fallback(Behavior::Status(status));
        bot.say(&conversation, "1", "hello?").await;
        let notices = bot
            .webhook
            .wait_notices(n + 1, Duration::from_secs(10))
            .await;
        let notice = &notices[n];
        assert_eq!(notice.conversation, conversation);
        assert!(notice.text.contains("refused"), "{}", notice.text);
        assert!(!notice.text.contains("can't reach"), "{}", notice.text);
        assert_eq!(notice.covers, ["1"], "the notice ends the batch");
        // Long enough for a retry (within the round, or a round after the backoff).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            bot.model.requests().len(),
            n * 2 + 1,
            "HTTP {status} is not retried"
        );
        let logs = bot.lull.logs();
        assert!(
            logs.lines().any(|l| l.contains("ERROR")
                && l.contains(&format!("HTTP {status}"))
                && l.contains(setting)),
            "no ERROR naming {setting}:\n{logs}"
        );
        // The conversation moves on: the next message is answered.
        bot.model.fallback(Behavior::Answer);
        bot.say(&conversation, "2", "still there?").await;
        let replies = bot
            .webhook
            .wait_replies(n + 1, Duration::from_secs(10))
            .await;
        assert_eq!(replies[n].covers, ["2"]);
        assert_eq!(
            bot.model.without_history(n * 2 + 1).as_deref(),
            Some("still there?"),
            "no history: nothing was answered"
        );
    }
    assert_eq!(bot.notices(), 2, "told once per batch");
    bot.assert_invariants(2, 2).await;
    let metrics = bot.lull.metrics().await.unwrap();
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"refused\"}"], 2.0);
}

/// Four 15,000-character messages to a model that refuses prompts over 40,000
/// characters: asked again without the history, then with the batch cut and a note
/// saying so; one reply covers all four, and the next message is answered normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_too_long_is_sent_again_smaller_and_answered_once() {
    // Requests counted one by one: no summary beside them.
    let bot = Bot::start(&[("LULL_DEBOUNCE_MS", "1500"), ("LULL_SUMMARY", "off")]).await;
    bot.say("c", "0", "hello").await;
    bot.webhook.wait_replies(1, Duration::from_secs(10)).await;
    bot.model.fallback(Behavior::RefuseOver {
        chars: 40_000,
        server: Server::OpenAi,
    });
    // About 15,000 characters each.
    let long = |i: usize| {
        format!(
            "Message {i} begins. {}Question {i}?",
            "lorem ipsum ".repeat(1249)
        )
    };
    for i in 1..=4 {
        bot.say("c", &i.to_string(), &long(i)).await;
    }
    let replies = bot.webhook.wait_replies(2, Duration::from_secs(20)).await;
    assert_eq!(
        replies[1].covers,
        ["1", "2", "3", "4"],
        "one reply for the batch"
    );
    let requests = bot.model.requests();
    assert_eq!(requests.len(), 4, "the first exchange, then three tries");
    // 1: the whole prompt with history; 2: without history; 3: the batch cut.
    assert_eq!(bot.model.messages(1).len(), 4);
    assert!(bot.model.prompt_chars(1) > 60_000);
    assert_eq!(bot.model.messages(2).len(), 2, "less history first");
    assert!(
        bot.model.prompt_chars(2) > 60_000,
        "the batch itself is still whole"
    );
    let cut = &bot.model.messages(3)[1].1;
    assert!(
        bot.model.prompt_chars(3) <= 40_000,
        "{}",
        bot.model.prompt_chars(3)
    );
    assert!(
        cut.contains("Note from lull") && cut.contains("too long"),
        "the model is told"
    );
    for i in 1..=4 {
        assert!(
            cut.contains(&format!("Message {i} begins.")),
            "message {i}'s start kept"
        );
        assert!(
            cut.contains(&format!("Question {i}?")),
            "message {i}'s end kept"
        );
    }
    assert_eq!(bot.notices(), 0, "the user got an answer, not a notice");
    // Later messages are answered normally.
    bot.say("c", "5", "thanks!").await;
    let replies = bot.webhook.wait_replies(3, Duration::from_secs(10)).await;
    assert_eq!(replies[2].covers, ["5"]);
    assert_eq!(bot.model.requests().len(), 5);
    bot.assert_invariants(3, 0).await;
    let metrics = bot.lull.metrics().await.unwrap();
    assert_eq!(
        metrics["lull_llm_requests_total{outcome=\"too_long\"}"],
        2.0
    );
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"ok\"}"], 3.0);
}

/// A model that refuses every prompt as too long, worded as vLLM, llama.cpp and
/// OpenRouter word it: a bounded number of smaller tries, then the user is told once,
/// the batch is ended (the notice covers it), and a later message is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_always_too_long_tells_the_user_once_and_moves_on() {
    let bot = Bot::start(&[]).await;
    bot.model.script([
        Behavior::ContextLength(Server::Vllm),
        Behavior::ContextLength(Server::LlamaCpp),
        Behavior::ContextLength(Server::OpenRouter),
    ]);
    bot.model.fallback(Behavior::ContextLength(Server::Ollama));
    bot.say("c", "1", &"a long paste ".repeat(1000)).await;
    let notices = bot.webhook.wait_notices(1, Duration::from_secs(10)).await;
    assert!(notices[0].text.contains("too long"), "{}", notices[0].text);
    assert_eq!(notices[0].covers, ["1"]);
    // The whole batch, then cut to a half and a quarter (no history to leave out).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(bot.model.requests().len(), 3, "a bounded number of tries");
    assert_eq!(bot.notices(), 1, "told once");
    bot.model.fallback(Behavior::Answer);
    bot.say("c", "2", "short one").await;
    let replies = bot.webhook.wait_replies(1, Duration::from_secs(10)).await;
    assert_eq!(replies[0].covers, ["2"]);
    assert_eq!(
        bot.model.without_history(3).as_deref(),
        Some("short one"),
        "the notice never enters the history"
    );
    bot.assert_invariants(1, 1).await;
}

/// Retries exhausted, round after round: the user is told once (not once per
/// attempt or per round), and when the model is back one reply covers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_stays_down_notifies_once_and_loses_nothing() {
    let bot = Bot::start(&[("LULL_LLM_RETRIES", "1")]).await;
    bot.model.fallback(Behavior::Status(503));
    bot.say("c", "1", "are you there?").await;
    // Two rounds of two attempts each.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while bot.model.requests().len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "expected a second failing round"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bot.say("c", "2", "hello?").await;
    bot.model.fallback(Behavior::Answer);
    let replies = bot.webhook.wait_replies(1, Duration::from_secs(30)).await;
    assert_eq!(replies[0].covers, ["1", "2"]);
    assert_eq!(bot.notices(), 1, "told once");
    let notice = bot
        .webhook
        .received()
        .into_iter()
        .find(|r| r.kind == "notice")
        .unwrap();
    assert!(
        notice.text.contains("kept your messages"),
        "{}",
        notice.text
    );
    let verdict = bot.verdict().await;
    assert_eq!(
        (verdict.replies, verdict.duplicates, verdict.lost),
        (1, 0, 0),
        "{verdict:?}"
    );
    let metrics = bot.lull.metrics().await.unwrap();
    assert!(
        metrics["lull_llm_requests_total{outcome=\"error\"}"] >= 4.0,
        "{metrics:#?}"
    );
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"ok\"}"], 1.0);
}

/// The exact message list for a group burst after some history, and after `/reset`;
/// the settings that shape the request; token accounting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_list_carries_history_authors_and_resets() {
    let bot = Bot::start(&[
        ("LULL_SYSTEM_PROMPT", "You are a test bot."),
        ("LULL_TEMPERATURE", "0.25"),
        ("LULL_MAX_TOKENS", "300"),
        // In a group only an admin may /reset.
        ("LULL_ADMINS", "http:bob"),
    ])
    .await;
    bot.say_in_group("g", "1", "Ann", "hi all").await;
    bot.webhook.wait_replies(1, Duration::from_secs(10)).await;
    bot.say_in_group("g", "2", "Bob", "what's 2+2?").await;
    bot.say_in_group("g", "3", "Ann", "and 3+3?").await;
    bot.webhook.wait_replies(2, Duration::from_secs(10)).await;
    let s = |role: &str, content: &str| (role.to_owned(), content.to_owned());
    assert_eq!(
        bot.model.messages(1),
        vec![
            s("system", "You are a test bot."),
            s("user", "Ann: hi all"),
            s("assistant", "[model] Ann: hi all"),
            s("user", "Bob: what's 2+2?\nAnn: and 3+3?"),
        ]
    );
    let body: &Value = &bot.model.requests()[1].body;
    assert_eq!(body["model"], "fake-model");
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(body["max_tokens"], 300);

    bot.say_in_group("g", "4", "Bob", "/reset").await;
    bot.say_in_group("g", "5", "Bob", "new topic").await;
    bot.webhook.wait_replies(3, Duration::from_secs(10)).await;
    assert_eq!(
        bot.model.messages(2),
        vec![
            s("system", "You are a test bot."),
            s("user", "Bob: new topic")
        ],
        "after /reset the earlier exchanges are no longer sent"
    );
    assert_eq!(
        bot.model.requests().len(),
        3,
        "the command itself never reached the model"
    );

    // Usage from the API is stored per reply and counted.
    let db_path = bot.dir.path().join("lull.db");
    assert_eq!(
        db::count(
            &db_path,
            "SELECT SUM(prompt_tokens) FROM outbox WHERE kind = 'reply'"
        ),
        20 + 40 + 20
    );
    assert_eq!(
        db::count(
            &db_path,
            "SELECT SUM(completion_tokens) FROM outbox WHERE kind = 'reply'"
        ),
        21
    );
    let metrics = bot.lull.metrics().await.unwrap();
    assert_eq!(metrics["lull_llm_tokens_total{kind=\"prompt\"}"], 80.0);
    assert_eq!(metrics["lull_llm_tokens_total{kind=\"completion\"}"], 21.0);
    // What the budgets are charged: the same tokens, under the contract's name, and
    // per day in the database (for /usage) even with no budget set.
    assert_eq!(metrics["lull_tokens_total{kind=\"prompt\"}"], 80.0);
    assert_eq!(metrics["lull_tokens_total{kind=\"completion\"}"], 21.0);
    assert_eq!(
        db::count(
            &db_path,
            "SELECT SUM(tokens) FROM token_usage WHERE scope = 'bot'"
        ),
        101
    );
}

/// The history budget leaves the oldest exchanges out first (without summaries:
/// `LULL_SUMMARY=off` keeps the window alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_cut_to_its_budget() {
    let bot = Bot::start(&[("LULL_HISTORY_MESSAGES", "2"), ("LULL_SUMMARY", "off")]).await;
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        bot.say("c", &i.to_string(), text).await;
        bot.webhook
            .wait_replies(i + 1, Duration::from_secs(10))
            .await;
    }
    let s = |role: &str, content: &str| (role.to_owned(), content.to_owned());
    let messages = bot.model.messages(2);
    assert_eq!(
        &messages[1..],
        &[
            s("user", "two"),
            s("assistant", "[model] two"),
            s("user", "three")
        ]
    );
}

/// `/reset` unsticks a conversation in failure backoff: the model asked for an hour's
/// pause (429, `Retry-After: 3600`), the user sends `/reset`, the model is back, and
/// the pending message is answered at once, in the fresh context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_clears_the_failure_backoff() {
    let bot = Bot::start(&[]).await;
    bot.say("c", "1", "first").await;
    bot.webhook.wait_replies(1, Duration::from_secs(10)).await;
    bot.model.fallback(Behavior::RateLimited(3600));
    bot.say("c", "2", "second").await;
    let notices = bot.webhook.wait_notices(1, Duration::from_secs(10)).await;
    assert!(
        notices[0].text.contains("can't reach"),
        "{}",
        notices[0].text
    );
    assert_eq!(bot.model.requests().len(), 2);
    let retry_at = db::count(&bot.db(), "SELECT retry_at FROM timers");
    assert!(retry_at > 0, "in backoff");
    bot.model.fallback(Behavior::Answer);
    let reset = Instant::now();
    bot.say("c", "3", "/reset").await;
    let replies = bot.webhook.wait_replies(2, Duration::from_secs(10)).await;
    assert!(
        reset.elapsed() < Duration::from_secs(5),
        "{:?}",
        reset.elapsed()
    );
    assert_eq!(replies[1].covers, ["2"]);
    assert_eq!(
        bot.model.without_history(2).as_deref(),
        Some("second"),
        "answered in the fresh context"
    );
    bot.assert_invariants(2, 0).await;
}

/// A model (or a proxy in front of it) that quotes the `Authorization` header back in
/// its errors: 500 (retried), 401 and 400 (refused). The key appears in no log line
/// (text and JSON logs, at debug), not in the database file, not in any notice; the
/// redacted echo does reach the logs, so the check is not vacuous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_key_never_leaves_the_process() {
    for format in ["text", "json"] {
        let bot = Bot::start(&[("LOG_FORMAT", format), ("LULL_LLM_RETRIES", "1")]).await;
        bot.model.script([
            Behavior::EchoAuthorization(500),
            Behavior::EchoAuthorization(500),
            Behavior::EchoAuthorization(401),
        ]);
        bot.model.fallback(Behavior::EchoAuthorization(400));
        bot.say("a", "1", "hello").await;
        // "Can't reach" after the 500s, then the refusal a backoff later.
        bot.webhook.wait_notices(2, Duration::from_secs(15)).await;
        bot.say("b", "1", "hello").await;
        bot.webhook.wait_notices(3, Duration::from_secs(10)).await;
        // The 400 is asked once more without lull's own tools (it may be about them).
        assert_eq!(bot.model.requests().len(), 5);
        bot.assert_invariants(0, 2).await;
        let logs = bot.lull.logs();
        assert!(
            !logs.contains(KEY),
            "{format}: the key leaked into the logs:\n{logs}"
        );
        assert!(
            logs.contains("Authorization: Bearer <redacted>")
                && logs.contains("Incorrect API key provided: Bearer <redacted>"),
            "{format}: the echo should reach the logs, redacted:\n{logs}"
        );
        for notice in bot.notice_list() {
            assert!(!notice.text.contains(KEY), "{}", notice.text);
        }
        for file in ["lull.db", "lull.db-wal"] {
            let bytes = std::fs::read(bot.dir.path().join(file)).unwrap_or_default();
            assert!(
                !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                "{format}: the key is in {file}"
            );
        }
    }
}

/// A 2 MB answer reaches Telegram cut to `LULL_MAX_REPLY_CHARS` (16000 by default):
/// at most ceil(16000 / 4096) + 1 messages, the last ending with the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_answer_reaches_telegram_cut_to_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let telegram = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    let paragraph = format!(
        "{}\n\n",
        "All work and no play makes a long answer. ".repeat(24)
    );
    let huge = paragraph.repeat(2_000_000 / paragraph.len() + 1);
    assert!(huge.len() >= 2_000_000);
    model.fallback(Behavior::Content(huge));
    let env: Vec<(&str, String)> = vec![
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_API_KEY", KEY.into()),
        ("LULL_ALLOWED_USERS", "*".into()),
        ("LULL_DEBOUNCE_MS", "200".into()),
        ("LULL_POLL_MS", "200".into()),
    ];
    let _lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    let chat = 4301;
    telegram.push_message(text_message(chat, chat, "tell me everything"));
    telegram.wait_sent(chat, 1, Duration::from_secs(20)).await;
    let verdict = db::settled(&dir.path().join("lull.db"), Duration::from_secs(20)).await;
    assert_eq!((verdict.replies, verdict.lost), (1, 0), "{verdict:?}");
    let sent = telegram.sent_to(chat);
    assert!(
        (4..=16_000usize.div_ceil(4096) + 1).contains(&sent.len()),
        "{} messages",
        sent.len()
    );
    assert!(
        sent.last()
            .unwrap()
            .text
            .ends_with("[… reply cut at 16000 characters]"),
        "{}",
        sent.last().unwrap().text
    );
    let stored = &db::replies(&dir.path().join("lull.db"))[0].text;
    assert!(
        stored.chars().count() <= 16_000,
        "{}",
        stored.chars().count()
    );
}

//! The OpenAI-compatible client against a scripted fake server: every failure mode
//! ends with the user seeing one reply (or one notice and, later, one reply), nothing
//! lost or doubled; the exact message list; token accounting; the key kept secret.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::db;
use crate::support::openai_fake::{Behavior, FakeOpenAi};
use crate::support::process::{LullProcess, post_message};
use crate::support::webhook::Webhook;

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
        self.webhook
            .received()
            .iter()
            .filter(|r| r.kind == "notice")
            .count()
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

/// A 4xx other than 429 is not retried: one request, one notice, the messages stay
/// pending and the next successful round covers them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_not_retried_and_nothing_is_lost() {
    let bot = Bot::start(&[]).await;
    bot.model.script([Behavior::Status(400)]);
    bot.say("c", "1", "first").await;
    // The notice arrives; the model was asked once.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while bot.notices() == 0 {
        assert!(std::time::Instant::now() < deadline, "no failure notice");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(bot.model.requests().len(), 1, "a 400 is not retried");
    bot.say("c", "2", "second").await;
    let replies = bot.webhook.wait_replies(1, Duration::from_secs(20)).await;
    assert_eq!(replies[0].covers, ["1", "2"]);
    assert_eq!(replies[0].text, "[model] first\nsecond");
    assert_eq!(bot.notices(), 1);
    assert_eq!(bot.model.requests().len(), 2);
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
}

/// The history budget leaves the oldest exchanges out first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_cut_to_its_budget() {
    let bot = Bot::start(&[("LULL_HISTORY_MESSAGES", "2")]).await;
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

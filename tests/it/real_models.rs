//! The real-server tier: lull against llama.cpp's own `llama-server` (built from
//! source by `scripts/llama-server`) on SmolLM2-135M-Instruct, a real model shipped in
//! a PyPI wheel, on loopback. Nobody here wrote that server: what lull assumes of
//! OpenAI-compatible servers is checked against one. Skipped (one printed line) where
//! the server is not set up; required in CI (`LULL_REQUIRE_LLAMA=1`). See
//! `support::llama`.
//!
//! A 135M model on one thread of a shared core is slow (one 16-token answer once took
//! 30 s on 2 busy cores): replies are kept short (`LULL_MAX_TOKENS`) and the time
//! limit generous (`LULL_LLM_TIMEOUT_MS`). What the model says is not checked, only
//! what lull does with it.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::db;
use crate::support::fakes::telegram::{TelegramFake, text_message};
use crate::support::fakes::webhook::Webhook;
use crate::support::llama::{self, LlamaServer};
use crate::support::process::{LullProcess, post_message};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The context the tier's server is started with: small, so a long message overflows
/// it, as it would a big model's with a long conversation.
const CTX: u32 = 512;

/// The environment lull runs with against `server`.
fn model_env(server: &LlamaServer) -> Vec<(&'static str, String)> {
    vec![
        ("LULL_LLM", "openai".into()),
        ("OPENAI_BASE_URL", server.base_url.clone()),
        ("OPENAI_MODEL", server.model.clone()),
        ("LULL_MAX_TOKENS", "24".into()),
        ("LULL_LLM_TIMEOUT_MS", "180000".into()),
        ("LULL_LEASE_TTL_MS", "60000".into()),
        // A 512-token context has no room for the built-in tools' definitions; these
        // tests are about replies, not tools.
        ("LULL_TOOLS", "off".into()),
        ("RUST_LOG", "info,lull_core=debug".into()),
    ]
}

/// The real server, started for one test, or `None` (skipped) where it is not set up.
async fn server(test: &str) -> Option<LlamaServer> {
    let (binary, model) = llama::available(test)?;
    let server = LlamaServer::start(&binary, &model, CTX).await;
    println!("{test}: {}", server.describe());
    Some(server)
}

/// lull with the http adapter against `server`.
struct HttpBot {
    dir: tempfile::TempDir,
    webhook: Webhook,
    lull: LullProcess,
    client: reqwest::Client,
}

impl HttpBot {
    async fn start(server: &LlamaServer) -> HttpBot {
        let dir = tempfile::tempdir().unwrap();
        let webhook = Webhook::start().await;
        let mut env = model_env(server);
        env.extend([
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("LULL_DEBOUNCE_MS", "1000".into()),
            ("LULL_MAX_WAIT_MS", "20000".into()),
        ]);
        let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
        lull.wait_healthy(SECS(20)).await;
        HttpBot {
            dir,
            webhook,
            lull,
            client: reqwest::Client::new(),
        }
    }

    async fn say(&self, conversation: &str, id: &str, text: &str) {
        let r = post_message(&self.client, &self.lull.base_url(), conversation, id, text)
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    async fn metric(&self, name: &str) -> f64 {
        let metrics = self.lull.metrics().await.unwrap();
        metrics.get(name).copied().unwrap_or(0.0)
    }
}

/// A burst of three messages is one model request and one reply covering all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_server_a_burst_gets_one_reply() {
    let Some(server) = server("real_server_a_burst_gets_one_reply").await else {
        return;
    };
    let bot = HttpBot::start(&server).await;
    bot.say("c1", "b1", "Hi!").await;
    bot.say("c1", "b2", "What is the capital of France?").await;
    bot.say("c1", "b3", "Answer in one word.").await;
    let replies = bot.webhook.wait_replies(1, SECS(240)).await;
    let received = bot.webhook.received();
    let reply = &received[0];
    println!("the model said: {:?}", reply.text);
    assert!(!reply.text.trim().is_empty());
    assert_eq!(reply.covers, ["b1", "b2", "b3"], "{replies:?}");
    let v = db::settled(&bot.db(), SECS(60)).await;
    assert_eq!(
        (v.replies, v.give_ups, v.duplicates, v.lost, v.stale),
        (1, 0, 0, 0, 0),
        "{v:?}"
    );
    assert_eq!(
        bot.metric("lull_llm_requests_total{outcome=\"ok\"}").await,
        1.0,
        "{}",
        bot.lull.logs()
    );
    assert_eq!(bot.webhook.received().len(), 1);
}

/// With a 512-token context: a message that fits only when cut gets the documented
/// fallback (refused whole, answered cut, with a note to the model), and one far too
/// long for even a quarter of it ends with one "too long" notice and no reply, and
/// the conversation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_server_too_long_messages_get_the_fallback_and_one_notice() {
    let Some(server) =
        server("real_server_too_long_messages_get_the_fallback_and_one_notice").await
    else {
        return;
    };
    let bot = HttpBot::start(&server).await;
    // About 650 tokens: over the context whole, under it cut to half.
    let long = "Please read this sentence and summarise it. ".repeat(70);
    bot.say("c1", "t1", long.trim_end()).await;
    bot.webhook.wait_replies(1, SECS(300)).await;
    let first = bot.webhook.received();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].kind, "reply", "{first:?}\n{}", bot.lull.logs());
    assert_eq!(
        bot.metric("lull_llm_requests_total{outcome=\"too_long\"}")
            .await,
        1.0
    );
    assert!(
        bot.lull
            .logs()
            .contains("the prompt is too long for the model; asking again with less"),
        "{}",
        bot.lull.logs()
    );

    // About 2,700 tokens, in a conversation of its own (no history to drop first): a
    // quarter of it is still over the context.
    let huge = "Please read this sentence and summarise it. ".repeat(280);
    bot.say("c2", "t2", huge.trim_end()).await;
    let notice = bot
        .webhook
        .wait_until_received(SECS(300), |r| r.kind == "notice")
        .await;
    assert!(notice.text.contains("too long"), "{:?}", notice.text);
    assert_eq!(notice.covers, ["t2"]);
    assert_eq!(bot.webhook.received().len(), 2, "one notice, no reply");
    // Whole, then cut to a half and a quarter: three refusals, counted.
    assert_eq!(
        bot.metric("lull_llm_requests_total{outcome=\"too_long\"}")
            .await,
        4.0
    );
    let v = db::settled(&bot.db(), SECS(60)).await;
    assert_eq!(
        (v.replies, v.give_ups, v.duplicates, v.lost),
        (1, 1, 0, 0),
        "{v:?}"
    );

    // The conversation goes on.
    bot.say("c2", "t3", "Thanks. Say hello.").await;
    let replies = bot.webhook.wait_replies(2, SECS(240)).await;
    assert_eq!(replies[1].covers, ["t3"]);
    assert_eq!(bot.webhook.received().len(), 3);
}

/// A reply streamed by the real server (live drafts in a Telegram private chat ask
/// for `stream: true`) is read from its event stream and delivered once. (The http
/// adapter has no drafts, so lull never streams for it: the streamed path is reached
/// through Telegram's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_server_a_streamed_reply_is_delivered_once() {
    let Some(server) = server("real_server_a_streamed_reply_is_delivered_once").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let telegram = TelegramFake::start().await;
    let mut extra: Vec<(&str, String)> = model_env(&server);
    extra.push(("LULL_MAX_TOKENS", "48".into()));
    extra.push(("LULL_MAX_WAIT_MS", "20000".into()));
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let env = crate::telegram::env(dir.path(), &telegram, &extra);
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    lull.wait_healthy(SECS(20)).await;
    let chat = 2660;
    telegram.push_message(text_message(chat, chat, "Tell me about cats."));
    let sent = telegram.wait_sent(chat, 1, SECS(300)).await;
    println!("the model said: {:?}", sent[0].visible());
    assert!(!sent[0].visible().trim().is_empty());
    let drafts = telegram.drafts_to(chat);
    println!(
        "{} drafts, {} with text",
        drafts.len(),
        drafts.iter().filter(|d| d.visible() != "…").count()
    );
    assert!(
        !drafts.is_empty(),
        "drafts on: the model was asked to stream"
    );
    let v = db::settled(&dir.path().join("lull.db"), SECS(60)).await;
    assert_eq!((v.replies, v.duplicates, v.lost), (1, 0, 0), "{v:?}");
    assert_eq!(telegram.sent_to(chat).len(), 1);
    let logs = lull.logs();
    assert!(
        !logs.contains("refuses streamed answers") && !logs.contains("without a single event"),
        "the server streamed: {logs}"
    );
    // The stream's last chunk carried the usage.
    let metrics = lull.metrics().await.unwrap();
    assert!(
        metrics
            .get("lull_tokens_total{kind=\"completion\"}")
            .is_some_and(|n| *n > 0.0),
        "{metrics:?}"
    );
}

/// `lull check` finds the model served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_server_check_is_ok() {
    let Some(server) = server("real_server_check_is_ok").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut env = model_env(&server);
    env.push((
        "DATABASE_URL",
        format!("sqlite:{}", dir.path().join("lull.db").display()),
    ));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_lull"))
            .arg("check")
            .env_clear()
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    let expected = format!("ok    model         {} is served by", server.model);
    assert!(report.contains(&expected), "{report}");
}

//! What real OpenAI-compatible servers do that the fake did not (issue 26), taught to
//! the fake and tested against it; the real servers themselves are tried in
//! `real_models`. Each test failed before its fix (what it printed is in the commit
//! that fixed it):
//! - a streamed request answered 200 with an empty event stream (`llama-cpp-python`
//!   on a prompt too long) is asked again once for a whole answer, whose refusal then
//!   shrinks the prompt, instead of being taken for a dead server;
//! - a model list without `created` passes `lull check`;
//! - a reply the token limit cut (`finish_reason: "length"`) ends with a visible note
//!   and is counted;
//! - the docs (docs/getting-started.md, "Commands") say what `lull chat` exits with and how long a message may be.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::db;
use crate::support::fakes::openai::{Behavior, FakeOpenAi};
use crate::support::fakes::telegram::{TelegramFake, text_message};
use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, post_message};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The note a cut reply ends with (its start: the rest says why).
const CUT_NOTE: &str = "[the model stopped here:";

/// lull on Telegram with `model`: in a private chat it shows live drafts, so the
/// model is asked to stream.
async fn telegram_bot(
    dir: &tempfile::TempDir,
    telegram: &TelegramFake,
    model: &FakeOpenAi,
) -> LullProcess {
    let env = crate::telegram::env(
        dir.path(),
        telegram,
        &[
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", model.base_url.as_str()),
            ("OPENAI_MODEL", "fake-model"),
            ("LULL_MAX_WAIT_MS", "20000"),
        ],
    );
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    lull.wait_healthy(SECS(20)).await;
    lull
}

/// A model that behaves like `llama-cpp-python` on a prompt over 2,500 characters,
/// asked to stream (live drafts in a Telegram private chat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_event_stream_is_asked_again_whole_and_the_prompt_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let telegram = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::EmptyStreamOver { chars: 2_500 });
    let lull = telegram_bot(&dir, &telegram, &model).await;
    let chat = 2601;
    let long = "Please summarise this. ".repeat(150); // 3,450 characters
    telegram.push_message(text_message(chat, chat, long.trim_end()));
    let sent = telegram.wait_sent(chat, 1, SECS(30)).await;
    let requests = model.requests();
    let asked: Vec<(bool, usize)> = (0..requests.len())
        .map(|n| (model.streamed(n), model.prompt_chars(n)))
        .collect();
    assert!(
        sent[0]
            .visible()
            .starts_with("[model] Please summarise this."),
        "{:?}; requests (streamed, chars): {asked:?}\n{}",
        sent[0].visible(),
        lull.logs()
    );
    // Streamed → empty; the same asked whole → 400 too long; then a smaller prompt,
    // streamed, fits.
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert!(asked[0].0 && !asked[1].0 && asked[2].0, "{asked:?}");
    assert_eq!(asked[0].1, asked[1].1, "the same prompt asked again whole");
    assert!(asked[2].1 <= 2_500, "{asked:?}");
    let v = db::settled(&dir.path().join("lull.db"), SECS(20)).await;
    assert_eq!((v.replies, v.give_ups, v.duplicates, v.lost), (1, 0, 0, 0));
    assert_eq!(telegram.sent_to(chat).len(), 1, "no notice, one reply");
}

/// `llama-cpp-python`'s model list has no `created`: `lull check` reads only `id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_accepts_a_model_list_without_created() {
    let dir = tempfile::tempdir().unwrap();
    let model = FakeOpenAi::start().await;
    model.models_without_created();
    let env = [
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_MODEL", "fake-model".into()),
    ];
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_lull"))
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
    assert!(
        report.contains("ok    model         fake-model is served by"),
        "{report}"
    );
}

/// A reply the model cut short (`finish_reason: "length"`), whole and streamed, ends
/// with a note saying so, and each is counted in `lull_replies_cut_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_by_the_token_limit_says_so_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let model = FakeOpenAi::start().await;
    model.script([Behavior::Cut(
        "The three reasons are: first, the weather; second,".into(),
    )]);
    let env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_MODEL", "fake-model".into()),
        ("LULL_DEBOUNCE_MS", "200".into()),
        ("RUST_LOG", "debug".into()),
    ];
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    lull.wait_healthy(SECS(20)).await;
    let client = reqwest::Client::new();
    let r = post_message(&client, &lull.base_url(), "c1", "m1", "why?")
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    webhook.wait_replies(1, SECS(20)).await;
    let received = webhook.received();
    let text = &received[0].text;
    assert!(
        text.starts_with("The three reasons are: first, the weather; second,"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with(']') && text.contains(CUT_NOTE),
        "the note ends the reply: {text:?}"
    );
    let metrics = lull.metrics().await.unwrap();
    assert_eq!(
        metrics.get("lull_replies_cut_total").copied(),
        Some(1.0),
        "{metrics:?}"
    );
    let stored = db::replies(&dir.path().join("lull.db"));
    assert!(stored[0].text.contains(CUT_NOTE), "{stored:?}");
}

/// A streamed reply cut short gets the same note, in the message (the drafts showed
/// the words as they came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_cut_short_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let telegram = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    model.script([Behavior::Cut("Once upon a time there was a".into())]);
    let lull = telegram_bot(&dir, &telegram, &model).await;
    let chat = 2602;
    telegram.push_message(text_message(chat, chat, "tell me a story"));
    let sent = telegram.wait_sent(chat, 1, SECS(30)).await;
    let visible = sent[0].visible();
    assert!(model.streamed(0));
    assert!(
        visible.starts_with("Once upon a time there was a") && visible.contains(CUT_NOTE),
        "{visible:?}"
    );
    let metrics = lull.metrics().await.unwrap();
    assert_eq!(metrics.get("lull_replies_cut_total").copied(), Some(1.0));
}

/// `lull chat` exits 1 when the model could not answer (here: every prompt refused as
/// too long), and docs/getting-started.md says so; it also states the longest message lull takes.
#[test]
fn the_readme_says_what_lull_chat_exits_with_and_how_long_a_message_may_be() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(FakeOpenAi::start());
    model.fallback(Behavior::RefuseOver {
        chars: 10,
        server: crate::support::fakes::openai::Server::LlamaCpp,
    });
    let dir = tempfile::tempdir().unwrap();
    let out = chat(
        &dir,
        "a message far longer than the model takes\n",
        &[
            ("OPENAI_BASE_URL", model.base_url.as_str()),
            ("OPENAI_MODEL", "fake-model"),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(runtime);

    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/getting-started.md"
    ))
    .unwrap()
    .split_whitespace()
    .collect::<Vec<_>>()
    .join(" ");
    let commands = readme.split("## Commands").nth(1).unwrap();
    assert!(
        commands.contains("exits 1 when the model could not answer")
            && !commands.contains("then exits 0."),
        "docs/getting-started.md's `lull chat` states its exit statuses"
    );
    let cap = format!(
        "{} characters",
        lull_core::dispatcher::MAX_MESSAGE_CHARS
            .to_string()
            .as_bytes()
            .rchunks(3)
            .rev()
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(
        readme.contains(&format!("longer than {cap}")),
        "docs/getting-started.md states the longest message lull takes ({cap})"
    );
}

/// `lull chat` on `input`, with the model settings in `env`.
fn chat(dir: &tempfile::TempDir, input: &str, env: &[(&str, &str)]) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_lull"))
        .arg("chat")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        )
        .env("LULL_LLM", "openai")
        .env("LULL_DEBOUNCE_MS", "200")
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lull chat");
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().expect("lull chat finishes")
}

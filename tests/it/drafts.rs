//! Live drafts end to end: the real `lull` binary against the loopback Bot API fake
//! and a model server that streams (`support::fakes::openai`'s SSE mode). A draft is a
//! preview, never a message: these tests check that drafts grow while the model
//! writes, that the reply is still exactly one real message, that a reply made stale
//! by a newer message leaves no message behind, and that drafts are paced.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::db;
use crate::support::fakes::openai::{Behavior, FakeOpenAi, Stream, StreamEnd};
use crate::support::fakes::telegram::{Fault, TelegramFake, mention, text_message};
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// A reply of a few hundred characters (with some Markdown), as a model writes one.
const ANSWER: &str = "Sure! Your regex **^\\d{3}-\\d{4}$** matches exactly three digits, a dash and \
four digits, so `555-1234` matches and `5551234` does not. If you want the dash to be \
optional, write `^\\d{3}-?\\d{4}$` instead; to allow spaces too, use a character class \
such as `[- ]?`. Anchors matter: without `^` and `$` the pattern also matches inside \
longer strings like `call 555-1234 now`.";

struct Bot {
    dir: tempfile::TempDir,
    telegram: TelegramFake,
    model: FakeOpenAi,
    lull: LullProcess,
}

impl Bot {
    async fn start(extra: &[(&str, &str)]) -> Bot {
        let dir = tempfile::tempdir().unwrap();
        let telegram = TelegramFake::start().await;
        let model = FakeOpenAi::start().await;
        let mut with_model = vec![
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", model.base_url.as_str()),
            ("OPENAI_MODEL", "fake-model"),
            ("LULL_MAX_WAIT_MS", "20000"),
        ];
        with_model.extend_from_slice(extra);
        let env = crate::telegram::env(dir.path(), &telegram, &with_model);
        let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
        lull.wait_healthy(SECS(20)).await;
        Bot {
            dir,
            telegram,
            model,
            lull,
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    /// Once settled: one reply per burst, every invariant holds.
    async fn assert_invariants(&self, replies: usize) {
        let v = db::settled(&self.db(), SECS(20)).await;
        assert_eq!(
            (
                v.replies,
                v.duplicates,
                v.lost,
                v.stale,
                v.token_regressions
            ),
            (replies, 0, 0, 0, 0),
            "{v:?}"
        );
    }

    /// The token reached no log line.
    fn finish(self) {
        let secret = self.telegram.token.split_once(':').unwrap().1;
        assert!(!self.lull.logs().contains(secret), "the bot token leaked");
    }
}

/// The model streams `ANSWER` in 12 pieces over 3 s, then finishes after a pause.
fn answer_over_three_seconds(tail: Duration) -> Behavior {
    Behavior::Stream(Stream {
        text: Some(ANSWER.into()),
        pieces: 12,
        every: MS(250),
        tail,
        end: StreamEnd::Done,
    })
}

/// The Bot API calls answering cost (`send…` methods), by method, and in all.
fn answering_calls(telegram: &TelegramFake) -> (std::collections::BTreeMap<String, usize>, usize) {
    let mut calls = std::collections::BTreeMap::new();
    for (method, _) in telegram.calls_except_polling() {
        if method.starts_with("send") {
            *calls.entry(method).or_default() += 1;
        }
    }
    let total = calls.values().sum();
    (calls, total)
}

/// What the user sees of `ANSWER` in the reply.
fn assert_is_the_answer(visible: &str) {
    assert!(
        visible.starts_with("Sure! Your regex ") && visible.ends_with("call 555-1234 now."),
        "{visible}"
    );
}

/// The model's answer is read as it streams: drafts arrive while it writes, in
/// order, each growing on the last (placeholder first, one draft id for the whole
/// batch), paced to one a second; the reply is one real message, the same HTML as
/// the last draft; tokens are counted from the stream's usage chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_grow_while_the_model_writes_and_the_reply_is_the_last_draft() {
    let bot = Bot::start(&[]).await;
    // A pause before the finish chunk, so the last draft can show every word.
    bot.model.script([answer_over_three_seconds(MS(1500))]);
    let chat = 5101;
    bot.telegram
        .push_message(text_message(chat, chat, "why does my regex fail?"));
    let sent = bot.telegram.wait_sent(chat, 1, SECS(20)).await;
    let reply = &sent[0];
    let drafts = bot.telegram.drafts_to(chat);
    let stream = bot.model.streams().remove(0);
    eprintln!(
        "drafts: {:#?}",
        drafts
            .iter()
            .map(|d| (d.draft_id, d.visible()))
            .collect::<Vec<_>>()
    );

    assert!(bot.model.streamed(0), "the model was asked to stream");
    assert_eq!(
        bot.model.requests()[0].body["stream_options"]["include_usage"],
        true
    );
    assert_is_the_answer(&reply.visible());
    assert_eq!(reply.parse_mode.as_deref(), Some("HTML"));

    // The placeholder first, then the reply as it grows, all in the batch's draft.
    assert_eq!(drafts[0].visible(), "…");
    assert!(drafts.iter().all(|d| d.draft_id == drafts[0].draft_id));
    let texts: Vec<String> = drafts[1..].iter().map(|d| d.visible()).collect();
    assert!(texts.len() >= 3, "{texts:#?}");
    for pair in texts.windows(2) {
        assert!(
            pair[1].len() > pair[0].len() && pair[1].starts_with(pair[0].trim_end()),
            "drafts grow in order: {pair:#?}"
        );
    }
    // Read incrementally: drafts showed words before the model finished.
    let ended = stream.ended.expect("the stream ended");
    let before_end = drafts[1..].iter().filter(|d| d.at < ended).count();
    assert!(
        before_end >= 3,
        "{before_end} drafts before the model finished"
    );
    // The last draft is the reply, rendered the same way.
    let last = drafts.last().unwrap();
    assert_eq!(
        (last.text.as_str(), last.parse_mode.as_deref()),
        (reply.text.as_str(), Some("HTML"))
    );
    assert!(last.at < reply.at);
    // Paced: never two draft calls within a second (a little slack for the clock).
    let calls = bot.telegram.calls("sendMessageDraft");
    for pair in calls.windows(2) {
        assert!(pair[1] - pair[0] >= MS(950), "{:?}", pair[1] - pair[0]);
    }
    // The reply goes out as soon as the model finished, not a draft later.
    assert!(reply.at - ended < SECS(1), "{:?}", reply.at - ended);
    // Usage from the stream's last chunk: stored with the reply and counted.
    assert_eq!(
        db::count(
            &bot.db(),
            "SELECT completion_tokens FROM outbox WHERE kind = 'reply'"
        ),
        7
    );
    let metrics = bot.lull.metrics().await.unwrap();
    assert_eq!(
        metrics["lull_llm_tokens_total{kind=\"completion\"}"], 7.0,
        "{metrics:#?}"
    );
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"ok\"}"], 1.0);
    // Drafts replace "typing…" in a private chat.
    assert!(bot.telegram.actions().is_empty());
    bot.assert_invariants(1).await;
    bot.finish();
}

/// A message sent while the model writes: the round writing the first answer stops
/// its draft, its reply is dropped at the final check (no real message from it), and
/// one reply covers both messages. The second batch has a draft of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_mid_generation_leaves_no_stale_message() {
    let bot = Bot::start(&[]).await;
    let slow = Stream::echo(10, MS(400));
    bot.model
        .script([Behavior::Stream(slow.clone()), Behavior::Stream(slow)]);
    let chat = 5102;
    bot.telegram
        .push_message(text_message(chat, chat, "what is the capital of France"));
    // The first answer is being drafted.
    let first = bot
        .telegram
        .wait_for("a draft with words", SECS(20), |f| {
            f.drafts_to(chat)
                .into_iter()
                .find(|d| d.visible().starts_with("[model]"))
        })
        .await;
    let pushed = Instant::now();
    bot.telegram
        .push_message(text_message(chat, chat, "and of Italy?"));
    let sent = bot.telegram.wait_sent(chat, 1, SECS(30)).await;
    assert_eq!(
        sent[0].visible(),
        "[model] what is the capital of France\nand of Italy?"
    );
    bot.assert_invariants(1).await;
    // The stale answer never became a message.
    assert_eq!(bot.telegram.sent_to(chat).len(), 1);
    let metrics = bot.lull.metrics().await.unwrap();
    assert_eq!(metrics["lull_replies_dropped_stale_total"], 1.0);
    // The first batch's draft stopped growing once the second message was stored
    // (a call already on its way aside), and its answer stopped too: the stream was
    // closed at once (the overtaken generation cancelled), not written for seconds
    // more; the reply was drafted in the second batch's draft.
    let drafts = bot.telegram.drafts_to(chat);
    assert_eq!(first.draft_id, 1, "{drafts:#?}");
    let late: Vec<_> = drafts
        .iter()
        .filter(|d| d.draft_id == first.draft_id && d.at > pushed + MS(500))
        .collect();
    assert!(late.is_empty(), "{late:#?}");
    let first_stream = &bot.model.streams()[0];
    assert!(
        first_stream.ended.is_none(),
        "the overtaken answer was cut off, not finished: {first_stream:?}"
    );
    assert!(
        first_stream
            .pieces
            .iter()
            .all(|(_, at)| *at < pushed + SECS(1)),
        "no piece of the overtaken answer long after the newer message: {first_stream:?}"
    );
    let second: Vec<_> = drafts.iter().filter(|d| d.at > pushed).collect();
    assert!(
        second.iter().all(|d| d.draft_id == 1 || d.draft_id == 2),
        "{second:#?}"
    );
    // The covering round starts at once (the overtaken one was stopped), so its
    // draft may come before the second message's placeholder had a slot.
    let second: Vec<_> = second.into_iter().filter(|d| d.draft_id == 2).collect();
    assert!(
        second
            .iter()
            .all(|d| d.visible() == "…" || d.visible().starts_with("[model]")),
        "{second:#?}"
    );
    assert!(
        second
            .iter()
            .any(|d| d.visible().starts_with("[model] what is the capital")),
        "{second:#?}"
    );
    bot.finish();
}

/// Groups get "typing…", never a draft (the Bot API refuses them there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_chat_gets_no_drafts() {
    let bot = Bot::start(&[]).await;
    bot.model
        .script([Behavior::Stream(Stream::echo(6, MS(300)))]);
    let chat = -100_5103;
    bot.telegram
        .push_message(mention(chat, 31, "what is the answer?"));
    let sent = bot.telegram.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].visible(), "[model] User31: what is the answer?");
    assert!(bot.telegram.calls("sendMessageDraft").is_empty());
    assert!(
        bot.telegram
            .actions()
            .iter()
            .any(|a| a.chat_id == chat && a.action == "typing")
    );
    assert!(!bot.model.streamed(0), "no one watches: a whole answer");
    bot.assert_invariants(1).await;
    bot.finish();
}

/// A server that answers a streamed request with one whole JSON answer is read as
/// such; one that refuses `stream` is asked again for a whole answer, within the same
/// attempt, and never asked to stream again. The drafts show the placeholder only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_does_not_stream_still_answers() {
    let bot = Bot::start(&[]).await;
    bot.model.script([Behavior::Slow(MS(1500))]);
    let chat = 5104;
    bot.telegram.push_message(text_message(chat, chat, "hello"));
    let sent = bot.telegram.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].visible(), "[model] hello");
    assert!(bot.model.streamed(0));
    assert_eq!(bot.model.requests().len(), 1);
    let drafts = bot.telegram.drafts_to(chat);
    assert!(!drafts.is_empty());
    assert!(drafts.iter().all(|d| d.visible() == "…"), "{drafts:#?}");
    bot.assert_invariants(1).await;

    bot.model
        .script([Behavior::RefuseStream, Behavior::RefuseStream]);
    bot.telegram
        .push_message(text_message(chat, chat, "and now?"));
    let sent = bot.telegram.wait_sent(chat, 2, SECS(20)).await;
    assert_eq!(sent[1].visible(), "[model] and now?");
    assert!(bot.model.streamed(1) && !bot.model.streamed(2));
    bot.telegram
        .push_message(text_message(chat, chat, "still there?"));
    let sent = bot.telegram.wait_sent(chat, 3, SECS(20)).await;
    assert_eq!(sent[2].visible(), "[model] still there?");
    assert_eq!(bot.model.requests().len(), 4);
    assert!(
        !bot.model.streamed(3),
        "asked for whole answers from then on"
    );
    assert!(bot.lull.logs().contains("refuses streamed answers"));
    bot.assert_invariants(3).await;
    bot.finish();
}

/// A stream that breaks mid-way, and one that stalls, are transient failures: retried
/// within the round (the stall after `LULL_LLM_TIMEOUT_MS`), and the reply is the one
/// complete answer, sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_or_stalled_stream_is_retried() {
    let bot = Bot::start(&[("LULL_LLM_TIMEOUT_MS", "1500")]).await;
    let cut = |end| {
        Behavior::Stream(Stream {
            end,
            ..Stream::echo(6, MS(100))
        })
    };
    bot.model.script([
        cut(StreamEnd::Break),
        cut(StreamEnd::Stall),
        Behavior::Stream(Stream::echo(6, MS(100))),
    ]);
    let chat = 5105;
    bot.telegram
        .push_message(text_message(chat, chat, "tell me a long story please"));
    let sent = bot.telegram.wait_sent(chat, 1, SECS(30)).await;
    assert_eq!(sent[0].visible(), "[model] tell me a long story please");
    assert_eq!(bot.model.requests().len(), 3);
    let metrics = bot.lull.metrics().await.unwrap();
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"error\"}"], 1.0);
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"timeout\"}"], 1.0);
    assert_eq!(metrics["lull_llm_requests_total{outcome=\"ok\"}"], 1.0);
    bot.assert_invariants(1).await;
    assert_eq!(bot.telegram.sent_to(chat).len(), 1);
    bot.finish();
}

/// A 429 on drafts: no draft is sent before its `retry_after`, later drafts come at
/// half the pace, and the reply is not held back by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_on_drafts_slows_them_without_delaying_the_reply() {
    let bot = Bot::start(&[]).await;

    // A question while drafts get a 429 asking to wait `retry_after` seconds: the
    // reply, and when the 429 came.
    let ask = async |chat: i64, retry_after: u64| {
        bot.model
            .script([answer_over_three_seconds(Duration::ZERO)]);
        bot.telegram
            .fail("sendMessageDraft", Fault::TooManyRequests(retry_after), 1);
        bot.telegram
            .push_message(text_message(chat, chat, "a question"));
        let sent = bot.telegram.wait_sent(chat, 1, SECS(20)).await.remove(0);
        let refused = *bot.telegram.faulted("sendMessageDraft").last().unwrap();
        let ended = bot.model.streams().last().unwrap().ended.unwrap();
        // Sent as soon as the model finished.
        assert!(sent.at - ended < SECS(1), "{:?}", sent.at - ended);
        (sent, refused)
    };

    // A wait longer than the whole answer: the reply does not wait it out, and no
    // draft is sent within it.
    let (sent, refused) = ask(5106, 10).await;
    assert!(sent.at - refused < SECS(10));
    assert_eq!(bot.telegram.calls("sendMessageDraft").len(), 1);

    // A short wait, in another chat: honoured, then drafts at half the pace.
    let (sent, refused) = ask(5107, 1).await;
    let calls: Vec<Instant> = bot
        .telegram
        .calls("sendMessageDraft")
        .into_iter()
        .filter(|&at| at > refused && at < sent.at)
        .collect();
    assert!(calls.len() >= 2, "{calls:?}");
    assert!(calls[0] - refused >= MS(950), "{:?}", calls[0] - refused);
    assert!(calls[1] - calls[0] >= MS(1900), "{:?}", calls[1] - calls[0]);
    bot.assert_invariants(2).await;
    bot.finish();
}

/// `LULL_STREAM=off`: no draft, a whole answer, "typing…" as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lull_stream_off_no_drafts_are_sent() {
    let bot = Bot::start(&[("LULL_STREAM", "off")]).await;
    // The same answer in the same time, whole.
    bot.model
        .script([answer_over_three_seconds(Duration::ZERO)]);
    let chat = 5107;
    bot.telegram
        .push_message(text_message(chat, chat, "why does my regex fail?"));
    let sent = bot.telegram.wait_sent(chat, 1, SECS(20)).await;
    assert_is_the_answer(&sent[0].visible());
    assert!(bot.telegram.calls("sendMessageDraft").is_empty());
    assert!(!bot.model.streamed(0));
    assert!(
        bot.telegram
            .actions()
            .iter()
            .any(|a| a.chat_id == chat && a.action == "typing")
    );
    bot.assert_invariants(1).await;
    bot.finish();
}

/// Measured: the Bot API calls that answering one message in a private chat costs,
/// with drafts and without, for a reply of about 400 characters the model writes over
/// 3 s (`cargo test bot_api_calls -- --nocapture` prints them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bot_api_calls_per_reply_with_and_without_drafts() {
    let mut totals = Vec::new();
    for stream in ["auto", "off"] {
        let bot = Bot::start(&[("LULL_STREAM", stream)]).await;
        bot.model
            .script([answer_over_three_seconds(Duration::ZERO)]);
        let chat = 5109;
        bot.telegram
            .push_message(text_message(chat, chat, "why does my regex fail?"));
        bot.telegram.wait_sent(chat, 1, SECS(20)).await;
        bot.assert_invariants(1).await;
        let (calls, total) = answering_calls(&bot.telegram);
        eprintln!("LULL_STREAM={stream}: {total} Bot API calls for one reply {calls:?}");
        totals.push(total);
        bot.finish();
    }
    // With drafts: the placeholder, at most a draft a second while the model writes,
    // the reply. Without: "typing…" (every 4 s) and the reply.
    assert!(totals[0] <= 1 + 4 + 1, "{totals:?}");
    assert!(totals[1] <= 2, "{totals:?}");
}

//! The Telegram adapter end to end: the real `lull` binary against the loopback Bot
//! API fake (`support::fakes::telegram`), with the echo responder. Every test also
//! checks that the bot token never reached the process's logs (run at debug level).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::db;
use crate::support::fakes::telegram::{
    self as fake, BOT_USERNAME, Fault, TelegramFake, edited, in_topic, mention, text_message,
};
use crate::support::process::{LullProcess, free_port};

const SECS: fn(u64) -> Duration = Duration::from_secs;

pub(crate) struct Tg {
    dir: tempfile::TempDir,
    pub(crate) fake: TelegramFake,
    pub(crate) lull: LullProcess,
}

/// The environment of a `lull run` on the fake: `extra` adds or replaces variables.
pub(crate) fn env(
    dir: &std::path::Path,
    fake: &TelegramFake,
    extra: &[(&str, &str)],
) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> = vec![
        ("TELEGRAM_BOT_TOKEN", fake.token.clone()),
        ("TELEGRAM_API_URL", fake.url.clone()),
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.join("lull.db").display()),
        ),
        ("LULL_LLM", "echo".into()),
        ("LULL_ALLOWED_USERS", "*".into()),
        ("LULL_DEBOUNCE_MS", "500".into()),
        ("LULL_MAX_WAIT_MS", "6000".into()),
        ("LULL_POLL_MS", "200".into()),
        ("RUST_LOG", "debug".into()),
    ];
    for (k, v) in extra {
        env.retain(|(key, _)| key != k);
        let key: &'static str = Box::leak(k.to_string().into_boxed_str());
        env.push((key, v.to_string()));
    }
    env
}

/// Wait until the fake has seen a successful poll since `after`: the process holds
/// the poller lease and polls.
pub(crate) async fn wait_polling(fake: &TelegramFake, after: Instant) {
    fake.wait_for("a poll", SECS(20), |f| {
        f.polls()
            .iter()
            .any(|p| p.started >= after && p.status != 409)
            .then_some(())
    })
    .await;
}

pub(crate) async fn start(extra: &[(&str, &str)]) -> Tg {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let begun = Instant::now();
    let lull = LullProcess::start(dir.path(), "lull", &["run"], &env(dir.path(), &fake, extra));
    wait_polling(&fake, begun).await;
    Tg { dir, fake, lull }
}

impl Tg {
    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    /// The token (or its secret half) in no log line of any process of the test.
    pub(crate) fn finish(self) {
        assert_token_absent(&self.fake.token, &self.lull.logs());
    }
}

fn assert_token_absent(token: &str, logs: &str) {
    let secret = token.split_once(':').unwrap().1;
    assert!(!logs.is_empty(), "no logs captured");
    assert!(
        !logs.contains(secret),
        "the bot token leaked into the logs:\n{logs}"
    );
}

pub(crate) async fn health(lull: &LullProcess) -> Value {
    reqwest::get(format!("{}/healthz", lull.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn id(message: &Value) -> i64 {
    message["message_id"].as_i64().unwrap()
}

/// Stored message ids of a conversation.
pub(crate) fn stored(db_path: &std::path::Path, conversation: &str) -> Vec<String> {
    db::messages(db_path)
        .into_iter()
        .filter(|m| m.conversation == conversation)
        .map(|m| m.message_id)
        .collect()
}

/// Three quick private messages get one reply covering all three, as HTML, with
/// the reply shown as a live draft while the model worked (a private chat's
/// "typing…"); the updates are confirmed once stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_three_private_messages_gets_one_reply() {
    // A model that takes a moment, so the draft has time to show.
    let tg = start(&[("LULL_ECHO_DELAY_MS", "800")]).await;
    let chat = 4201;
    let mut last_update = 0;
    for text in ["first", "second", "third"] {
        last_update = tg.fake.push_message(text_message(chat, chat, text));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(sent[0].text, "[echo] 3 messages:\nfirst\nsecond\nthird");
    assert_eq!(sent[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(sent[0].reply_to, None, "no quote in a private chat");
    assert!(
        tg.fake
            .drafts_to(chat)
            .iter()
            .any(|d| d.visible().starts_with("[echo]") && d.at <= sent[0].at),
        "the reply drafted before it was sent"
    );
    // One reply covers all three; nothing is left to answer.
    let verdict = db::settled(&tg.db(), SECS(10)).await;
    assert_eq!(
        (
            verdict.messages,
            verdict.replies,
            verdict.duplicates,
            verdict.lost
        ),
        (3, 1, 0, 0),
        "{verdict:?}"
    );
    tg.fake
        .wait_for("updates confirmed", SECS(15), |f| {
            (f.confirmed_below() > last_update).then_some(())
        })
        .await;
    assert_eq!(tg.fake.sent_to(chat).len(), 1);
    tg.finish();
}

/// In a group only messages addressed to the bot are answered: a mention, one of its
/// commands (`/help@bot`), a reply to the bot. Replies quote the message they answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_message_is_answered_only_when_addressed_to_the_bot() {
    let tg = start(&[]).await;
    let chat = -100_4202;
    let quiet = text_message(chat, 11, "just chatting among ourselves");
    let other_bot = text_message(chat, 11, "/help@some_other_bot");
    let asked = mention(chat, 11, "what is the answer?");
    tg.fake.push_message(quiet.clone());
    tg.fake.push_message(other_bot.clone());
    tg.fake.push_message(asked.clone());
    let sent = tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(
        sent[0].text,
        "[echo] 1 message:\nUser11: what is the answer?"
    );
    assert_eq!(
        sent[0].reply_to,
        Some(id(&asked)),
        "the reply quotes the question"
    );
    assert!(sent[0].allow_without_reply);

    let help = text_message(chat, 12, &format!("/help@{BOT_USERNAME}"));
    tg.fake.push_message(help.clone());
    let sent = tg.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(
        sent[1].text.contains("/reset"),
        "the help text: {}",
        sent[1].text
    );
    assert_eq!(sent[1].reply_to, Some(id(&help)));

    let mut follow_up = text_message(chat, 12, "and why?");
    follow_up["reply_to_message"] = json!({
        "message_id": sent[0].message_id, "date": 1_700_000_000,
        "chat": fake::chat(chat, false), "from": fake::bot_user(), "text": sent[0].text,
    });
    tg.fake.push_message(follow_up.clone());
    let sent = tg.fake.wait_sent(chat, 3, SECS(15)).await;
    assert_eq!(sent[2].text, "[echo] 1 message:\nUser12: and why?");

    // The unaddressed messages never reached the core.
    assert_eq!(
        stored(&tg.db(), &chat.to_string()),
        [id(&asked).to_string(), id(&follow_up).to_string()]
    );
    assert_eq!(tg.fake.sent_to(chat).len(), 3);
    tg.finish();
}

/// Each forum topic is its own conversation, answered (and shown typing) in its
/// topic; the General topic is the group's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_forum_topic_is_a_separate_conversation() {
    // A model that takes a moment, so "typing…" has time to show.
    let tg = start(&[("LULL_ECHO_DELAY_MS", "800")]).await;
    let chat = -100_4203;
    tg.fake
        .push_message(in_topic(mention(chat, 13, "question in topic ten"), 10));
    tg.fake
        .push_message(in_topic(mention(chat, 13, "question in topic twenty"), 20));
    tg.fake
        .push_message(mention(chat, 13, "question in general"));
    let sent = tg.fake.wait_sent(chat, 3, SECS(15)).await;
    let in_thread = |thread: Option<i64>| -> Vec<String> {
        sent.iter()
            .filter(|s| s.thread_id == thread)
            .map(|s| s.text.clone())
            .collect()
    };
    assert_eq!(
        in_thread(Some(10)),
        ["[echo] 1 message:\nUser13: question in topic ten"]
    );
    assert_eq!(
        in_thread(Some(20)),
        ["[echo] 1 message:\nUser13: question in topic twenty"]
    );
    assert_eq!(
        in_thread(None),
        ["[echo] 1 message:\nUser13: question in general"]
    );
    let typing_threads: std::collections::BTreeSet<Option<i64>> = tg
        .fake
        .actions()
        .iter()
        .filter(|a| a.chat_id == chat)
        .map(|a| a.thread_id)
        .collect();
    assert_eq!(
        typing_threads,
        [None, Some(10), Some(20)].into_iter().collect()
    );
    let mut keys: Vec<String> = db::messages(&tg.db())
        .into_iter()
        .map(|m| m.conversation)
        .collect();
    keys.sort();
    assert_eq!(keys, ["-1004203", "-1004203:10", "-1004203:20"]);
    tg.finish();
}

/// An edit while the model is answering the original text: that answer is dropped,
/// and the one reply answers the edited text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_during_generation_yields_one_reply_to_the_edited_text() {
    let tg = start(&[("LULL_ECHO_DELAY_MS", "2000")]).await;
    let chat = 4204;
    let question = text_message(chat, chat, "what is 2+2?");
    tg.fake.push_message(question.clone());
    // The reply's first words are drafted: generation has started.
    tg.fake
        .wait_for("generation started", SECS(10), |f| {
            f.drafts_to(chat)
                .iter()
                .any(|d| d.visible().starts_with("[echo]"))
                .then_some(())
        })
        .await;
    tg.fake
        .push("edited_message", edited(&question, "what is 3+3?"));
    let sent = tg.fake.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\nwhat is 3+3?");
    let metrics = tg.lull.metrics().await.unwrap();
    assert_eq!(
        metrics.get("lull_replies_dropped_stale_total"),
        Some(&1.0),
        "{metrics:#?}"
    );
    let verdict = db::settled(&tg.db(), SECS(10)).await;
    assert_eq!(
        (verdict.replies, verdict.duplicates, verdict.lost),
        (1, 0, 0),
        "{verdict:?}"
    );
    assert_eq!(tg.fake.sent_to(chat).len(), 1);
    tg.finish();
}

/// A reply of over 6,000 characters arrives as two messages, each within Telegram's
/// 4096 and each valid HTML (the fake refuses invalid HTML, and a plain-text
/// fallback would show as a missing parse mode), with Markdown and `<`, `>`, `&`
/// intact for the reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_6000_character_reply_arrives_as_two_well_formed_messages() {
    let tg = start(&[]).await;
    let chat = 4205;
    let first: String = (0..100)
        .map(|i| format!("Line {i}: **bold** and `a<b>&c` text.\n"))
        .collect();
    let second: String = format!(
        "```rust\n{}```",
        (0..100)
            .map(|i| format!("let x{i} = a < b && c > {i:04};\n"))
            .collect::<String>()
    );
    assert!(
        first.len() > 2900 && second.len() > 2700,
        "{} {}",
        first.len(),
        second.len()
    );
    tg.fake
        .push_message(text_message(chat, chat, first.trim_end()));
    tg.fake.push_message(text_message(chat, chat, &second));
    let sent = tg.fake.wait_sent(chat, 2, SECS(15)).await;
    let reply = &db::replies(&tg.db())[0].text;
    assert!(reply.chars().count() > 6000, "{}", reply.chars().count());
    assert_eq!(sent.len(), 2);
    let mut visible = String::new();
    for part in &sent {
        assert_eq!(part.parse_mode.as_deref(), Some("HTML"), "{}", part.text);
        let text = fake::html_visible_text(&part.text).expect("valid HTML");
        assert!(text.encode_utf16().count() <= 4096);
        visible.push_str(&text);
        visible.push('\n');
    }
    for i in [0, 50, 99] {
        assert!(
            visible.contains(&format!("Line {i}: bold and a<b>&c text.")),
            "line {i} in\n{visible}"
        );
        assert!(
            visible.contains(&format!("let x{i} = a < b && c > {i:04};")),
            "code line {i}"
        );
    }
    assert!(
        sent[0].text.contains("<b>bold</b>")
            && sent[0].text.contains("<code>a&lt;b&gt;&amp;c</code>")
    );
    assert!(
        sent.iter()
            .any(|s| s.text.contains("<pre><code class=\"language-rust\">"))
    );
    tg.finish();
}

/// If Telegram refuses the HTML ("can't parse entities"), the part goes out as plain
/// text instead of being lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_html_is_sent_as_plain_text() {
    let tg = start(&[]).await;
    let chat = 4210;
    tg.fake.reject_html(true);
    tg.fake
        .push_message(text_message(chat, chat, "**hi** <there>"));
    let sent = tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(sent[0].parse_mode, None);
    assert_eq!(sent[0].text, "[echo] 1 message:\n**hi** <there>");
    tg.finish();
}

/// A 429 on sending is waited out for its `retry_after` and the reply arrives once;
/// a 429 on polling pauses the poller as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_waited_out() {
    let tg = start(&[]).await;
    let chat = 4206;
    tg.fake.fail("sendMessage", Fault::TooManyRequests(2), 1);
    tg.fake.fail("getUpdates", Fault::TooManyRequests(1), 1);
    tg.fake.push_message(text_message(chat, chat, "hello"));
    let sent = tg.fake.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\nhello");

    let refused = tg.fake.faulted("sendMessage");
    assert_eq!(refused.len(), 1);
    let waited = sent[0].at - refused[0];
    assert!(waited >= SECS(2), "sent again after {waited:?}");

    let refused = tg.fake.faulted("getUpdates")[0];
    let next_poll = tg
        .fake
        .calls("getUpdates")
        .into_iter()
        .find(|&at| at > refused)
        .unwrap();
    assert!(
        next_poll - refused >= SECS(1),
        "polled again after {:?}",
        next_poll - refused
    );
    assert_eq!(tg.fake.sent_to(chat).len(), 1);
    tg.finish();
}

/// A user who blocked the bot: the reply is given up at once (no retry), with one
/// ERROR line naming the conversation and reply, and `lull_replies_failed_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_a_user_who_blocked_the_bot_is_given_up_once() {
    let tg = start(&[]).await;
    let chat = 4207;
    tg.fake.fail("sendMessage", Fault::Blocked, 1);
    tg.fake.push_message(text_message(chat, chat, "hello"));
    tg.fake
        .wait_for("the refusal", SECS(20), |f| {
            (!f.faulted("sendMessage").is_empty()).then_some(())
        })
        .await;
    let verdict = db::settled(&tg.db(), SECS(10)).await;
    assert_eq!(verdict.duplicates, 0, "{verdict:?}");
    assert_eq!(
        db::count(
            &tg.db(),
            "SELECT COUNT(*) FROM outbox WHERE failed_at IS NOT NULL AND attempts = 1"
        ),
        1
    );
    let metrics = tg.lull.metrics().await.unwrap();
    assert_eq!(metrics["lull_replies_failed_total"], 1.0, "{metrics:#?}");
    assert_eq!(tg.fake.calls("sendMessage").len(), 1, "not retried");
    let errors = tg.lull.error_lines("gave up");
    assert_eq!(errors.len(), 1, "{}", tg.lull.logs());
    assert!(
        errors[0].contains(&format!("telegram:{chat}")) && errors[0].contains("reply_id="),
        "{}",
        errors[0]
    );
    tg.finish();
}

/// Polling survives a 5xx and a response that is not JSON: it backs off, recovers,
/// and the message waiting meanwhile is answered once. (teloxide itself waits 10 s
/// after a 5xx before reporting it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_backs_off_and_recovers_from_server_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    fake.fail("getUpdates", Fault::Garbage, 1);
    fake.fail("getUpdates", Fault::ServerError(502), 1);
    let chat = 4207;
    fake.push_message(text_message(chat, chat, "are you there?"));
    let lull = LullProcess::start(dir.path(), "lull", &["run"], &env(dir.path(), &fake, &[]));
    let sent = fake.wait_sent(chat, 1, SECS(30)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\nare you there?");
    assert_eq!(fake.faulted("getUpdates").len(), 2);
    assert!(lull.logs().contains("polling Telegram failed; retrying"));
    let tg = Tg { dir, fake, lull };
    assert_eq!(tg.fake.sent_to(chat).len(), 1);
    tg.finish();
}

/// A process killed after fetching an update but before storing it loses nothing:
/// the offset was not advanced, so the update is delivered again and answered once.
/// The store is held locked (as a busy database would be) so the kill lands in
/// exactly that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_loses_no_update() {
    let mut tg = start(&[("LULL_LEASE_TTL_MS", "3000")]).await;
    let chat = 4208;
    let lock = rusqlite::Connection::open(tg.db()).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let update = tg
        .fake
        .push_message(text_message(chat, chat, "do not lose me"));
    tg.fake
        .wait_for("update fetched", SECS(15), |f| {
            f.was_served(update).then_some(())
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    tg.lull.kill9();
    assert!(
        tg.fake.confirmed_below() <= update,
        "acknowledged before it was stored"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    assert!(
        stored(&tg.db(), &chat.to_string()).is_empty(),
        "not stored before the kill"
    );

    tg.lull.restart();
    let sent = tg.fake.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\ndo not lose me");
    assert_eq!(stored(&tg.db(), &chat.to_string()).len(), 1);
    let verdict = db::settled(&tg.db(), SECS(10)).await;
    assert_eq!(
        (verdict.replies, verdict.duplicates, verdict.lost),
        (1, 0, 0),
        "{verdict:?}"
    );
    tg.finish();
}

/// A database that refuses writes (locked past the store's busy timeout) loses
/// nothing either: the update stays unconfirmed, is fetched again, and is stored
/// and answered once the database recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_error_loses_no_update() {
    let tg = start(&[]).await;
    let chat = 4213;
    let lock = rusqlite::Connection::open(tg.db()).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let update = tg
        .fake
        .push_message(text_message(chat, chat, "store me later"));
    let deadline = Instant::now() + SECS(15);
    while !tg.lull.logs().contains("could not store an update") {
        assert!(Instant::now() < deadline, "{}", tg.lull.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        tg.fake.confirmed_below() <= update,
        "acknowledged though not stored"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    let sent = tg.fake.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\nstore me later");
    let verdict = db::settled(&tg.db(), SECS(10)).await;
    assert_eq!(
        (
            verdict.messages,
            verdict.replies,
            verdict.duplicates,
            verdict.lost
        ),
        (1, 1, 0, 0),
        "{verdict:?}"
    );
    tg.finish();
}

/// Two processes on one database: only the poller-lease holder polls (the fake
/// answers a concurrent poll with 409, and counts none), the other reports standby,
/// and takes over within the lease TTL when the poller is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_poll_at_once_and_the_standby_takes_over() {
    const TTL_MS: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let ttl = TTL_MS.to_string();
    let extra = [("LULL_LEASE_TTL_MS", ttl.as_str())];
    let env = env(dir.path(), &fake, &extra);
    let begun = Instant::now();
    let mut a = LullProcess::start(dir.path(), "a", &["run"], &env);
    wait_polling(&fake, begun).await;
    let mut b = LullProcess::start(dir.path(), "b", &["run"], &env);
    b.wait_healthy(SECS(20)).await;
    assert_eq!(health(&a).await["adapters"]["telegram"], "up");
    assert_eq!(health(&b).await["adapters"]["telegram"], "standby");

    let chat = 4209;
    fake.push_message(text_message(chat, chat, "one"));
    fake.wait_sent(chat, 1, SECS(15)).await;
    // Both alive for a while: several renewals and polls, and the standby retrying.
    tokio::time::sleep(SECS(3)).await;
    assert_eq!(fake.conflicts(), 0);

    a.kill9();
    let killed = Instant::now();
    fake.push_message(text_message(chat, chat, "two"));
    let sent = fake.wait_sent(chat, 2, SECS(20)).await;
    assert_eq!(sent[1].text, "[echo] 1 message:\ntwo");
    let takeover = fake
        .polls()
        .iter()
        .find(|p| p.started > killed)
        .unwrap()
        .started
        - killed;
    eprintln!("standby took over polling {takeover:?} after the kill");
    assert!(
        takeover <= Duration::from_millis(TTL_MS + TTL_MS / 3 + 1000),
        "took over after {takeover:?}"
    );
    assert_eq!(health(&b).await["adapters"]["telegram"], "up");
    assert_eq!(fake.conflicts(), 0, "two polls were open at once");

    // A graceful stop hands the lease over at once (no waiting out the TTL).
    a.restart();
    a.wait_healthy(SECS(20)).await;
    assert_eq!(health(&a).await["adapters"]["telegram"], "standby");
    b.signal("TERM");
    assert_eq!(b.wait_exit(SECS(15)), Some(0));
    let stopped = Instant::now();
    fake.push_message(text_message(chat, chat, "three"));
    fake.wait_sent(chat, 3, SECS(20)).await;
    let handover = fake
        .polls()
        .iter()
        .find(|p| p.started > stopped)
        .unwrap()
        .started
        - stopped;
    eprintln!("standby took over polling {handover:?} after a graceful stop");
    assert!(
        handover < Duration::from_millis(TTL_MS),
        "handed over after {handover:?}"
    );
    assert_eq!(fake.conflicts(), 0, "two polls were open at once");
    // Updates fetched again after a takeover are stored once and answered once.
    let verdict = db::settled(&dir.path().join("lull.db"), SECS(10)).await;
    assert_eq!(
        (
            verdict.messages,
            verdict.replies,
            verdict.duplicates,
            verdict.lost
        ),
        (3, 3, 0, 0),
        "{verdict:?}"
    );
    assert_eq!(fake.sent_to(chat).len(), 3);
    assert_token_absent(&fake.token, &a.logs());
    assert_token_absent(&fake.token, &b.logs());
}

/// Counter-test of the one above: two processes that do not share a database (so
/// no poller lease) both poll, and the fake sees the conflict; the adapter reports
/// it and backs off instead of spinning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_without_a_shared_lease_do_conflict() {
    let fake = TelegramFake::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let begun = Instant::now();
    let a = LullProcess::start(dir_a.path(), "a", &["run"], &env(dir_a.path(), &fake, &[]));
    wait_polling(&fake, begun).await;
    let b = LullProcess::start(dir_b.path(), "b", &["run"], &env(dir_b.path(), &fake, &[]));
    fake.wait_for("a 409 Conflict", SECS(20), |f| {
        (f.conflicts() > 0).then_some(())
    })
    .await;
    let deadline = Instant::now() + SECS(10);
    while !(a.logs() + &b.logs()).contains("another poller for this bot token") {
        assert!(Instant::now() < deadline, "the conflict was not reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Backing off: far fewer conflicts than a spinning poller would cause.
    tokio::time::sleep(SECS(2)).await;
    assert!(fake.conflicts() < 10, "{} conflicts", fake.conflicts());
    assert_token_absent(&fake.token, &a.logs());
    assert_token_absent(&fake.token, &b.logs());
}

/// A user not in LULL_ALLOWED_USERS gets the notice naming their id, and nothing of
/// theirs is stored or reaches the model; a listed user is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_user_gets_the_notice() {
    let tg = start(&[("LULL_ALLOWED_USERS", "telegram:4211")]).await;
    tg.fake.push_message(text_message(4212, 4212, "let me in"));
    tg.fake.push_message(text_message(4211, 4211, "hi"));
    let denied = tg.fake.wait_sent(4212, 1, SECS(15)).await;
    assert!(
        denied[0].text.contains("4212") && denied[0].text.contains("telegram:4212"),
        "{}",
        denied[0].text
    );
    let allowed = tg.fake.wait_sent(4211, 1, SECS(15)).await;
    assert_eq!(allowed[0].text, "[echo] 1 message:\nhi");
    assert!(stored(&tg.db(), "4212").is_empty());
    tg.finish();
}

/// The token stays out of the logs when the Bot API cannot be reached (network
/// errors carry request URLs, which carry the token) and when it is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_never_appears_in_logs() {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    // Nothing listens here: every request fails to connect.
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    let offline = LullProcess::start(
        dir.path(),
        "offline",
        &["run"],
        &env(
            dir.path(),
            &fake,
            &[("TELEGRAM_API_URL", &unreachable), ("RUST_LOG", "trace")],
        ),
    );
    // A token the fake does not know: 401 Unauthorized.
    let wrong = format!("{}:{}", fake::BOT_ID, "B".repeat(35));
    let other_dir = tempfile::tempdir().unwrap();
    let mut rejected = LullProcess::start(
        other_dir.path(),
        "rejected",
        &["run"],
        &env(other_dir.path(), &fake, &[("TELEGRAM_BOT_TOKEN", &wrong)]),
    );
    // A rejected token stops the process with an error naming the variable, so a
    // supervisor sees the failure instead of a process running on, unhealthy.
    let code = rejected.wait_exit(SECS(15));
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    let logs = rejected.logs();
    assert!(
        logs.contains("Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)"),
        "{logs}"
    );
    let deadline = Instant::now() + SECS(15);
    while !offline.logs().contains("cannot reach the Telegram Bot API") {
        assert!(Instant::now() < deadline, "{}", offline.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_token_absent(&fake.token, &offline.logs());
    assert_token_absent(&wrong, &rejected.logs());
}

/// The fake's HTML check, which the formatting test relies on, refuses what
/// Telegram refuses.
#[test]
fn the_fake_validates_html_like_telegram() {
    assert_eq!(
        fake::html_visible_text("<b>a &lt; b</b> &amp; <a href=\"x\">c</a>").unwrap(),
        "a < b & c"
    );
    for bad in [
        "<b>x",
        "<x>y</x>",
        "a < b",
        "a & b",
        "<b><i>x</b></i>",
        "a > b",
    ] {
        assert!(fake::html_visible_text(bad).is_err(), "{bad}");
    }
}

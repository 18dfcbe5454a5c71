//! Group context (`LULL_GROUP_CONTEXT`) end to end: the real binary against the
//! Telegram and Discord fakes. Group messages not addressed to lull are kept (the
//! newest N per conversation) and shown to the model, with their authors, when lull
//! is addressed; they never trigger a reply, arm no timer and bump no version;
//! `/new` forgets them; off by default; `lull check` tells when Telegram's privacy
//! mode keeps them from the bot.

use std::time::Duration;

use crate::check::{lull_check, platform_fakes};
use crate::discord::{ALICE, BOB, Harness, WAIT};
use crate::support::db;
use crate::support::fakes::discord::{ChannelKind, Say};
use crate::support::fakes::openai::FakeOpenAi;
use crate::support::fakes::telegram::{BOT_USERNAME, TelegramFake, mention, text_message};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The overheard messages kept for `conversation` (its platform key), oldest first.
fn kept(db_path: &std::path::Path, conversation: &str) -> Vec<String> {
    db::rows(
        db_path,
        &format!(
            "SELECT o.text FROM overheard o JOIN conversations c ON c.id = o.conversation_id
             WHERE c.key = '{conversation}' ORDER BY o.id"
        ),
    )
    .into_iter()
    .map(|row| row[0].clone())
    .collect()
}

/// Wait until `conversation` keeps `n` overheard messages.
async fn wait_kept(db_path: &std::path::Path, conversation: &str, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + SECS(15);
    loop {
        let rows = kept(db_path, conversation);
        if rows.len() >= n {
            return rows;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{conversation} kept {rows:?}, not {n} overheard messages"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last user turn of model request `n`.
fn user_turn(model: &FakeOpenAi, n: usize) -> String {
    let messages = model.messages(n);
    let (role, turn) = messages.last().unwrap();
    assert_eq!(role, "user", "{messages:?}");
    turn.clone()
}

/// Four messages among members, then a question to lull: the model gets the newest
/// three as context, each with its author, before the question, in one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_sees_the_newest_group_messages_with_their_authors_when_addressed() {
    let model = FakeOpenAi::start().await;
    let tg = crate::telegram::start(&[
        ("LULL_GROUP_CONTEXT", "3"),
        ("LULL_LLM", "openai"),
        ("OPENAI_BASE_URL", &model.base_url),
        ("OPENAI_API_KEY", "sk-group-context"),
    ])
    .await;
    let chat = -100_6101;
    for (from, text) in [
        (11, "first, too old to keep"),
        (12, "shall we meet at noon?"),
        (11, "noon works"),
        (13, "bring the maps"),
    ] {
        tg.fake.push_message(text_message(chat, from, text));
    }
    let rows = wait_kept(&tg.db(), &chat.to_string(), 3).await;
    assert_eq!(
        rows,
        ["shall we meet at noon?", "noon works", "bring the maps"],
        "bounded at LULL_GROUP_CONTEXT"
    );
    tg.fake.push_message(mention(chat, 12, "where do we meet?"));
    tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(model.requests().len(), 1, "one request: the question's");
    let turn = user_turn(&model, 0);
    assert_eq!(turn, "User12: where do we meet?", "the question alone");
    // The context is a message of its own before it, each message quoted.
    let messages = model.messages(0);
    let (role, context) = &messages[messages.len() - 2];
    assert_eq!(role, "user");
    let quoted = r#""User12": "shall we meet at noon?"
"User11": "noon works"
"User13": "bring the maps""#;
    let (before, _) = context.split_once(quoted).expect(context);
    assert!(before.contains("not addressed to you"), "{context}");
    assert!(!context.contains("too old"), "{context}");
    tg.finish();
}

/// Overheard messages alone: no model call, no reply, no timer, no version bump,
/// nothing pending; a private chat answered meanwhile shows the process is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overheard_message_never_triggers_a_reply() {
    let tg = crate::telegram::start(&[("LULL_GROUP_CONTEXT", "5")]).await;
    let chat = -100_6102;
    tg.fake
        .push_message(text_message(chat, 11, "just chatting"));
    tg.fake.push_message(text_message(chat, 12, "me too"));
    wait_kept(&tg.db(), &chat.to_string(), 2).await;
    let private = 6102;
    tg.fake
        .push_message(text_message(private, private, "hello"));
    tg.fake.wait_sent(private, 1, SECS(15)).await;
    let db_path = tg.db();
    let group = format!("(SELECT id FROM conversations WHERE key = '{chat}')");
    assert_eq!(
        db::count(
            &db_path,
            &format!("SELECT COUNT(*) FROM timers WHERE conversation_id = {group}")
        ),
        0,
        "no timer armed"
    );
    assert_eq!(
        db::count(
            &db_path,
            &format!("SELECT version FROM conversations WHERE id = {group}")
        ),
        0,
        "no version bumped"
    );
    assert!(crate::telegram::stored(&db_path, &chat.to_string()).is_empty());
    assert!(tg.fake.sent_to(chat).is_empty(), "no reply in the group");
    let typing = tg.fake.actions();
    assert!(
        typing.iter().all(|a| a.chat_id != chat),
        "nobody typing: {typing:?}"
    );
    let reactions = tg.fake.reactions();
    assert!(
        reactions.iter().all(|r| r.chat_id != chat),
        "no ack: {reactions:?}"
    );
    tg.finish();
}

/// `/new` starts a fresh context: what was overheard before it is forgotten, what
/// is overheard after it is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_forgets_the_group_context() {
    let tg = crate::telegram::start(&[("LULL_GROUP_CONTEXT", "5"), ("LULL_ADMINS", "telegram:11")])
        .await;
    let chat = -100_6103;
    tg.fake.push_message(text_message(chat, 12, "the old plan"));
    wait_kept(&tg.db(), &chat.to_string(), 1).await;
    tg.fake
        .push_message(text_message(chat, 11, &format!("/new@{BOT_USERNAME}")));
    tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert!(kept(&tg.db(), &chat.to_string()).is_empty(), "forgotten");
    tg.fake.push_message(text_message(chat, 12, "the new plan"));
    wait_kept(&tg.db(), &chat.to_string(), 1).await;
    tg.fake.push_message(mention(chat, 11, "which plan?"));
    let sent = tg.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(
        sent[1].text.contains(r#""User12": "the new plan""#),
        "{}",
        sent[1].text
    );
    assert!(!sent[1].text.contains("the old plan"), "{}", sent[1].text);
    assert!(
        sent[1].text.ends_with("User11: which plan?"),
        "{}",
        sent[1].text
    );
    tg.finish();
}

/// Without `LULL_GROUP_CONTEXT` nothing unaddressed is kept or shown; with it, a
/// sender lull would not answer is not kept either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_context_is_off_by_default_and_only_for_admitted_senders() {
    let tg = crate::telegram::start(&[]).await;
    let chat = -100_6104;
    tg.fake
        .push_message(text_message(chat, 12, "not for the bot"));
    tg.fake.push_message(mention(chat, 11, "hi"));
    let sent = tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\nUser11: hi");
    assert!(kept(&tg.db(), &chat.to_string()).is_empty());
    tg.finish();

    let tg = crate::telegram::start(&[
        ("LULL_GROUP_CONTEXT", "5"),
        ("LULL_ALLOWED_USERS", "telegram:11"),
    ])
    .await;
    tg.fake
        .push_message(text_message(chat, 12, "a stranger's words"));
    tg.fake
        .push_message(text_message(chat, 11, "a member's words"));
    wait_kept(&tg.db(), &chat.to_string(), 1).await;
    tg.fake.push_message(mention(chat, 11, "hi"));
    let sent = tg.fake.wait_sent(chat, 1, SECS(15)).await;
    assert!(
        sent[0].text.contains(r#""User11": "a member's words""#),
        "{}",
        sent[0].text
    );
    assert!(!sent[0].text.contains("stranger"), "{}", sent[0].text);
    assert_eq!(kept(&tg.db(), &chat.to_string()), ["a member's words"]);
    assert!(
        tg.fake.sent_to(chat).len() == 1,
        "the stranger is not told they are not admitted: they did not ask"
    );
    tg.finish();
}

/// On Discord a guild channel's chatter is context for a mention there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_channel_s_chatter_is_context_for_a_mention() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    h.start("lull", &[("LULL_GROUP_CONTEXT", "2")]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(channel, BOB, "lunch at one?"));
    wait_kept(&h.db(), &channel.to_string(), 1).await;
    h.fake
        .say(Say::new(channel, ALICE, "what did Bob ask?").mention());
    let sent = h.fake.wait_sent(channel, 1, WAIT).await;
    let bob = format!(r#""user{}": "lunch at one?""#, BOB % 1000);
    let alice = format!("user{}: what did Bob ask?", ALICE % 1000);
    assert!(sent[0].content.contains(&bob), "{}", sent[0].content);
    assert!(sent[0].content.ends_with(&alice), "{}", sent[0].content);
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (1, 1), "{verdict:?}");
}

/// `lull check` with group context on says whether Telegram delivers the messages:
/// only with privacy mode off (or to a group admin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_tells_whether_telegram_privacy_mode_hides_group_messages() {
    let (telegram, _discord) = platform_fakes().await;
    let check = |fake: &TelegramFake| {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("TELEGRAM_BOT_TOKEN", fake.token.clone()),
            ("TELEGRAM_API_URL", fake.url.clone()),
            ("LULL_LLM", "echo".into()),
            ("LULL_GROUP_CONTEXT", "4".into()),
        ];
        async move {
            let report = lull_check(env).await;
            drop(dir);
            report
        }
    };
    let (_, report) = check(&telegram).await;
    assert!(
        report.contains("ok    group context the last 4 messages per admitted group"),
        "{report}"
    );
    assert!(
        report
            .contains("Telegram privacy mode is on (getMe: can_read_all_group_messages is false)"),
        "{report}"
    );
    assert!(report.contains("/setprivacy"), "{report}");
    telegram.set_privacy_mode(false);
    let (code, report) = check(&telegram).await;
    assert!(
        report.contains("; Telegram privacy mode is off"),
        "{report}"
    );
    assert!(!report.contains("/setprivacy"), "{report}");
    assert_eq!(code, Some(0), "{report}");
}

//! Quick reply buttons (issue 27): an approval question shows Approve and Cancel
//! buttons on Telegram and Discord, and a tap arrives as a new message from the user
//! who tapped, with exactly the button's text, taking the same path as typing it.
//!
//! Receiving is tested through the real binary with the echo responder (the reply
//! repeats the batch, so it shows what was stored): a tap answered once however often
//! it is delivered, data lull could not have offered ignored, the platform's
//! acknowledgement sent (and its failure delaying nothing). Sending is tested at the
//! adapter, on its own: an approval question only comes from a tool (through the
//! binary in `a_telegram_approval_question_gets_buttons_and_a_tap_approves_once`,
//! ignored until the MCP runtime is merged).

use std::path::Path;
use std::time::{Duration, Instant};

use lull_core::domain::{ConversationRef, OutboxId, Platform};
use lull_core::store::OutboxKind;
use lull_port::{Outbound, OutgoingPart, QuickReply};
use serde_json::json;

use crate::discord::{ALICE, BOB, Harness, WAIT, adapter, echoed};
use crate::support::db;
use crate::support::fakes::discord::{ChannelKind, Say};
use crate::support::fakes::openai::{Agent, Behavior, FakeOpenAi};
use crate::support::fakes::telegram::{Fault, TelegramFake, callback_query, text_message};
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn stored(db_path: &Path, conversation: &str) -> Vec<(String, String)> {
    db::messages(db_path)
        .into_iter()
        .filter(|m| m.conversation == conversation)
        .map(|m| (m.message_id, m.text))
        .collect()
}

fn approve_and_cancel(id: u32) -> Vec<QuickReply> {
    vec![
        QuickReply {
            label: "Approve".into(),
            text: format!("/approve {id}"),
        },
        QuickReply {
            label: "Cancel".into(),
            text: format!("/cancel {id}"),
        },
    ]
}

fn part<'a>(
    conversation: &'a ConversationRef,
    reply_to: Option<&'a str>,
    quick_replies: &'a [QuickReply],
) -> OutgoingPart<'a> {
    OutgoingPart {
        conversation,
        outbox_id: OutboxId(3),
        created_at: lull_core::domain::Timestamp(1_700_000_000_000),
        stored_at: lull_core::domain::Timestamp(1_700_000_000_000),
        kind: OutboxKind::Notice,
        index: 0,
        count: 1,
        text: "I'd like to run t. Answer /approve 12 or /cancel 12.",
        reply_to,
        covers: &[],
        quick_replies,
    }
}

/// The core offers buttons under a notice that asks an approval question (its last
/// part), never under a reply: a notice queued for a conversation is delivered by
/// its next round with the answers it was stored with as quick replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_asking_for_approval_is_delivered_with_its_answers() {
    use lull_core::store::{Enqueue, NewNotice, SqliteStore, prelude::*};
    let db = crate::helpers::temp_db();
    let settings = crate::helpers::settings(200, 3000, 3000);
    let store = std::sync::Arc::new(SqliteStore::open(&db.path, settings.timers).unwrap());
    let node = crate::helpers::Node::start_with_store(
        store.clone(),
        settings,
        crate::helpers::CountingEcho::new(0),
    );
    node.send("c1", "m1", "hello").await;
    node.outbound.wait_replies(1, SECS(10)).await;
    let question = lull_core::texts::approval_question(12, "counter__delete", "{}", "10m");
    store
        .enqueue_notice(Enqueue {
            notice: NewNotice {
                conversation: ConversationRef::new(Platform::Http, "c1"),
                is_group: false,
                text: question.text.clone(),
                reply_to: None,
                quick_replies: question.quick_replies.clone(),
                dedupe_key: "buttons-test-q12".into(),
            },
            holder: &lull_core::domain::HolderId::generate(),
            now: lull_core::domain::Timestamp::now(),
        })
        .await
        .unwrap();
    node.send("c1", "m2", "and now?").await;
    node.outbound.wait_replies(2, SECS(10)).await;
    let all = node.outbound.all();
    let notice = all
        .iter()
        .find(|d| d.kind == OutboxKind::Notice)
        .expect("the notice delivered");
    assert_eq!(notice.text, question.text);
    assert_eq!(notice.quick_replies, ["/approve 12", "/cancel 12"]);
    assert!(
        all.iter()
            .filter(|d| d.kind == OutboxKind::Reply)
            .all(|d| d.quick_replies.is_empty())
    );
}

/// A tapped button (a `callback_query`) is stored as a message from the tapping user
/// with the button's data and answered once, though Telegram delivers it twice;
/// `answerCallbackQuery` is called for it (its first call failing with a 500 delays
/// nothing), and for a tap whose data lull could not have offered, which is not
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_tap_is_a_message_from_the_tapper_answered_once() {
    let t = crate::telegram::start(&[]).await;
    let chat = 4701;
    t.fake.push_message(text_message(chat, chat, "hello"));
    let first = t.fake.wait_sent(chat, 1, SECS(15)).await.remove(0);
    assert!(first.buttons().is_empty(), "a reply offers no buttons");

    t.fake
        .fail("answerCallbackQuery", Fault::ServerError(500), 1);
    let tap = callback_query("cbq-1", chat, &first, "/approve 7");
    let tapped_at = Instant::now();
    t.fake.push_callback(tap.clone());
    t.fake.push_callback(tap);
    // The failing answer is one of cbq-1's (a failed answer is not retried, and the
    // answers run on tasks of their own, which a loaded machine may reorder): cbq-2
    // is delivered once it has failed.
    t.fake
        .wait_for("the first answer failed", SECS(15), |f| {
            (!f.faulted("answerCallbackQuery").is_empty()).then_some(())
        })
        .await;
    t.fake
        .push_callback(callback_query("cbq-2", chat, &first, "/reset"));
    let sent = t.fake.wait_sent(chat, 2, SECS(15)).await;
    assert_eq!(sent[1].text, "[echo] 1 message:\n/approve 7");
    assert!(
        sent[1].at.duration_since(tapped_at) < SECS(5),
        "the failing answerCallbackQuery held the tap back"
    );
    t.fake
        .wait_for("both taps answered", SECS(20), |f| {
            let answers = f.callback_answers();
            (answers.contains(&"cbq-1".to_owned()) && answers.contains(&"cbq-2".to_owned()))
                .then_some(())
        })
        .await;
    assert_eq!(t.fake.faulted("answerCallbackQuery").len(), 1);

    let verdict = db::settled(&t.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (2, 2, 0, 0, 0), "{verdict:?}");
    let messages = stored(&t.db(), &chat.to_string());
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(
        messages[1],
        ("cb:cbq-1".to_owned(), "/approve 7".to_owned()),
        "stored once, by its callback id"
    );
    assert_eq!(t.fake.sent_to(chat).len(), 2);
    t.finish();
}

/// Webhook mode takes taps too: `setWebhook` asks for `callback_query` updates, a
/// tap POSTed twice is stored and answered once, and answered to Telegram.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_tap_by_webhook_is_answered_once() {
    let (dir, fake, lull) = crate::telegram_webhook::started().await;
    let db_path = dir.path().join("lull.db");
    assert!(
        fake.webhook()
            .unwrap()
            .allowed_updates
            .unwrap()
            .contains(&"callback_query".to_owned())
    );
    let chat = 4702;
    fake.push_message(text_message(chat, chat, "hello"));
    let first = fake.wait_sent(chat, 1, SECS(20)).await.remove(0);
    let tap = callback_query("cbq-w", chat, &first, "/cancel 3");
    fake.push_callback(tap.clone());
    fake.push_callback(tap);
    let sent = fake.wait_sent(chat, 2, SECS(20)).await;
    assert_eq!(sent[1].text, "[echo] 1 message:\n/cancel 3");
    fake.wait_for("the tap answered", SECS(20), |f| {
        f.callback_answers()
            .contains(&"cbq-w".to_owned())
            .then_some(())
    })
    .await;
    let verdict = db::settled(&db_path, SECS(10)).await;
    assert_eq!(verdict.counts(), (2, 2, 0, 0, 0), "{verdict:?}");
    assert!(fake.deliveries().iter().all(|d| d.status == 200));
    assert_eq!(fake.sent_to(chat).len(), 2);
    crate::telegram_webhook::assert_secrets_absent(&fake, &lull.logs());
}

/// The sending half on its own: a part with quick replies carries them as an inline
/// keyboard whose callback data is each reply's text; a reply over Telegram's 64
/// bytes gets no button, and a part without quick replies no keyboard.
#[tokio::test]
async fn telegram_sends_quick_replies_as_an_inline_keyboard() {
    let fake = TelegramFake::start().await;
    let (outbound, _inbound) = lull_adapters::telegram::connect(&lull_adapters::PlatformSettings {
        token: secrecy::SecretString::from(fake.token.clone()),
        api_url: fake.url.clone(),
        max_image_bytes: 10 << 20,
        overhear: false,
        auto_thread: false,
    })
    .unwrap();
    let conversation = ConversationRef::new(Platform::Telegram, "4703");
    let mut replies = approve_and_cancel(12);
    replies.push(QuickReply {
        label: "Too long".into(),
        text: format!("/approve {}", "9".repeat(60)),
    });
    outbound
        .send(&part(&conversation, None, &replies))
        .await
        .unwrap();
    outbound
        .send(&part(&conversation, None, &[]))
        .await
        .unwrap();
    let sent = fake.sent_to(4703);
    assert_eq!(
        sent[0].buttons(),
        [
            ("Approve".to_owned(), "/approve 12".to_owned()),
            ("Cancel".to_owned(), "/cancel 12".to_owned())
        ]
    );
    assert!(sent[1].reply_markup.is_none());
}

/// Through the binary with a tool: the approval question reaches Telegram with
/// Approve and Cancel buttons; tapping Approve (delivered twice) runs the action
/// once and answers the tap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_approval_question_gets_buttons_and_a_tap_approves_once() {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::Agent(Agent::calling(
        "counter__delete",
        json!({ "path": "notes.txt" }),
    )));
    let mcp = crate::tools::counter_config(dir.path(), 2000);
    let env = crate::telegram::env(
        dir.path(),
        &fake,
        &[
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", &model.base_url),
            ("OPENAI_API_KEY", "sk-buttons-test"),
            ("OPENAI_MODEL", "fake-model"),
            ("LULL_MCP_CONFIG", &mcp.display().to_string()),
            ("LULL_DEBOUNCE_MS", "200"),
        ],
    );
    let begun = Instant::now();
    let lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    crate::telegram::wait_polling(&fake, begun).await;

    let chat = 4704;
    fake.push_message(text_message(chat, chat, "delete my notes"));
    let question = fake
        .wait_for("the approval question", SECS(40), |f| {
            f.sent_to(chat)
                .into_iter()
                .find(|s| s.visible().contains("/approve"))
        })
        .await;
    let buttons = question.buttons();
    assert_eq!(buttons.len(), 2, "{question:?}");
    assert_eq!(buttons[0].0, "Approve");
    assert_eq!(buttons[1].0, "Cancel");
    assert!(buttons[0].1.starts_with("/approve ") && buttons[1].1.starts_with("/cancel "));
    let executed = |dir: &Path| crate::tools::executed_in(dir, "delete");
    assert_eq!(executed(dir.path()), 0, "not before the yes");
    let before = fake.sent_to(chat).len();

    let tap = callback_query("cbq-yes", chat, &question, &buttons[0].1);
    fake.push_callback(tap.clone());
    fake.push_callback(tap);
    fake.wait_for("the approved reply", SECS(40), |f| {
        f.sent_to(chat)
            .iter()
            .skip(before)
            .any(|s| s.visible().contains("deleted"))
            .then_some(())
    })
    .await;
    fake.wait_for("the tap answered", SECS(20), |f| {
        f.callback_answers()
            .contains(&"cbq-yes".to_owned())
            .then_some(())
    })
    .await;
    let verdict = db::settled(&dir.path().join("lull.db"), SECS(20)).await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
    assert_eq!(executed(dir.path()), 1, "approved once, run once");
    let secret = fake.token.split_once(':').unwrap().1.to_owned();
    assert!(!lull.logs().contains(&secret), "the bot token leaked");
}

/// A clicked button (an `INTERACTION_CREATE` of type 3) in a guild channel is stored
/// as a message from the member who clicked, with the button's `custom_id`, and
/// answered once though it is dispatched twice; every click is answered with
/// DEFERRED_UPDATE_MESSAGE (type 6), the first answer failing delaying nothing; a
/// click whose `custom_id` lull could not have offered is not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_click_is_a_message_from_the_clicker_answered_once() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(channel, ALICE, "hello").mention());
    let first = h.fake.wait_sent(channel, 1, WAIT).await.remove(0);
    assert!(first.buttons().is_empty(), "a reply offers no buttons");

    h.fake.fail_callbacks(1);
    let clicked_at = Instant::now();
    let click = h.fake.click(channel, BOB, first.id, "/approve 7");
    h.fake.dispatch_interaction(&click);
    let ignored = h.fake.click(channel, BOB, first.id, "/reset");
    let replies = h.fake.wait_sent(channel, 2, WAIT).await;
    assert_eq!(echoed(&replies[1]), ["user2: /approve 7"]);
    assert!(
        clicked_at.elapsed() < SECS(5),
        "the failing callback held the click back"
    );
    assert_eq!(replies[1].reply_to, None, "a click is no message to quote");
    let callbacks = h
        .fake
        .wait_for(WAIT, || {
            let callbacks = h.fake.callbacks();
            (callbacks.len() >= 3).then_some(callbacks)
        })
        .await
        .expect("every click answered");
    assert!(callbacks.iter().all(|c| c.kind == Some(6)), "{callbacks:?}");
    assert_eq!(callbacks.iter().filter(|c| c.status == 500).count(), 1);
    let ids: Vec<u64> = [&click, &ignored]
        .iter()
        .map(|i| i["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(
        ids.iter()
            .all(|id| callbacks.iter().any(|c| c.interaction == *id))
    );

    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (2, 2), "{verdict:?}");
    let messages = stored(&h.db(), &channel.to_string());
    assert_eq!(
        messages[1],
        (format!("interaction:{}", ids[0]), "/approve 7".to_owned())
    );
    assert_eq!(h.fake.sent(channel).len(), 2);
    h.assert_token_kept_secret();
}

/// The sending half on its own: a part with quick replies carries them as one action
/// row of buttons whose `custom_id` is each reply's text; a part answering a click
/// (`interaction:<id>`, no message) is sent without a quote.
#[tokio::test]
async fn discord_sends_quick_replies_as_buttons() {
    let h = Harness::new().await;
    let outbound = adapter(&h.fake).outbound;
    let channel = h.fake.channel(ChannelKind::Guild);
    let conversation = ConversationRef::new(Platform::Discord, channel.to_string());
    let replies = approve_and_cancel(12);
    outbound
        .send(&part(&conversation, Some("interaction:123"), &replies))
        .await
        .unwrap();
    let sent = h.fake.sent(channel);
    assert_eq!(
        sent[0].buttons(),
        [
            ("Approve".to_owned(), "/approve 12".to_owned()),
            ("Cancel".to_owned(), "/cancel 12".to_owned())
        ]
    );
    assert_eq!(sent[0].reply_to, None);
    assert_eq!(sent[0].components.as_ref().unwrap()[0]["type"], 1);
}

//! Ack reactions (`LULL_ACK_REACTION`) end to end: the real binary against the
//! Telegram and Discord fakes. A burst wears one 👀 while lull waits and loses it when
//! the reply covering it is sent; across replicas it is still one per burst (the
//! store's claim; its counter-test turns the claim off); a failing or hanging
//! reaction endpoint delays no reply and is logged once per chat.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::discord::{ALICE, Harness, WAIT};
use crate::support::fakes::discord::{ChannelKind, ReactionFault, Say};
use crate::support::fakes::telegram::{Fault, ReactionSet, TelegramFake, text_message};
use crate::telegram_webhook::{wait_registered, webhook_process_with};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn id(message: &Value) -> i64 {
    message["message_id"].as_i64().unwrap()
}

/// When Discord took the messages posted to `channel`, in order.
fn posted(h: &Harness, channel: u64) -> Vec<Instant> {
    h.fake
        .posts()
        .iter()
        .filter(|p| p.channel == channel && p.message.is_some())
        .map(|p| p.at)
        .collect()
}

/// The reactions the fake accepted in `chat`: (message, emoji), in order.
fn reactions_in(fake: &TelegramFake, chat: i64) -> Vec<(i64, Option<String>)> {
    fake.reactions()
        .into_iter()
        .filter(|r: &ReactionSet| r.chat_id == chat)
        .map(|r| (r.message_id, r.emoji))
        .collect()
}

/// Wait until `chat` shows `n` reaction calls.
async fn wait_reactions(fake: &TelegramFake, chat: i64, n: usize) -> Vec<(i64, Option<String>)> {
    fake.wait_for("the reactions", SECS(10), |f| {
        let seen = reactions_in(f, chat);
        (seen.len() >= n).then_some(seen)
    })
    .await
}

/// A burst of three gets one 👀, on its first message, while lull waits; it is taken
/// off after the reply went out; the next burst gets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_reaction_is_set_once_per_burst_and_taken_off_when_answered() {
    let tg = crate::telegram::start(&[]).await;
    let chat = 7101;
    let burst: Vec<Value> = ["one", "two", "three"]
        .iter()
        .map(|text| text_message(chat, chat, text))
        .collect();
    for message in &burst {
        tg.fake.push_message(message.clone());
    }
    let first = id(&burst[0]);
    let set = wait_reactions(&tg.fake, chat, 1).await;
    assert_eq!(
        set,
        [(first, Some("👀".to_owned()))],
        "on the burst's first"
    );
    let sent = tg.fake.wait_sent(chat, 1, SECS(10)).await;
    assert_eq!(sent[0].text, "[echo] 3 messages:\none\ntwo\nthree");
    let both = wait_reactions(&tg.fake, chat, 2).await;
    assert_eq!(both[1], (first, None), "taken off once answered");
    let off = tg.fake.reactions().last().unwrap().at;
    assert!(off >= sent[0].at, "taken off after the reply");

    let next = text_message(chat, chat, "four");
    tg.fake.push_message(next.clone());
    tg.fake.wait_sent(chat, 2, SECS(10)).await;
    let all = wait_reactions(&tg.fake, chat, 4).await;
    assert_eq!(
        all[2..],
        [(id(&next), Some("👀".to_owned())), (id(&next), None)],
        "the next burst's own"
    );
    // Nothing more: one set and one take-off per burst.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reactions_in(&tg.fake, chat).len(), 4);
    tg.finish();
}

/// `LULL_ACK_REACTION=off`: no reaction at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reaction_when_off() {
    let tg = crate::telegram::start(&[("LULL_ACK_REACTION", "off")]).await;
    let chat = 7102;
    tg.fake.push_message(text_message(chat, chat, "hi"));
    tg.fake.wait_sent(chat, 1, SECS(10)).await;
    assert!(tg.fake.calls("setmessagereaction").is_empty());
    tg.finish();
}

/// Telegram's reaction endpoint hangs: the reply comes when it would without
/// reactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_reaction_endpoint_delays_no_reply() {
    let tg = crate::telegram::start(&[]).await;
    let chat = 7103;
    tg.fake
        .fail("setmessagereaction", Fault::Hang(SECS(30)), 10);
    // A reply well before the 30 s hang ends: the reaction waits beside it.
    tg.fake.push_message(text_message(chat, chat, "hello?"));
    tg.fake.wait_sent(chat, 1, SECS(10)).await;
    assert_eq!(
        tg.fake.calls("setmessagereaction").len(),
        1,
        "never retried"
    );
    tg.finish();
}

/// Discord: the reaction is put on the mention and deleted after the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_puts_the_reaction_and_deletes_it_after_the_reply() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    let asked = h.fake.say(Say::new(channel, ALICE, "hello").mention());
    h.fake.wait_sent(channel, 1, WAIT).await;
    let calls = h
        .fake
        .wait_for(WAIT, || {
            let calls = h.fake.reactions();
            (calls.len() >= 2).then_some(calls)
        })
        .await
        .expect("a reaction put and deleted");
    let seen: Vec<(u64, &str, bool, u16)> = calls
        .iter()
        .map(|c| (c.message, c.emoji.as_str(), c.on, c.status))
        .collect();
    assert_eq!(seen, [(asked, "👀", true, 204), (asked, "👀", false, 204)]);
    assert!(
        calls[1].at >= posted(&h, channel)[0],
        "deleted after the reply"
    );
    h.assert_token_kept_secret();
}

/// Discord's reaction endpoint answers 500, then hangs: every reply comes when it
/// would without reactions, nothing is retried, and the failures of a channel are
/// logged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_reaction_endpoint_delays_nothing_and_is_logged_once_per_chat() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    let other = h.fake.channel(ChannelKind::Guild);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.fault_reactions(Some(ReactionFault::Fail(500)));
    for n in 1..=2 {
        h.fake
            .say(Say::new(channel, ALICE, &format!("try {n}")).mention());
        h.fake.wait_sent(channel, n, WAIT).await;
    }
    // Each burst's set and take-off were tried once: 2 bursts, no retries.
    let in_channel = |h: &Harness| {
        h.fake
            .reactions()
            .iter()
            .filter(|c| c.channel == channel)
            .count()
    };
    h.fake
        .wait_for(WAIT, || (in_channel(&h) >= 4).then_some(()))
        .await
        .expect("both bursts' calls");
    h.fake.fault_reactions(Some(ReactionFault::Hang(SECS(30))));
    // Answered well before the 30 s hang ends.
    h.fake.say(Say::new(other, ALICE, "still there?").mention());
    h.fake.wait_sent(other, 1, WAIT).await;
    assert_eq!(in_channel(&h), 4, "{:?}", h.fake.reactions());
    let warnings = h
        .logs()
        .lines()
        .filter(|l| {
            l.contains("the ack reaction (LULL_ACK_REACTION)") && l.contains(&channel.to_string())
        })
        .count();
    assert_eq!(warnings, 1, "logged once for the channel");
    h.assert_token_kept_secret();
}

/// Two webhook replicas behind a load balancer store the messages of one burst
/// between them: `reactions` of the fake per reply (`counter`: with the claim off).
async fn split_burst(counter: bool) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let extra: &[(&str, &str)] = if counter {
        &[("LULL_TEST_NO_ACK_CLAIM", "1")]
    } else {
        &[]
    };
    let mut a = webhook_process_with(dir.path(), &fake, "a", None, extra);
    a.wait_healthy(SECS(20)).await;
    let mut b = webhook_process_with(dir.path(), &fake, "b", Some(a.port), extra);
    b.wait_healthy(SECS(20)).await;
    wait_registered(&fake).await;
    fake.balance(&[a.base_url(), b.base_url()]);
    let chat = 7104;
    for n in 0..4 {
        fake.push_message(text_message(chat, chat, &format!("m{n}")));
    }
    let sent = fake.wait_sent(chat, 1, SECS(10)).await;
    let deliveries = fake.deliveries();
    for process in [&a, &b] {
        assert!(
            deliveries
                .iter()
                .any(|d| d.target.starts_with(&process.base_url()) && d.status == 200),
            "{} stored none of the burst",
            process.name
        );
    }
    // Wait for the take-off that follows the reply (none without the claim: no row
    // names the message; then for a second set), then count the sets.
    fake.wait_for("the reactions", SECS(10), |f| {
        let seen = reactions_in(f, chat);
        let done = if counter {
            seen.iter().filter(|(_, e)| e.is_some()).count() >= 2
        } else {
            seen.iter().any(|(_, e)| e.is_none())
        };
        done.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sets = reactions_in(&fake, chat)
        .iter()
        .filter(|(_, e)| e.is_some())
        .count();
    (sets, sent.len())
}

/// One reaction per burst with two replicas storing it, each claiming in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_set_one_reaction_per_split_burst() {
    let (sets, replies) = split_burst(false).await;
    assert_eq!(sets, replies, "one reaction per burst answered");
}

/// Counter-test: without the store's claim every message gets one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_claim_a_split_burst_gets_several_reactions() {
    let (sets, replies) = split_burst(true).await;
    assert!(sets > replies, "{sets} reactions for {replies} replies");
}

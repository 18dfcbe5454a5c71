//! Discord auto threads (`LULL_DISCORD_AUTO_THREAD=on`) end to end: the real binary
//! against the Discord fake. A mention in a server channel opens a thread on it (the
//! thread's id is the mention's) and the reply goes there, once; in that thread no
//! mention is needed, also after a restart (the database remembers lull's threads);
//! a thread that cannot be opened leaves the answer in the channel; off by default.

use crate::discord::{ALICE, BOB, Harness, WAIT, echoed};
use crate::support::fakes::discord::{ChannelKind, Say};

const ON: (&str, &str) = ("LULL_DISCORD_AUTO_THREAD", "on");

/// The messages lull stored in `conversation` (a channel or thread id).
fn stored(h: &Harness, conversation: u64) -> Vec<String> {
    crate::telegram::stored(&h.db(), &conversation.to_string())
}

/// A mention opens a thread named after it, the reply goes there (not to the
/// channel), once; a follow-up there without a mention is answered too, also one
/// sent while lull was down and one after its restart; unaddressed chatter in the
/// channel and in someone else's thread is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_opens_a_thread_answered_there_without_mentions_also_after_a_restart() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    let theirs = h.fake.channel(ChannelKind::Thread);
    let lull = h.start("lull", &[ON]).await;
    h.fake.wait_connected(1, WAIT).await;

    let asked = h
        .fake
        .say(Say::new(channel, ALICE, "what is 2+2?").mention());
    let replies = h.fake.wait_sent(asked, 1, WAIT).await;
    assert_eq!(echoed(&replies[0]), ["user1: what is 2+2?"]);
    assert_eq!(
        h.fake.threads_started(),
        [(channel, asked, "what is 2+2?".to_owned())]
    );
    assert!(h.fake.sent(channel).is_empty(), "nothing in the channel");

    h.fake.say(Say::new(asked, BOB, "and 3+3?"));
    let replies = h.fake.wait_sent(asked, 2, WAIT).await;
    assert_eq!(echoed(&replies[1]), ["user2: and 3+3?"]);

    h.settled().await;
    h.processes[lull].kill9();
    h.fake.wait_connected(0, WAIT).await;
    h.fake.say(Say::new(asked, BOB, "sent while you were down"));
    h.processes[lull].restart();
    let replies = h.fake.wait_sent(asked, 3, WAIT).await;
    assert_eq!(
        echoed(&replies[2]),
        ["user2: sent while you were down"],
        "read back from the thread's history"
    );
    assert!(
        h.fake
            .history_reads()
            .iter()
            .any(|(read, _)| *read == asked),
        "{:?}",
        h.fake.history_reads()
    );
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(theirs, BOB, "chatter in their thread"));
    h.fake.say(Say::new(channel, BOB, "chatter in the channel"));
    h.fake.say(Say::new(asked, ALICE, "and after a restart?"));
    let replies = h.fake.wait_sent(asked, 4, WAIT).await;
    assert_eq!(echoed(&replies[3]), ["user1: and after a restart?"]);

    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (4, 4), "{verdict:?}");
    assert_eq!(stored(&h, asked).len(), 4, "the mention is the thread's");
    assert!(stored(&h, channel).is_empty());
    assert!(stored(&h, theirs).is_empty(), "not lull's thread");
    assert!(h.fake.sent(theirs).is_empty() && h.fake.sent(channel).is_empty());
    assert_eq!(h.fake.threads_started().len(), 1, "one thread");
    h.assert_token_kept_secret();
}

/// A mention inside a thread is answered in it: no thread is opened in a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_in_a_thread_is_answered_in_that_thread() {
    let mut h = Harness::new().await;
    let theirs = h.fake.channel(ChannelKind::Thread);
    h.start("lull", &[ON]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(theirs, ALICE, "hello").mention());
    let replies = h.fake.wait_sent(theirs, 1, WAIT).await;
    assert_eq!(echoed(&replies[0]), ["user1: hello"]);
    assert!(h.fake.threads_started().is_empty());
    h.settled().await;
}

/// When Discord refuses the thread (no permission), the mention is answered in its
/// channel, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_that_cannot_be_opened_leaves_the_answer_in_the_channel() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    h.fake.refuse_threads(true);
    h.start("lull", &[ON]).await;
    h.fake.wait_connected(1, WAIT).await;
    let asked = h.fake.say(Say::new(channel, ALICE, "hello").mention());
    let replies = h.fake.wait_sent(channel, 1, WAIT).await;
    assert_eq!(replies[0].reply_to, Some(asked.to_string()));
    assert_eq!(h.fake.thread_calls(), [(channel, asked)], "tried once");
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (1, 1), "{verdict:?}");
}

/// Without the setting a mention is answered in its channel and no thread is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_threads_are_off_by_default() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(channel, ALICE, "hello").mention());
    h.fake.wait_sent(channel, 1, WAIT).await;
    assert!(h.fake.thread_calls().is_empty());
    h.settled().await;
}

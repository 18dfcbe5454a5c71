//! Discord slash commands end to end: registered at start (a bulk overwrite),
//! acknowledged at once with a deferred response, answered by editing it, and
//! answered once when the interaction reaches two replicas (the store keeps one
//! answer per interaction id; the counter-test turns that off).

use std::time::{Duration, Instant};

use crate::discord::{ALICE, Harness, WAIT};
use crate::support::fakes::discord::ChannelKind;

/// Discord's limit for acknowledging an interaction.
const DISCORD_ACK_LIMIT: Duration = Duration::from_secs(3);

/// Every process registers the commands at start; each offers its argument.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_commands_are_registered_at_start() {
    let mut h = Harness::new().await;
    h.start("lull", &[]).await;
    let (commands, _) = h
        .fake
        .wait_for(WAIT, || {
            let registered = h.fake.commands();
            (registered.1 >= 1).then_some(registered)
        })
        .await
        .expect("the commands registered");
    let names: Vec<&str> = commands.iter().filter_map(|c| c["name"].as_str()).collect();
    for name in [
        "new", "stop", "retry", "model", "persona", "usage", "status",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let model = commands.iter().find(|c| c["name"] == "model").unwrap();
    assert_eq!(model["options"][0]["type"], 3, "{model}");
    assert_eq!(model["options"][0]["required"], false);
    h.assert_token_kept_secret();
}

/// A slash command is deferred within Discord's 3 s, and its answer replaces the
/// "thinking…" (no channel message); an unknown command is answered with the help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_command_is_deferred_at_once_and_answered_in_its_response() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    let ran = Instant::now();
    let usage = h.fake.slash(channel, ALICE, "usage", None);
    let id: u64 = usage["id"].as_str().unwrap().parse().unwrap();
    let deferred = h
        .fake
        .wait_for(WAIT, || {
            h.fake
                .callbacks()
                .into_iter()
                .find(|c| c.interaction == id && c.status == 204)
        })
        .await
        .expect("the interaction acknowledged");
    assert_eq!(deferred.kind, Some(5), "a deferred message");
    assert!(deferred.at - ran < DISCORD_ACK_LIMIT);
    let answered = h
        .fake
        .wait_for(WAIT, || h.fake.responses().first().cloned())
        .await
        .expect("the response edited");
    assert_eq!(answered.0, id);
    assert!(!answered.1.is_empty());

    h.fake
        .slash(channel, ALICE, "persona", Some(("name", "pirate")));
    let responses = h
        .fake
        .wait_for(WAIT, || {
            let responses = h.fake.responses();
            (responses.len() >= 2).then_some(responses)
        })
        .await
        .expect("the second answered");
    assert!(!responses[1].1.is_empty());
    assert!(h.fake.sent(channel).is_empty(), "no channel message");
    h.assert_token_kept_secret();
}

/// Two replicas both receive one slash command (and one of them twice): its answer
/// is one response edit, whoever delivers it. `counter`: commands not deduplicated.
async fn answers_with_two_replicas(counter: bool) -> usize {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    let mut extra = vec![("LULL_DISCORD_SHARDS", "2")];
    if counter {
        extra.push(("LULL_TEST_NO_COMMAND_DEDUPE", "1"));
    }
    h.start("a", &extra).await;
    h.fake.wait_shards(&[(0, 2), (1, 2)], WAIT).await;
    h.start("b", &extra).await;
    // The first holds both shards until the second starts and takes shard 1.
    let shard_1_holds = |h: &Harness| {
        h.logs()
            .lines()
            .filter(|l| {
                l.contains("this process now holds the platform connection")
                    && l.contains("shard=1/2")
            })
            .count()
    };
    h.fake
        .wait_for(WAIT, || (shard_1_holds(&h) >= 2).then_some(()))
        .await
        .expect("the second process takes shard 1");
    h.fake.wait_shards(&[(0, 2), (1, 2)], WAIT).await;
    let interaction = h.fake.slash(channel, ALICE, "usage", None);
    h.fake.dispatch_interaction_everywhere(&interaction);
    h.fake
        .wait_for(WAIT, || h.fake.responses().first().cloned())
        .await
        .expect("the command answered");
    // Time for a second answer to show, were there one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answers = h.fake.responses().len() + h.fake.sent(channel).len();
    h.assert_token_kept_secret();
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_command_is_answered_once_with_two_replicas() {
    assert_eq!(answers_with_two_replicas(false).await, 1);
}

/// Counter-test: answered once per process that received it, the command is
/// answered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dedupe_a_slash_command_is_answered_twice() {
    assert!(answers_with_two_replicas(true).await > 1);
}

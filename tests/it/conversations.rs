//! What a conversation is: a group stays a group whichever update created its row.

use std::time::Duration;

use lull_core::dispatcher::Accepted;
use lull_core::domain::Platform;

use crate::dispatcher::wait_settled;
use crate::helpers::{CountingEcho, Leases, Node, message, settings, temp_db};
use lull_core::store::RecentQuery;

/// `/reset` as a group's very first update must not record the group as a private
/// chat: author names stay in the prompt, and catch-up still sees a group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_first_update_is_a_command_stays_a_group() {
    let db = temp_db();
    let mut settings = settings(100, 3000, 3000);
    // In a group only an admin may /reset.
    settings.access.admins = "http:user".parse().unwrap();
    let node = Node::start(&db.path, settings, CountingEcho::new(0), Leases::Enforced);
    let group = |id: &str, text: &str| {
        let mut incoming = message("g1", id, text);
        incoming.is_group = true;
        incoming.author = "Ann".into();
        incoming
    };
    assert!(matches!(
        node.dispatcher.ingest(group("1", "/reset")).await.unwrap(),
        Accepted::Command(_)
    ));
    node.dispatcher
        .ingest(group("2", "hello all"))
        .await
        .unwrap();
    let replies = node.outbound.wait_replies(1, Duration::from_secs(10)).await;
    assert!(
        replies[0].text.contains("Ann: hello all"),
        "group prompts carry author names: {}",
        replies[0].text
    );
    wait_settled(&node, "g1").await;
    let recent = node
        .dispatcher
        .store()
        .recent_conversations(RecentQuery {
            platform: Platform::Http,
            since: lull_core::domain::Timestamp(0),
            limit: 10,
        })
        .await
        .unwrap();
    assert!(recent[0].is_group, "{recent:?}");
}

//! Command menus registered at start, through the real binary: Telegram's
//! `setMyCommands` for private chats, group members and group admins; a failing call never holds
//! the start up.

use std::time::Duration;

use serde_json::json;

use crate::support::fakes::telegram::{Fault, text_message};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Each scope gets its menu once at start: everyone's commands in private chats, what
/// any member may use in groups, with the admins' own added for group administrators.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_menus_are_registered_at_start() {
    let tg = crate::telegram::start(&[]).await;
    let sets = tg
        .fake
        .wait_for("both menus", SECS(10), |f| {
            let sets = f.command_sets();
            (sets.len() >= 3).then_some(sets)
        })
        .await;
    assert_eq!(sets.len(), 3, "{sets:?}");
    let private = sets
        .iter()
        .find(|s| s.scope == json!({"type": "all_private_chats"}))
        .expect("the private chats' menu");
    let admins = sets
        .iter()
        .find(|s| s.scope == json!({"type": "all_chat_administrators"}))
        .expect("the group admins' menu");
    let names = |s: &crate::support::fakes::telegram::CommandsSet| -> Vec<String> {
        s.commands.iter().map(|(name, _)| name.clone()).collect()
    };
    for word in [
        "new", "stop", "retry", "model", "persona", "usage", "status", "help",
    ] {
        assert!(
            names(private).iter().any(|n| n == word),
            "{word} in {private:?}"
        );
    }
    assert!(!names(private).iter().any(|n| n == "prompt"));
    // Ordinary group members see what they may use (before issue 37: nothing).
    let members = sets
        .iter()
        .find(|s| s.scope == json!({"type": "all_group_chats"}))
        .expect("the group members' menu");
    for word in ["usage", "status", "help"] {
        assert!(names(members).iter().any(|n| n == word), "{members:?}");
    }
    for word in ["new", "stop", "prompt"] {
        assert!(!names(members).iter().any(|n| n == word), "{members:?}");
    }
    assert!(names(admins).starts_with(&names(private)));
    assert!(names(admins).iter().any(|n| n == "prompt"));
    tg.finish();
}

/// `setMyCommands` answers 500 for ever: lull starts, polls and answers all the same,
/// and does not retry (the failure is logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_menu_call_does_not_hold_the_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let fake = crate::support::fakes::telegram::TelegramFake::start().await;
    fake.fail("setMyCommands", Fault::ServerError(500), 100);
    let begun = std::time::Instant::now();
    let _lull = crate::support::process::LullProcess::start(
        dir.path(),
        "lull",
        &["run"],
        &crate::telegram::env(dir.path(), &fake, &[]),
    );
    crate::telegram::wait_polling(&fake, begun).await;
    fake.push_message(text_message(7201, 7201, "hi"));
    fake.wait_sent(7201, 1, SECS(10)).await;
    assert!(fake.command_sets().is_empty());
    assert!(fake.calls("setMyCommands").len() <= 2, "retried");
}

//! Conformance of the settings area: a conversation's own choices, applied once and
//! fresh, and `/stop`.

use super::{
    at, collect, committed, holder, http, mark, message, pending_ids, release, round, stale, stored,
};
use crate::domain::{ConversationRef, Timestamp};
use crate::store::{
    CommandClaim, ContextReset, ConversationSettings, IdleForget, ReplyCommit, RetryOutcome,
    RetryRequest, Setting, SettingChange, SettingOutcome, Stop, Stopped, Store,
};

/// `/stop` of the direct conversation `conversation` at `now`.
async fn stop(store: &dyn Store, conversation: &ConversationRef, now: Timestamp) -> Stopped {
    let stop = Stop {
        conversation,
        is_group: false,
        now,
    };
    store.stop_conversation(stop).await.expect("stopping")
}

async fn change(
    store: &dyn Store,
    conversation: &crate::domain::ConversationRef,
    setting: Setting,
    value: Option<&str>,
) -> SettingOutcome {
    store
        .change_setting(SettingChange {
            conversation,
            is_group: false,
            setting,
            value,
            now: at(0),
        })
        .await
        .expect("changing a setting")
}

/// A setting is the conversation's alone; the same value twice is written once;
/// clearing it brings the default back.
pub async fn a_setting_is_applied_once_and_per_conversation(store: &dyn Store) {
    let (c1, c2) = (http("c1"), http("c2"));
    assert_eq!(
        store.conversation_settings(&c1).await.unwrap(),
        ConversationSettings::default(),
        "a conversation never seen has the defaults"
    );
    let first = change(store, &c1, Setting::Model, Some("big")).await;
    assert!(matches!(first, SettingOutcome::Changed { .. }), "{first:?}");
    assert_eq!(
        change(store, &c1, Setting::Model, Some("big")).await,
        SettingOutcome::Unchanged,
        "a pick applied twice is applied once"
    );
    change(store, &c1, Setting::Persona, Some("pirate")).await;
    change(store, &c1, Setting::Prompt, Some("Be brief.")).await;
    stored(store, message(c2.clone(), "m1"), &holder("a"), at(0)).await;
    assert_eq!(
        store.conversation_settings(&c1).await.unwrap(),
        ConversationSettings {
            model: Some("big".into()),
            persona: Some("pirate".into()),
            prompt: Some("Be brief.".into()),
        }
    );
    assert_eq!(
        store.conversation_settings(&c2).await.unwrap(),
        ConversationSettings::default(),
        "another conversation keeps the defaults"
    );
    change(store, &c1, Setting::Model, None).await;
    assert_eq!(store.conversation_settings(&c1).await.unwrap().model, None);
    assert_eq!(
        store.is_settled(&c1).await.unwrap(),
        Some(true),
        "a change with nothing pending leaves the conversation settled"
    );
}

/// A setting changed while a reply is generated makes that reply stale, like a new
/// message; the next round answers the same messages, and the conversation settles.
pub async fn a_setting_changed_mid_generation_makes_the_reply_stale(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1000)).await;
    let SettingOutcome::Changed { version, .. } =
        change(store, &c1, Setting::Model, Some("big")).await
    else {
        panic!("the model was not changed");
    };
    assert!(version > batch.v0);
    assert_eq!(stale(store, &lease, &batch, at(1100)).await, version);
    let again = collect(store, id).await;
    assert_eq!(again.v0, version);
    assert_eq!(
        again.pending.len(),
        2,
        "the same messages are still pending"
    );
    committed(store, &lease, &again, "answer", at(1200)).await;
    assert!(collect(store, id).await.pending.is_empty());
}

/// A control fences even a reply the cap would force out: after a setting change, and
/// after `/new`, a round that collected its batch before the control commits nothing at
/// the cap (its messages took the control's version); the round after it answers the
/// same messages, and after `/new` only its reply is history.
pub async fn a_control_fences_even_a_forced_reply(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1000)).await;
    let SettingOutcome::Changed { version, .. } =
        change(store, &c1, Setting::Prompt, Some("Be brief.")).await
    else {
        panic!("the prompt was not changed");
    };
    // At 5 s the oldest message has waited past the 4 s cap: a reply stale by a new
    // message would be forced out; one stale by a control is not.
    assert_eq!(stale(store, &lease, &batch, at(5000)).await, version);
    let again = collect(store, id).await;
    assert_eq!(pending_ids(&again), ["m1", "m2"], "still pending");
    committed(store, &lease, &again, "first answer", at(5100)).await;
    release(store, &lease, at(5200)).await;

    // m3 is stored at 0 (the helper's timeline): its cap has passed by 6 s.
    let (_, lease, batch) = round(store, &c1, &a, &["m3"], at(6000)).await;
    let reset = store
        .reset_context(ContextReset {
            conversation: &c1,
            is_group: false,
            holder: &a,
            now: at(6100),
        })
        .await
        .expect("resetting");
    assert_eq!(reset.conversation, id);
    assert!(reset.version > batch.v0, "/new moves the version");
    assert_eq!(stale(store, &lease, &batch, at(6200)).await, reset.version);
    let fresh = collect(store, id).await;
    assert_eq!(pending_ids(&fresh), ["m3"], "kept for the fresh context");
    assert!(fresh.history.is_empty(), "{:?}", fresh.history);
    committed(store, &lease, &fresh, "fresh answer", at(6300)).await;
    stored(store, message(c1.clone(), "m4"), &a, at(6400)).await;
    let after = collect(store, id).await;
    let replies: Vec<&str> = after.history.iter().map(|e| e.reply.as_str()).collect();
    assert_eq!(
        replies,
        ["fresh answer"],
        "only the answer after /new is history"
    );
    // With nothing pending, /new leaves the conversation settled.
    committed(store, &lease, &after, "last", at(6500)).await;
    store
        .reset_context(ContextReset {
            conversation: &c1,
            is_group: false,
            holder: &a,
            now: at(6600),
        })
        .await
        .expect("resetting");
    let settled = collect(store, id).await;
    assert!(
        settled.pending.is_empty() && settled.timer.is_none(),
        "{settled:?}"
    );
}

/// `/stop` closes every pending message without a reply: the reply in flight is stale
/// even when the cap would force it out, nothing is pending, no timer is left, and the
/// next message is answered on its own.
pub async fn stop_closes_the_pending_messages_and_the_generation(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1000)).await;
    let stopped = stop(store, &c1, at(1100)).await;
    assert_eq!((stopped.conversation, stopped.closed.len()), (id, 2));
    assert!(stopped.version > batch.v0);
    // At 5 s the oldest message has waited past the 4 s cap: a stale reply would be
    // forced out, but /stop closed every message it covers.
    assert_eq!(
        stale(store, &lease, &batch, at(5000)).await,
        stopped.version
    );
    let after = collect(store, id).await;
    assert!(after.pending.is_empty(), "{:?}", after.pending);
    assert_eq!(after.timer, None, "no timer is left");
    assert_eq!(store.is_settled(&c1).await.unwrap(), Some(true));
    let nothing = stop(store, &c1, at(5100)).await;
    assert!(nothing.closed.is_empty(), "a second /stop closes nothing");
    stored(store, message(c1.clone(), "m3"), &a, at(5200)).await;
    let next = collect(store, id).await;
    let ids: Vec<&str> = next.pending.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["m3"], "only the new message is pending");
    committed(store, &lease, &next, "answer", at(5300)).await;
}

/// An idle conversation starts from a fresh context: its earlier exchanges are no
/// longer history; one active within the idle time keeps them.
pub async fn an_idle_conversation_starts_afresh(store: &dyn Store) {
    let a = holder("a");
    let idle = std::time::Duration::from_secs(60);
    assert!(
        !store
            .forget_if_idle(IdleForget {
                conversation: &http("c0"),
                idle,
                now: at(0)
            })
            .await
            .unwrap(),
        "never seen"
    );
    for (key, next_at, fresh) in [("c1", 30_000, false), ("c2", 61_000, true)] {
        let c = http(key);
        let (id, lease, batch) = round(store, &c, &a, &["m1"], at(1000)).await;
        committed(store, &lease, &batch, "answer", at(1000)).await;
        assert_eq!(
            store
                .forget_if_idle(IdleForget {
                    conversation: &c,
                    idle,
                    now: at(next_at)
                })
                .await
                .unwrap(),
            fresh,
            "{key}"
        );
        stored(store, message(c.clone(), "m2"), &a, at(next_at)).await;
        let history = collect(store, id).await.history;
        assert_eq!(history.is_empty(), fresh, "{key}: {history:?}");
        assert!(
            !store
                .forget_if_idle(IdleForget {
                    conversation: &c,
                    idle,
                    now: at(next_at + 1)
                })
                .await
                .unwrap(),
            "{key}: just active"
        );
    }
}

/// `/retry` makes the last delivered reply's messages pending again, once: the old
/// reply leaves the history and covers nothing, the timer is due now; with messages
/// pending, or the reply not yet sent, or nothing answered, it does nothing.
pub async fn retry_answers_the_last_batch_again(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let retry = |now| {
        store.retry_last_reply(RetryRequest {
            conversation: &c1,
            is_group: false,
            holder: &a,
            now,
        })
    };
    assert_eq!(retry(at(0)).await.unwrap(), RetryOutcome::Nothing);
    let (id, lease, batch) = round(store, &c1, &a, &["m1", "m2"], at(1000)).await;
    assert_eq!(
        retry(at(1000)).await.unwrap(),
        RetryOutcome::Busy,
        "pending"
    );
    let (outbox, _) = committed(store, &lease, &batch, "first answer", at(1000)).await;
    assert_eq!(
        retry(at(1000)).await.unwrap(),
        RetryOutcome::Busy,
        "not sent yet"
    );
    mark(store, outbox, 1, true, at(1100)).await;
    let RetryOutcome::Retried {
        conversation,
        version,
        messages,
    } = retry(at(2000)).await.unwrap()
    else {
        panic!("not retried")
    };
    assert_eq!((conversation, messages), (id, 2));
    let again = collect(store, id).await;
    assert_eq!(again.v0, version);
    let ids: Vec<&str> = again
        .pending
        .iter()
        .map(|m| m.message_id.as_str())
        .collect();
    assert_eq!(ids, ["m1", "m2"], "the last batch is pending again");
    assert!(again.history.is_empty(), "the old reply left the history");
    assert_eq!(again.timer.map(|t| t.due_at), Some(at(2000)), "due now");
    assert_eq!(retry(at(2000)).await.unwrap(), RetryOutcome::Busy, "once");
    committed(store, &lease, &again, "second answer", at(2100)).await;
    assert!(collect(store, id).await.pending.is_empty());
}

/// The same pick twice at once (a button tapped twice, two replicas): applied once, the
/// version moved once; and a pick racing a commit either stales it or comes after it.
pub async fn concurrent_picks_apply_once_and_never_slip_under_a_commit(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    for n in 0..4 {
        let value = format!("model-{n}");
        let pick = SettingChange {
            conversation: &c1,
            is_group: false,
            setting: Setting::Model,
            value: Some(&value),
            now: at(0),
        };
        let (one, two) = tokio::join!(store.change_setting(pick), store.change_setting(pick));
        let outcomes = [one.unwrap(), two.unwrap()];
        let changed = outcomes
            .iter()
            .filter(|o| matches!(o, SettingOutcome::Changed { .. }))
            .count();
        assert_eq!(changed, 1, "{outcomes:?}");
    }
    let (id, lease, batch) = round(store, &c1, &a, &["m1"], at(1000)).await;
    let (pick, commit) = tokio::join!(
        store.change_setting(SettingChange {
            conversation: &c1,
            is_group: false,
            setting: Setting::Model,
            value: Some("late"),
            now: at(1100)
        }),
        store.commit_reply(ReplyCommit {
            lease: &lease,
            batch: &batch,
            reply: super::reply("answer"),
            now: at(1100)
        }),
    );
    let SettingOutcome::Changed { version, .. } = pick.unwrap() else {
        panic!("the pick was not applied");
    };
    let after = collect(store, id).await;
    match commit.unwrap() {
        // The commit came first: the pick found the conversation settled, and left it so.
        crate::store::CommitOutcome::Committed { .. } => {
            assert!(after.pending.is_empty(), "{after:?}");
            assert_eq!(
                store.is_settled(&c1).await.unwrap(),
                Some(false),
                "undelivered"
            );
        }
        // The pick came first: the reply is stale and m1 still pending at the new version.
        crate::store::CommitOutcome::Stale { version: seen } => {
            assert_eq!(seen, version);
            assert_eq!(after.pending.len(), 1);
        }
    }
}

/// A command message is claimed once, across callers, per conversation: a redelivery
/// (one after the other, or two at once) acts once; the same message id in another
/// conversation is another command; a claim older than the kept days is forgotten.
pub async fn a_command_is_claimed_once(store: &dyn Store) {
    let c1 = http("c1");
    let c2 = http("c2");
    assert!(
        store
            .claim_command(CommandClaim {
                conversation: &c1,
                message_id: "cmd1",
                now: at(1000)
            })
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_command(CommandClaim {
                conversation: &c1,
                message_id: "cmd1",
                now: at(2000)
            })
            .await
            .unwrap(),
        "redelivered"
    );
    assert!(
        store
            .claim_command(CommandClaim {
                conversation: &c2,
                message_id: "cmd1",
                now: at(2000)
            })
            .await
            .unwrap(),
        "another chat"
    );
    for n in 0..4 {
        let id = format!("race{n}");
        let (one, two) = tokio::join!(
            store.claim_command(CommandClaim {
                conversation: &c1,
                message_id: &id,
                now: at(3000)
            }),
            store.claim_command(CommandClaim {
                conversation: &c1,
                message_id: &id,
                now: at(3000)
            }),
        );
        assert!(
            one.unwrap() ^ two.unwrap(),
            "exactly one of two at once claims {id}"
        );
    }
    // A claim given back (its act failed) is claimed again by the redelivery.
    store.release_command(&c2, "cmd1").await.unwrap();
    assert!(
        store
            .claim_command(CommandClaim {
                conversation: &c2,
                message_id: "cmd1",
                now: at(2500)
            })
            .await
            .unwrap(),
        "given back"
    );
    let days = crate::store::COMMAND_CLAIM_DAYS as u64 * 86_400_000;
    assert!(
        store
            .claim_command(CommandClaim {
                conversation: &c2,
                message_id: "new",
                now: at(days + 3000)
            })
            .await
            .unwrap()
    );
    assert!(
        store
            .claim_command(CommandClaim {
                conversation: &c1,
                message_id: "cmd1",
                now: at(days + 3000)
            })
            .await
            .unwrap(),
        "kept for COMMAND_CLAIM_DAYS, then forgotten"
    );
}

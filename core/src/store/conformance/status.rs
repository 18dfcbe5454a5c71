//! Conformance of the status area: the operator's view counts what the rows say, over
//! the windows it names, the same on every backend.

use std::time::Duration;

use super::{
    TTL, at, claim, claimed, collect, holder, http, mark, message, release, reply, stored,
};
use crate::domain::{ConversationId, Lease, LeaseKey, Platform, Timestamp, TokenUsage};
use crate::limits::TimeZone;
use crate::money::Usd;
use crate::store::{
    CommitOutcome, ConnectionLease, ConversationTokens, Enqueue, LeaseCharge, LiveHolder,
    NewNotice, NewReply, OutboxFailure, Period, RateCheck, RateWindow, Recent, ReplyCommit,
    Reservation, RoundFailure, ScopeCharge, Setting, SettingChange, StatusQuery, Store,
    StoreStatus, TokenCharge,
};

/// The status read at `now`: five top conversations, thirty UTC days.
async fn status_at(store: &dyn Store, now: Timestamp) -> StoreStatus {
    let utc = TimeZone::utc();
    let asked = StatusQuery {
        now,
        top: 5,
        days: utc.days_up_to(now, 30),
        today_since: utc.day_start(now),
    };
    store.status(asked).await.expect("reading the status")
}

/// Charge `tokens` (and a thousand nano-dollars each) to `conversation`, the bot and
/// the bot's month under `lease`, on `now`'s UTC day, as the wallet does for every
/// model call.
async fn spend(store: &dyn Store, lease: &Lease, conversation: &str, tokens: i64, now: Timestamp) {
    let charge = TokenCharge {
        day: TimeZone::utc().day(now),
        scopes: [
            (format!("conversation:http:{conversation}"), Period::Day),
            ("bot".into(), Period::Day),
            ("month:bot".into(), Period::Month),
        ]
        .into_iter()
        .map(|(scope, period)| ScopeCharge {
            period,
            cost: tokens * 1000,
            ..ScopeCharge::tokens(scope, tokens, None)
        })
        .collect(),
        hold_until: None,
        reservation: Reservation::None,
    };
    store
        .charge_tokens(LeaseCharge {
            lease,
            charge: &charge,
            now,
        })
        .await
        .expect("charging tokens");
}

/// A scripted day: one reply sent (120 tokens), one given up whose generation was also
/// charged 30 tokens for a dropped attempt, one conversation backing off after a failed
/// generation and held by a rate limit, a model-down notice, a poller lease. Read at
/// once, every count shows it, and the tokens are the wallet's total (150, not the 120
/// the stored replies report); read a day later, the hour and day windows are empty, the
/// tokens moved back a day, the leases expired.
pub async fn the_status_counts_what_the_rows_say(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let empty = status_at(store, at(0)).await;
    assert_eq!(
        (empty.pending, empty.answering, empty.replies_per_hour.len()),
        (0, 0, 24)
    );
    assert_eq!(empty.tokens_per_day.len(), 30);
    assert!(empty.tokens_per_day.iter().all(|d| d.tokens == 0));

    let (c1, ..) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let (c2, ..) = stored(store, message(http("c2"), "m2"), &a, at(10)).await;
    let (c3, ..) = stored(store, message(http("c3"), "m3"), &a, at(20)).await;

    // c1: answered with 120 tokens and delivered; its lease given back.
    let lease = claimed(store, c1, &a, at(1000)).await;
    let batch = collect(store, c1).await;
    let with_usage = NewReply {
        usage: Some(TokenUsage {
            prompt: 100,
            completion: 20,
            cached: 0,
        }),
        ..reply("answer")
    };
    let sent = match store
        .commit_reply(ReplyCommit {
            lease: &lease,
            batch: &batch,
            reply: with_usage,
            now: at(1100),
        })
        .await
    {
        Ok(CommitOutcome::Committed { outbox, .. }) => outbox.id,
        other => panic!("the reply was not committed: {other:?}"),
    };
    spend(store, &lease, "c1", 120, at(1100)).await;
    mark(store, sent, 1, true, at(1200)).await;
    release(store, &lease, at(1200)).await;

    // c3: a generation dropped (30 tokens, no reply stored), then answered (no usage),
    // and its delivery given up.
    let lease = claimed(store, c3, &a, at(1000)).await;
    spend(store, &lease, "c3", 30, at(1050)).await;
    let batch = collect(store, c3).await;
    let failed = match store
        .commit_reply(ReplyCommit {
            lease: &lease,
            batch: &batch,
            reply: reply("lost"),
            now: at(1100),
        })
        .await
    {
        Ok(CommitOutcome::Committed { outbox, .. }) => outbox.id,
        other => panic!("the reply was not committed: {other:?}"),
    };
    store
        .fail_outbox(OutboxFailure {
            id: failed,
            error: "refused",
            now: at(1300),
        })
        .await
        .unwrap();
    release(store, &lease, at(1300)).await;

    // c2: b is answering it, its last generation failed, a rate limit holds it, and the
    // user was told the model is down. b also holds the Telegram poller.
    let lease = claimed(store, c2, &b, at(1400)).await;
    store
        .record_failure(RoundFailure {
            lease: &lease,
            retry_at: at(60_000),
            now: at(1400),
        })
        .await
        .unwrap();
    let rate = RateWindow {
        max: 0,
        window: Duration::from_secs(60),
    };
    let hold = store
        .hold_over_rate(RateCheck {
            conversation: c2,
            user_id: "u1",
            rate,
            now: at(1450),
        })
        .await
        .unwrap();
    assert!(hold.is_some(), "a rate of 0 holds the conversation");
    store
        .enqueue_notice(Enqueue {
            notice: NewNotice {
                conversation: http("c2"),
                is_group: false,
                text: "the model is down".into(),
                reply_to: None,
                quick_replies: Vec::new(),
                dedupe_key: format!("model-down/{c2}/1"),
            },
            holder: &b,
            now: at(1450),
        })
        .await
        .unwrap()
        .expect("the notice is queued");
    let poller = LeaseKey::Poller(Platform::Telegram, 0);
    claim(store, &poller, &b, at(1500))
        .await
        .expect("the poller lease is free");

    let now = at(2000);
    let status = status_at(store, now).await;
    let one = Recent { hour: 1, day: 1 };
    let mut hours = vec![0; 24];
    hours[23] = 1;
    assert_eq!(
        StoreStatus {
            tokens_per_day: Vec::new(),
            ..status.clone()
        },
        StoreStatus {
            pending: 1,
            answering: 1,
            held: 1,
            retrying: 1,
            holders: vec![LiveHolder {
                holder: "b".into(),
                conversations: 1,
                connections: vec!["poller/telegram".into()],
            }],
            connections: vec![ConnectionLease {
                resource: "poller/telegram".into(),
                holder: "b".into(),
                expires_at: at(1500).plus(TTL).0,
            }],
            sent: one,
            failed: one,
            generated: Recent { hour: 2, day: 2 },
            model_failures: one,
            replies_per_hour: hours,
            tokens_per_day: Vec::new(),
            month_cost: Usd(150_000),
            top_conversations: vec![
                ConversationTokens {
                    conversation: c1.0,
                    platform: "http".into(),
                    key: "c1".into(),
                    tokens: 120,
                    replies: 1,
                },
                ConversationTokens {
                    conversation: c3.0,
                    platform: "http".into(),
                    key: "c3".into(),
                    tokens: 30,
                    replies: 1,
                },
            ],
        }
    );
    let today = status.tokens_per_day.last().expect("thirty days");
    assert_eq!(
        today.tokens, 150,
        "the wallet's total, dropped attempts too"
    );
    assert_eq!(today.day, utc(now));
    assert_eq!(today.cost, Usd(150_000), "dollars beside the tokens");
    assert_eq!(
        status.tokens_per_day.iter().map(|d| d.tokens).sum::<u64>(),
        150
    );

    // A day later: the windows are empty, yesterday's tokens are a day back.
    let later = Timestamp(now.0 + 86_400_000);
    let status = status_at(store, later).await;
    assert_eq!(status.sent, Recent::default());
    assert_eq!(status.failed, Recent::default());
    assert_eq!(status.generated, Recent::default());
    assert!(status.replies_per_hour.iter().all(|&n| n == 0));
    assert!(status.top_conversations.is_empty());
    assert!(status.holders.is_empty() && status.connections.is_empty());
    assert_eq!((status.answering, status.held, status.retrying), (0, 0, 1));
    assert_eq!(
        status.month_cost,
        Usd(150_000),
        "the month so far keeps yesterday"
    );
    let days: Vec<u64> = status.tokens_per_day.iter().map(|d| d.tokens).collect();
    assert_eq!(days[28..], [150, 0]);
    assert_eq!(status.tokens_per_day[28].day, utc(now));
}

/// `now`'s UTC day, as the status names days.
fn utc(now: Timestamp) -> String {
    jiff::Timestamp::from_millisecond(now.0)
        .unwrap()
        .strftime("%Y-%m-%d")
        .to_string()
}

/// The console's chats: each with its choices and state, the most recently written to
/// first; one asked by id alone; an unknown id none.
pub async fn the_console_lists_chats_with_their_choices_and_state(store: &dyn Store) {
    let a = holder("a");
    let (c1, _, _) = stored(store, message(http("c1"), "m1"), &a, at(1000)).await;
    let (c2, _, _) = stored(store, message(http("c2"), "m1"), &a, at(2000)).await;
    store
        .change_setting(SettingChange {
            conversation: &http("c1"),
            is_group: false,
            setting: Setting::Model,
            value: Some("big"),
            now: at(2100),
        })
        .await
        .unwrap();
    claimed(store, c2, &a, at(2200)).await;
    let chats = store.chats(None, 10, at(2300)).await.unwrap();
    // Id, key, model, newest message, waiting, answering.
    type Shown<'a> = (i64, &'a str, Option<&'a str>, Option<i64>, bool, bool);
    let shown: Vec<Shown<'_>> = chats
        .iter()
        .map(|c| {
            (
                c.id,
                c.key.as_str(),
                c.model.as_deref(),
                c.last_message_at,
                c.waiting,
                c.answering,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (c2.0, "c2", None, Some(at(2000).0), true, true),
            (c1.0, "c1", Some("big"), Some(at(1000).0), true, false),
        ]
    );
    assert_eq!(chats[0].platform, "http");
    let one = store.chats(Some(c1), 10, at(2300)).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].model.as_deref(), Some("big"));
    assert!(
        store
            .chats(Some(ConversationId(c2.0 + 100)), 10, at(2300))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.chats(None, 1, at(2300)).await.unwrap().len(), 1);

    // A title noted, renamed, noted again unchanged: the newest shown, no version
    // moved (it is no setting: a round in flight is not dropped for it).
    assert_eq!(chats[1].title, None, "never told");
    for title in ["Family", "Family chat", "Family chat"] {
        store.note_chat_title(c1, title).await.unwrap();
    }
    let one = store.chats(Some(c1), 10, at(2300)).await.unwrap();
    assert_eq!(one[0].title.as_deref(), Some("Family chat"));
    // The message, the model, then the next message: the titles moved no version.
    let (_, version, _) = stored(store, message(http("c1"), "m2"), &a, at(2400)).await;
    assert_eq!(version.0, 3, "a title moves no version");
}

/// The console's people: a day's `user:` totals, tokens and dollars, most tokens
/// first, other scopes and other days left out.
pub async fn the_console_lists_a_days_people_by_their_use(store: &dyn Store) {
    let a = holder("a");
    let (id, _, _) = stored(store, message(http("c1"), "m1"), &a, at(1000)).await;
    let lease = claimed(store, id, &a, at(1000)).await;
    let charge = |day: &str, scopes: Vec<(&str, i64)>| TokenCharge {
        day: day.into(),
        scopes: scopes
            .into_iter()
            .map(|(scope, tokens)| ScopeCharge {
                cost: tokens * 10,
                ..ScopeCharge::tokens(scope, tokens, None)
            })
            .collect(),
        hold_until: None,
        reservation: Reservation::None,
    };
    for c in [
        charge(
            "2026-12-05",
            vec![
                ("user:telegram:7", 100),
                ("user:telegram:8", 300),
                ("bot", 400),
            ],
        ),
        charge("2026-12-05", vec![("conversation:http:c1", 900)]),
        charge("2026-12-04", vec![("user:telegram:9", 50)]),
    ] {
        store
            .charge_tokens(LeaseCharge {
                lease: &lease,
                charge: &c,
                now: at(1100),
            })
            .await
            .unwrap();
    }
    let people = store.people_usage("2026-12-05", 10).await.unwrap();
    let shown: Vec<(&str, u64, u64)> = people
        .iter()
        .map(|p| (p.user.as_str(), p.tokens, p.cost.0))
        .collect();
    assert_eq!(
        shown,
        [("telegram:8", 300, 3000), ("telegram:7", 100, 1000)]
    );
    assert_eq!(store.people_usage("2026-12-05", 1).await.unwrap().len(), 1);
    assert!(
        store
            .people_usage("2026-12-06", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

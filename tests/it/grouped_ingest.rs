//! Group commit on PostgreSQL (`store::postgres::ingest`): messages that reach one
//! process while its ingest senders are busy are stored together, in one
//! transaction; each caller still hears about its own message; one refused message
//! fails alone; groups of several replicas never deadlock (they lock conversations in
//! one order), and the counter-tests show what each check catches without its
//! protection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lull_core::domain::{ConversationRef, HolderId, Platform, Timestamp};
use lull_core::store::{IngestOutcome, NewMessage, PostgresStore, TimeSource, prelude::*};

use crate::support::db::{Postgres, count, rows};

fn message(key: &str, id: &str, text: &str) -> NewMessage {
    NewMessage {
        conversation: ConversationRef::new(Platform::Http, key),
        is_group: false,
        message_id: id.into(),
        user_id: "u".into(),
        author: "U".into(),
        text: text.into(),
        media: Vec::new(),
    }
}

async fn open(url: &str) -> PostgresStore {
    PostgresStore::open(
        url,
        lull_core::store::conformance::policy(),
        TimeSource::Database,
    )
    .await
    .expect("open the PostgreSQL store")
}

/// Transactions that stored the messages: rows written by one transaction share
/// its id (`xmin`).
fn commits(db: &Postgres) -> i64 {
    count(db, "SELECT COUNT(DISTINCT xmin::text) FROM messages")
}

/// Store `message` through `store`, which must store it (not as a redelivery).
async fn stored(store: &PostgresStore, holder: &HolderId, message: NewMessage) {
    let outcome = store
        .ingest(message, holder, Timestamp(0))
        .await
        .expect("stored");
    assert!(
        matches!(outcome, IngestOutcome::Stored { .. }),
        "{outcome:?}"
    );
}

/// Wait for every task, failing on the first that failed.
async fn finish(mut tasks: tokio::task::JoinSet<()>) {
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// `conversations` conversations of `each` messages, each conversation's sent one
/// after the other by its own task (so its versions must follow its messages), all
/// conversations at once: every message stored once, in order.
async fn send_at_once(store: PostgresStore, conversations: usize, each: usize) {
    let holder = Arc::new(HolderId::new("grouped"));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conversations {
        let (store, holder) = (store.clone(), holder.clone());
        tasks.spawn(async move {
            for i in 0..each {
                let id = format!("c{c}-{i}");
                stored(
                    &store,
                    &holder,
                    message(&format!("c{c}"), &id, &format!("m{i}")),
                )
                .await;
            }
        });
    }
    finish(tasks).await;
}

/// Every conversation's messages, by version: texts `m0`, `m1`, … in order, each once.
fn assert_stored_in_order(db: &Postgres, conversations: usize, each: usize) {
    let found = rows(
        db,
        "SELECT c.key, m.text FROM messages m JOIN conversations c ON c.id = m.conversation_id
         ORDER BY c.key, m.version",
    );
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in found {
        by_key
            .entry(row[0].clone())
            .or_default()
            .push(row[1].clone());
    }
    assert_eq!(by_key.len(), conversations);
    let expected: Vec<String> = (0..each).map(|i| format!("m{i}")).collect();
    for (key, texts) in by_key {
        assert_eq!(texts, expected, "the messages of {key}, by version");
    }
    let versions = count(
        db,
        "SELECT COUNT(*) FROM conversations c
         WHERE c.version <> (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id)",
    );
    assert_eq!(
        versions, 0,
        "each message bumped its conversation's version once"
    );
}

const CONVERSATIONS: usize = 40;
const EACH: usize = 10;

/// 400 messages in flight at once from 40 conversations: stored in at most half as
/// many transactions as messages (about 100 on a quiet machine, 160 under a full
/// test run's load), each once, each conversation's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_messages_that_arrive_together_commit_together() {
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    send_at_once(open(&url).await, CONVERSATIONS, EACH).await;
    let db = Postgres(url);
    assert_stored_in_order(&db, CONVERSATIONS, EACH);
    let commits = commits(&db);
    eprintln!(
        "{} messages sent at once: {commits} transactions",
        CONVERSATIONS * EACH
    );
    assert!(
        commits <= (CONVERSATIONS * EACH / 2) as i64,
        "{commits} transactions stored {} messages sent at once",
        CONVERSATIONS * EACH
    );
}

/// The counter-test: without grouping (every message its own call), the same load
/// takes a transaction per message, which the check above refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_messages_that_arrive_together_commit_together_counter_test() {
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    send_at_once(
        open(&url).await.without_grouped_ingest(),
        CONVERSATIONS,
        EACH,
    )
    .await;
    let db = Postgres(url);
    assert_stored_in_order(&db, CONVERSATIONS, EACH);
    assert_eq!(
        commits(&db),
        (CONVERSATIONS * EACH) as i64,
        "one transaction a message"
    );
}

/// A message the database refuses (a NUL byte, which no PostgreSQL text holds) among
/// messages stored together: it fails alone, with its error; every other caller's
/// message is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_refused_message_fails_alone_among_those_stored_together() {
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let store = open(&url).await;
    let holder = Arc::new(HolderId::new("grouped"));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (store, holder) = (store.clone(), holder.clone());
        tasks.spawn(async move {
            let text = if i == 150 { "bad\0byte" } else { "fine" };
            let result = store
                .ingest(
                    message(&format!("c{}", i % 20), &format!("m{i}"), text),
                    &holder,
                    Timestamp(0),
                )
                .await;
            (i, result)
        });
    }
    let mut failed = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (i, result) = done.unwrap();
        match result {
            Ok(IngestOutcome::Stored { .. }) => {}
            other => failed.push((i, format!("{other:?}"))),
        }
    }
    assert_eq!(
        failed.len(),
        1,
        "only the refused message fails: {failed:?}"
    );
    assert_eq!(failed[0].0, 150, "{failed:?}");
    let db = Postgres(url);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM messages"), 199);
    assert!(
        commits(&db) < 199,
        "the others were still stored together: {} transactions",
        commits(&db)
    );
}

/// Deadlocks the server detected in this test's database, once every connection
/// that could still report one is closed (a backend reports its statistics when it
/// goes idle or exits).
async fn deadlocks(db: &Postgres) -> i64 {
    tokio::time::sleep(Duration::from_millis(500)).await;
    count(
        db,
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
    )
}

/// Four replicas storing bursts into the same conversations, created by all of them
/// at once, each replica's messages reaching the conversations in another order, and
/// every other message into a new conversation (a new timer row, counted in a shard
/// of `pending_shards` that groups share).
async fn four_replicas_at_once(url: &str, round: usize) {
    let stores = [
        open(url).await,
        open(url).await,
        open(url).await,
        open(url).await,
    ];
    let holder = Arc::new(HolderId::new("grouped"));
    let mut tasks = tokio::task::JoinSet::new();
    for (r, store) in stores.iter().enumerate() {
        for t in 0..24 {
            let (store, holder) = (store.clone(), holder.clone());
            tasks.spawn(async move {
                for i in 0..20 {
                    // Each replica walks the 12 conversations in its own order.
                    let k = match r {
                        0 => i % 12,
                        1 => 11 - i % 12,
                        2 => (i * 5) % 12,
                        _ => (i * 7 + t) % 12,
                    };
                    // Every other message opens a conversation of its own: its
                    // timer row is new, and counted (`pending_shards`).
                    let key = if i % 2 == 0 {
                        format!("k{k}")
                    } else {
                        format!("n{round}r{r}t{t}i{i}")
                    };
                    let id = format!("{round}r{r}t{t}i{i}");
                    stored(&store, &holder, message(&key, &id, "x")).await;
                }
            });
        }
    }
    finish(tasks).await;
    drop(stores);
}

/// Detect a deadlock after 20 ms instead of the default second (the waits are short).
fn detect_deadlocks_quickly(db: &Postgres) {
    let name = db.0.rsplit('/').next().unwrap().to_owned();
    rows(
        db,
        &format!("ALTER DATABASE \"{name}\" SET deadlock_timeout = '20ms'"),
    );
}

/// Groups of four replicas lock the conversations they store into, and then the
/// counter rows their new timers touch, each in one order: no deadlock, and every
/// message stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_storing_together_never_deadlock() {
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let db = Postgres(url.clone());
    detect_deadlocks_quickly(&db);
    four_replicas_at_once(&url, 0).await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM messages"), 4 * 24 * 20);
    assert!(
        commits(&db) < 4 * 24 * 20,
        "the replicas stored messages together"
    );
    assert_eq!(deadlocks(&db).await, 0, "deadlocks between groups");
}

/// The counter-test: the same load with `lull_ingest_many` and `lull_ingest_rows`
/// replaced, in this test's database, by ones that lock a group's rows in the order
/// they were sent (both orders removed from both: conversations by key, counter rows
/// by shard); the server then finds deadlocks between groups, which the check above
/// refuses. (The store retries a deadlocked group and then stores its messages one
/// by one, so nothing is lost either way: the cost is the wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_storing_together_never_deadlock_counter_test() {
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let db = Postgres(url.clone());
    detect_deadlocks_quickly(&db);
    // Open once so the schema exists, then take the order out.
    drop(open(&url).await);
    // A small group is stored row by row (`lull_ingest_rows`), a larger one as sets.
    for (function, orders) in [
        (
            "lull_ingest_rows",
            [
                ("ORDER BY p_platform[s.i], p_key[s.i], s.i", "ORDER BY s.i"),
                ("ORDER BY v_ids[s.i] % 16, v_ids[s.i], s.i", "ORDER BY s.i"),
            ],
        ),
        (
            "lull_ingest_many",
            [
                ("ORDER BY g.platform, g.key", "ORDER BY MIN(g.i)"),
                (
                    "ORDER BY l.conversation % 16, l.conversation",
                    "ORDER BY l.i",
                ),
            ],
        ),
    ] {
        let definition = &rows(
            &db,
            &format!("SELECT pg_get_functiondef('{function}'::regproc)"),
        )[0][0];
        let mut unordered = definition.clone();
        for (order, sent) in orders {
            assert!(
                unordered.contains(order),
                "the counter-test takes out {order}"
            );
            unordered = unordered.replace(order, sent);
        }
        rows(&db, &unordered);
    }
    let mut found = 0;
    for round in 0..5 {
        four_replicas_at_once(&url, round).await;
        found = deadlocks(&db).await;
        if found > 0 {
            break;
        }
    }
    eprintln!("without the order: {found} deadlock(s)");
    assert!(found > 0, "groups stored in their own orders deadlocked");
}

/// A group that fails for a reason the same for all its messages (a busy database,
/// here from the fault plan, after the call's own retries) is every caller's answer
/// at once: no caller waits for one more bounded call per message before hearing it.
/// (Storing each alone after such a failure took 5 store calls a message here: over
/// 500 for these 100.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_busy_database_fails_a_group_at_once() {
    use lull_core::store::{FaultPlan, StoreError};

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let faults = Arc::new(FaultPlan::default());
    let store = open(&url).await.with_faults(faults.clone());
    faults.busy_intake(true);
    let holder = Arc::new(HolderId::new("grouped"));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (store, holder) = (store.clone(), holder.clone());
        tasks.spawn(async move {
            let message = message(&format!("c{}", i % 10), &format!("m{i}"), "x");
            store.ingest(message, &holder, Timestamp(0)).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        let result = done.unwrap();
        assert!(matches!(result, Err(StoreError::Busy)), "{result:?}");
    }
    let calls = faults.intake_calls();
    assert!(calls < 100, "{calls} store calls for 100 messages");
    let db = Postgres(url);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM messages"), 0);
}

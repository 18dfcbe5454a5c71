//! The PostgreSQL pool hands out the connection returned last (`store::postgres`'s
//! `QUEUE_MODE`): steady work stays on the connections already warm (each one's
//! first call of an ingest function plans it, about 10 ms of the server's time),
//! however many connections a moment of concurrency once opened. The counter-test
//! hands connections out in turn and shows the check catches it.

use lull_core::domain::{ConversationRef, HolderId, Platform, Timestamp};
use lull_core::store::conformance::policy;
use lull_core::store::{
    IngestOutcome, NewMessage, PostgresStore, StoreError, TimeSource, prelude::*,
};

use crate::support::db::{Postgres, count, rows};

/// Connections opened by the moment of concurrency, at least.
const OPENED_AT_LEAST: i64 = 4;
/// Messages stored one after the other afterwards.
const STEADY: usize = 40;

/// The store's connections (this database's client backends but the test's own)
/// that ran a statement since the server's time `since`.
fn connections_used_since(db: &Postgres, since: &str) -> i64 {
    count(
        db,
        &format!(
            "SELECT COUNT(*) FROM pg_stat_activity
              WHERE datname = current_database() AND backend_type = 'client backend'
                AND pid <> pg_backend_pid() AND state_change > '{since}'::timestamptz"
        ),
    )
}

/// Open connections with crowds of 16 calls at once (again while fewer than
/// `OPENED_AT_LEAST` are open: the pool keeps what it opened, and a loaded machine
/// may finish a crowd's first calls before its last start), then store `STEADY`
/// messages one after the other: how many connections served those.
async fn steady_work_after_a_crowd(store: PostgresStore, db: &Postgres) -> i64 {
    let open_now = || {
        count(
            db,
            "SELECT COUNT(*) FROM pg_stat_activity
              WHERE datname = current_database() AND backend_type = 'client backend'
                AND pid <> pg_backend_pid()",
        )
    };
    let mut opened = 0;
    for _ in 0..10 {
        let mut crowd = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let store = store.clone();
            crowd.spawn(async move { store.access_rules().await.expect("read access rules") });
        }
        while let Some(done) = crowd.join_next().await {
            done.unwrap();
        }
        opened = open_now();
        if opened > OPENED_AT_LEAST {
            break;
        }
    }
    assert!(
        opened > OPENED_AT_LEAST,
        "ten crowds opened only {opened} connections: the test shows nothing"
    );
    let since = rows(db, "SELECT clock_timestamp()::text")[0][0].clone();
    let holder = HolderId::generate();
    for i in 0..STEADY {
        let message = NewMessage {
            conversation: ConversationRef::new(Platform::Http, format!("c{}", i % 4)),
            is_group: false,
            message_id: format!("m{i}"),
            user_id: "u".into(),
            author: "U".into(),
            text: "hello".into(),
            media: Vec::new(),
        };
        let outcome = store
            .ingest(message, &holder, Timestamp(0))
            .await
            .expect("stored");
        assert!(
            matches!(outcome, IngestOutcome::Stored { .. }),
            "{outcome:?}"
        );
    }
    let used = connections_used_since(db, &since);
    eprintln!("a crowd opened {opened} connections; {STEADY} messages after it used {used}");
    used
}

/// How many connections served the steady work on a fresh database, the store
/// opened by `open`; `None` without PostgreSQL.
async fn used_after_a_crowd<F, O>(open: O) -> Option<i64>
where
    O: FnOnce(String) -> F,
    F: Future<Output = Result<PostgresStore, StoreError>>,
{
    let url = crate::support::postgres::fresh_database()?;
    let store = open(url.clone()).await.expect("open the PostgreSQL store");
    Some(steady_work_after_a_crowd(store, &Postgres(url)).await)
}

/// After a crowd opened many connections, messages stored one after the other use
/// one of them (two at most: a statement's own bookkeeping may borrow a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_steady_work_stays_on_the_connections_already_warm() {
    let Some(used) = used_after_a_crowd(|url| async move {
        PostgresStore::open(&url, policy(), TimeSource::Database).await
    })
    .await
    else {
        return;
    };
    assert!(
        used <= 2,
        "{STEADY} messages stored one after the other used {used} connections"
    );
}

/// The counter-test: connections handed out in turn, the same steady work visits
/// every connection the crowd opened, which the check above refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_steady_work_stays_on_the_connections_already_warm_counter_test() {
    let Some(used) = used_after_a_crowd(|url| async move {
        PostgresStore::open_handing_connections_out_in_turn(&url, policy(), TimeSource::Database)
            .await
    })
    .await
    else {
        return;
    };
    assert!(
        used > OPENED_AT_LEAST,
        "handed out in turn, {STEADY} messages used only {used} connections"
    );
}

//! The store contract, checked against the SQLite backend: the same test body
//! (`lull_core::store::conformance`) every backend runs, one test per check.

use std::ops::Deref;

use lull_core::store::SqliteStore;
use lull_core::timing::TimerPolicy;

/// A store on a fresh database file, with the folder that holds it.
struct Fresh {
    store: SqliteStore,
    _dir: tempfile::TempDir,
}

impl Deref for Fresh {
    type Target = SqliteStore;

    fn deref(&self) -> &SqliteStore {
        &self.store
    }
}

async fn open(timers: TimerPolicy) -> Fresh {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("lull.db"), timers).expect("open the store");
    Fresh { store, _dir: dir }
}

lull_core::store_conformance!(open);

/// The same checks against the PostgreSQL backend, on a fresh database of the test
/// cluster each, with the caller's clock (the checks drive time themselves).
mod postgres {
    use lull_core::store::{PostgresStore, TimeSource};
    use lull_core::timing::TimerPolicy;

    async fn open(timers: TimerPolicy) -> Option<Box<PostgresStore>> {
        let url = crate::support::postgres::fresh_database()?;
        let store = PostgresStore::open(&url, timers, TimeSource::Caller)
            .await
            .expect("open the PostgreSQL store");
        Some(Box::new(store))
    }

    lull_core::store_conformance!(optional open);
}

/// Wake-ups across hosts: a timer armed through one store wakes every other store on
/// the database (`NOTIFY` in the ingest transaction, a `LISTEN` connection per
/// process); a redelivered message arms nothing and announces nothing; a dropped
/// LISTEN connection is reconnected and announcements flow again (a timer on a
/// platform with none yet: announced, being earlier than every other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_announces_armed_timers_to_other_processes() {
    use std::time::Duration;

    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::{HolderId, Platform};
    use lull_core::store::{IngestOutcome, prelude::*};

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let here = open_on_database_clock(&url).await;
    let elsewhere = open_on_database_clock(&url).await;
    let woken = elsewhere
        .wake_ups()
        .expect("PostgreSQL announces armed timers");
    let wait = |limit| tokio::time::timeout(limit, woken.notified());
    // The listener looks once when it (re)connects.
    wait(Duration::from_secs(10)).await.expect("listening");
    let holder = HolderId::new("here");
    let stored = here.ingest(message("m1"), &holder, SystemClock.now()).await;
    assert!(
        matches!(stored, Ok(IngestOutcome::Stored { .. })),
        "{stored:?}"
    );
    wait(Duration::from_secs(5))
        .await
        .expect("a timer armed elsewhere wakes this process");

    let again = here.ingest(message("m1"), &holder, SystemClock.now()).await;
    assert!(
        matches!(again, Ok(IngestOutcome::Duplicate { .. })),
        "{again:?}"
    );
    assert!(
        wait(Duration::from_millis(500)).await.is_err(),
        "a redelivered message armed nothing and announced nothing"
    );

    // Drop every LISTEN connection: it comes back and announcements flow again.
    crate::support::db::rows(
        &crate::support::db::Postgres(url.clone()),
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
    );
    wait(Duration::from_secs(10)).await.expect("reconnected");
    here.ingest(
        message_in(Platform::Telegram, "c1", "m2"),
        &holder,
        SystemClock.now(),
    )
    .await
    .unwrap();
    wait(Duration::from_secs(5))
        .await
        .expect("announcements after the reconnect");
}

/// Wake-ups that do not fan out: a timer is announced only when it is due before
/// every future timer of its platform (what every replica already wakes for), so a
/// burst, or a second conversation due later, announces nothing; a timer due sooner
/// (a full batch) is announced, and a process that serves other platforms is not
/// woken by it. Nothing unannounced is unseen: after the process that armed every
/// timer is gone, another one that heard of none but the first finds each by its
/// due-work query (the next deadline it is told, then the work once the hand-off
/// passed), which its poll runs at least every `LULL_POLL_MS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_announces_only_timers_earlier_than_every_known_one() {
    use std::time::Duration;

    use lull_core::domain::{HolderId, Platform};
    use lull_core::store::{
        IngestOutcome, PostgresStore, TimeSource, WorkQuery, conformance::at, prelude::*,
    };

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let timers = lull_core::store::conformance::policy();
    let open = || PostgresStore::open(&url, timers, TimeSource::Caller);
    let here = open().await.unwrap();
    let elsewhere = open().await.unwrap();
    let mut announced = crate::support::postgres::Announcements::listen(&url).await;
    let woken = elsewhere
        .wake_ups()
        .expect("PostgreSQL announces armed timers");
    let wait = |limit| tokio::time::timeout(limit, woken.notified());
    let quiet = Duration::from_millis(400);
    wait(Duration::from_secs(10)).await.expect("listening");
    let (armer, other) = (HolderId::new("armer"), HolderId::new("other"));
    let query = WorkQuery {
        platforms: vec![Platform::Http],
        holder: other.clone(),
        handoff: Duration::from_secs(1),
        limit: 16,
    };
    // The other process looks once: it serves http only.
    let first = elsewhere.due_work(&query, at(0)).await.unwrap();
    assert!(first.ready.is_empty() && first.next_at.is_none());

    // The first timer of the platform is announced; the rest of its burst is not.
    for (i, t) in [0, 100, 200].into_iter().enumerate() {
        let stored = here
            .ingest(
                message_in(Platform::Http, "a", &format!("a{i}")),
                &armer,
                at(t),
            )
            .await
            .unwrap();
        assert!(matches!(stored, IngestOutcome::Stored { .. }), "{stored:?}");
        let expected: &[&str] = if i == 0 { &["http"] } else { &[] };
        assert_eq!(
            announced.since_last().await,
            expected,
            "message {i} of the burst"
        );
    }
    wait(Duration::from_secs(10))
        .await
        .expect("the other process was woken by the first");
    // A second conversation due after the first (every replica wakes before it
    // anyway): not announced.
    here.ingest(message_in(Platform::Http, "b", "b0"), &armer, at(300))
        .await
        .unwrap();
    assert!(
        announced.since_last().await.is_empty(),
        "a later timer announced"
    );
    // Another platform's first timer: announced, but not to a process that does not
    // serve it.
    here.ingest(message_in(Platform::Telegram, "t", "t0"), &armer, at(300))
        .await
        .unwrap();
    assert_eq!(announced.since_last().await, ["telegram"]);
    assert!(
        wait(quiet).await.is_err(),
        "a telegram timer woke an http-only process"
    );

    // The process that armed them is gone. The other one, told of the first timer
    // only, is told when to look next, and then finds both.
    drop(here);
    let next = elsewhere.due_work(&query, at(400)).await.unwrap();
    assert!(next.ready.is_empty());
    assert_eq!(
        next.next_at,
        Some(at(1200)),
        "the burst's timer, re-armed by its last message"
    );
    let later = elsewhere.due_work(&query, at(1200)).await.unwrap();
    assert!(
        later.ready.is_empty(),
        "another process's timer waits for the hand-off"
    );
    let due = elsewhere.due_work(&query, at(2300)).await.unwrap();
    assert_eq!(
        due.ready.len(),
        2,
        "both conversations found, neither announced twice: {due:?}"
    );

    // With every timer past, the next one is announced; one due sooner than every
    // other (a full batch is due at once) is too, and one due later is not.
    let again = open().await.unwrap();
    for (i, expected) in [(1, true), (2, false), (3, true)] {
        again
            .ingest(
                message_in(Platform::Http, "b", &format!("b{i}")),
                &armer,
                at(2400),
            )
            .await
            .unwrap();
        let expected: &[&str] = if expected { &["http"] } else { &[] };
        assert_eq!(announced.since_last().await, expected, "message b{i}");
    }
}

/// An edit re-arms its conversation's timer and announces it only as an ingest does:
/// when it is due before every future timer of its platform (a later one wakes no
/// replica: they all wake before it anyway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_edit_announces_only_an_earlier_timer() {
    use lull_core::domain::{ConversationRef, HolderId, Platform};
    use lull_core::store::{
        IngestOutcome, MessageEdit, PostgresStore, StoredBy, TimeSource, conformance::at,
        prelude::*,
    };

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let timers = lull_core::store::conformance::policy();
    let here = PostgresStore::open(&url, timers, TimeSource::Caller)
        .await
        .unwrap();
    let mut announced = crate::support::postgres::Announcements::listen(&url).await;
    let holder = HolderId::new("here");
    for (key, t) in [("a", 0), ("b", 100)] {
        here.ingest(
            message_in(Platform::Http, key, &format!("{key}0")),
            &holder,
            at(t),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        announced.since_last().await,
        ["http"],
        "a's timer, not b's (later)"
    );
    let edit = |key: &str, t| {
        let edit = MessageEdit {
            conversation: ConversationRef::new(Platform::Http, key),
            message_id: format!("{key}0"),
            text: format!("edited at {t}"),
        };
        here.edit(
            edit,
            StoredBy {
                holder: &holder,
                now: at(t),
            },
        )
    };
    // An edit of b re-arms b's timer, still after a's: not announced.
    let edited = edit("b", 200).await.unwrap();
    assert!(matches!(edited, IngestOutcome::Stored { .. }), "{edited:?}");
    assert!(
        announced.since_last().await.is_empty(),
        "an edit announced a timer due after another"
    );
    // Every timer past: an edit's timer is the earliest again, and announced.
    let edited = edit("a", 60_000).await.unwrap();
    assert!(matches!(edited, IngestOutcome::Stored { .. }), "{edited:?}");
    assert_eq!(announced.since_last().await, ["http"]);
}

/// One clock for leases and timers: on the database's clock, a replica whose clock
/// runs a minute ahead can neither claim a lease another replica holds nor find a
/// timer due early, and the next deadline it is told is on its own timeline. The
/// same scenario on the callers' clocks (`TimeSource::Caller`, what the conformance
/// checks use) does both: the counter-test that shows what the database's clock
/// prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deadlines_are_on_the_database_clock_whatever_a_replica_clock_says() {
    use std::time::Duration;

    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::{HolderId, LeaseKey, Platform};
    use lull_core::store::{
        IngestOutcome, LeaseClaim, LeaseRelease, PostgresStore, RoundClaim, TimeSource, WorkQuery,
        prelude::*,
    };

    /// Whether the skewed replica (a) took the held lease, (b) found the timer due.
    async fn skewed_replica(url: &str, time: TimeSource) -> (bool, bool) {
        let timers = lull_core::store::conformance::policy();
        let store = PostgresStore::open(url, timers, time).await.unwrap();
        let (on_time, ahead) = (HolderId::new("on-time"), HolderId::new("ahead"));
        let now = SystemClock.now();
        let skewed = now.plus(Duration::from_secs(60));
        let IngestOutcome::Stored {
            conversation,
            due_at,
            ..
        } = store.ingest(message("m1"), &on_time, now).await.unwrap()
        else {
            panic!("not stored");
        };
        assert!(
            due_at > now,
            "due after the debounce on the caller's timeline"
        );
        let key = LeaseKey::Conversation(conversation);
        let ttl = Duration::from_secs(10);
        let held = store
            .claim_lease(LeaseClaim {
                key: &key,
                holder: &on_time,
                ttl,
                now,
            })
            .await
            .unwrap()
            .expect("a free lease");
        let taken = store
            .claim_lease(LeaseClaim {
                key: &key,
                holder: &ahead,
                ttl,
                now: skewed,
            })
            .await
            .unwrap();
        let took = taken.is_some();
        let query = WorkQuery {
            platforms: vec![Platform::Http],
            holder: on_time.clone(),
            handoff: Duration::ZERO,
            limit: 10,
        };
        // Released, so only the timer decides whether the conversation is due.
        store
            .release_lease(LeaseRelease {
                lease: &held,
                last_sent: None,
                now,
            })
            .await
            .unwrap();
        if let Some(taken) = taken {
            store
                .release_lease(LeaseRelease {
                    lease: &taken,
                    last_sent: None,
                    now: skewed,
                })
                .await
                .unwrap();
        }
        let work = store.due_work(&query, skewed).await.unwrap();
        if time == TimeSource::Database {
            let next = work.next_at.expect("the timer is the next deadline");
            let delta = next.0 - skewed.0;
            assert!(
                (0..=2000).contains(&delta),
                "the next deadline is told on the skewed replica's timeline ({delta} ms ahead of its now)"
            );
            // A round it claims sees the timer on its own timeline too: not yet due.
            let claimed = store
                .claim_round(RoundClaim {
                    conversation,
                    holder: &ahead,
                    ttl,
                    history: 10,
                    summaries: true,
                    now: skewed,
                })
                .await
                .unwrap()
                .expect("the lease is free");
            let due_in = claimed.batch.timer.expect("armed").due_at.0 - skewed.0;
            assert!(
                (0..=2000).contains(&due_in),
                "due in {due_in} ms on its timeline"
            );
        }
        (took, !work.ready.is_empty())
    }

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    assert_eq!(
        skewed_replica(&url, TimeSource::Database).await,
        (false, false),
        "on the database's clock"
    );
    let url = crate::support::postgres::fresh_database().unwrap();
    assert_eq!(
        skewed_replica(&url, TimeSource::Caller).await,
        (true, true),
        "the counter-test: on the callers' clocks, the skewed replica takes the lease and the timer early"
    );
}

/// A stable `webhook-id` on PostgreSQL: the conformance check that an outbox row is
/// read with one `stored_at` by `commit_reply`, `claim_round` and `due_outbox`, run on
/// the database's clock (production's `TimeSource::Database`) by callers whose clocks
/// are three years behind it and jump between calls, so each transaction measures
/// its own offset (the conformance run uses the callers' clock, where nothing moves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_outbox_row_is_stored_at_one_time_on_the_database_clock() {
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let store = open_on_database_clock(&url).await;
    lull_core::store::conformance::an_outbox_row_is_stored_at_one_time_in_every_read(&store).await;
}

/// A silent path to the database fails a call in bounded time: a store whose
/// connections go through a proxy that stops forwarding without closing anything (no
/// reset, the kernel still acknowledges: a frozen network, a hung host) answers a
/// lease renewal with a transient error within its call deadline, instead of waiting
/// for a reply that never comes; after the thaw it works again (the silent connection
/// was dropped, not handed out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_call_through_a_frozen_path_fails_in_bounded_time() {
    use std::time::{Duration, Instant};

    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::{HolderId, LeaseKey};
    use lull_core::store::{IngestOutcome, LeaseClaim, LeaseRenewal, prelude::*};

    use crate::support::freeze_proxy::FreezeProxy;

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let proxy = FreezeProxy::for_postgres(&url);
    let store = open_on_database_clock(&proxy.url(&url)).await;
    let holder = HolderId::new("a");
    let IngestOutcome::Stored { conversation, .. } = store
        .ingest(message("m1"), &holder, SystemClock.now())
        .await
        .unwrap()
    else {
        panic!("not stored");
    };
    let ttl = Duration::from_secs(60);
    let lease = store
        .claim_lease(LeaseClaim {
            key: &LeaseKey::Conversation(conversation),
            holder: &holder,
            ttl,
            now: SystemClock.now(),
        })
        .await
        .unwrap()
        .expect("a free lease");

    proxy.freeze();
    let started = Instant::now();
    let renewed = tokio::time::timeout(
        Duration::from_secs(30),
        store.renew_lease(LeaseRenewal {
            lease: &lease,
            ttl,
            now: SystemClock.now(),
        }),
    )
    .await;
    let took = started.elapsed();
    println!("renew_lease through a frozen path: {renewed:?} after {took:?}");
    let renewed = renewed.expect("renew_lease still hanging 30 s after the path froze");
    let error = renewed.expect_err("no answer can come through a frozen path");
    assert!(error.is_transient(), "{error:?}");
    assert!(took < Duration::from_secs(15), "failed only after {took:?}");

    proxy.thaw();
    let renewed = store
        .renew_lease(LeaseRenewal {
            lease: &lease,
            ttl,
            now: SystemClock.now(),
        })
        .await;
    assert!(renewed.is_ok(), "after the thaw: {renewed:?}");
}

/// Failures of a PostgreSQL server reach the dispatcher as the backend-neutral
/// errors it knows: a dropped connection is transient (`Pool`) and the next call
/// works on a new one; a database that refuses writes (a read-only standby after a
/// failover) is `Io`, makes the health check fail, and clears with the first write
/// that succeeds again. A message is stored exactly once through all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failures_map_to_store_errors_and_health() {
    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::HolderId;
    use lull_core::store::{IngestOutcome, StoreError, prelude::*};

    use crate::support::db::{self, Postgres};

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let database = Postgres(url.clone());
    // Settings of the database are changed from another one (it may refuse writes).
    let (server, name) = url.rsplit_once('/').unwrap();
    let admin = Postgres(format!("{server}/postgres"));
    let store = open_on_database_clock(&url).await;
    let holder = HolderId::new("a");
    let drop_connections = || {
        db::rows(
            &database,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
    };
    // Every session started from now on refuses (or takes) writes.
    let read_only = |on: bool| {
        db::rows(
            &admin,
            &format!("ALTER DATABASE {name} SET default_transaction_read_only = {on}"),
        );
        drop_connections();
    };
    store.ping().await.expect("healthy");

    drop_connections();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match store
            .ingest(message("m1"), &holder, SystemClock.now())
            .await
        {
            Ok(outcome) => {
                assert!(
                    matches!(outcome, IngestOutcome::Stored { .. }),
                    "{outcome:?}"
                );
                break;
            }
            Err(e) => {
                assert!(e.is_transient(), "a dropped connection is transient: {e:?}");
                assert!(attempts < 10, "the pool never reconnected: {e}");
            }
        }
    }

    read_only(true);
    let refused = loop {
        match store
            .ingest(message("m2"), &holder, SystemClock.now())
            .await
        {
            Err(StoreError::Pool(_)) => continue,
            other => break other,
        }
    };
    assert!(matches!(refused, Err(StoreError::Io(_))), "{refused:?}");
    assert!(
        matches!(store.ping().await, Err(StoreError::Io(_))),
        "unhealthy while writes are refused"
    );

    read_only(false);
    let stored = loop {
        match store
            .ingest(message("m2"), &holder, SystemClock.now())
            .await
        {
            Err(StoreError::Pool(_) | StoreError::Io(_)) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(stored, Ok(IngestOutcome::Stored { .. })),
        "{stored:?}"
    );
    store.ping().await.expect("healthy again after a write");
    assert_eq!(db::count(&database, "SELECT COUNT(*) FROM messages"), 2);
}

/// A message `id` in conversation `c1` of the http platform.
fn message(id: &str) -> lull_core::store::NewMessage {
    message_in(lull_core::domain::Platform::Http, "c1", id)
}

/// Message `id` in conversation `key` of `platform`.
fn message_in(
    platform: lull_core::domain::Platform,
    key: &str,
    id: &str,
) -> lull_core::store::NewMessage {
    lull_core::store::NewMessage {
        conversation: lull_core::domain::ConversationRef::new(platform, key),
        is_group: false,
        message_id: id.into(),
        user_id: "u".into(),
        author: "U".into(),
        text: "hi".into(),
        media: Vec::new(),
    }
}

/// Replicas starting at once on an empty database cannot race their migrations: each
/// is applied once, under the advisory lock, and every replica opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_of_replicas_starting_at_once_do_not_race() {
    use lull_core::store::{PostgresStore, TimeSource};

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let opening = (0..6).map(|_| {
        let url = url.clone();
        tokio::spawn(async move {
            PostgresStore::open(
                &url,
                lull_core::store::conformance::policy(),
                TimeSource::Database,
            )
            .await
        })
    });
    for opened in futures_util::future::join_all(opening).await {
        opened.unwrap().expect("every replica opens");
    }
    let database = crate::support::db::Postgres(url);
    assert_eq!(
        crate::support::db::rows(
            &database,
            "SELECT version FROM lull_migrations ORDER BY version"
        ),
        (1..=lull_core::store::POSTGRES_SCHEMA)
            .map(|v| vec![v.to_string()])
            .collect::<Vec<_>>(),
        "each migration applied once"
    );
}

/// A write that waits on a row lock longer than the statement timeout is refused as
/// `Busy` (transient: the caller tries again), after one timeout, not after a retry
/// per attempt; the lock's holder is undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lock_held_too_long_is_busy() {
    use std::time::{Duration, Instant};

    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::HolderId;
    use lull_core::store::{StoreError, prelude::*};

    use crate::support::db::{self, Postgres};

    let Some(cluster) = crate::support::postgres::cluster() else {
        return;
    };
    let url = cluster.create_database();
    let store = open_on_database_clock(&url).await;
    let holder = HolderId::new("a");
    store
        .ingest(message("m1"), &holder, SystemClock.now())
        .await
        .unwrap();
    // Another session holds the conversation's row lock for eight seconds.
    let mut locker = std::process::Command::new(cluster.bin().join("psql"))
        .args(["-X", "-q", "-d", &url, "-c"])
        .arg("BEGIN; SELECT 1 FROM conversations FOR UPDATE; SELECT pg_sleep(8); COMMIT;")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let database = Postgres(url.clone());
    while db::count(
        &database,
        // Asleep: the lock is taken (the statement is active from its start, before
        // its FOR UPDATE has the row).
        "SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(8)%' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()",
    ) == 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let refused = store
        .ingest(message("m2"), &holder, SystemClock.now())
        .await;
    let waited = started.elapsed();
    assert!(matches!(refused, Err(StoreError::Busy)), "{refused:?}");
    assert!(refused.unwrap_err().is_transient());
    assert!(
        waited < Duration::from_secs(7),
        "refused after the statement timeout, not once per retry ({waited:?})"
    );
    assert!(locker.wait().unwrap().success());
    store
        .ingest(message("m2"), &holder, SystemClock.now())
        .await
        .expect("stored once the lock is gone");
}

/// A PostgreSQL store on the database's clock, as a process opens it, with the
/// conformance checks' timer policy.
async fn open_on_database_clock(url: &str) -> lull_core::store::PostgresStore {
    lull_core::store::PostgresStore::open(
        url,
        lull_core::store::conformance::policy(),
        lull_core::store::TimeSource::Database,
    )
    .await
    .expect("open the PostgreSQL store")
}

/// Index-driven due work on PostgreSQL: with twenty thousand conversations (timers
/// far in the future, delivered outbox rows, released leases), a scheduler's pass
/// (`due_work`) and the pending gauge read no table from end to end: the server's own
/// statistics count index scans and not one sequential scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_due_work_and_the_gauge_scan_no_table() {
    use std::time::Duration;

    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::{HolderId, Platform};
    use lull_core::store::{WorkQuery, prelude::*};

    use crate::support::db::{self, Postgres};

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    // The schema (its index builds read every table once), by a store that is then
    // closed, so its sessions' counts are in before the counting starts.
    drop(open_on_database_clock(&url).await);
    let database = Postgres(url.clone());
    let others = "SELECT COUNT(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()";
    while db::count(&database, others) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db::rows(
        &database,
        "INSERT INTO conversations (platform, key, created_at)
             SELECT 'http', 'k' || g, 0 FROM generate_series(1, 20000) g;
         INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
             SELECT id, 'http', 9000000000000000, 1, 0, 'elsewhere' FROM conversations;
         INSERT INTO outbox (conversation_id, kind, text, owner, created_at, next_attempt_at, sent_at)
             SELECT id, 'reply', 'sent', 'elsewhere', 0, 0, 1 FROM conversations;
         INSERT INTO leases (resource, conversation_id, token)
             SELECT 'conversation/' || id, id, 1 FROM conversations;
         ANALYZE;",
    );
    // In a session of its own: the filling session's counts are in by now.
    db::rows(&database, "SELECT pg_stat_reset()");
    let store = open_on_database_clock(&url).await;
    let query = WorkQuery {
        platforms: vec![Platform::Http, Platform::Telegram],
        holder: HolderId::new("here"),
        handoff: Duration::from_millis(500),
        limit: 256,
    };
    for _ in 0..8 {
        let work = store.due_work(&query, SystemClock.now()).await.unwrap();
        assert!(work.ready.is_empty(), "{work:?}");
        assert_eq!(store.pending_conversations().await.unwrap(), 20_000);
    }
    // A session's counts are in once it has ended.
    drop(store);
    while db::count(&database, others) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rows = db::rows(
        &database,
        "SELECT relname, seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables
         WHERE relname IN ('timers', 'outbox', 'conversations', 'leases', 'messages')
         ORDER BY relname",
    );
    let indexed = |table: &str| rows.iter().any(|r| r[0] == table && r[2] != "0");
    assert!(indexed("timers") && indexed("outbox"), "{rows:?}");
    let sequential: Vec<&Vec<String>> = rows.iter().filter(|r| r[1] != "0").collect();
    assert!(
        sequential.is_empty(),
        "sequential scans: {sequential:?} of {rows:?}"
    );
}

/// The journal on the database's clock: a caller an hour behind it reserves a question
/// for a minute on its own timeline; the database keeps it open that minute (not an
/// hour less), every caller is handed its expiry on its own timeline, and once the
/// database's clock passes it, it is expired for every caller however skewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_action_expiries_are_translated_between_timelines() {
    use std::time::Duration;

    use lull_core::clock::{Clock, SystemClock};
    use lull_core::domain::{HolderId, Timestamp};
    use lull_core::store::{
        ActionKey, ActionReservation, ApprovalAnswer, ConversationAt, Decision, IngestOutcome,
        NewAction, Reserve, RoundClaim, prelude::*,
    };

    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let store = open_on_database_clock(&url).await;
    let hour = 3_600_000;
    let behind = || Timestamp(SystemClock.now().0 - hour);
    let ahead = || Timestamp(SystemClock.now().0 + hour);
    let holder = HolderId::new("a");
    let IngestOutcome::Stored { conversation, .. } = store
        .ingest(message("m1"), &holder, behind())
        .await
        .unwrap()
    else {
        panic!("stored");
    };
    let claimed = store
        .claim_round(RoundClaim {
            conversation,
            holder: &holder,
            ttl: Duration::from_secs(30),
            history: 5,
            summaries: true,
            now: behind(),
        })
        .await
        .unwrap()
        .expect("the round is free");
    let batch = claimed.batch;
    let ask = |tool: &str, expires_at: Timestamp| NewAction {
        key: ActionKey::of(conversation, batch.pending[0].row, tool, "{}"),
        batch: batch.pending[0].row,
        tool: tool.into(),
        arguments: "{}".into(),
        idempotent: false,
        needs_approval: true,
        requested_by: None,
        expires_at,
        approved: None,
    };
    let now = behind();
    let minute = Timestamp(now.0 + 60_000);
    let ActionReservation::Awaiting { row, .. } = store
        .reserve_action(Reserve {
            lease: &claimed.lease,
            v0: batch.v0,
            action: ask("t__minute", minute),
            now,
        })
        .await
        .unwrap()
    else {
        panic!("awaiting");
    };
    assert_eq!(
        row.expires_at, minute,
        "handed back on the caller's timeline"
    );
    assert!((row.created_at.0 - now.0).abs() < 2_000, "{row:?}");
    let seen_ahead = store
        .open_approvals(
            ConversationAt {
                conversation,
                now: ahead(),
            },
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert_eq!(
        seen_ahead.len(),
        1,
        "open for a minute of the database's clock"
    );
    assert!(
        (seen_ahead[0].expires_at.0 - (minute.0 + 2 * hour)).abs() < 2_000,
        "on the reader's timeline: {seen_ahead:?}"
    );
    // A short question: expired once the database's clock passes it.
    let now = behind();
    let ActionReservation::Awaiting { row: brief, .. } = store
        .reserve_action(Reserve {
            lease: &claimed.lease,
            v0: batch.v0,
            action: ask("t__brief", Timestamp(now.0 + 300)),
            now,
        })
        .await
        .unwrap()
    else {
        panic!("awaiting");
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let open = store
        .open_approvals(
            ConversationAt {
                conversation,
                now: behind(),
            },
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert_eq!(open.iter().map(|r| r.id).collect::<Vec<_>>(), [row.id]);
    assert!(matches!(
        store
            .decide_action(ApprovalAnswer {
                conversation,
                id: brief.id,
                approve: true,
                now: behind()
            })
            .await
            .unwrap(),
        Decision::Expired(_)
    ));
}

//! The multi-process stress and crash test, and its counter-test, on SQLite and on
//! PostgreSQL (with a server restart). See `tests/support/stress.rs`; `cargo bench
//! --bench soak` runs longer versions.

use crate::support::postgres::{Cluster, Durability};
use crate::support::stress::{self, Faults, StressPlan};

/// Three processes, fifty conversations, two holders killed mid-round, a model that
/// fails some requests and refuses some batches, a webhook that refuses or answers
/// too slowly some deliveries: no message answered twice, none lost, every reply
/// fresh, fencing tokens growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_with_kills_and_faults_keeps_every_invariant() {
    let report = stress::run(&StressPlan::ci()).await;
    println!("{report}");
    assert!(report.messages > 100, "{report}");
    assert_eq!(report.kills, 2, "{report}");
    // The faults did happen.
    assert!(report.model_failures > 0, "{report}");
    assert!(report.webhook_failures > 0, "{report}");
    assert!(report.given_up > 0, "{report}");
    assert_eq!(report.duplicates, 0, "{report}");
    assert_eq!(report.lost, 0, "{report}");
    assert_eq!(report.stale, 0, "{report}");
    assert_eq!(report.token_regressions, 0, "{report}");
    assert_eq!(report.text_mismatches, 0, "{report}");
    // The last step's faults did happen, and no delivery was forgotten.
    assert!(report.locks_after_accept > 0, "{report}");
    assert_eq!(report.double_deliveries, 0, "{report}");
    assert!(
        report.replies < report.messages,
        "bursts share replies: {report}"
    );
}

/// The counter-test of the last step: the same faults with the sent-mark deferred and
/// dropped on a failed write (`LULL_TEST_DEFER_MARKS`, the behaviour before marks were
/// facts): the checker finds replies delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counter_test_with_deferred_marks_the_checker_finds_double_deliveries() {
    let plan = StressPlan {
        kills: 0,
        conversations: 30,
        switches: vec!["LULL_TEST_DEFER_MARKS"],
        faults: Some(Faults {
            locks_after_accept: 4,
            ..Faults::ci()
        }),
        ..StressPlan::ci()
    };
    let report = stress::run(&plan).await;
    println!("{report}");
    assert!(report.locks_after_accept > 0, "{report}");
    assert!(
        report.double_deliveries > 0,
        "with deferred marks double deliveries were expected: {report}"
    );
}

/// The counter-test: the same run with every lease check switched off (a switch only
/// test builds have) must be caught producing duplicates. A checker that cannot fail
/// proves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counter_test_without_leases_the_checker_finds_duplicates() {
    counter_test(None).await;
}

/// The counter-test's run on the database `database` (`None`: a SQLite file): no
/// kills, every lease check off; the checker must find duplicates.
async fn counter_test(database: Option<String>) {
    let plan = StressPlan {
        leases: false,
        kills: 0,
        conversations: 30,
        database,
        ..StressPlan::ci()
    };
    let report = stress::run(&plan).await;
    println!("{report}");
    assert!(
        report.duplicates > 0,
        "without leases duplicates were expected: {report}"
    );
}

/// The same run on PostgreSQL (three processes on one database of a cluster of this
/// test's own), and the server restarted halfway (a fast shutdown, down for
/// [`stress::SERVER_DOWN`], started again) between the two kills, while rounds hold
/// leases: every connection drops, ingest is refused until the server is back, renewals
/// and commits fail mid-round. Still no message answered twice, none lost, every reply
/// fresh; the messages the restart caught unanswered and those sent after it are all
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stress_with_kills_faults_and_a_server_restart_keeps_every_invariant() {
    let Some(cluster) = Cluster::private(Durability::Off) else {
        return;
    };
    let cluster = std::sync::Arc::new(cluster);
    let plan = StressPlan {
        database: Some(cluster.create_database()),
        restart_server: Some(cluster.clone()),
        lease_ttl_ms: stress::RESTART_TTL_MS,
        freeze_path: Some(std::time::Duration::from_millis(
            stress::RESTART_TTL_MS * 3 / 2,
        )),
        ..StressPlan::ci()
    };
    let report = stress::run(&plan).await;
    println!("{report}");
    let explain = || format!("{report}\nserver log:\n{}", cluster.log());
    assert!(report.messages > 100, "{}", explain());
    assert_eq!(report.kills, 2, "{}", explain());
    assert_eq!(report.server_restarts, 1, "{}", explain());
    assert_eq!(report.path_freezes, 1, "{}", explain());
    // The restart hit traffic: work in flight when it stopped, messages after it.
    assert!(report.pending_at_restart > 0, "{}", explain());
    assert!(report.acked_after_restart > 0, "{}", explain());
    assert!(report.model_failures > 0, "{}", explain());
    assert!(report.webhook_failures > 0, "{}", explain());
    assert_eq!(report.duplicates, 0, "{}", explain());
    assert_eq!(report.lost, 0, "{}", explain());
    assert_eq!(report.stale, 0, "{}", explain());
    assert_eq!(report.token_regressions, 0, "{}", explain());
    assert_eq!(report.text_mismatches, 0, "{}", explain());
    assert_eq!(report.double_deliveries, 0, "{}", explain());
}

/// The counter-test of the last step on PostgreSQL: the server restarted right after a
/// reply was accepted, with the sent-mark deferred and dropped on a failed write
/// (`LULL_TEST_DEFER_MARKS`): the checker finds a reply delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_counter_test_with_deferred_marks_a_restart_after_a_send_delivers_twice() {
    let Some(cluster) = Cluster::private(Durability::Off) else {
        return;
    };
    let cluster = std::sync::Arc::new(cluster);
    let plan = StressPlan {
        kills: 0,
        conversations: 30,
        database: Some(cluster.create_database()),
        restart_server: Some(cluster.clone()),
        lease_ttl_ms: stress::RESTART_TTL_MS,
        switches: vec!["LULL_TEST_DEFER_MARKS"],
        ..StressPlan::ci()
    };
    let report = stress::run(&plan).await;
    println!("{report}");
    assert_eq!(report.server_restarts, 1, "{report}");
    assert!(
        report.double_deliveries > 0,
        "with deferred marks a double delivery was expected: {report}"
    );
}

/// Its counter-test on PostgreSQL: the same run with every lease check switched off
/// must be caught producing duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_counter_test_without_leases_the_checker_finds_duplicates() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    counter_test(Some(database)).await;
}

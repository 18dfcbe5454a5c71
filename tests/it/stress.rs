//! The multi-process stress and crash test, and its counter-test. See
//! `tests/support/stress.rs`; `cargo bench --bench soak` runs longer versions.

use crate::support::stress::{self, StressPlan};

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
    assert!(
        report.replies < report.messages,
        "bursts share replies: {report}"
    );
}

/// The counter-test: the same run with every lease check switched off (a switch only
/// test builds have) must be caught producing duplicates. A checker that cannot fail
/// proves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counter_test_without_leases_the_checker_finds_duplicates() {
    let plan = StressPlan {
        leases: false,
        kills: 0,
        conversations: 30,
        ..StressPlan::ci()
    };
    let report = stress::run(&plan).await;
    println!("{report}");
    assert!(
        report.duplicates > 0,
        "without leases duplicates were expected: {report}"
    );
}

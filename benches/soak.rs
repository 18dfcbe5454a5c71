//! The stress and crash harness as a runnable soak: the same code as the
//! `stress_with_kills_keeps_every_invariant` test, with its size chosen on the
//! command line. Prints one summary line and exits non-zero if an invariant broke.
//!
//! ```sh
//! cargo bench --bench soak -- --processes 8 --conversations 500 --kills 20
//! cargo bench --bench soak -- --no-leases     # the counter-test: must report duplicates
//! cargo bench --bench soak -- --no-faults     # echo responder, a webhook that never fails
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use support::stress::{self, StressPlan};

fn main() {
    let mut plan = StressPlan::ci();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |what: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match arg.as_str() {
            "--processes" => plan.processes = number("--processes") as usize,
            "--conversations" => plan.conversations = number("--conversations") as usize,
            "--kills" => plan.kills = number("--kills") as usize,
            "--spread-ms" => plan.spread_ms = number("--spread-ms"),
            "--seed" => plan.seed = number("--seed"),
            "--no-leases" => plan.leases = false,
            "--no-faults" => plan.faults = None,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    // Keep the arrival rate of the CI run: conversations start over a longer window.
    plan.spread_ms = plan.spread_ms.max(plan.conversations as u64 * 160);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = runtime.block_on(stress::run(&plan));
    println!("{report}");
    let broken = report.duplicates
        + report.lost
        + report.stale
        + report.token_regressions
        + report.text_mismatches;
    if plan.leases && broken > 0 {
        std::process::exit(1);
    }
    if !plan.leases && report.duplicates == 0 {
        eprintln!("counter-test: no duplicates found without leases");
        std::process::exit(1);
    }
}

//! How much an idle `lull run` costs: CPU time over a quiet period (the scheduler
//! sleeps until the next deadline and polls once per `LULL_POLL_MS`), resident memory
//! before and after a burst of traffic, and the median reply latency of a one-message
//! conversation (debounce excluded). Prints one line per figure.
//!
//! ```sh
//! cargo bench --bench idle            # 30 s idle window
//! cargo bench --bench idle -- 60      # another window, in seconds
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::process::{LullProcess, post_message};
use support::webhook::Webhook;

/// utime + stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("linux /proc");
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let window: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let webhook = Webhook::start().await;
        let env = [
            ("DATABASE_URL", format!("sqlite:{}", dir.path().join("lull.db").display())),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("LULL_DEBOUNCE_MS", "100".into()),
            ("RUST_LOG", "warn".into()),
        ];
        let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
        lull.wait_healthy(Duration::from_secs(20)).await;
        let pid = lull.pid().unwrap();
        let ticks_per_second = 100.0; // USER_HZ on Linux
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!("idle: rss_kib={} (fresh process)", rss_kib(pid));

        let before = cpu_ticks(pid);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(window)).await;
        let used = (cpu_ticks(pid) - before) as f64 / ticks_per_second;
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "idle: cpu_seconds={used:.3} over {elapsed:.1}s = {:.3}% of one core (poll every 1000 ms)",
            100.0 * used / elapsed
        );

        // Latency of single-message conversations: time from 202 to the reply minus
        // the 100 ms debounce.
        let client = reqwest::Client::new();
        let mut latencies = Vec::new();
        for i in 0..50 {
            let sent = Instant::now();
            let r = post_message(&client, &lull.base_url(), &format!("c{i}"), "1", "ping").await.unwrap();
            assert_eq!(r.status().as_u16(), 202);
            webhook.wait_replies(i + 1, Duration::from_secs(10)).await;
            latencies.push(sent.elapsed().saturating_sub(Duration::from_millis(100)));
        }
        latencies.sort();
        println!(
            "latency: median_ms={:.1} p90_ms={:.1} (50 one-message conversations, debounce excluded, echo responder)",
            latencies[25].as_secs_f64() * 1000.0,
            latencies[45].as_secs_f64() * 1000.0
        );
        println!("idle: rss_kib={} (after 50 conversations)", rss_kib(pid));
    });
}

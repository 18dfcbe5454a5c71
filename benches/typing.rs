//! The latency bench on a typing trace: how long lull waits after a person's last
//! message before it asks the model, with a fixed and with an adaptive debounce, on
//! the same scripted trace (`tests/support/trace.rs`: people of complete messages,
//! people of 2–5 fragments with log-normal gaps, photos followed by their caption,
//! and people who switch from complete messages to fragments),
//! replayed in one run through the http adapter of two `lull run` processes (the
//! release binary, the `echo` responder with a fixed 200 ms model delay); and how
//! quickly an overtaken generation is stopped.
//!
//! ```sh
//! cargo bench --bench typing                 # 3 repetitions of the whole trace
//! cargo bench --bench typing -- --reps 1
//! cargo bench --bench typing -- --quick      # fewer people, one repetition
//! ```
//!
//! Every figure is a wait measured by timers (the database's arrival time of the
//! message, the reply's commit time less its generation time), not a CPU cost, so a
//! loaded machine moves it little; it is printed as the median of the repetitions
//! with min and max. BENCHMARKS.md holds the results.

mod figures;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use figures::{Figure, fmt};
use support::fakes::openai::{Behavior, FakeOpenAi, Stream};
use support::fakes::webhook::Webhook;
use support::process::LullProcess;
use support::trace::{self, Answered, Shape, Style};

/// The echo responder's delay: the model's time, the same for every reply.
const MODEL_MS: u64 = 200;

/// Rows by (order, figure), columns fixed and adaptive.
#[derive(Default)]
struct Table {
    rows: BTreeMap<usize, (String, String, [Figure; 2], String)>,
}

impl Table {
    fn record(
        &mut self,
        order: usize,
        name: &str,
        unit: &str,
        column: usize,
        value: f64,
        goal: &str,
    ) {
        let row = self
            .rows
            .entry(order)
            .or_insert_with(|| (name.into(), unit.into(), Default::default(), goal.into()));
        row.2[column].push(value);
    }

    fn print(&self) {
        println!("| figure | fixed | adaptive | goal |");
        println!("| --- | --- | --- | --- |");
        for (name, unit, [fixed, adaptive], goal) in self.rows.values() {
            println!(
                "| {name} | {} | {} | {goal} |",
                fixed.cell(unit),
                adaptive.cell(unit)
            );
        }
    }
}

/// A `lull run` on a fresh SQLite database with the http adapter and `env`.
async fn start(env: &[(&'static str, String)]) -> (tempfile::TempDir, Webhook, LullProcess) {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut vars: Vec<(&str, String)> = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("RUST_LOG", "warn".into()),
    ];
    vars.extend(env.iter().cloned());
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &vars);
    lull.wait_healthy(Duration::from_secs(30)).await;
    (dir, webhook, lull)
}

/// One replay of the trace into a process with `LULL_DEBOUNCE=mode`: what became of
/// each burst, and the model calls it made.
async fn replay(people: &[trace::Person], mode: &str) -> (Vec<Answered>, f64) {
    let (dir, _webhook, lull) = start(&[
        ("LULL_LLM", "echo".into()),
        ("LULL_ECHO_DELAY_MS", MODEL_MS.to_string()),
        ("LULL_DEBOUNCE", mode.into()),
    ])
    .await;
    trace::replay(people, &lull.base_url()).await;
    let db = dir.path().join("lull.db");
    support::db::settled(&db, Duration::from_secs(60)).await;
    let calls = trace::model_calls(&lull).await;
    (trace::answered(&db, people), calls)
}

/// Record one replay's figures in `column`.
fn record(table: &mut Table, column: usize, answered: &[Answered], calls: f64) {
    let waits = |pick: &dyn Fn(&Answered) -> bool| -> Vec<Duration> {
        answered
            .iter()
            .filter(|a| pick(a))
            .map(|a| a.wait)
            .collect()
    };
    let all = waits(&|_| true);
    let singles = waits(&|a| a.messages == 1 && a.style == Style::Complete);
    let fragments = waits(&|a| a.messages >= 2 && a.style == Style::Fragments);
    let photos = waits(&|a| a.messages == 2 && a.style == Style::Photo);
    let p = trace::percentile_ms;
    table.record(
        1,
        "wait after the last message p50, every burst",
        "ms",
        column,
        p(&all, 50.0),
        "",
    );
    table.record(
        2,
        "wait after the last message p90, every burst",
        "ms",
        column,
        p(&all, 90.0),
        "",
    );
    table.record(
        3,
        "wait p50, single complete messages",
        "ms",
        column,
        p(&singles, 50.0),
        "≤ 500",
    );
    table.record(
        4,
        "wait p90, single complete messages",
        "ms",
        column,
        p(&singles, 90.0),
        "",
    );
    table.record(
        5,
        "wait p50, bursts of 2–5 fragments",
        "ms",
        column,
        p(&fragments, 50.0),
        "",
    );
    table.record(
        6,
        "wait p90, bursts of 2–5 fragments",
        "ms",
        column,
        p(&fragments, 90.0),
        "",
    );
    table.record(
        7,
        "wait p50, a photo then its caption",
        "ms",
        column,
        p(&photos, 50.0),
        "",
    );
    let bursts = answered.len() as f64;
    table.record(
        8,
        "model calls per burst, whole trace",
        "calls/burst",
        column,
        calls / bursts,
        "≤ 1.05",
    );
    let early: usize = answered.iter().map(|a| a.replies - 1).sum();
    table.record(
        9,
        &format!("replies sent before their burst ended (of {bursts} bursts)"),
        "replies",
        column,
        early as f64,
        "0",
    );
    let split = answered
        .iter()
        .filter(|a| a.messages >= 2 && a.replies > 1)
        .count();
    let multi = answered.iter().filter(|a| a.messages >= 2).count();
    table.record(
        10,
        &format!("bursts of several messages split (of {multi})"),
        "bursts",
        column,
        split as f64,
        "",
    );
    // People who write complete messages, then switch to fragments (issue 37): the
    // rhythm learned from the first must not split the second.
    let switched = |a: &&Answered| a.style == Style::Switching && a.messages >= 2;
    let switched_split = answered
        .iter()
        .filter(switched)
        .filter(|a| a.replies > 1)
        .count();
    let switched_multi = answered.iter().filter(switched).count();
    table.record(
        11,
        &format!("fragment bursts after complete messages split (of {switched_multi})"),
        "bursts",
        column,
        switched_split as f64,
        "adaptive ≤ fixed",
    );
    let switched_singles = waits(&|a| a.messages == 1 && a.style == Style::Switching);
    table.record(
        12,
        "wait p50, their complete messages",
        "ms",
        column,
        p(&switched_singles, 50.0),
        "",
    );
}

/// An overtaken generation, `trials` times: a message is answered by a model that
/// takes 2 s; 300 ms into the generation a newer message arrives. Returns, per trial,
/// the time from the newer message until the model's request was dropped, and the
/// model time spent on the dropped request.
async fn overtaken(trials: usize) -> Vec<(Duration, Duration)> {
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::Stream(Stream::echo(
        40,
        Duration::from_millis(50),
    )));
    let (_dir, webhook, lull) = start(&[
        ("LULL_LLM", "openai".into()),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("LULL_DEBOUNCE", "fixed".into()),
        ("LULL_DEBOUNCE_MS", "100".into()),
    ])
    .await;
    let client = reqwest::Client::new();
    let post = |conversation: String, id: &'static str| {
        let (client, base) = (client.clone(), lull.base_url());
        async move {
            let r = support::process::post_message(&client, &base, &conversation, id, "hello")
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 202);
        }
    };
    let mut out = Vec::new();
    for k in 0..trials {
        let conversation = format!("over{k}");
        post(conversation.clone(), "m1").await;
        let asked = 2 * k + 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        while model.requests().len() < asked {
            assert!(Instant::now() < deadline, "the model was never asked");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let newer = Instant::now();
        post(conversation.clone(), "m2").await;
        let replies = webhook.wait_replies(k + 1, Duration::from_secs(20)).await;
        assert_eq!(replies[k].covers.len(), 2, "one reply covers both");
        let abandoned = model.abandoned();
        let (started, dropped) = *abandoned.get(k).expect("the overtaken request was dropped");
        out.push((
            dropped.duration_since(newer),
            dropped.duration_since(started),
        ));
    }
    out
}

fn main() {
    let mut reps = 3;
    let mut people = 30;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => (reps, people) = (1, 10),
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let runtime = figures::runtime();
    let started = Instant::now();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut table = Table::default();
    let mut stops = Vec::new();
    runtime.block_on(async {
        for rep in 0..reps {
            let mut people = trace::trace(1000 * rep as u64 + 1, "p", people, Shape::human());
            let switchers = (people.len() / 5).max(2);
            people.extend(trace::switchers(
                1000 * rep as u64 + 500,
                "s",
                switchers,
                Shape::human(),
            ));
            let (fixed, adaptive) =
                tokio::join!(replay(&people, "fixed"), replay(&people, "adaptive"));
            record(&mut table, 0, &fixed.0, fixed.1);
            record(&mut table, 1, &adaptive.0, adaptive.1);
        }
        stops = overtaken(5).await;
    });
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut stop: Vec<f64> = stops.iter().map(|s| ms(s.0)).collect();
    let mut spent: Vec<f64> = stops.iter().map(|s| ms(s.1)).collect();
    stop.sort_by(|a, b| a.partial_cmp(b).unwrap());
    spent.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "lull typing bench: {reps} repetition(s) of {people} people, {} CPUs, load average at start {}, {:.0} s",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        started.elapsed().as_secs_f64()
    );
    table.print();
    println!(
        "overtaken generation (same process, {} trials): newer message to dropped request p50 {} ms (max {} ms); model time spent on it p50 {} ms of a 2000 ms answer",
        stops.len(),
        fmt(stop[stop.len() / 2]),
        fmt(stop[stop.len() - 1]),
        fmt(spent[spent.len() / 2]),
    );
}

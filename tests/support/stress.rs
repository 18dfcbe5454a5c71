//! The multi-process stress and crash harness.
//!
//! N real `lull run` processes share one database (a fresh SQLite file, or the
//! plan's `DATABASE_URL`, e.g. a PostgreSQL database), each with its own HTTP port and
//! the http adapter, the `echo` responder with a random delay, and one webhook
//! collector. M conversations get random bursts (spread over the processes, a message
//! refused by a dead process is sent again to another, as a platform redelivers).
//! Meanwhile processes holding a lease are killed with SIGKILL and restarted, and (on
//! PostgreSQL, with [`StressPlan::restart_server`]) the database server is restarted
//! once between the kills: every connection drops, ingest is refused with 503 until it
//! is back, renewals and commits fail mid-round. With [`Faults`], the model (a fake
//! OpenAI-compatible server) fails a share of requests with 5xx and refuses some
//! batches as too long, and the webhook refuses, rate limits (429, `Retry-After`), or
//! answers too slowly, a share of deliveries. The faults of the last step hit the write
//! that records a delivery: right after accepting a reply the receiver holds SQLite's
//! write lock past the busy timeout a few times; on PostgreSQL the server restart comes
//! right after a reply was accepted, and one replica's path to the database goes silent
//! for a while ([`StressPlan::freeze_path`]); kills land in the middle of rate-limit
//! waits. At the end the checker compares what the webhook received and what the
//! database holds against the invariants: no message covered twice, none uncovered,
//! every reply fresh (or forced by the cap), fencing tokens only growing, and no reply
//! sent again once lull saw it accepted, unless a kill fell between (a delivered part
//! is a fact).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Mutex as AsyncMutex;

use super::db;
use super::fakes::openai::{Behavior, Chaos, FakeOpenAi};
use super::fakes::webhook::{Answer, Webhook};
use super::freeze_proxy::FreezeProxy;
use super::postgres::Cluster;
use super::process::{LullProcess, post_message};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct StressPlan {
    pub processes: usize,
    pub conversations: usize,
    pub kills: usize,
    /// `false` runs the counter-test: every lease check switched off.
    pub leases: bool,
    pub debounce_ms: u64,
    pub max_wait_ms: u64,
    pub lease_ttl_ms: u64,
    pub poll_ms: u64,
    /// `LULL_ECHO_DELAY_MS` of every process.
    pub echo_delay: String,
    pub bursts: (usize, usize),
    pub burst_len: (usize, usize),
    pub max_gap_ms: u64,
    /// Pause between two bursts of one conversation.
    pub pause_ms: (u64, u64),
    /// Conversations start at random moments within this window.
    pub spread_ms: u64,
    pub seed: u64,
    /// Faults of the model and the webhook mixed into the run; `None` answers with
    /// the offline `echo` responder and a webhook that accepts everything.
    pub faults: Option<Faults>,
    /// The `DATABASE_URL` every process shares (a fresh, empty database); `None`: a
    /// fresh SQLite file.
    pub database: Option<String>,
    /// The PostgreSQL cluster `database` lives on, restarted once mid-run (down for
    /// [`SERVER_DOWN`], between two kills, never during one, right after the webhook
    /// accepted a reply); `None`: no restart. A private cluster: other tests must not
    /// see its server go away.
    pub restart_server: Option<Arc<Cluster>>,
    /// Test-only switches set to `1` in every process (a counter-test turns one
    /// protection off: `LULL_TEST_DEFER_MARKS`, `LULL_TEST_UNBOUNDED_SENDS`).
    pub switches: Vec<&'static str>,
    /// PostgreSQL: the first process reaches the database through a proxy whose path
    /// goes silent once, after the kills, for this long (no reset, no error: a frozen
    /// network), while it holds leases; the others take its conversations over.
    pub freeze_path: Option<Duration>,
}

/// Everyday faults of the services lull depends on.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    /// Share of model requests answered with a 5xx (retried, then backed off).
    pub model_errors: f64,
    /// Share of messages the model refuses as too long (OpenAI's 400
    /// `context_length_exceeded`) in any prompt: their batch is given up with a notice.
    pub poisoned: f64,
    /// Share of webhook POSTs refused with 500, 502 or 404.
    pub webhook_errors: f64,
    /// Share of webhook POSTs answered after `LULL_WEBHOOK_TIMEOUT_MS` (lull gives up
    /// waiting and sends the reply again under the same `webhook-id`).
    pub webhook_slow: f64,
    /// Share of webhook POSTs answered 429 with `Retry-After: 1`: the round waits under
    /// its lease (and some kills land in that wait).
    pub webhook_limited: f64,
    /// Times (SQLite) the receiver, right after accepting a reply and before answering,
    /// takes the database's write lock and holds it past the store's busy timeout
    /// (shortened for the run): the write recording the delivery fails.
    pub locks_after_accept: usize,
}

impl Faults {
    /// What CI mixes in.
    pub(crate) fn ci() -> Faults {
        Faults {
            model_errors: 0.15,
            poisoned: 0.03,
            webhook_errors: 0.10,
            webhook_slow: 0.05,
            webhook_limited: 0.05,
            locks_after_accept: 3,
        }
    }
}

/// What a poisoned message carries; the model fake refuses any prompt with it.
const POISON: &str = "OVERSIZE";
/// The webhook time limit of a faulty run, and how long a slow answer takes.
const WEBHOOK_TIMEOUT_MS: u64 = 400;
/// How long a restarted database server stays down: longer than a lease renewal
/// interval, so rounds in flight lose their renewals and commits.
pub(crate) const SERVER_DOWN: Duration = Duration::from_millis(1500);
/// The lease TTL of a run that restarts the server: a delivered part is recorded once
/// the database is back only while the holder's lease outlives the outage (a successor
/// may claim an expired lease the moment the server is back), so two thirds of it (the
/// lease as last renewed) must outlast the server being down and starting again.
pub(crate) const RESTART_TTL_MS: u64 = 4800;
/// SQLite's busy timeout in a faulty run (`LULL_TEST_BUSY_TIMEOUT_MS`), and how long the
/// receiver holds the write lock: past the one, within the lease's TTL.
const BUSY_TIMEOUT_MS: u64 = 700;
const LOCK_HELD: Duration = Duration::from_millis(1200);
/// How long the receiver waits for the write lock before letting a reply go without
/// it: far within [`SEEN_WITHIN`].
const LOCK_WAIT: Duration = Duration::from_millis(100);
/// An acceptance answered later than this after its request arrived is not taken as
/// seen by lull. lull gives up at [`WEBHOOK_TIMEOUT_MS`] counted from before the
/// request arrived, and a sender at its limit can miss an answer that came a little
/// earlier (reqwest looks at its deadline before the response; a process off the CPU
/// then reads both at once); nor is the handler always dropped the moment the sender
/// hangs up. So an answer near the limit says nothing about what lull saw, and its
/// second delivery is the at-least-once retry receivers deduplicate, not a fact lull
/// forgot.
const SEEN_WITHIN: Duration = Duration::from_millis(WEBHOOK_TIMEOUT_MS / 2);

impl StressPlan {
    /// The short run CI does on every submission.
    pub(crate) fn ci() -> StressPlan {
        StressPlan {
            processes: 3,
            conversations: 50,
            kills: 2,
            leases: true,
            debounce_ms: 300,
            max_wait_ms: 2000,
            lease_ttl_ms: 2400,
            poll_ms: 200,
            echo_delay: "50..400".into(),
            bursts: (1, 3),
            burst_len: (1, 10),
            max_gap_ms: 400,
            pause_ms: (100, 1500),
            spread_ms: 8000,
            seed: 7,
            faults: Some(Faults::ci()),
            database: None,
            restart_server: None,
            switches: Vec::new(),
            freeze_path: None,
        }
    }
}

/// What the run found.
#[derive(Debug, Clone, Default)]
pub(crate) struct StressReport {
    pub processes: usize,
    pub conversations: usize,
    pub messages: usize,
    pub replies: usize,
    pub kills: usize,
    /// Messages covered by more than one distinct reply.
    pub duplicates: usize,
    /// Acknowledged messages no delivered reply covers.
    pub lost: usize,
    /// Unforced replies that missed a message existing at their commit.
    pub stale: usize,
    /// Replies whose fencing token did not grow.
    pub token_regressions: usize,
    /// Replies whose text is not exactly the messages they claim to cover.
    pub text_mismatches: usize,
    /// Replies lull saw accepted (answered within [`SEEN_WITHIN`]) and sent again with
    /// no kill between: a delivery it failed to record (a dropped sent-mark, a send
    /// past its lease).
    pub double_deliveries: usize,
    /// Acceptances answered too late after their request to be taken as seen by lull
    /// (near its time limit): not counted as deliveries it saw.
    pub late_answers: usize,
    /// Times the receiver held the write lock right after accepting a reply.
    pub locks_after_accept: usize,
    /// Kills of a process while the webhook had rate limited one of its deliveries.
    pub kills_in_waits: usize,
    /// Times one process's path to the database went silent.
    pub path_freezes: usize,
    /// The double deliveries, for the failure message: which reply, when.
    pub doubled: Vec<String>,
    /// The disruptions, when (for the failure message).
    pub events: Vec<String>,
    /// For each double delivery: every POST of the reply and the log lines naming it
    /// (for the failure message).
    pub traces: Vec<String>,
    /// The same reply POSTed again after a kill between the POST and recording it
    /// (receivers deduplicate on `reply_id`).
    pub redeliveries: usize,
    /// Messages covered by a give-up notice (the model refused their batch).
    pub given_up: usize,
    /// Model requests the fake failed (5xx and too-long refusals).
    pub model_failures: usize,
    /// Webhook POSTs not accepted (refused, or answered after lull's time limit).
    pub webhook_failures: usize,
    /// `lull_lease_contended_total` summed over every process (sampled).
    pub contended: u64,
    /// Replies the cap forced out.
    pub forced: usize,
    /// Restarts of the database server.
    pub server_restarts: usize,
    /// Messages acknowledged before the server stopped and not yet answered then: the
    /// work the restart caught in flight.
    pub pending_at_restart: usize,
    /// Messages acknowledged after the server was back.
    pub acked_after_restart: usize,
    pub elapsed: Duration,
}

impl fmt::Display for StressReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stress: processes={} conversations={} messages={} replies={} kills={} duplicates={} lost={} stale={} \
             given_up={} model_failures={} webhook_failures={} \
             contended={} forced={} redeliveries={} double_deliveries={} locks_after_accept={} kills_in_waits={} \
             token_regressions={} text_mismatches={} elapsed={:.1}s",
            self.processes,
            self.conversations,
            self.messages,
            self.replies,
            self.kills,
            self.duplicates,
            self.lost,
            self.stale,
            self.given_up,
            self.model_failures,
            self.webhook_failures,
            self.contended,
            self.forced,
            self.redeliveries,
            self.double_deliveries,
            self.locks_after_accept,
            self.kills_in_waits,
            self.token_regressions,
            self.text_mismatches,
            self.elapsed.as_secs_f64()
        )?;
        if self.late_answers > 0 {
            write!(f, " late_answers={}", self.late_answers)?;
        }
        if self.path_freezes > 0 {
            write!(f, " path_freezes={}", self.path_freezes)?;
        }
        if !self.doubled.is_empty() {
            write!(
                f,
                "\n  doubled: {}\n  events: {}",
                self.doubled.join("; "),
                self.events.join("; ")
            )?;
            for trace in &self.traces {
                write!(f, "\n{trace}")?;
            }
        }
        if self.server_restarts > 0 {
            write!(
                f,
                " server_restarts={} pending_at_restart={} acked_after_restart={}",
                self.server_restarts, self.pending_at_restart, self.acked_after_restart
            )?;
        }
        Ok(())
    }
}

/// A message the driver got a 202 for.
#[derive(Debug, Clone)]
struct Acked {
    conversation: String,
    id: String,
    text: String,
    /// When the 202 came.
    at: Instant,
}

pub(crate) async fn run(plan: &StressPlan) -> StressReport {
    let started = Instant::now();
    assert!(
        plan.restart_server.is_none() || plan.lease_ttl_ms >= RESTART_TTL_MS,
        "a lease shorter than the server's outage cannot be kept through it"
    );
    let dir = tempfile::tempdir().unwrap();
    let db_path = match &plan.database {
        Some(url) => db::Location::from_url(url),
        None => db::Location::Sqlite(dir.path().join("lull.db")),
    };
    let webhook = Arc::new(Webhook::start().await);
    let mut env = vec![
        ("DATABASE_URL", db_path.url()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", plan.debounce_ms.to_string()),
        ("LULL_MAX_WAIT_MS", plan.max_wait_ms.to_string()),
        ("LULL_LEASE_TTL_MS", plan.lease_ttl_ms.to_string()),
        ("LULL_POLL_MS", plan.poll_ms.to_string()),
        ("RUST_LOG", "warn,lull_core::dispatcher=debug".into()),
    ];
    if !plan.leases {
        env.push(("LULL_TEST_DISABLE_LEASE", "1".into()));
    }
    for switch in &plan.switches {
        env.push((switch, "1".into()));
    }
    let after_accept = Arc::new(AfterAccept {
        db: db_path.clone(),
        locks_left: AtomicUsize::new(plan.faults.as_ref().map_or(0, |f| f.locks_after_accept)),
        locks: AtomicUsize::new(0),
        locked_until: Mutex::new(Instant::now() + Duration::from_secs(1)),
        cluster: plan.restart_server.clone(),
        restart_armed: AtomicBool::new(false),
        outage: Mutex::new(None),
    });
    {
        let after_accept = after_accept.clone();
        webhook.before_answer(Arc::new(move |_| after_accept.run()));
    }
    // The model: the offline echo responder, or a fake model server with faults that
    // answers in echo's words (so every reply's text can be checked).
    let model = match &plan.faults {
        None => {
            env.push(("LULL_LLM", "echo".into()));
            env.push(("LULL_ECHO_DELAY_MS", plan.echo_delay.clone()));
            None
        }
        Some(faults) => {
            let model = FakeOpenAi::start().await;
            let (min, max) = plan
                .echo_delay
                .split_once("..")
                .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
                .unwrap_or((0, 0));
            model.fallback(Behavior::Chaos(Chaos {
                delay_ms: (min, max),
                server_errors: faults.model_errors,
                poison: POISON.into(),
            }));
            webhook.otherwise(Answer::Flaky {
                fail: faults.webhook_errors,
                slow: faults.webhook_slow,
                slow_for: Duration::from_millis(WEBHOOK_TIMEOUT_MS * 2),
                limited: faults.webhook_limited,
            });
            if faults.locks_after_accept > 0 {
                env.push(("LULL_TEST_BUSY_TIMEOUT_MS", BUSY_TIMEOUT_MS.to_string()));
            }
            env.push(("LULL_LLM", "openai".into()));
            env.push(("OPENAI_BASE_URL", model.base_url.clone()));
            env.push(("OPENAI_MODEL", "fake-model".into()));
            env.push(("LULL_WEBHOOK_TIMEOUT_MS", WEBHOOK_TIMEOUT_MS.to_string()));
            Some(model)
        }
    };
    let proxy = plan.freeze_path.map(|_| {
        let url = plan
            .database
            .as_deref()
            .expect("a frozen path needs PostgreSQL");
        Arc::new(FreezeProxy::for_postgres(url))
    });
    let mut processes = Vec::new();
    for i in 0..plan.processes {
        let mut env = env.clone();
        if let (0, Some(proxy)) = (i, &proxy) {
            env.retain(|(key, _)| *key != "DATABASE_URL");
            env.push(("DATABASE_URL", proxy.url(&db_path.url())));
        }
        processes.push(LullProcess::start(
            dir.path(),
            &format!("lull{i}"),
            &["run"],
            &env,
        ));
    }
    for p in &mut processes {
        p.wait_healthy(Duration::from_secs(20)).await;
    }
    let urls: Arc<Vec<String>> = Arc::new(processes.iter().map(LullProcess::base_url).collect());
    let processes: Arc<Vec<AsyncMutex<LullProcess>>> =
        Arc::new(processes.into_iter().map(AsyncMutex::new).collect());

    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));
    let contended = Arc::new(Mutex::new(ContendedSamples::default()));
    let sampling = tokio::spawn(sample_contention(urls.clone(), contended.clone()));

    let mut drivers = tokio::task::JoinSet::new();
    for c in 0..plan.conversations {
        drivers.spawn(drive_conversation(
            plan.clone(),
            c,
            urls.clone(),
            acked.clone(),
        ));
    }
    let disrupting = tokio::spawn(disrupt(
        plan.clone(),
        processes.clone(),
        db_path.clone(),
        webhook.clone(),
        after_accept.clone(),
        proxy.clone(),
    ));
    while let Some(result) = drivers.join_next().await {
        result.expect("driver task");
    }
    let disrupted = disrupting.await.expect("disrupting task");

    let acked_count = acked.lock().unwrap().len();
    wait_quiescent(&db_path, &webhook, acked_count, Duration::from_secs(120)).await;
    sampling.abort();
    sample_once(&urls, &contended).await;

    let acked = acked.lock().unwrap().clone();
    let mut report = check(&acked, &webhook, &db_path);
    // A kill, or a path to the database gone silent, between a reply's acceptance and
    // its sent-mark is the window no holder can close (it cannot reach the database):
    // counted apart. A server restart is not such a break: the holder's lease outlives
    // it, and the mark must be written once the server is back.
    let breaks: Vec<(Instant, Instant)> = disrupted
        .kill_times
        .iter()
        .map(|&k| (k, k))
        .chain(disrupted.frozen)
        .collect();
    let doubled = double_deliveries(&webhook, &breaks);
    report.double_deliveries = doubled.len();
    report.late_answers = late_answers(&webhook);
    let at = |t: Instant| t.duration_since(started).as_secs_f64();
    report.doubled = doubled
        .iter()
        .map(|(reply, first, second)| {
            format!(
                "reply {reply} accepted at {:.2}s and sent again at {:.2}s",
                at(*first),
                at(*second)
            )
        })
        .collect();
    report.traces = doubled
        .iter()
        .map(|(reply, _, _)| trace_of(*reply, &webhook, &processes, &db_path, started))
        .collect();
    report.events = disrupted
        .kill_times
        .iter()
        .map(|k| format!("kill at {:.2}s", at(*k)))
        .chain(
            disrupted
                .frozen
                .map(|(from, to)| format!("path frozen {:.2}s..{:.2}s", at(from), at(to))),
        )
        .chain(
            disrupted
                .outage
                .map(|(from, to)| format!("server down {:.2}s..{:.2}s", at(from), at(to))),
        )
        .collect();
    report.path_freezes = usize::from(disrupted.frozen.is_some());
    report.locks_after_accept = after_accept.locks.load(Ordering::SeqCst);
    report.kills_in_waits = disrupted.kills_in_waits;
    if let Some(model) = &model {
        report.model_failures = model.failures();
    }
    report.webhook_failures = webhook.request_log().len() - webhook.received().len();
    report.processes = plan.processes;
    report.conversations = plan.conversations;
    report.kills = disrupted.kill_times.len();
    if let Some(outage) = disrupted.outage {
        report.server_restarts = 1;
        let (pending, after) = around_outage(&acked, &webhook, outage);
        report.pending_at_restart = pending;
        report.acked_after_restart = after;
    }
    report.contended = contended.lock().unwrap().total();
    report.elapsed = started.elapsed();
    drop(processes);
    report
}

/// One conversation's traffic: a few bursts of messages with random gaps.
async fn drive_conversation(
    plan: StressPlan,
    c: usize,
    urls: Arc<Vec<String>>,
    acked: Arc<Mutex<Vec<Acked>>>,
) {
    let mut rng =
        fastrand::Rng::with_seed(plan.seed.wrapping_mul(1_000_003).wrapping_add(c as u64));
    let client = reqwest::Client::new();
    let conversation = format!("c{c}");
    tokio::time::sleep(Duration::from_millis(rng.u64(0..=plan.spread_ms))).await;
    let mut n = 0;
    for burst in 0..rng.usize(plan.bursts.0..=plan.bursts.1) {
        if burst > 0 {
            tokio::time::sleep(Duration::from_millis(
                rng.u64(plan.pause_ms.0..=plan.pause_ms.1),
            ))
            .await;
        }
        for _ in 0..rng.usize(plan.burst_len.0..=plan.burst_len.1) {
            let id = format!("m{n}");
            let poisoned = plan.faults.as_ref().is_some_and(|f| rng.f64() < f.poisoned);
            let text = if poisoned {
                format!("{conversation} {id} {POISON}")
            } else {
                format!("{conversation} {id}")
            };
            send_until_stored(&client, &urls, &mut rng, &conversation, &id, &text).await;
            acked.lock().unwrap().push(Acked {
                conversation: conversation.clone(),
                id,
                text,
                at: Instant::now(),
            });
            n += 1;
            tokio::time::sleep(Duration::from_millis(rng.u64(0..=plan.max_gap_ms))).await;
        }
    }
}

/// POST to a random process until one answers 202 (a dead process's refusal is
/// redelivered elsewhere, as a platform would).
async fn send_until_stored(
    client: &reqwest::Client,
    urls: &[String],
    rng: &mut fastrand::Rng,
    conversation: &str,
    id: &str,
    text: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut target = rng.usize(0..urls.len());
    loop {
        match post_message(client, &urls[target], conversation, id, text).await {
            Ok(r) if r.status().as_u16() == 202 => return,
            Ok(r) if r.status().as_u16() == 503 => {}
            Ok(r) => panic!(
                "{conversation}/{id} refused: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "{conversation}/{id}: no process stored it within 60 s"
        );
        target = (target + 1) % urls.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the disrupting task did.
#[derive(Debug, Clone)]
struct Disrupted {
    /// When each kill happened.
    kill_times: Vec<Instant>,
    /// Kills of a process while the webhook rate limited one of its deliveries.
    kills_in_waits: usize,
    /// When the database server was stopped and when it accepted connections again.
    outage: Option<(Instant, Instant)>,
    /// When the first process's path to the database went silent, and came back.
    frozen: Option<(Instant, Instant)>,
}

/// What the receiver does right after accepting a reply, before answering it: the
/// faults that hit the write recording a delivery.
struct AfterAccept {
    db: db::Location,
    /// Write locks still to take (SQLite), and taken.
    locks_left: AtomicUsize,
    locks: AtomicUsize,
    /// One lock at a time, with room between them.
    locked_until: Mutex<Instant>,
    /// The server to stop right after the next accepted reply, once armed.
    cluster: Option<Arc<Cluster>>,
    restart_armed: AtomicBool,
    outage: Mutex<Option<(Instant, Instant)>>,
}

impl AfterAccept {
    /// Runs on a blocking thread before the webhook answers a reply it accepted.
    fn run(self: &Arc<Self>) {
        if self.restart_armed.swap(false, Ordering::SeqCst)
            && let Some(cluster) = self.cluster.clone()
        {
            // Down before the answer goes out: the write recording it fails.
            let stopped = Instant::now();
            cluster.stop_at_once();
            let me = self.clone();
            std::thread::spawn(move || {
                std::thread::sleep(SERVER_DOWN);
                cluster.start_again();
                *me.outage.lock().unwrap() = Some((stopped, Instant::now()));
            });
            return;
        }
        let db::Location::Sqlite(path) = &self.db else {
            return;
        };
        // Not at random: the first reply accepted once the previous lock is well past
        // (so every run has its locks, spread over the traffic).
        if self.locks_left.load(Ordering::SeqCst) == 0 {
            return;
        }
        {
            let mut until = self.locked_until.lock().unwrap();
            if Instant::now() < *until {
                return;
            }
            *until = Instant::now() + LOCK_HELD * 4;
        }
        if self
            .locks_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return;
        }
        // Taken at once or not at all: an answer held back while other writers keep
        // the lock would reach lull near its time limit, where lull may not see it.
        if db::try_hold_write_lock(path, LOCK_HELD, LOCK_WAIT) {
            self.locks.fetch_add(1, Ordering::SeqCst);
        } else {
            self.locks_left.fetch_add(1, Ordering::SeqCst);
            *self.locked_until.lock().unwrap() = Instant::now();
        }
    }
}

/// Kill processes that hold a conversation lease (mid-generation or mid-delivery; every
/// other kill, if it can, one waiting out a 429 the webhook just answered), spread over
/// the traffic, and restart each on its port; restart the database server once
/// halfway, right after the webhook accepted a reply, if the plan says so. One event at
/// a time: a process restarted while the server is down would refuse to start, and the
/// checker's reads need the server.
async fn disrupt(
    plan: StressPlan,
    processes: Arc<Vec<AsyncMutex<LullProcess>>>,
    db_path: db::Location,
    webhook: Arc<Webhook>,
    after_accept: Arc<AfterAccept>,
    proxy: Option<Arc<FreezeProxy>>,
) -> Disrupted {
    let mut rng = fastrand::Rng::with_seed(plan.seed ^ 0xdead_beef);
    let restart_at = plan.restart_server.as_ref().map(|_| plan.kills / 2);
    let events = plan.kills + usize::from(restart_at.is_some()) + usize::from(proxy.is_some());
    let interval = Duration::from_millis(plan.spread_ms / (events as u64 + 1));
    let mut done = Disrupted {
        kill_times: Vec::new(),
        kills_in_waits: 0,
        outage: None,
        frozen: None,
    };
    for event in 0..events {
        tokio::time::sleep(interval).await;
        if let (Some(proxy), Some(frozen_for)) = (&proxy, plan.freeze_path)
            && event == events - 1
        {
            // While the first process holds a lease, if it does within a while.
            let holder = find_holder(&db_path, &processes[..1]).await;
            proxy.freeze();
            let frozen_at = Instant::now();
            tracing_line(&format!(
                "froze process 0's database path (holding a lease: {})",
                holder.is_some()
            ));
            tokio::time::sleep(frozen_for).await;
            proxy.thaw();
            done.frozen = Some((frozen_at, Instant::now()));
            continue;
        }
        if let (Some(at), Some(cluster)) = (restart_at, &plan.restart_server)
            && event == at
        {
            // Right after a reply was accepted (mid-round, like the kills).
            after_accept.restart_armed.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(5);
            while after_accept.outage.lock().unwrap().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if after_accept.restart_armed.swap(false, Ordering::SeqCst) {
                // No reply was accepted meanwhile: restarted anyway.
                let _ = find_holder(&db_path, &processes).await;
                let cluster = cluster.clone();
                let stopped = Instant::now();
                tokio::task::spawn_blocking(move || cluster.restart(SERVER_DOWN))
                    .await
                    .expect("restart the database server");
                done.outage = Some((stopped, Instant::now()));
            } else {
                while after_accept.outage.lock().unwrap().is_none() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                done.outage = *after_accept.outage.lock().unwrap();
            }
            continue;
        }
        let in_wait = if done.kill_times.len() % 2 == 1 {
            holder_in_a_wait(&db_path, &processes, &webhook).await
        } else {
            None
        };
        let victim = match in_wait {
            Some(victim) => {
                done.kills_in_waits += 1;
                victim
            }
            None => find_holder(&db_path, &processes)
                .await
                .unwrap_or_else(|| rng.usize(0..processes.len())),
        };
        let mut process = processes[victim].lock().await;
        process.kill9();
        done.kill_times.push(Instant::now());
        tokio::time::sleep(Duration::from_millis(rng.u64(200..=800))).await;
        process.restart();
        process.wait_healthy(Duration::from_secs(20)).await;
    }
    done
}

/// A line of the harness's own in the test output.
fn tracing_line(line: &str) {
    println!("stress: {line}");
}

/// The index of a process waiting out a 429 the webhook answered within the last
/// 300 ms (it still holds that conversation's lease), looking for up to five seconds.
async fn holder_in_a_wait(
    db_path: &db::Location,
    processes: &[AsyncMutex<LullProcess>],
    webhook: &Webhook,
) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let recent: BTreeSet<String> = webhook
            .rate_limited()
            .into_iter()
            .filter(|(_, at)| at.elapsed() < Duration::from_millis(300))
            .map(|(conversation, _)| conversation)
            .collect();
        for conversation in recent {
            if let Some(pid) = holder_of(db_path, &conversation) {
                for (i, process) in processes.iter().enumerate() {
                    if process.lock().await.pid() == Some(pid) {
                        return Some(i);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The pid of the process holding the live lease of conversation `key`, if any.
fn holder_of(db_path: &db::Location, key: &str) -> Option<u32> {
    live_holder_pids(db_path, Some(key)).into_iter().next()
}

/// Replies lull saw accepted and then sent again, with no break (a kill, a silent
/// path: `breaks`, as intervals) between the two: each such later POST, whatever the
/// receiver answered it, is a delivery that was made and then forgotten. Seen:
/// answered 2xx within [`SEEN_WITHIN`] of the request's arrival. (reply, the seen
/// acceptance, the next POST of the reply.)
pub(crate) fn double_deliveries(
    webhook: &Webhook,
    breaks: &[(Instant, Instant)],
) -> Vec<(i64, Instant, Instant)> {
    let posts: Vec<(i64, Instant)> = webhook
        .request_log()
        .iter()
        .filter_map(|request| Some((reply_of(request)?, request.at)))
        .collect();
    webhook
        .answered()
        .into_iter()
        .filter(|seen| seen.took < SEEN_WITHIN)
        .filter_map(|seen| {
            let again = posts
                .iter()
                .filter(|(reply, at)| *reply == seen.reply_id && *at > seen.at)
                .map(|(_, at)| *at)
                .min()?;
            Some((seen.reply_id, seen.at, again))
        })
        .filter(|(_, first, again)| {
            !breaks
                .iter()
                .any(|(from, to)| *from <= *again && *to >= *first)
        })
        .collect()
}

/// The reply a POST delivers, if its body says.
fn reply_of(request: &super::fakes::webhook::Request) -> Option<i64> {
    serde_json::from_slice::<serde_json::Value>(&request.body).ok()?["reply_id"].as_i64()
}

/// Acceptances answered too late to be taken as seen by lull (see [`SEEN_WITHIN`]).
fn late_answers(webhook: &Webhook) -> usize {
    webhook
        .answered()
        .iter()
        .filter(|a| a.took >= SEEN_WITHIN)
        .count()
}

/// What happened to reply `reply`: every POST of it (when, its webhook id) and every
/// line any process logged naming its outbox row or its conversation.
fn trace_of(
    reply: i64,
    webhook: &Webhook,
    processes: &[AsyncMutex<LullProcess>],
    db_path: &db::Location,
    started: Instant,
) -> String {
    let at = |t: Instant| t.duration_since(started).as_secs_f64();
    let conversation = db::count(
        db_path,
        &format!("SELECT conversation_id FROM outbox WHERE id = {reply}"),
    );
    let mut out = format!("  reply {reply}:");
    for request in webhook.request_log() {
        if reply_of(&request) != Some(reply) {
            continue;
        }
        out += &format!(
            "\n    POST at {:.2}s, webhook-id {}",
            at(request.at),
            request.webhook_id.as_deref().unwrap_or("-")
        );
    }
    let names = [
        format!("outbox={reply} "),
        format!("conversation={conversation} "),
        format!("conversation/{conversation} "),
    ];
    for process in processes {
        let Ok(process) = process.try_lock() else {
            continue;
        };
        for line in process.logs().lines() {
            let line = format!("{line} ");
            if names.iter().any(|name| line.contains(name)) {
                out += &format!("\n    {}: {}", process.name, line.trim_end());
            }
        }
    }
    out
}

/// Around an outage from `stopped` to `back`: how many acknowledged messages were
/// still unanswered when the server stopped (no answer had reached the webhook), and
/// how many were acknowledged after it was back.
fn around_outage(
    acked: &[Acked],
    webhook: &Webhook,
    (stopped, back): (Instant, Instant),
) -> (usize, usize) {
    let answered_before = covered(answers(webhook).into_iter().filter(|r| r.at < stopped));
    let pending = acked
        .iter()
        .filter(|m| m.at < stopped)
        .filter(|m| !answered_before.contains(&(m.conversation.clone(), m.id.clone())))
        .count();
    let after = acked.iter().filter(|m| m.at > back).count();
    (pending, after)
}

/// The index of a process that holds a live conversation lease right now, looking for
/// up to two seconds.
async fn find_holder(
    db_path: &db::Location,
    processes: &[AsyncMutex<LullProcess>],
) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let holders = live_holder_pids(db_path, None);
        for (i, process) in processes.iter().enumerate() {
            if let Some(pid) = process.lock().await.pid()
                && holders.contains(&pid)
            {
                return Some(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Pids of processes holding a live conversation lease (holder ids are
/// `host:pid:random`); only conversation `key`'s, if given.
fn live_holder_pids(db_path: &db::Location, key: Option<&str>) -> BTreeSet<u32> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let only = key.map_or_else(String::new, |key| {
        format!(" AND conversation_id = (SELECT id FROM conversations WHERE key = '{key}')")
    });
    db::rows(
        db_path,
        &format!(
            "SELECT holder FROM leases WHERE holder IS NOT NULL AND expires_at > {now} AND conversation_id IS NOT NULL{only}"
        ),
    )
    .into_iter()
    .filter_map(|row| {
        row[0]
            .rsplit(':')
            .nth(1)
            .and_then(|pid| pid.parse().ok())
    })
    .collect()
}

/// Contention counters per process; a counter that went down means the process was
/// restarted, and the earlier incarnation's last value is kept.
#[derive(Debug, Default)]
struct ContendedSamples {
    current: BTreeMap<usize, u64>,
    finished: u64,
}

impl ContendedSamples {
    fn record(&mut self, process: usize, value: u64) {
        let current = self.current.entry(process).or_default();
        if value < *current {
            self.finished += *current;
        }
        *current = value;
    }

    fn total(&self) -> u64 {
        self.finished + self.current.values().sum::<u64>()
    }
}

async fn sample_once(urls: &[String], samples: &Mutex<ContendedSamples>) {
    for (i, url) in urls.iter().enumerate() {
        let Ok(response) = reqwest::get(format!("{url}/metrics")).await else {
            continue;
        };
        let Ok(text) = response.text().await else {
            continue;
        };
        if let Some(value) = super::process::parse_metrics(&text).get("lull_lease_contended_total")
        {
            samples.lock().unwrap().record(i, *value as u64);
        }
    }
}

async fn sample_contention(urls: Arc<Vec<String>>, samples: Arc<Mutex<ContendedSamples>>) {
    loop {
        sample_once(&urls, &samples).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Wait until nothing is pending or undelivered and the webhook has covered every
/// acknowledged message (or the limit passes; the checker then reports what is lost).
async fn wait_quiescent(
    db_path: &db::Location,
    webhook: &Webhook,
    messages: usize,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let pending = db::count(db_path, "SELECT COUNT(*) FROM timers");
        let undelivered = db::count(
            db_path,
            "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL",
        );
        let covered = covered(answers(webhook));
        if pending == 0 && undelivered == 0 && covered.len() >= messages {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `(conversation, message id)` pairs `answers` cover.
fn covered(
    answers: impl IntoIterator<Item = super::fakes::webhook::Received>,
) -> BTreeSet<(String, String)> {
    answers
        .into_iter()
        .flat_map(|r| {
            r.covers
                .into_iter()
                .map(move |id| (r.conversation.clone(), id))
        })
        .collect()
}

/// What the webhook accepted that answers messages: replies, and notices that gave up
/// on a batch (they cover what the model refused).
fn answers(webhook: &Webhook) -> Vec<super::fakes::webhook::Received> {
    webhook
        .received()
        .into_iter()
        .filter(|r| r.kind == "reply" || !r.covers.is_empty())
        .collect()
}

fn check(acked: &[Acked], webhook: &Webhook, db_path: &db::Location) -> StressReport {
    let received = answers(webhook);
    let mut distinct: BTreeMap<i64, &super::fakes::webhook::Received> = BTreeMap::new();
    for reply in &received {
        distinct.entry(reply.reply_id).or_insert(reply);
    }
    let mut coverage: BTreeMap<(&str, &str), BTreeSet<i64>> = BTreeMap::new();
    for reply in distinct.values() {
        for id in &reply.covers {
            coverage
                .entry((reply.conversation.as_str(), id.as_str()))
                .or_default()
                .insert(reply.reply_id);
        }
    }
    let texts: BTreeMap<(&str, &str), &str> = acked
        .iter()
        .map(|m| ((m.conversation.as_str(), m.id.as_str()), m.text.as_str()))
        .collect();
    let mut report = StressReport {
        messages: acked.len(),
        replies: distinct.values().filter(|r| r.kind == "reply").count(),
        redeliveries: received.len() - distinct.len(),
        given_up: distinct
            .values()
            .filter(|r| r.kind != "reply")
            .map(|r| r.covers.len())
            .sum(),
        ..StressReport::default()
    };
    for m in acked {
        match coverage.get(&(m.conversation.as_str(), m.id.as_str())) {
            None => report.lost += 1,
            Some(replies) => report.duplicates += replies.len() - 1,
        }
    }
    for reply in distinct.values().filter(|r| r.kind == "reply") {
        let lines: Vec<&str> = reply.text.lines().skip(1).collect();
        let expected: Vec<&str> = reply
            .covers
            .iter()
            .map(|id| {
                texts
                    .get(&(reply.conversation.as_str(), id.as_str()))
                    .copied()
                    .unwrap_or("?")
            })
            .collect();
        if lines != expected {
            report.text_mismatches += 1;
        }
    }
    let verdict = db::check(db_path);
    report.stale = verdict.stale;
    report.token_regressions = verdict.token_regressions;
    report.forced = db::count(
        db_path,
        "SELECT COUNT(*) FROM outbox WHERE kind = 'reply' AND forced",
    ) as usize;
    // The database must agree with what the webhook saw.
    report.duplicates = report.duplicates.max(verdict.duplicates);
    report.lost = report.lost.max(verdict.lost);
    report
}

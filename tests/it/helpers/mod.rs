//! Shared test scaffolding: dispatchers ("nodes") running in their own runtimes so a
//! test can crash one mid-generation, an outbound that records what it delivered, and
//! responders a test can hold mid-generation.

#![allow(dead_code)]

pub(crate) use crate::support::db;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lull_core::clock::SystemClock;
use lull_core::dispatcher::{Accepted, DispatchSettings, Dispatcher, Event};
use lull_core::domain::{ConversationRef, OutboxId, Platform};
use lull_core::llm::echo::{EchoDelay, EchoResponder};
use lull_core::llm::{Generation, LlmError, Partial, Prompt, Responder};
use lull_core::store::{FaultPlan, OutboxKind, PostgresStore, SqliteStore, Store, TimeSource};
use lull_core::timing::{LeaseTiming, TimerPolicy};
use lull_port::{Content, Incoming, IncomingKind, Outbound, OutgoingPart, SendError};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A fresh database file in its own temporary folder (removed on drop).
pub(crate) struct TempDb {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub(crate) fn temp_db() -> TempDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("lull.db");
    TempDb { _dir: dir, path }
}

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh database of either backend: a file in its own temporary folder, or a new
/// database on the test cluster.
pub(crate) enum TestDb {
    Sqlite(TempDb),
    Postgres(db::Postgres),
}

impl TestDb {
    /// A fresh database; `None` when the backend is PostgreSQL and it is not installed
    /// here (the test returns: skipped, as the cluster helper printed).
    pub(crate) fn new(backend: Backend) -> Option<TestDb> {
        match backend {
            Backend::Sqlite => Some(TestDb::Sqlite(temp_db())),
            Backend::Postgres => crate::support::postgres::fresh_database()
                .map(|url| TestDb::Postgres(db::Postgres(url))),
        }
    }

    /// Its `DATABASE_URL`, for a `lull` process.
    pub(crate) fn url(&self) -> String {
        match self {
            TestDb::Sqlite(db) => format!("sqlite:{}", db.path.display()),
            TestDb::Postgres(db) => db.0.clone(),
        }
    }

    /// Open a store on it as a process would (PostgreSQL on the database's clock),
    /// with its leases and fault plan as the test asks.
    pub(crate) async fn open(
        &self,
        timers: TimerPolicy,
        leases: Leases,
        faults: Option<Arc<FaultPlan>>,
    ) -> Arc<dyn Store> {
        match self {
            TestDb::Sqlite(db) => {
                let mut store = SqliteStore::open(&db.path, timers).expect("open db");
                if leases == Leases::Disabled {
                    store = store.without_lease_checks();
                }
                if let Some(plan) = faults {
                    store = store.with_faults(plan);
                }
                Arc::new(store)
            }
            TestDb::Postgres(db) => {
                let mut store = PostgresStore::open(&db.0, timers, TimeSource::Database)
                    .await
                    .expect("open the PostgreSQL store");
                if leases == Leases::Disabled {
                    store = store.without_lease_checks();
                }
                if let Some(plan) = faults {
                    store = store.with_faults(plan);
                }
                Arc::new(store)
            }
        }
    }
}

impl db::Database for TestDb {
    fn db(&self) -> db::Db<'_> {
        match self {
            TestDb::Sqlite(db) => db::Db::Sqlite(&db.path),
            TestDb::Postgres(db) => db::Db::Postgres(&db.0),
        }
    }
}

/// Runs `$body` (an async fn taking a [`Backend`]) as two tests, one per backend:
/// `$name::sqlite` and `$name::postgres` (skipped without PostgreSQL).
#[macro_export]
macro_rules! on_both_backends {
    ($name:ident, $body:path) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $body($crate::helpers::Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $body($crate::helpers::Backend::Postgres).await
            }
        }
    };
}

/// Settings with short timings for tests.
pub(crate) fn settings(debounce: u64, max_wait: u64, ttl: u64) -> DispatchSettings {
    DispatchSettings {
        timers: TimerPolicy::new(ms(debounce), ms(max_wait), 20).unwrap(),
        lease: LeaseTiming::with_ttl(ms(ttl)).unwrap(),
        poll_every: ms(50),
        ..DispatchSettings::default()
    }
}

/// One delivered part, as the platform saw it.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub conversation: ConversationRef,
    pub outbox: OutboxId,
    pub kind: OutboxKind,
    pub text: String,
    pub covers: Vec<String>,
    /// The texts of the quick replies offered with the part.
    pub quick_replies: Vec<String>,
    pub at: Instant,
}

/// An outbound for the `http` platform that records every part it is given.
pub(crate) struct RecordingOutbound {
    pub platform: Platform,
    pub sent: Mutex<Vec<Delivered>>,
    changed: Notify,
    /// While set, sends hang (a process stuck mid-delivery).
    pub hang: std::sync::atomic::AtomicBool,
    /// The next this-many sends fail with `fail_with`.
    pub fail_next: AtomicUsize,
    pub fail_with: Mutex<Option<SendError>>,
    /// Every send attempt, successful or not.
    pub attempts: AtomicUsize,
}

impl RecordingOutbound {
    pub(crate) fn new(platform: Platform) -> Arc<Self> {
        Arc::new(Self {
            platform,
            sent: Mutex::new(Vec::new()),
            changed: Notify::new(),
            hang: Default::default(),
            fail_next: AtomicUsize::new(0),
            fail_with: Mutex::new(None),
            attempts: AtomicUsize::new(0),
        })
    }

    /// Make the next `n` sends fail with `error`.
    pub(crate) fn fail(&self, n: usize, error: SendError) {
        *self.fail_with.lock().unwrap() = Some(error);
        self.fail_next.store(n, Ordering::SeqCst);
    }

    pub(crate) fn replies(&self) -> Vec<Delivered> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.kind == OutboxKind::Reply)
            .cloned()
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<Delivered> {
        self.sent.lock().unwrap().clone()
    }

    /// Wait until at least `n` replies were delivered; panics after `limit`.
    pub(crate) async fn wait_replies(&self, n: usize, limit: Duration) -> Vec<Delivered> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            let replies = self.replies();
            if replies.len() >= n {
                return replies;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "expected {n} replies within {limit:?}, got {}: {:#?}",
                    replies.len(),
                    replies
                );
            }
        }
    }
}

#[async_trait]
impl Outbound for RecordingOutbound {
    fn platform(&self) -> Platform {
        self.platform
    }

    fn split(&self, text: &str) -> Vec<String> {
        lull_port::split::split_message(text, 4096)
    }

    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError> {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(self.fail_with.lock().unwrap().clone().expect("failure set"));
        }
        self.sent.lock().unwrap().push(Delivered {
            conversation: part.conversation.clone(),
            outbox: part.outbox_id,
            kind: part.kind,
            text: part.text.to_owned(),
            covers: part.covers.to_vec(),
            quick_replies: part.quick_replies.iter().map(|r| r.text.clone()).collect(),
            at: Instant::now(),
        });
        self.changed.notify_waiters();
        Ok(())
    }

    async fn typing(&self, _conversation: &ConversationRef) -> Result<(), SendError> {
        Ok(())
    }

    fn typing_every(&self) -> Option<Duration> {
        None
    }
}

/// A responder that reports each generation as it starts and finishes only when the
/// test opens its gate (one permit per generation). Replies like `echo`.
pub(crate) struct GatedResponder {
    started: mpsc::UnboundedSender<usize>,
    gate: Semaphore,
    pub calls: AtomicUsize,
}

impl GatedResponder {
    pub(crate) fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<usize>) {
        let (started, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Self {
                started,
                gate: Semaphore::new(0),
                calls: AtomicUsize::new(0),
            }),
            rx,
        )
    }

    /// Let `n` generations finish.
    pub(crate) fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

#[async_trait]
impl Responder for GatedResponder {
    fn name(&self) -> &'static str {
        "gated"
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let _ = self.started.send(prompt.batch.len());
        self.gate.acquire().await.expect("gate open").forget();
        EchoResponder::new(EchoDelay::fixed(0))
            .respond(prompt, partial)
            .await
    }
}

/// Counts calls to the echo responder.
pub(crate) struct CountingEcho {
    inner: EchoResponder,
    pub calls: AtomicUsize,
}

impl CountingEcho {
    pub(crate) fn new(delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: EchoResponder::new(EchoDelay::fixed(delay_ms)),
            calls: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Responder for CountingEcho {
    fn name(&self) -> &'static str {
        "counting-echo"
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.respond(prompt, partial).await
    }
}

/// A dispatcher with its scheduler running in a runtime of its own, so that the test
/// can kill it abruptly (as `kill -9` would: no lease released, nothing flushed).
pub(crate) struct Node {
    pub dispatcher: Arc<Dispatcher>,
    pub outbound: Arc<RecordingOutbound>,
    runtime: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
}

/// Whether the node's store enforces leases (the counter-test turns them off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leases {
    Enforced,
    Disabled,
}

impl Node {
    pub(crate) fn start(
        db: &Path,
        settings: DispatchSettings,
        responder: Arc<dyn Responder>,
        leases: Leases,
    ) -> Node {
        let store = SqliteStore::open(db, settings.timers).expect("open db");
        let store = match leases {
            Leases::Enforced => store,
            Leases::Disabled => store.without_lease_checks(),
        };
        Self::start_with_store(Arc::new(store), settings, responder)
    }

    /// A node on a test database of either backend.
    pub(crate) async fn on(
        db: &TestDb,
        settings: DispatchSettings,
        responder: Arc<dyn Responder>,
        leases: Leases,
    ) -> Node {
        let store = db.open(settings.timers, leases, None).await;
        Self::start_with_store(store, settings, responder)
    }

    pub(crate) fn start_with_store(
        store: Arc<dyn lull_core::store::Store>,
        settings: DispatchSettings,
        responder: Arc<dyn Responder>,
    ) -> Node {
        Self::start_on(Platform::Http, store, settings, responder)
    }

    /// A node serving `platform` (its outbound records under that platform).
    pub(crate) fn start_on(
        platform: Platform,
        store: Arc<dyn lull_core::store::Store>,
        settings: DispatchSettings,
        responder: Arc<dyn Responder>,
    ) -> Node {
        Self::start_built(platform, |outbound| {
            Dispatcher::builder(store, responder, settings, Arc::new(SystemClock))
                .outbounds(vec![outbound as Arc<dyn Outbound>])
        })
    }

    /// A node serving `platform`, its dispatcher built by `build` (handed the node's
    /// recording outbound): for a dispatcher with a toolbox or a transcriber.
    pub(crate) fn start_built(
        platform: Platform,
        build: impl FnOnce(Arc<RecordingOutbound>) -> lull_core::dispatcher::DispatcherBuilder,
    ) -> Node {
        let outbound = RecordingOutbound::new(platform);
        let dispatcher = build(outbound.clone()).build();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("node runtime");
        let stop = CancellationToken::new();
        runtime.spawn(dispatcher.clone().run(stop.clone()));
        Node {
            dispatcher,
            outbound,
            runtime: Some(runtime),
            stop,
        }
    }

    pub(crate) fn events(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.dispatcher.subscribe()
    }

    /// Kill the node abruptly: every task stops where it is; its leases stay in the
    /// database until they expire.
    pub(crate) fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Stop gracefully (rounds finish within the grace period).
    pub(crate) async fn stop(mut self) {
        self.stop.cancel();
        if let Some(runtime) = self.runtime.take() {
            tokio::task::spawn_blocking(move || runtime.shutdown_timeout(Duration::from_secs(15)))
                .await
                .unwrap();
        }
    }

    pub(crate) async fn send(&self, conversation: &str, id: &str, text: &str) -> Accepted {
        let mut incoming = message(conversation, id, text);
        incoming.conversation.platform = self.outbound.platform;
        self.dispatcher.ingest(incoming).await.expect("ingest")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A new text message on the http platform.
pub(crate) fn message(conversation: &str, id: &str, text: &str) -> Incoming {
    Incoming {
        conversation: ConversationRef::new(Platform::Http, conversation),
        is_group: false,
        user_id: "user".into(),
        chats: Vec::new(),
        author: "User".into(),
        title: None,
        message_id: id.into(),
        content: Content::Text(text.into()),
        media: Vec::new(),
        kind: IncomingKind::New,
    }
}

/// Wait for the first event matching `pick`; panics after `limit`.
pub(crate) async fn wait_event<T>(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    limit: Duration,
    mut pick: impl FnMut(&Event) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) => {
                if let Some(found) = pick(&event) {
                    return found;
                }
            }
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("event stream ended: {e}"),
            Err(_) => panic!("no matching event within {limit:?}"),
        }
    }
}

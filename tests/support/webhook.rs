//! A webhook on loopback that records every reply the http adapter POSTs, and can be
//! told to fail the next requests (to exercise retries).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde::Deserialize;
use tokio::sync::Notify;

/// One POST the webhook received.
#[derive(Debug, Clone, Deserialize)]
pub struct Received {
    pub conversation: String,
    pub text: String,
    pub covers: Vec<String>,
    pub reply_id: i64,
    pub kind: String,
    #[serde(skip, default = "Instant::now")]
    pub at: Instant,
}

#[derive(Default)]
struct Inner {
    received: Mutex<Vec<Received>>,
    changed: Notify,
    fail_next: AtomicUsize,
    requests: AtomicUsize,
}

/// The collector; dropping it stops the server.
pub struct Webhook {
    pub url: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl Webhook {
    pub async fn start() -> Webhook {
        let inner = Arc::new(Inner::default());
        let router = Router::new()
            .route("/replies", post(receive))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Webhook {
            url: format!("http://{addr}/replies"),
            inner,
            _server: server,
        }
    }

    /// Answer the next `n` requests with HTTP 500.
    pub fn fail_next(&self, n: usize) {
        self.inner.fail_next.store(n, Ordering::SeqCst);
    }

    /// Every request, including failed ones.
    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::SeqCst)
    }

    pub fn received(&self) -> Vec<Received> {
        self.inner.received.lock().unwrap().clone()
    }

    pub fn replies(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.kind == "reply")
            .collect()
    }

    /// Wait until `n` replies arrived; panics after `limit`.
    pub async fn wait_replies(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.inner.changed.notified();
            let replies = self.replies();
            if replies.len() >= n {
                return replies;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("expected {n} replies within {limit:?}, got {replies:#?}");
            }
        }
    }
}

async fn receive(State(inner): State<Arc<Inner>>, body: axum::body::Bytes) -> StatusCode {
    inner.requests.fetch_add(1, Ordering::SeqCst);
    if inner
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    match serde_json::from_slice::<Received>(&body) {
        Ok(received) => {
            inner.received.lock().unwrap().push(received);
            inner.changed.notify_waiters();
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

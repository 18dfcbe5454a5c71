//! A webhook on loopback standing in for a receiver of the http adapter's replies. It
//! records every POST with its headers, can be scripted to fail (a status, a 429 with
//! `Retry-After`, a slow or hung answer), and, given the secret, verifies Standard
//! Webhooks signatures the way a receiver would (a bad signature gets 401).
//!
//! What a receiver *accepted* (`received`) is not what it *shows*: a receiver that
//! got the same reply twice (lull timed out while it was answering) deduplicates on
//! `webhook-id`, and [`Webhook::shown`] is what its user sees.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use tokio::sync::Notify;

/// A reply the webhook accepted. `covers` holds string ids as they are and any other
/// id as its JSON text; `body` is the payload as sent, for exact checks.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub conversation: String,
    pub text: String,
    pub covers: Vec<String>,
    pub reply_id: i64,
    pub kind: String,
    pub webhook_id: Option<String>,
    pub body: serde_json::Value,
    pub at: Instant,
}

#[derive(Deserialize)]
struct Payload {
    conversation: String,
    text: String,
    covers: Vec<serde_json::Value>,
    reply_id: i64,
    kind: String,
}

/// A 2xx the webhook answered on a connection still open. A sender that gave up long
/// before (lull's time limit, a lost lease) closed the connection, its handler was
/// dropped, and no answer is recorded. Near the sender's time limit the two race: the
/// handler is not always dropped the moment the sender hangs up, and a sender can miss
/// an answer that came just before its limit. Only an answer well within the limit
/// (`took`) says the sender saw the reply accepted.
#[derive(Debug, Clone)]
pub(crate) struct Answered {
    pub reply_id: i64,
    pub conversation: String,
    pub at: Instant,
    /// From the request's arrival to this answer.
    pub took: Duration,
}

/// Run before a reply accepted at once is answered (on a blocking thread), e.g. to take
/// the database's write lock while lull is about to record the delivery.
pub(crate) type BeforeAnswer = Arc<dyn Fn(&Received) + Send + Sync>;

/// One POST as it arrived, whatever the webhook answered.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub webhook_id: Option<String>,
    pub timestamp: Option<String>,
    pub signature: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    /// With a secret: whether the signature verified.
    pub signature_ok: Option<bool>,
    pub at: Instant,
}

/// How the webhook answers one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Answer {
    /// 200; the reply is accepted.
    Ok,
    /// This status; the reply is not accepted.
    Status(u16),
    /// 429 with `Retry-After: <seconds>`.
    RetryAfter(u64),
    /// The reply is accepted at once, but the answer (200) comes after the delay: a
    /// slow receiver whose sender may have given up waiting.
    Slow(Duration),
    /// Never answers; nothing is accepted.
    Hang,
    /// A flaky receiver: each request fails with 500, 502 or 404 with probability
    /// `fail`, else is slow (accepted, answered after `slow_for`) with probability
    /// `slow`, else is rate limited (429, `Retry-After: 1`) with probability `limited`,
    /// else is accepted at once.
    Flaky {
        fail: f64,
        slow: f64,
        slow_for: Duration,
        limited: f64,
    },
}

impl Answer {
    /// The answer to give now: a `Flaky` receiver draws one.
    fn draw(self) -> Answer {
        match self {
            Answer::Flaky {
                fail,
                slow,
                slow_for,
                limited,
            } => {
                let roll = fastrand::f64();
                if roll < fail {
                    Answer::Status([500, 502, 404][fastrand::usize(0..3)])
                } else if roll < fail + slow {
                    Answer::Slow(slow_for)
                } else if roll < fail + slow + limited {
                    Answer::RetryAfter(1)
                } else {
                    Answer::Ok
                }
            }
            other => other,
        }
    }
}

#[derive(Default)]
struct Inner {
    requests: Mutex<Vec<Request>>,
    received: Mutex<Vec<Received>>,
    changed: Notify,
    script: Mutex<VecDeque<Answer>>,
    /// The answer once the script is used up (`None`: `Answer::Ok`).
    otherwise: Mutex<Option<Answer>>,
    secret: Option<Vec<u8>>,
    in_flight: AtomicUsize,
    answered: Mutex<Vec<Answered>>,
    before_answer: Mutex<Option<BeforeAnswer>>,
    /// (conversation, when) of every 429 answered.
    limited: Mutex<Vec<(String, Instant)>>,
}

/// The collector; dropping it stops the server.
pub(crate) struct Webhook {
    pub url: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl Webhook {
    /// A webhook that accepts every reply without checking signatures.
    pub(crate) async fn start() -> Webhook {
        Self::serve(Inner::default()).await
    }

    /// A webhook that verifies every request's signature with `secret` (`whsec_…`)
    /// and answers 401 to a missing or wrong one.
    pub(crate) async fn signed(secret: &str) -> Webhook {
        let key = BASE64
            .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
            .expect("base64 secret");
        Self::serve(Inner {
            secret: Some(key),
            ..Inner::default()
        })
        .await
    }

    async fn serve(inner: Inner) -> Webhook {
        let inner = Arc::new(inner);
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

    /// Answer the next requests as listed, in order (after what is already scripted).
    pub(crate) fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.inner.script.lock().unwrap().extend(answers);
    }

    /// Answer the next `n` requests with HTTP 500.
    pub(crate) fn fail_next(&self, n: usize) {
        self.script(std::iter::repeat_n(Answer::Status(500), n));
    }

    /// How to answer once the script is used up (the default is `Answer::Ok`).
    pub(crate) fn otherwise(&self, answer: Answer) {
        *self.inner.otherwise.lock().unwrap() = Some(answer);
    }

    /// Run `hook` before answering each reply accepted at once (see [`BeforeAnswer`]).
    pub(crate) fn before_answer(&self, hook: BeforeAnswer) {
        *self.inner.before_answer.lock().unwrap() = Some(hook);
    }

    /// Every 2xx answered on a connection still open, in order (see [`Answered`]).
    pub(crate) fn answered(&self) -> Vec<Answered> {
        self.inner.answered.lock().unwrap().clone()
    }

    /// How many times reply `reply_id` was answered 2xx on an open connection: how many
    /// times the sender saw it accepted, when no answer came near its time limit.
    pub(crate) fn times_answered(&self, reply_id: i64) -> usize {
        self.answered()
            .iter()
            .filter(|a| a.reply_id == reply_id)
            .count()
    }

    /// (conversation, when) of every 429 answered, oldest first.
    pub(crate) fn rate_limited(&self) -> Vec<(String, Instant)> {
        self.inner.limited.lock().unwrap().clone()
    }

    /// Every request, including refused and unanswered ones.
    pub(crate) fn requests(&self) -> usize {
        self.inner.requests.lock().unwrap().len()
    }

    pub(crate) fn request_log(&self) -> Vec<Request> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Requests the webhook is still answering (slow or hung).
    pub(crate) fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// How many replies and notices the webhook accepted (cheap to poll).
    pub(crate) fn accepted(&self) -> usize {
        self.inner.received.lock().unwrap().len()
    }

    /// Every reply and notice the webhook accepted, duplicates included.
    pub(crate) fn received(&self) -> Vec<Received> {
        self.inner.received.lock().unwrap().clone()
    }

    /// Accepted replies (not notices), duplicates included.
    pub(crate) fn replies(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.kind == "reply")
            .collect()
    }

    /// The replies a receiver deduplicating on `webhook-id` shows, in arrival order.
    pub(crate) fn shown(&self) -> Vec<Received> {
        let mut seen = HashSet::new();
        self.replies()
            .into_iter()
            .filter(|r| seen.insert(r.webhook_id.clone().expect("a webhook-id header")))
            .collect()
    }

    /// Wait until `n` replies arrived; panics after `limit`.
    pub(crate) async fn wait_replies(&self, n: usize, limit: Duration) -> Vec<Received> {
        self.wait_until(limit, |w| {
            let replies = w.replies();
            (replies.len() >= n).then_some(replies)
        })
        .await
    }

    /// Wait until the webhook accepted something matching `pick`; panics after `limit`.
    pub(crate) async fn wait_until_received(
        &self,
        limit: Duration,
        mut pick: impl FnMut(&Received) -> bool,
    ) -> Received {
        self.wait_until(limit, |w| w.received().into_iter().find(|r| pick(r)))
            .await
    }

    /// Accepted notices (lull's own short messages), duplicates included.
    pub(crate) fn notices(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.kind == "notice")
            .collect()
    }

    /// Wait until `n` notices were accepted; panics after `limit`.
    pub(crate) async fn wait_notices(&self, n: usize, limit: Duration) -> Vec<Received> {
        self.wait_until(limit, |w| {
            let notices = w.notices();
            (notices.len() >= n).then_some(notices)
        })
        .await
    }

    /// Wait until `n` requests arrived (answered or not); panics after `limit`.
    pub(crate) async fn wait_requests(&self, n: usize, limit: Duration) -> Vec<Request> {
        self.wait_until(limit, |w| {
            let requests = w.request_log();
            (requests.len() >= n).then_some(requests)
        })
        .await
    }

    async fn wait_until<T>(&self, limit: Duration, mut done: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.inner.changed.notified();
            if let Some(value) = done(self) {
                return value;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "webhook: condition not met within {limit:?}; requests: {:#?}",
                    self.request_log()
                );
            }
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// What a Standard Webhooks receiver checks: some `v1,` signature in the
/// space-separated list is base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")), and
/// the timestamp is within five minutes of now. Written apart from lull's signer on
/// purpose: a shared bug would not show.
fn verify(key: &[u8], id: &str, timestamp: &str, signature: &str, body: &[u8]) -> bool {
    let Ok(seconds) = timestamp.parse::<i64>() else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    if (now - seconds).abs() > 300 {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = mac.finalize().into_bytes();
    signature.split(' ').any(|candidate| {
        candidate
            .strip_prefix("v1,")
            .and_then(|sig| BASE64.decode(sig).ok())
            .is_some_and(|sig| sig.as_slice() == expected.as_slice())
    })
}

/// Decrements the in-flight count when a request ends, answered or abandoned.
struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

async fn receive(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let arrived = Instant::now();
    inner.in_flight.fetch_add(1, Ordering::SeqCst);
    let _in_flight = InFlight(inner.clone());
    let webhook_id = header(&headers, "webhook-id");
    let timestamp = header(&headers, "webhook-timestamp");
    let signature = header(&headers, "webhook-signature");
    let signature_ok =
        inner
            .secret
            .as_ref()
            .map(|key| match (&webhook_id, &timestamp, &signature) {
                (Some(id), Some(ts), Some(sig)) => verify(key, id, ts, sig, &body),
                _ => false,
            });
    inner.requests.lock().unwrap().push(Request {
        webhook_id: webhook_id.clone(),
        timestamp,
        signature,
        content_type: header(&headers, "content-type"),
        body: body.to_vec(),
        signature_ok,
        at: Instant::now(),
    });
    inner.changed.notify_waiters();
    if signature_ok == Some(false) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let answer = inner
        .script
        .lock()
        .unwrap()
        .pop_front()
        .or(*inner.otherwise.lock().unwrap())
        .unwrap_or(Answer::Ok)
        .draw();
    let accept = || -> Result<Received, StatusCode> {
        let payload: Payload =
            serde_json::from_slice(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let received = Received {
            conversation: payload.conversation,
            text: payload.text,
            covers: payload
                .covers
                .iter()
                .map(|id| match id {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect(),
            reply_id: payload.reply_id,
            kind: payload.kind,
            webhook_id: webhook_id.clone(),
            body: json,
            at: Instant::now(),
        };
        inner.received.lock().unwrap().push(received.clone());
        inner.changed.notify_waiters();
        Ok(received)
    };
    // Recorded only if the handler gets here: a sender that stopped waiting dropped it.
    let answered = |received: &Received| {
        inner.answered.lock().unwrap().push(Answered {
            reply_id: received.reply_id,
            conversation: received.conversation.clone(),
            at: Instant::now(),
            took: arrived.elapsed(),
        });
        inner.changed.notify_waiters();
        StatusCode::OK.into_response()
    };
    match answer {
        Answer::Ok => match accept() {
            Ok(received) => {
                let hook = inner.before_answer.lock().unwrap().clone();
                if let Some(hook) = hook {
                    let seen = received.clone();
                    tokio::task::spawn_blocking(move || hook(&seen))
                        .await
                        .expect("before-answer hook");
                }
                answered(&received)
            }
            Err(status) => status.into_response(),
        },
        Answer::Status(code) => StatusCode::from_u16(code).unwrap().into_response(),
        Answer::RetryAfter(seconds) => {
            if let Ok(payload) = serde_json::from_slice::<Payload>(&body) {
                inner
                    .limited
                    .lock()
                    .unwrap()
                    .push((payload.conversation, Instant::now()));
            }
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", seconds.to_string())],
            )
                .into_response()
        }
        Answer::Slow(delay) => {
            let accepted = accept();
            tokio::time::sleep(delay).await;
            match accepted {
                Ok(received) => answered(&received),
                Err(status) => status.into_response(),
            }
        }
        Answer::Hang => std::future::pending().await,
        Answer::Flaky { .. } => unreachable!("drawn above"),
    }
}

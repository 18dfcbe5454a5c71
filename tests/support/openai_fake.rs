//! A fake OpenAI-compatible server on loopback that can be scripted per request:
//! slow, 5xx, 429 with `Retry-After`, malformed JSON, empty content, a dropped
//! connection, a prompt refused as too long (in the error formats of several
//! servers), an error body that echoes the `Authorization` header back. It records
//! every request body (the exact message list lull sent).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// What the server does with one request.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// Answer `[model] <last user message>` with a usage field (the default).
    Answer,
    /// Answer with this content.
    Content(String),
    /// Wait, then answer.
    Slow(Duration),
    /// An error status with an OpenAI-style error body.
    Status(u16),
    /// 429 with `Retry-After: <seconds>`.
    RateLimited(u64),
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with empty content.
    Empty,
    /// Start the response, then break the connection.
    Drop,
    /// A 400 refusing the prompt as longer than the model's context, in the error
    /// format of `server`.
    ContextLength(Server),
    /// Answer like `Answer` if the prompt (every message's content) has at most
    /// `chars` characters, else refuse it like `ContextLength(server)`.
    RefuseOver { chars: usize, server: Server },
    /// An error status whose body quotes the request's `Authorization` header, as
    /// careless servers and proxies do: JSON for 4xx, plain text for 5xx.
    EchoAuthorization(u16),
    /// A model under load, for the stress run: answers like the `echo` responder
    /// (`[echo] N messages:` then the user turn) after a random delay; fails a
    /// share of requests with a random 5xx; refuses as too long (OpenAI's 400) every
    /// prompt whose user turn contains `poison`.
    Chaos(Chaos),
}

/// The parameters of [`Behavior::Chaos`].
#[derive(Debug, Clone)]
pub struct Chaos {
    pub delay_ms: (u64, u64),
    /// Share of requests answered with 500, 502 or 503.
    pub server_errors: f64,
    pub poison: String,
}

/// The OpenAI-compatible servers whose context-length refusals the fake imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    OpenAi,
    Vllm,
    LlamaCpp,
    Ollama,
    OpenRouter,
}

impl Server {
    /// The body of a context-length refusal, as each server words it.
    fn context_length_body(self) -> Value {
        match self {
            Server::OpenAi => json!({ "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 15023 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded" } }),
            Server::Vllm => json!({
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 15023 tokens (10927 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError", "param": null, "code": 400 }),
            Server::LlamaCpp => json!({ "error": {
                "code": 400, "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 15023, "n_ctx": 4096 } }),
            Server::Ollama => json!({ "error": {
                "message": "the input length exceeds the context length", "type": "api_error",
                "param": null, "code": null } }),
            Server::OpenRouter => json!({ "error": {
                "message": "This endpoint's maximum context length is 8192 tokens. However, you requested about 15023 tokens (15023 of text input). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.",
                "code": 400 } }),
        }
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub body: Value,
    pub authorization: Option<String>,
    pub at: Instant,
}

#[derive(Default)]
struct Inner {
    script: Mutex<VecDeque<Behavior>>,
    /// Used once the script is empty.
    fallback: Mutex<Option<Behavior>>,
    requests: Mutex<Vec<Recorded>>,
    failures: Mutex<usize>,
}

pub struct FakeOpenAi {
    /// The API base to give lull (`OPENAI_BASE_URL`).
    pub base_url: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeOpenAi {
    pub async fn start() -> FakeOpenAi {
        let inner = Arc::new(Inner::default());
        let router = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/models", get(models))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        FakeOpenAi {
            base_url: format!("http://{addr}/v1"),
            inner,
            _server: server,
        }
    }

    /// Behaviours for the next requests, in order.
    pub fn script(&self, behaviors: impl IntoIterator<Item = Behavior>) {
        self.inner.script.lock().unwrap().extend(behaviors);
    }

    /// The behaviour once the script is used up (default: `Answer`).
    pub fn fallback(&self, behavior: Behavior) {
        *self.inner.fallback.lock().unwrap() = Some(behavior);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Requests answered with an error status.
    pub fn failures(&self) -> usize {
        *self.inner.failures.lock().unwrap()
    }

    /// The user turn of request `n` if it carried no history (the system prompt and
    /// one user turn), else `None`.
    pub fn without_history(&self, n: usize) -> Option<String> {
        match self.messages(n).as_slice() {
            [(system, _), (user, turn)] if system == "system" && user == "user" => {
                Some(turn.clone())
            }
            _ => None,
        }
    }

    /// Characters of every message's content in request `n` (what `RefuseOver` counts).
    pub fn prompt_chars(&self, n: usize) -> usize {
        prompt_chars(&self.requests()[n].body)
    }

    /// The `messages` of request `n`, as `(role, content)`.
    pub fn messages(&self, n: usize) -> Vec<(String, String)> {
        self.requests()[n].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

fn completion(content: &str, body: &Value) -> Value {
    let messages = body["messages"].as_array().map_or(0, Vec::len) as u32;
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000u32,
        "model": body["model"],
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": content },
            "finish_reason": "stop"
        }],
        "usage": { "prompt_tokens": 10 * messages, "completion_tokens": 7, "total_tokens": 10 * messages + 7 }
    })
}

fn prompt_chars(body: &Value) -> usize {
    body["messages"].as_array().map_or(0, |messages| {
        messages
            .iter()
            .map(|m| m["content"].as_str().unwrap_or_default().chars().count())
            .sum()
    })
}

fn error(status: u16, message: &str) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        axum::Json(json!({ "error": { "message": message, "type": "fake_error", "param": null, "code": null } })),
    )
        .into_response()
}

async fn completions(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let response = respond(&inner, headers, body).await;
    if !response.status().is_success() {
        *inner.failures.lock().unwrap() += 1;
    }
    response
}

async fn respond(inner: &Inner, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    inner.requests.lock().unwrap().push(Recorded {
        body: body.clone(),
        authorization: authorization.clone(),
        at: Instant::now(),
    });
    let behavior = inner
        .script
        .lock()
        .unwrap()
        .pop_front()
        .or_else(|| inner.fallback.lock().unwrap().clone())
        .unwrap_or(Behavior::Answer);
    let last_user = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    match behavior {
        Behavior::Answer => {
            axum::Json(completion(&format!("[model] {last_user}"), &body)).into_response()
        }
        Behavior::Content(content) => axum::Json(completion(&content, &body)).into_response(),
        Behavior::Slow(delay) => {
            tokio::time::sleep(delay).await;
            axum::Json(completion(&format!("[model] {last_user}"), &body)).into_response()
        }
        Behavior::Status(status) => error(status, &format!("fake failure {status}")),
        Behavior::RateLimited(seconds) => {
            let mut response = error(429, "rate limited");
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.to_string().parse().unwrap());
            response
        }
        Behavior::Malformed => (
            [(header::CONTENT_TYPE, "application/json")],
            "{\"id\": \"chatcmpl-fake\", \"choices\": [ this is not json",
        )
            .into_response(),
        Behavior::Empty => axum::Json(completion("", &body)).into_response(),
        Behavior::ContextLength(server) => (
            StatusCode::BAD_REQUEST,
            axum::Json(server.context_length_body()),
        )
            .into_response(),
        Behavior::RefuseOver { chars, server } if prompt_chars(&body) > chars => (
            StatusCode::BAD_REQUEST,
            axum::Json(server.context_length_body()),
        )
            .into_response(),
        Behavior::RefuseOver { .. } => {
            axum::Json(completion(&format!("[model] {last_user}"), &body)).into_response()
        }
        Behavior::EchoAuthorization(status) => {
            let echoed = authorization.unwrap_or_default();
            if status < 500 {
                error(
                    status,
                    &format!(
                        "Incorrect API key provided: {echoed}. You can find your API key at https://example.com."
                    ),
                )
            } else {
                (
                    StatusCode::from_u16(status).unwrap(),
                    format!("upstream failed; request was: POST /v1/chat/completions\nAuthorization: {echoed}\n"),
                )
                    .into_response()
            }
        }
        Behavior::Chaos(chaos) => {
            tokio::time::sleep(Duration::from_millis(fastrand::u64(
                chaos.delay_ms.0..=chaos.delay_ms.1,
            )))
            .await;
            if last_user.contains(&chaos.poison) {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(Server::OpenAi.context_length_body()),
                )
                    .into_response();
            }
            if fastrand::f64() < chaos.server_errors {
                let status = [500, 502, 503][fastrand::usize(0..3)];
                return error(status, "fake overload");
            }
            let lines = last_user.lines().count();
            let plural = if lines == 1 { "" } else { "s" };
            let content = format!("[echo] {lines} message{plural}:\n{last_user}");
            axum::Json(completion(&content, &body)).into_response()
        }
        Behavior::Drop => {
            // A body that fails after its first bytes: hyper aborts the connection.
            let chunks: Vec<Result<&'static str, std::io::Error>> = vec![
                Ok("{\"id\": \"chatcmpl-"),
                Err(std::io::Error::other("connection dropped")),
            ];
            (
                [(header::CONTENT_TYPE, "application/json")],
                Body::from_stream(futures_util::stream::iter(chunks)),
            )
                .into_response()
        }
    }
}

async fn models() -> Result<axum::Json<Value>, Infallible> {
    Ok(axum::Json(json!({
        "object": "list",
        "data": [{ "id": "fake-model", "object": "model", "created": 0, "owned_by": "fake" }]
    })))
}

//! A fake OpenAI-compatible server on loopback that can be scripted per request:
//! slow, 5xx, 429 with `Retry-After`, malformed JSON, empty content, a dropped
//! connection, a prompt refused as too long (in the error formats of several
//! servers), an error body that echoes the `Authorization` header back. It records
//! every request body (the exact message list lull sent).
//!
//! Streaming: every behaviour but [`Behavior::Stream`] answers a streamed request
//! (`stream: true`) with one whole JSON answer, as a server that does not stream
//! does; [`Behavior::Stream`] answers it with server-sent events, piece by piece with
//! delays (usage in the last chunk), or breaking or stalling mid-way, and records
//! when it sent each piece. [`Behavior::RefuseStream`] refuses `stream` with a 400.
//!
//! Vision: a user turn may be content parts (`text` and `image_url`, as OpenAI takes
//! them); the text parts are what [`FakeOpenAi::messages`] shows and what `Answer`
//! echoes, the image URLs are kept ([`FakeOpenAi::images`]). With
//! [`FakeOpenAi::refuse_images`] a request carrying an image part gets OpenAI's 400 for
//! a model without vision.
//!
//! Real servers' quirks, as they were seen (docs/models.md): `llama-cpp-python`
//! answers a too-long *streamed* prompt with 200 and an event stream that ends without
//! a single event, while refusing the same prompt asked for whole with a 400
//! ([`Behavior::EmptyStreamOver`]); its model list has no `created`
//! ([`FakeOpenAi::models_without_created`]); every server ends an answer the token
//! limit cut with `finish_reason: "length"` ([`Behavior::Cut`]).
//!
//! Transcriptions: `POST /v1/audio/transcriptions` (multipart `model` and `file`)
//! answers `{"text": …}` with the transcript a test set for those bytes
//! ([`FakeOpenAi::transcript`]; "transcript of N bytes" otherwise), after an optional
//! delay; every call is recorded (model, file bytes).

use std::collections::VecDeque;
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
pub(crate) enum Behavior {
    /// Answer `[model] <last user message>` with a usage field (the default).
    Answer,
    /// Answer with this content.
    Content(String),
    /// Answer like `Answer`, reporting this usage instead of the usual (a model that
    /// counts more tokens than lull estimated).
    Usage { prompt: u64, completion: u64 },
    /// Answer like `Answer` after `delay`, reporting this usage with `cached` of the
    /// prompt's tokens read from the cache (`prompt_tokens_details.cached_tokens`).
    Billed {
        prompt: u64,
        completion: u64,
        cached: u64,
        delay: Duration,
    },
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
    /// A streamed answer (a whole JSON one to a request that is not streamed).
    Stream(Stream),
    /// 400 "stream is not supported" to a streamed request; else like `Answer`.
    RefuseStream,
    /// `llama-cpp-python`'s answer to a prompt longer than `chars` characters: a
    /// streamed request gets 200 `text/event-stream` with no event at all, a whole
    /// one its 400 `context_length_exceeded`. A prompt that fits is answered like
    /// `Answer`.
    EmptyStreamOver { chars: usize },
    /// This content, cut short by the token limit: `finish_reason: "length"` (in the
    /// whole answer, or in the last chunk of a streamed one).
    Cut(String),
    /// A model that uses tools ([`Agent`]).
    Agent(Agent),
    /// 400 "tools are not supported" to a request that offers tools; else like
    /// `Answer` (a model without tool support).
    RefuseTools,
    /// An ideal summariser, for checking what a summary kept: answers every distinct
    /// fact word of the request's user turn (a word `f` followed by digits, `f07`),
    /// in order of first appearance, after `after`, and once `gate` (if any) gives a
    /// permit.
    Digest {
        after: Duration,
        gate: Option<Arc<tokio::sync::Semaphore>>,
    },
}

/// The distinct fact words of `text` (`f` and digits), in order of first appearance.
pub(crate) fn fact_words(text: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for word in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        let is_fact = word.len() > 1
            && word.starts_with('f')
            && word[1..].chars().all(|c| c.is_ascii_digit());
        if is_fact && !seen.iter().any(|w| w == word) {
            seen.push(word.to_owned());
        }
    }
    seen
}

/// A model that uses tools, deterministically: asked with tools offered and no tool
/// result after the last user turn, it calls each of `calls` (those offered) at once,
/// after `think`; asked after tool results (or with none of its tools offered), it
/// answers `[model] <last user message> | <each tool result>` after `answer_after`.
/// So every round asks for the same calls until it has their results: what the
/// journal decides is what the test sees.
#[derive(Debug, Clone, Default)]
pub(crate) struct Agent {
    /// `(name, arguments)` of each call.
    pub calls: Vec<(String, Value)>,
    pub think: Duration,
    pub answer_after: Duration,
    /// Set this argument of every call to the first line of the last user turn (the
    /// batch's first message: the same for every round of the batch), so calls differ
    /// by conversation.
    pub user_field: Option<&'static str>,
    /// Set this argument of every call to the last line of the last user turn (the
    /// batch's newest message: a round of a grown batch asks differently).
    pub newest_field: Option<&'static str>,
    /// Call only when the last user turn contains this (otherwise answer at once).
    pub only_if: Option<&'static str>,
}

impl Agent {
    /// An agent that calls `name` with `arguments`.
    pub(crate) fn calling(name: &str, arguments: Value) -> Agent {
        Agent {
            calls: vec![(name.to_owned(), arguments)],
            ..Agent::default()
        }
    }
}

/// The parameters of [`Behavior::Stream`].
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    /// The answer; `None`: `[model] <last user message>`, as `Answer`.
    pub text: Option<String>,
    /// Pieces the answer is cut into (at word boundaries), one event each.
    pub pieces: usize,
    /// Before each piece.
    pub every: Duration,
    /// Between the last piece and the end of the stream (the finish and usage chunks).
    pub tail: Duration,
    pub end: StreamEnd,
}

impl Stream {
    /// `[model] <last user message>` in `pieces` pieces, one every `every`.
    pub(crate) fn echo(pieces: usize, every: Duration) -> Stream {
        Stream {
            text: None,
            pieces,
            every,
            tail: Duration::ZERO,
            end: StreamEnd::Done,
        }
    }
}

/// How a [`Stream`] ends.
/// How the fake answers one model-list request (`GET /models`) instead of its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListAnswer {
    /// This error status.
    Status(u16),
    /// Never.
    Hang,
    /// 200 with a body that is not a model list.
    Damaged,
    /// A list of this many models, `model-0001` onwards.
    Many(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// A finish reason, the usage chunk, `[DONE]`.
    Done,
    /// The connection breaks after the pieces.
    Break,
    /// Nothing more is sent, and the connection stays open.
    Stall,
}

/// What the server sent of one streamed answer.
#[derive(Debug, Clone)]
pub(crate) struct Streamed {
    /// The request it answered (index into `requests()`).
    pub request: usize,
    /// Each piece, and when it was sent.
    pub pieces: Vec<(String, Instant)>,
    /// When the stream ended (finish and usage sent), if it did.
    pub ended: Option<Instant>,
}

/// The parameters of [`Behavior::Chaos`].
#[derive(Debug, Clone)]
pub(crate) struct Chaos {
    pub delay_ms: (u64, u64),
    /// Share of requests answered with 500, 502 or 503.
    pub server_errors: f64,
    pub poison: String,
}

/// The OpenAI-compatible servers whose context-length refusals the fake imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    OpenAi,
    Vllm,
    LlamaCpp,
    Ollama,
    OpenRouter,
    /// `llama-cpp-python`'s server.
    LlamaCppPython,
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
            Server::LlamaCppPython => json!({ "error": {
                "message": "This model's maximum context length is 512 tokens, however you requested 15023 tokens (15023 in your prompt; 0 for the completion). Please reduce your prompt; or completion length.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded" } }),
        }
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
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
    streams: Mutex<Vec<Streamed>>,
    /// When each whole (not streamed) `Stream` answer was dropped before its end
    /// (the client closed the connection): (when it started, when it was dropped).
    abandoned: Mutex<Vec<(Instant, Instant)>>,
    /// Refuse requests with image parts (a model without vision).
    refuse_images: std::sync::atomic::AtomicBool,
    /// Statuses the next transcription requests answer, in order (then success).
    transcription_failures: Mutex<std::collections::VecDeque<u16>>,
    /// Audio bytes → transcript.
    transcripts: Mutex<Vec<(Vec<u8>, String)>>,
    /// `(model, file bytes)` of every transcription request.
    transcriptions: Mutex<Vec<(String, Vec<u8>)>>,
    /// The model list has no `created` (as `llama-cpp-python`'s).
    models_without_created: std::sync::atomic::AtomicBool,
    /// How the next model-list requests are answered, in order (then the list).
    model_list_script: Mutex<std::collections::VecDeque<ListAnswer>>,
    /// Model-list requests received.
    model_lists: std::sync::atomic::AtomicUsize,
    /// Requests naming these models get this behaviour (before the script).
    routes: Mutex<Vec<(String, Behavior)>>,
    /// Requests to routed models answered (with content or an error).
    routed_answered: std::sync::atomic::AtomicUsize,
}

pub(crate) struct FakeOpenAi {
    /// The API base to give lull (`OPENAI_BASE_URL`).
    pub base_url: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeOpenAi {
    pub(crate) async fn start() -> FakeOpenAi {
        let inner = Arc::new(Inner::default());
        let router = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/models", get(models))
            .route("/v1/audio/transcriptions", post(transcribe))
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
    pub(crate) fn script(&self, behaviors: impl IntoIterator<Item = Behavior>) {
        self.inner.script.lock().unwrap().extend(behaviors);
    }

    /// Requests naming `model` get `behavior`, whatever the script says.
    pub(crate) fn route_model(&self, model: &str, behavior: Behavior) {
        let mut routes = self.inner.routes.lock().unwrap();
        routes.retain(|(m, _)| m != model);
        routes.push((model.to_owned(), behavior));
    }

    /// Requests to routed models answered so far.
    pub(crate) fn routed_answered(&self) -> usize {
        self.inner
            .routed_answered
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The recorded requests naming `model`.
    pub(crate) fn requests_for(&self, model: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.body["model"] == model)
            .collect()
    }

    /// The behaviour once the script is used up (default: `Answer`).
    pub(crate) fn fallback(&self, behavior: Behavior) {
        *self.inner.fallback.lock().unwrap() = Some(behavior);
    }

    /// Refuse every request with an image part with a 400, as a model without vision.
    pub(crate) fn refuse_images(&self, refuse: bool) {
        self.inner
            .refuse_images
            .store(refuse, std::sync::atomic::Ordering::SeqCst);
    }

    /// List the models without `created`, as `llama-cpp-python`'s server does (only
    /// `id`, `object`, `owned_by`, `permissions`).
    pub(crate) fn models_without_created(&self) {
        self.inner
            .models_without_created
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answer the next model-list requests (`GET /models`) with these error
    /// statuses, in order.
    pub(crate) fn fail_model_lists(&self, statuses: &[u16]) {
        let answers: Vec<ListAnswer> = statuses.iter().map(|s| ListAnswer::Status(*s)).collect();
        self.script_model_lists(&answers);
    }

    /// Answer the next model-list requests (`GET /models`) so, in order.
    pub(crate) fn script_model_lists(&self, answers: &[ListAnswer]) {
        self.inner
            .model_list_script
            .lock()
            .unwrap()
            .extend(answers.iter().copied());
    }

    /// Model-list requests received so far.
    pub(crate) fn model_lists(&self) -> usize {
        self.inner
            .model_lists
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Answer the next transcription requests with these error statuses, in order.
    pub(crate) fn fail_transcriptions(&self, statuses: &[u16]) {
        self.inner
            .transcription_failures
            .lock()
            .unwrap()
            .extend(statuses.iter().copied());
    }

    /// Answer a transcription of `audio` with `text`.
    pub(crate) fn transcript(&self, audio: &[u8], text: &str) {
        self.inner
            .transcripts
            .lock()
            .unwrap()
            .push((audio.to_vec(), text.to_owned()));
    }

    /// `(model, file bytes)` of every transcription request so far.
    pub(crate) fn transcriptions(&self) -> Vec<(String, Vec<u8>)> {
        self.inner.transcriptions.lock().unwrap().clone()
    }

    /// The image URLs (`data:` URLs) of request `n`, in order.
    pub(crate) fn images(&self, n: usize) -> Vec<String> {
        images(&self.requests()[n].body)
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// The streamed answers sent so far.
    pub(crate) fn streams(&self) -> Vec<Streamed> {
        self.inner.streams.lock().unwrap().clone()
    }

    /// Whole answers of [`Behavior::Stream`] the client gave up on before their end:
    /// (when each started, when it was dropped), in order.
    pub(crate) fn abandoned(&self) -> Vec<(Instant, Instant)> {
        self.inner.abandoned.lock().unwrap().clone()
    }

    /// Whether request `n` asked for a streamed answer.
    pub(crate) fn streamed(&self, n: usize) -> bool {
        self.requests()[n].body["stream"] == true
    }

    /// Requests answered with an error status.
    pub(crate) fn failures(&self) -> usize {
        *self.inner.failures.lock().unwrap()
    }

    /// The user turn of request `n` if it carried no history (the system prompt and
    /// one user turn), else `None`.
    pub(crate) fn without_history(&self, n: usize) -> Option<String> {
        match self.messages(n).as_slice() {
            [(system, _), (user, turn)] if system == "system" && user == "user" => {
                Some(turn.clone())
            }
            _ => None,
        }
    }

    /// Characters of every message's content in request `n` (what `RefuseOver` counts).
    pub(crate) fn prompt_chars(&self, n: usize) -> usize {
        prompt_chars(&self.requests()[n].body)
    }

    /// The `messages` of request `n`, as `(role, content)`.
    pub(crate) fn messages(&self, n: usize) -> Vec<(String, String)> {
        self.requests()[n].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    content_text(&m["content"]),
                )
            })
            .collect()
    }
}

fn completion(content: &str, body: &Value) -> Value {
    finished(content, "stop", body)
}

/// A whole answer with this finish reason.
fn finished(content: &str, finish_reason: &str, body: &Value) -> Value {
    let messages = body["messages"].as_array().map_or(0, Vec::len) as u32;
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000u32,
        "model": body["model"],
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": content },
            "finish_reason": finish_reason
        }],
        "usage": { "prompt_tokens": 10 * messages, "completion_tokens": 7, "total_tokens": 10 * messages + 7 }
    })
}

/// A message's content as text: the string, or its text parts joined by newlines.
fn content_text(content: &Value) -> String {
    match content {
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.as_str().unwrap_or_default().to_owned(),
    }
}

/// The `image_url` URLs of every message of a request.
fn images(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|p| p["type"] == "image_url")
        .filter_map(|p| p["image_url"]["url"].as_str().map(str::to_owned))
        .collect()
}

fn prompt_chars(body: &Value) -> usize {
    body["messages"].as_array().map_or(0, |messages| {
        messages
            .iter()
            .map(|m| content_text(&m["content"]).chars().count())
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

/// The pieces of `text`: `n` runs of whole words (spaces kept), in order.
fn pieces(text: &str, n: usize) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let per = words.len().div_ceil(n.max(1)).max(1);
    words.chunks(per).map(|w| w.concat()).collect()
}

fn sse(data: &Value) -> String {
    format!("data: {data}\n\n")
}

fn chunk(body: &Value, choices: Value, usage: Value) -> Value {
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1_700_000_000u32,
        "model": body["model"], "choices": choices, "usage": usage,
    })
}

/// A streamed answer: the pieces of the text, one every `every`, then the finish
/// reason and the usage chunk (or a break, or a stall).
fn stream(inner: &Arc<Inner>, body: &Value, text: String, spec: Stream) -> Response {
    stream_finished(inner, body, text, spec, "stop")
}

/// A streamed answer whose finish chunk carries `finish_reason`.
fn stream_finished(
    inner: &Arc<Inner>,
    body: &Value,
    text: String,
    spec: Stream,
    finish_reason: &'static str,
) -> Response {
    let request = inner.requests.lock().unwrap().len() - 1;
    let index = {
        let mut streams = inner.streams.lock().unwrap();
        streams.push(Streamed {
            request,
            pieces: Vec::new(),
            ended: None,
        });
        streams.len() - 1
    };
    let messages = body["messages"].as_array().map_or(0, Vec::len) as u32;
    let body = body.clone();
    let inner = inner.clone();
    let events = async_stream(move |tx| async move {
        for piece in pieces(&text, spec.pieces) {
            tokio::time::sleep(spec.every).await;
            let data = chunk(
                &body,
                json!([{ "index": 0, "delta": { "role": "assistant", "content": piece }, "finish_reason": null }]),
                Value::Null,
            );
            inner.streams.lock().unwrap()[index]
                .pieces
                .push((piece.clone(), Instant::now()));
            if tx.send(Ok(sse(&data))).is_err() {
                return;
            }
        }
        tokio::time::sleep(spec.tail).await;
        match spec.end {
            StreamEnd::Break => {
                let _ = tx.send(Err(std::io::Error::other("connection dropped")));
            }
            StreamEnd::Stall => std::future::pending::<()>().await,
            StreamEnd::Done => {
                let finish = chunk(
                    &body,
                    json!([{ "index": 0, "delta": {}, "finish_reason": finish_reason }]),
                    Value::Null,
                );
                let usage = chunk(
                    &body,
                    json!([]),
                    json!({ "prompt_tokens": 10 * messages, "completion_tokens": 7, "total_tokens": 10 * messages + 7 }),
                );
                let _ = tx.send(Ok(sse(&finish)));
                let _ = tx.send(Ok(sse(&usage)));
                let _ = tx.send(Ok("data: [DONE]\n\n".to_owned()));
                inner.streams.lock().unwrap()[index].ended = Some(Instant::now());
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(events),
    )
        .into_response()
}

/// A body stream fed by a task: what `produce` sends, until it returns.
fn async_stream<F, Fut>(
    produce: F,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::UnboundedSender<Result<String, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Ends when the client goes away (the receiver is dropped with the body).
    tokio::spawn(produce(tx));
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// `POST /v1/audio/transcriptions`: the multipart fields `model` and `file`.
async fn transcribe(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(boundary) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_owned())
    else {
        return error(400, "expected multipart/form-data");
    };
    let (mut model, mut file) = (None, None);
    let delimiter = format!("--{boundary}");
    let mut rest: &[u8] = &body;
    while let Some(start) = find(rest, delimiter.as_bytes()) {
        rest = &rest[start + delimiter.len()..];
        let Some(head_end) = find(rest, b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&rest[..head_end]).into_owned();
        let value_start = head_end + 4;
        let value_end = find(&rest[value_start..], delimiter.as_bytes())
            .map_or(rest.len(), |e| value_start + e);
        let value = rest[value_start..value_end]
            .strip_suffix(b"\r\n")
            .unwrap_or(&rest[value_start..value_end]);
        if head.contains("name=\"model\"") {
            model = Some(String::from_utf8_lossy(value).into_owned());
        } else if head.contains("name=\"file\"") {
            file = Some(value.to_vec());
        }
    }
    let (Some(model), Some(file)) = (model, file) else {
        return error(400, "model and file are required");
    };
    inner
        .transcriptions
        .lock()
        .unwrap()
        .push((model, file.clone()));
    if let Some(status) = inner.transcription_failures.lock().unwrap().pop_front() {
        return error(status, "transcription failed (the test said so)");
    }
    let text = inner
        .transcripts
        .lock()
        .unwrap()
        .iter()
        .find(|(audio, _)| *audio == file)
        .map(|(_, text)| text.clone())
        .unwrap_or_else(|| format!("transcript of {} bytes", file.len()));
    axum::Json(json!({ "text": text })).into_response()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
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

async fn respond(inner: &Arc<Inner>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
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
    let routed = inner
        .routes
        .lock()
        .unwrap()
        .iter()
        .find(|(model, _)| body["model"] == model.as_str())
        .map(|(_, behavior)| behavior.clone());
    if let Some(behavior) = routed {
        let response = Box::pin(answer(
            inner,
            &body,
            behavior,
            streamed_of(&body),
            authorization,
        ))
        .await;
        inner
            .routed_answered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return response;
    }
    let behavior = inner
        .script
        .lock()
        .unwrap()
        .pop_front()
        .or_else(|| inner.fallback.lock().unwrap().clone())
        .unwrap_or(Behavior::Answer);
    answer(inner, &body, behavior, streamed_of(&body), authorization).await
}

/// Whether the request asks for a stream.
fn streamed_of(body: &Value) -> bool {
    body["stream"] == true
}

/// The answer of `behavior` to `body`.
async fn answer(
    inner: &Arc<Inner>,
    body: &Value,
    behavior: Behavior,
    streamed: bool,
    authorization: Option<String>,
) -> Response {
    let body = body.clone();
    let last_user = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| content_text(&m["content"]))
        .unwrap_or_default();
    if inner
        .refuse_images
        .load(std::sync::atomic::Ordering::SeqCst)
        && !images(&body).is_empty()
    {
        return error(
            400,
            "Invalid content type. image_url is only supported by certain models.",
        );
    }
    match behavior {
        Behavior::Digest { after, gate } => {
            tokio::time::sleep(after).await;
            if let Some(gate) = gate {
                gate.acquire().await.unwrap().forget();
            }
            let facts = fact_words(&last_user).join(" ");
            axum::Json(completion(&format!("Facts: {facts}"), &body)).into_response()
        }
        Behavior::RefuseTools if body.get("tools").is_some_and(|t| !t.is_null()) => {
            error(400, "tools are not supported by this model")
        }
        Behavior::RefuseTools => {
            axum::Json(completion(&format!("[model] {last_user}"), &body)).into_response()
        }
        Behavior::Agent(agent) => agent_turn(inner, &body, &last_user, agent, streamed).await,
        Behavior::Stream(spec) => {
            let text = spec
                .text
                .clone()
                .unwrap_or_else(|| format!("[model] {last_user}"));
            if streamed {
                stream(inner, &body, text, spec)
            } else {
                /// Records the answer as abandoned if it is dropped before its end.
                struct Abandon<'a>(&'a Inner, Instant, bool);
                impl Drop for Abandon<'_> {
                    fn drop(&mut self) {
                        if !self.2 {
                            self.0
                                .abandoned
                                .lock()
                                .unwrap()
                                .push((self.1, Instant::now()));
                        }
                    }
                }
                let mut guard = Abandon(inner.as_ref(), Instant::now(), false);
                tokio::time::sleep(spec.every * spec.pieces as u32 + spec.tail).await;
                guard.2 = true;
                axum::Json(completion(&text, &body)).into_response()
            }
        }
        Behavior::RefuseStream if streamed => error(
            400,
            "stream is not supported by this server; set stream to false",
        ),
        Behavior::EmptyStreamOver { chars } if prompt_chars(&body) > chars => {
            if streamed {
                // The headers of a stream, then its end: not one event.
                ([(header::CONTENT_TYPE, "text/event-stream")], "").into_response()
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    axum::Json(Server::LlamaCppPython.context_length_body()),
                )
                    .into_response()
            }
        }
        Behavior::Cut(content) if streamed => stream_finished(
            inner,
            &body,
            content,
            Stream::echo(3, Duration::ZERO),
            "length",
        ),
        Behavior::Cut(content) => axum::Json(finished(&content, "length", &body)).into_response(),
        Behavior::Answer | Behavior::RefuseStream | Behavior::EmptyStreamOver { .. } => {
            axum::Json(completion(&format!("[model] {last_user}"), &body)).into_response()
        }
        Behavior::Content(content) => axum::Json(completion(&content, &body)).into_response(),
        Behavior::Usage {
            prompt,
            completion: reported,
        } => {
            let mut answer = completion(&format!("[model] {last_user}"), &body);
            answer["usage"] = json!({
                "prompt_tokens": prompt, "completion_tokens": reported, "total_tokens": prompt + reported
            });
            axum::Json(answer).into_response()
        }
        Behavior::Billed {
            prompt,
            completion: reported,
            cached,
            delay,
        } => {
            tokio::time::sleep(delay).await;
            let mut answer = completion(&format!("[model] {last_user}"), &body);
            answer["usage"] = json!({
                "prompt_tokens": prompt, "completion_tokens": reported,
                "total_tokens": prompt + reported,
                "prompt_tokens_details": { "cached_tokens": cached }
            });
            axum::Json(answer).into_response()
        }
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

/// One turn of a [`Agent`].
async fn agent_turn(
    inner: &Arc<Inner>,
    body: &Value,
    last_user: &str,
    agent: Agent,
    streamed: bool,
) -> Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let after_user: Vec<&Value> = messages
        .iter()
        .rev()
        .take_while(|m| m["role"] != "user")
        .collect();
    let offered: Vec<String> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    let first_line = last_user.lines().next().unwrap_or_default().to_owned();
    let last_line = last_user.lines().last().unwrap_or_default().to_owned();
    let calls: Vec<(String, Value)> = agent
        .calls
        .iter()
        .filter(|(name, _)| offered.contains(name))
        .filter(|_| agent.only_if.is_none_or(|word| last_user.contains(word)))
        .cloned()
        .map(|(name, mut arguments)| {
            if let Some(field) = agent.user_field {
                arguments[field] = Value::String(first_line.clone());
            }
            if let Some(field) = agent.newest_field {
                arguments[field] = Value::String(last_line.clone());
            }
            (name, arguments)
        })
        .collect();
    if after_user.is_empty() && !calls.is_empty() {
        tokio::time::sleep(agent.think).await;
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, arguments))| {
                json!({ "id": format!("call_{i}"), "type": "function",
                        "function": { "name": name, "arguments": arguments.to_string() } })
            })
            .collect();
        if streamed {
            return stream_tool_calls(inner, body, calls);
        }
        let mut answer = finished("", "tool_calls", body);
        answer["choices"][0]["message"] =
            json!({ "role": "assistant", "content": null, "tool_calls": calls });
        return axum::Json(answer).into_response();
    }
    tokio::time::sleep(agent.answer_after).await;
    let results: Vec<String> = after_user
        .iter()
        .rev()
        .filter(|m| m["role"] == "tool")
        .map(|m| content_text(&m["content"]))
        .collect();
    let content = if results.is_empty() {
        format!("[model] {last_user}")
    } else {
        format!("[model] {last_user} | {}", results.join(" | "))
    };
    if streamed {
        return stream(inner, body, content, Stream::echo(2, Duration::ZERO));
    }
    axum::Json(completion(&content, body)).into_response()
}

/// Tool calls as a stream brings them: the id and name first, the arguments in two
/// pieces, then `finish_reason: "tool_calls"` and the usage.
fn stream_tool_calls(inner: &Arc<Inner>, body: &Value, calls: Vec<Value>) -> Response {
    let request = inner.requests.lock().unwrap().len() - 1;
    inner.streams.lock().unwrap().push(Streamed {
        request,
        pieces: Vec::new(),
        ended: Some(Instant::now()),
    });
    let mut events = Vec::new();
    for (index, call) in calls.iter().enumerate() {
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        let cut = arguments.len() / 2;
        let cut = (0..=cut)
            .rev()
            .find(|i| arguments.is_char_boundary(*i))
            .unwrap_or(0);
        events.push(json!([{ "index": 0, "delta": { "role": "assistant", "tool_calls": [
            { "index": index, "id": call["id"], "type": "function",
              "function": { "name": call["function"]["name"], "arguments": "" } }] }, "finish_reason": null }]));
        for piece in [&arguments[..cut], &arguments[cut..]] {
            events.push(json!([{ "index": 0, "delta": { "tool_calls": [
                { "index": index, "function": { "arguments": piece } }] }, "finish_reason": null }]));
        }
    }
    events.push(json!([{ "index": 0, "delta": {}, "finish_reason": "tool_calls" }]));
    let messages = body["messages"].as_array().map_or(0, Vec::len) as u32;
    let mut data: Vec<Result<String, std::io::Error>> = events
        .into_iter()
        .map(|choices| Ok(sse(&chunk(body, choices, Value::Null))))
        .collect();
    data.push(Ok(sse(&chunk(
        body,
        json!([]),
        json!({ "prompt_tokens": 10 * messages, "completion_tokens": 7, "total_tokens": 10 * messages + 7 }),
    ))));
    data.push(Ok("data: [DONE]\n\n".to_owned()));
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(futures_util::stream::iter(data)),
    )
        .into_response()
}

async fn models(State(inner): State<Arc<Inner>>) -> Response {
    inner
        .model_lists
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let scripted = inner.model_list_script.lock().unwrap().pop_front();
    match scripted {
        Some(ListAnswer::Status(status)) => {
            return error(status, "the fake fails this model list");
        }
        Some(ListAnswer::Hang) => return std::future::pending().await,
        Some(ListAnswer::Damaged) => {
            return (
                StatusCode::OK,
                [("content-type", "application/json")],
                "{\"data\": [{\"id\"",
            )
                .into_response();
        }
        Some(ListAnswer::Many(n)) => {
            let data: Vec<Value> = (1..=n)
                .map(|i| json!({ "id": format!("model-{i:04}"), "object": "model", "created": 0, "owned_by": "fake" }))
                .collect();
            return axum::Json(json!({ "object": "list", "data": data })).into_response();
        }
        None => {}
    }
    if inner
        .models_without_created
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return axum::Json(json!({
            "object": "list",
            "data": [{ "id": "fake-model", "object": "model", "owned_by": "me", "permissions": [] }]
        }))
        .into_response();
    }
    axum::Json(json!({
        "object": "list",
        "data": [{ "id": "fake-model", "object": "model", "created": 0, "owned_by": "fake" }]
    }))
    .into_response()
}

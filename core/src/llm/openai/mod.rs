//! A responder for any OpenAI-compatible chat completions server (OpenAI,
//! OpenRouter, Ollama, vLLM, llama.cpp), through async-openai.
//!
//! lull supplies async-openai's HTTP transport (its middleware seam) so that its own
//! retry policy is the only one that runs ([`super::retry`]), and so that a refused
//! request keeps what the server said: the status, the error message and
//! `Retry-After`. A refusal of a prompt as too long for the model is recognised in
//! the forms OpenAI-compatible servers give it ([`is_context_length`]).
//!
//! When someone watches the reply as it is written ([`Partial::is_watched`]: live
//! drafts), the answer is streamed (`stream: true`, server-sent events, with
//! `stream_options.include_usage` so the last chunk carries the token counts), and
//! each piece is shown as it arrives. The failure policy is the same as for a whole
//! answer: a refusal is classified from its status and body, the time limit covers
//! the wait for the first piece and every pause between pieces (a stream that stalls
//! is a timeout), and a stream that breaks or ends before the model finished is a
//! transient failure, retried. A server that does not stream is fine: a whole JSON
//! answer to a streamed request is read as the reply, and a server that refuses
//! `stream` is asked for whole answers from then on. A stream that ends without a
//! single event (`llama-cpp-python`'s answer to a streamed prompt too long for its
//! context) says nothing about the server: the same request is asked again once for
//! a whole answer, whose reply or refusal decides.
//!
//! An answer the model stopped at its token limit (`finish_reason: "length"`: the
//! context or `max_tokens` ran out) is a reply, but an unfinished one: it ends with
//! [`CUT_NOTE`], so the user can tell, and is counted in `lull_replies_cut_total`.
//!
//! Invariant: no error built here carries the key. The key is registered for
//! redaction when the responder is built, and every text quoting the server (a proxy
//! may echo the `Authorization` header) is redacted before it becomes an error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCallChunk,
    ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestAssistantMessageContent, ChatCompletionRequestMessage,
    ChatCompletionRequestMessageContentPartImage, ChatCompletionRequestMessageContentPartText,
    ChatCompletionRequestSystemMessage, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, ChatCompletionRequestUserMessageContentPart,
    ChatCompletionStreamOptions, ChatCompletionTool, ChatCompletionTools,
    CreateChatCompletionRequest, CreateChatCompletionResponse, FinishReason, FunctionCall,
    FunctionObject, ImageUrl,
};
use async_trait::async_trait;
use futures_util::StreamExt;
use secrecy::{ExposeSecret, SecretString};

use super::{
    Generation, HistoryBudget, LlmError, Partial, Prompt, Responder, ToolCall, merge_turn,
};
use crate::domain::TokenUsage;
use crate::metrics as names;

/// Ends a reply the model stopped at its token limit, so the user can tell it is
/// unfinished.
pub const CUT_NOTE: &str = "\n\n[the model stopped here: the reply reached its length limit]";

/// What a streamed request brought.
enum Streamed {
    Reply(Generation),
    /// The stream ended without a single event: no answer, and no refusal either.
    Nothing,
}

/// Tool calls as a stream brings them: pieces by index, the id and name in the
/// first, the arguments' JSON text spread over the rest.
#[derive(Default)]
struct StreamedCalls {
    calls: std::collections::BTreeMap<u32, ToolCall>,
}

impl StreamedCalls {
    fn add(&mut self, chunk: ChatCompletionMessageToolCallChunk) {
        let call = self.calls.entry(chunk.index).or_insert_with(|| ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        });
        if let Some(id) = chunk.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        if let Some(function) = chunk.function {
            if let Some(name) = function.name {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    /// The calls in index order; a call the server gave no id gets one, so its
    /// result can name it.
    fn finish(self) -> Vec<ToolCall> {
        self.calls
            .into_iter()
            .map(|(index, mut call)| {
                if call.id.is_empty() {
                    call.id = format!("call_{index}");
                }
                call
            })
            .collect()
    }
}

/// Only `id` of a listed model matters: servers differ in the rest
/// (`llama-cpp-python` sends no `created`).
#[derive(serde::Deserialize)]
struct ModelList {
    data: Vec<ListedModel>,
}

#[derive(serde::Deserialize)]
struct ListedModel {
    id: String,
}

/// How to reach the model and what to ask it.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// The API base, e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
    pub base_url: String,
    /// Optional: local servers accept requests without one.
    pub api_key: Option<SecretString>,
    pub model: String,
    pub system_prompt: String,
    /// Sampling temperature; the server's default when unset.
    pub temperature: Option<f32>,
    /// Longest reply in tokens (`max_tokens`, which every compatible server reads;
    /// `max_completion_tokens` for OpenAI's own API, whose newer models refuse the
    /// older name).
    pub max_tokens: u32,
    /// How much earlier conversation is sent.
    pub history: HistoryBudget,
    /// One request's time limit; for a streamed answer, the limit of the wait for its
    /// first piece and of every pause between pieces (it may take longer in all while
    /// it keeps coming: `max_tokens` bounds it).
    pub timeout: Duration,
}

/// Calls `POST {base}/chat/completions`, one request per attempt.
pub struct OpenAiResponder {
    client: Client<OpenAIConfig>,
    /// The same, for streamed requests: its transport turns a whole JSON answer into
    /// a [`WholeAnswer`], which async-openai's event-stream reader would find empty.
    streaming: Client<OpenAIConfig>,
    /// Cleared once the server refuses `stream`: whole answers from then on.
    streams: AtomicBool,
    settings: OpenAiSettings,
}

/// A whole JSON answer to a streamed request: the server does not stream (some
/// OpenAI-compatible servers ignore `stream`). Its body is the reply.
#[derive(Debug, thiserror::Error)]
#[error("the model server answered a streamed request with one whole answer")]
struct WholeAnswer(String);

/// A non-success answer of the model server, passed through async-openai intact
/// (its message already redacted).
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status}: {message}")]
pub(super) struct HttpFailure {
    status: u16,
    pub(super) message: String,
    retry_after: Option<Duration>,
    context_length: bool,
    out_of_credit: bool,
}

impl HttpFailure {
    /// What a non-success answer says. The whole body is redacted before any of it is
    /// kept, so a cut can never leave half a key behind.
    pub(super) fn read(status: u16, retry_after: Option<Duration>, body: &str) -> Self {
        let body = lull_port::secrets::redact(body);
        let json = serde_json::from_str::<serde_json::Value>(&body).ok();
        let message = error_message(&body, json.as_ref());
        Self {
            status,
            context_length: is_context_length(status, json.as_ref(), &message),
            out_of_credit: is_out_of_credit(json.as_ref()),
            message,
            retry_after,
        }
    }
}

/// `Retry-After`, in seconds or as a date (the port's one parser).
fn retry_after(headers: &reqwest_openai::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest_openai::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    lull_port::retry::parse_retry_after(value, std::time::SystemTime::now())
}

/// An async-openai client on lull's own transport: one attempt per request (the retry
/// policy is lull's), a refusal kept as an [`HttpFailure`], and, for a client of
/// `streamed` requests, a whole JSON answer kept as a [`WholeAnswer`].
fn client(
    config: &OpenAIConfig,
    http: &reqwest_openai::Client,
    streamed: bool,
) -> Client<OpenAIConfig> {
    let http = http.clone();
    let transport = tower::service_fn(move |factory: HttpRequestFactory| {
        let http = http.clone();
        async move {
            let request = factory.build().await?;
            // Errors carry no URL: some deployments put a key in the base URL.
            let unreadable = |e: reqwest_openai::Error| OpenAIError::Reqwest(e.without_url());
            let response = http.execute(request).await.map_err(unreadable)?;
            if response.status().is_success() {
                let json = response
                    .headers()
                    .get(reqwest_openai::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/json"));
                if streamed && json {
                    let body = response.text().await.map_err(unreadable)?;
                    return Err(OpenAIError::Boxed(Box::new(WholeAnswer(body))));
                }
                return Ok(response);
            }
            let status = response.status().as_u16();
            let retry_after = retry_after(response.headers());
            let body = response.text().await.unwrap_or_default();
            Err(OpenAIError::Boxed(Box::new(HttpFailure::read(
                status,
                retry_after,
                &body,
            ))))
        }
    });
    Client::with_config(config.clone()).with_http_service(transport)
}

/// Whether a refusal of a streamed request is about streaming (a server that does
/// not support `stream` or `stream_options`): asking for a whole answer may work.
fn refuses_streaming(error: &LlmError) -> bool {
    matches!(
        error,
        LlmError::Status { status, message, .. }
            if (400..500).contains(status)
                && !matches!(status, 401 | 403 | 404 | 408 | 429)
                && message.to_lowercase().contains("stream")
    )
}

/// The reply in a whole answer; an empty one is a failure, never a reply.
fn whole_generation(response: CreateChatCompletionResponse) -> Result<Generation, LlmError> {
    let (text, calls, finish) = response
        .choices
        .into_iter()
        .next()
        .map(|c| (c.message.content, c.message.tool_calls, c.finish_reason))
        .unwrap_or_default();
    let mut text = text.unwrap_or_default();
    let tool_calls: Vec<ToolCall> = calls
        .unwrap_or_default()
        .into_iter()
        .filter_map(|call| match call {
            ChatCompletionMessageToolCalls::Function(call) => Some(ToolCall {
                id: call.id,
                name: call.function.name,
                arguments: call.function.arguments,
            }),
            ChatCompletionMessageToolCalls::Custom(_) => None,
        })
        .collect();
    if text.trim().is_empty() && tool_calls.is_empty() {
        return Err(LlmError::Empty);
    }
    if finish == Some(FinishReason::Length) && tool_calls.is_empty() {
        text.push_str(cut_note());
    }
    Ok(Generation {
        text,
        usage: response.usage.map(|u| TokenUsage {
            prompt: u64::from(u.prompt_tokens),
            completion: u64::from(u.completion_tokens),
        }),
        tool_calls,
    })
}

/// The note for a reply cut at the token limit, counted (`lull_replies_cut_total`).
fn cut_note() -> &'static str {
    metrics::counter!(names::REPLIES_CUT).increment(1);
    CUT_NOTE
}

/// Whether a refusal says the account is out of credit: OpenAI's
/// `insufficient_quota` (sent with a 429, which would otherwise be retried for ever).
fn is_out_of_credit(json: Option<&serde_json::Value>) -> bool {
    json.is_some_and(|json| {
        let error = &json["error"];
        error["code"] == "insufficient_quota" || error["type"] == "insufficient_quota"
    })
}

/// The longest server message an error keeps, in characters.
const MAX_MESSAGE_CHARS: usize = 300;

/// The `error.message` of an OpenAI-style error body (`message` at the top in vLLM's
/// older form, `error` as a string in Ollama's), else the start of the body.
fn error_message(body: &str, json: Option<&serde_json::Value>) -> String {
    let message = json.and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["message"].as_str())
            .or_else(|| v["error"].as_str())
    });
    message
        .unwrap_or(body)
        .trim()
        .chars()
        .take(MAX_MESSAGE_CHARS)
        .collect()
}

/// Phrases OpenAI-compatible servers use when a prompt exceeds the model's context:
/// OpenAI, vLLM and OpenRouter ("maximum context length is 8192 tokens"), llama.cpp
/// ("exceeds the available context size"), Ollama ("exceeds the context length"),
/// Anthropic-compatible gateways ("prompt is too long"), TGI ("must be <= … tokens").
const CONTEXT_PHRASES: &[&str] = &[
    "context length",
    "context_length",
    "context size",
    "context window",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "prompt too long",
    "input is too long",
    "reduce the length of the messages",
    "`max_new_tokens` must be <=",
];

/// Whether a refusal says the prompt does not fit the model's context: OpenAI's
/// `context_length_exceeded` code (and `string_above_max_length`), llama.cpp's
/// `exceed_context_size_error` type, HTTP 413, or one of the phrases servers use (`CONTEXT_PHRASES`).
pub fn is_context_length(status: u16, json: Option<&serde_json::Value>, message: &str) -> bool {
    if status == 413 {
        return true;
    }
    if !(400..600).contains(&status) {
        return false;
    }
    let error = json.map(|v| &v["error"]);
    let named = [
        error.and_then(|e| e["code"].as_str()),
        error.and_then(|e| e["type"].as_str()),
        json.and_then(|v| v["code"].as_str()),
    ];
    if named.iter().flatten().any(|name| {
        matches!(
            *name,
            "context_length_exceeded" | "string_above_max_length" | "exceed_context_size_error"
        )
    }) {
        return true;
    }
    let message = message.to_lowercase();
    CONTEXT_PHRASES
        .iter()
        .any(|phrase| message.contains(phrase))
}

impl OpenAiResponder {
    /// A responder for `settings`. Registers the key for redaction
    /// ([`lull_port::secrets::register`]).
    pub fn new(settings: OpenAiSettings) -> Result<Self, String> {
        if let Some(key) = &settings.api_key {
            lull_port::secrets::register(key);
        }
        let http = reqwest_openai::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the model server client: {e}"))?;
        let config = OpenAIConfig::new()
            .with_api_base(settings.base_url.trim_end_matches('/'))
            .with_api_key(
                settings
                    .api_key
                    .as_ref()
                    .map(|k| k.expose_secret().to_owned())
                    .unwrap_or_default(),
            );
        Ok(Self {
            client: client(&config, &http, false),
            streaming: client(&config, &http, true),
            streams: AtomicBool::new(true),
            settings,
        })
    }

    /// The messages sent for a prompt: the system prompt, the history that fits the
    /// budget (oldest first), then the pending messages merged into one user turn.
    pub fn messages(&self, prompt: &Prompt) -> Vec<ChatCompletionRequestMessage> {
        let history = self.settings.history.fit(&prompt.history, prompt.is_group);
        let mut messages: Vec<ChatCompletionRequestMessage> =
            Vec::with_capacity(2 + 2 * history.len());
        messages.push(
            ChatCompletionRequestSystemMessage::from(
                prompt
                    .choices
                    .system_prompt
                    .as_deref()
                    .unwrap_or(&self.settings.system_prompt),
            )
            .into(),
        );
        for exchange in history {
            let user = merge_turn(
                exchange
                    .user
                    .iter()
                    .map(|s| (s.author.as_str(), s.text.as_str())),
                prompt.is_group,
            );
            messages.push(ChatCompletionRequestUserMessage::from(user.as_str()).into());
            messages.push(
                ChatCompletionRequestAssistantMessage::from(
                    ChatCompletionRequestAssistantMessageContent::from(exchange.reply.as_str()),
                )
                .into(),
            );
        }
        messages.push(user_turn(prompt).into());
        for turn in &prompt.turns {
            let calls = turn
                .calls
                .iter()
                .map(|call| {
                    ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                        id: call.id.clone(),
                        function: FunctionCall {
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        },
                    })
                })
                .collect();
            messages.push(
                ChatCompletionRequestAssistantMessage {
                    content: (!turn.text.is_empty()).then(|| {
                        ChatCompletionRequestAssistantMessageContent::from(turn.text.as_str())
                    }),
                    tool_calls: Some(calls),
                    ..Default::default()
                }
                .into(),
            );
            for (call, result) in turn.calls.iter().zip(&turn.results) {
                messages.push(
                    ChatCompletionRequestToolMessage {
                        content: ChatCompletionRequestToolMessageContent::Text(result.clone()),
                        tool_call_id: call.id.clone(),
                    }
                    .into(),
                );
            }
        }
        messages
    }

    /// The offered tools as OpenAI function definitions (`None` when none are).
    fn tools(prompt: &Prompt) -> Option<Vec<ChatCompletionTools>> {
        (!prompt.tools.is_empty()).then(|| {
            prompt
                .tools
                .iter()
                .map(|tool| {
                    ChatCompletionTools::Function(ChatCompletionTool {
                        function: FunctionObject {
                            name: tool.name.clone(),
                            description: (!tool.description.is_empty())
                                .then(|| tool.description.clone()),
                            parameters: Some(tool.parameters.clone()),
                            strict: None,
                        },
                    })
                })
                .collect()
        })
    }

    /// The server's model list (for `lull check`).
    pub async fn list_models(&self) -> Result<Vec<String>, LlmError> {
        let models = self.client.models();
        let list: ModelList = tokio::time::timeout(self.settings.timeout, models.list_byot())
            .await
            .map_err(|_| LlmError::Timeout(self.settings.timeout))?
            .map_err(|e| classify(e, self.settings.timeout))?;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    pub fn settings(&self) -> &OpenAiSettings {
        &self.settings
    }

    /// The request for a prompt (not streamed).
    fn request(&self, prompt: &Prompt) -> CreateChatCompletionRequest {
        // `max_tokens` is deprecated by OpenAI in favour of `max_completion_tokens`, and
        // OpenAI's reasoning models refuse it; but it is the one field every compatible
        // server (Ollama, vLLM, llama.cpp) reads.
        let openai = is_openai(&self.settings.base_url);
        // A budget's remainder caps the reply below `LULL_MAX_TOKENS`.
        let max_tokens = prompt.max_tokens.map_or(self.settings.max_tokens, |cap| {
            self.settings
                .max_tokens
                .min(u32::try_from(cap).unwrap_or(u32::MAX))
                .max(1)
        });
        #[allow(deprecated)]
        CreateChatCompletionRequest {
            model: (prompt.choices.model.as_ref())
                .unwrap_or(&self.settings.model)
                .clone(),
            messages: self.messages(prompt),
            temperature: prompt.choices.temperature.or(self.settings.temperature),
            max_tokens: (!openai).then_some(max_tokens),
            max_completion_tokens: openai.then_some(max_tokens),
            tools: Self::tools(prompt),
            ..Default::default()
        }
    }

    /// One request, answered whole.
    async fn whole(&self, request: CreateChatCompletionRequest) -> Result<Generation, LlmError> {
        let limit = self.settings.timeout;
        let chat = self.client.chat();
        let response = tokio::time::timeout(limit, chat.create(request))
            .await
            .map_err(|_| LlmError::Timeout(limit))?
            .map_err(|e| classify(e, limit))?;
        whole_generation(response)
    }

    /// One request, streamed: each piece is shown in `partial` as it arrives.
    async fn streamed(
        &self,
        mut request: CreateChatCompletionRequest,
        partial: &Partial,
    ) -> Result<Streamed, LlmError> {
        let limit = self.settings.timeout;
        request.stream = Some(true);
        request.stream_options = Some(ChatCompletionStreamOptions {
            include_usage: Some(true),
            include_obfuscation: None,
        });
        partial.restart();
        let chat = self.streaming.chat();
        let started = tokio::time::timeout(limit, chat.create_stream(request))
            .await
            .map_err(|_| LlmError::Timeout(limit))?;
        let mut chunks = match started {
            Ok(chunks) => chunks,
            Err(OpenAIError::Boxed(boxed)) if boxed.is::<WholeAnswer>() => {
                let WholeAnswer(body) = *boxed.downcast::<WholeAnswer>().expect("checked");
                let response = serde_json::from_str::<CreateChatCompletionResponse>(&body)
                    .map_err(|e| LlmError::Malformed(lull_port::secrets::redact_error(&e)))?;
                let generation = whole_generation(response)?;
                partial.push(&generation.text);
                return Ok(Streamed::Reply(generation));
            }
            Err(e) => return Err(classify(e, limit)),
        };
        let (mut text, mut usage, mut finished, mut cut) = (String::new(), None, false, false);
        let mut calls = StreamedCalls::default();
        let mut events = 0usize;
        // The limit applies to every pause: a stream that stalls is a timeout.
        while let Some(chunk) = tokio::time::timeout(limit, chunks.next())
            .await
            .map_err(|_| LlmError::Timeout(limit))?
        {
            let chunk = chunk.map_err(|e| classify(e, limit))?;
            events += 1;
            if let Some(u) = chunk.usage {
                usage = Some(TokenUsage {
                    prompt: u64::from(u.prompt_tokens),
                    completion: u64::from(u.completion_tokens),
                });
            }
            // One choice is asked for (`n` unset).
            for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
                if let Some(piece) = choice.delta.content {
                    text.push_str(&piece);
                    partial.push(&piece);
                }
                for chunk in choice.delta.tool_calls.into_iter().flatten() {
                    calls.add(chunk);
                }
                finished |= choice.finish_reason.is_some();
                cut |= choice.finish_reason == Some(FinishReason::Length);
            }
        }
        if events == 0 {
            return Ok(Streamed::Nothing);
        }
        // Every OpenAI-compatible server ends a complete answer with a finish reason;
        // without one the stream was cut (a proxy closing it cleanly, say).
        if !finished {
            return Err(LlmError::Malformed(
                "the streamed answer ended before the model finished".into(),
            ));
        }
        let tool_calls = calls.finish();
        if text.trim().is_empty() && tool_calls.is_empty() {
            return Err(LlmError::Empty);
        }
        if cut && tool_calls.is_empty() {
            let note = cut_note();
            partial.push(note);
            text.push_str(note);
        }
        Ok(Streamed::Reply(Generation {
            text,
            usage,
            tool_calls,
        }))
    }
}

#[async_trait]
impl Responder for OpenAiResponder {
    fn name(&self) -> &'static str {
        "openai"
    }

    async fn models(&self) -> Result<Vec<String>, LlmError> {
        self.list_models().await
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        let request = self.request(prompt);
        if partial.is_watched() && self.streams.load(Ordering::Relaxed) {
            match self.streamed(request.clone(), partial).await {
                Ok(Streamed::Reply(generation)) => return Ok(generation),
                // Asked once more, whole, within the same attempt: the answer or the
                // refusal (a prompt too long, say) then decides. Later requests stream
                // again: this is a reply to one prompt, not the server's way.
                Ok(Streamed::Nothing) => tracing::warn!(
                    conversation = %prompt.conversation,
                    "the model server ended a streamed answer without a single event; asking again for a whole answer"
                ),
                Err(error) if refuses_streaming(&error) => {
                    self.streams.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %error, "the model server refuses streamed answers; asking for whole answers from now on (live drafts show no text until the reply)");
                }
                Err(error) => return Err(error),
            }
        }
        self.whole(request).await
    }
}

/// Whether the base URL is OpenAI's own API.
/// The pending batch as one user message: plain text, or, when it carries images,
/// content parts (the text, then each image as a base64 `data:` URL), which OpenAI,
/// Ollama's OpenAI-compatible endpoint and vLLM accept. Only this turn carries
/// images; history keeps their `[image]` markers.
fn user_turn(prompt: &Prompt) -> ChatCompletionRequestUserMessage {
    let text = prompt.user_turn();
    if prompt.images.is_empty() {
        return ChatCompletionRequestUserMessage::from(text.as_str());
    }
    let mut parts = vec![ChatCompletionRequestUserMessageContentPart::Text(
        ChatCompletionRequestMessageContentPartText {
            text,
            prompt_cache_breakpoint: None,
        },
    )];
    parts.extend(prompt.images.iter().map(|image| {
        ChatCompletionRequestUserMessageContentPart::ImageUrl(
            ChatCompletionRequestMessageContentPartImage {
                image_url: ImageUrl {
                    url: image.data_url(),
                    detail: None,
                },
                prompt_cache_breakpoint: None,
            },
        )
    }));
    ChatCompletionRequestUserMessage {
        content: ChatCompletionRequestUserMessageContent::Array(parts),
        name: None,
    }
}

fn is_openai(base_url: &str) -> bool {
    url::Url::parse(base_url).is_ok_and(|u| u.host_str() == Some("api.openai.com"))
}

/// The failure as lull sorts it. Errors keep their cause chain (which socket error,
/// which TLS problem), redacted.
fn classify(error: OpenAIError, timeout: Duration) -> LlmError {
    use lull_port::secrets::{redact, redact_error};
    match error {
        OpenAIError::Boxed(boxed) => match boxed.downcast::<HttpFailure>() {
            Ok(failure) if failure.context_length => LlmError::ContextLength {
                status: failure.status,
                message: failure.message,
            },
            Ok(failure) if failure.out_of_credit => LlmError::OutOfCredit {
                status: failure.status,
                message: failure.message,
            },
            Ok(failure) => LlmError::Status {
                status: failure.status,
                message: failure.message,
                retry_after: failure.retry_after,
            },
            Err(other) => LlmError::Connect(redact_error(other.as_ref())),
        },
        OpenAIError::ApiError(e) => {
            let status = e.status_code.as_u16();
            let message = redact(&e.api_error.message);
            let code = serde_json::json!({ "error": { "code": e.api_error.code } });
            if is_context_length(status, Some(&code), &message) {
                LlmError::ContextLength { status, message }
            } else {
                LlmError::Status {
                    status,
                    message,
                    retry_after: None,
                }
            }
        }
        OpenAIError::JSONDeserialize(e, _) => LlmError::Malformed(redact_error(&e)),
        OpenAIError::Reqwest(e) if e.is_timeout() => LlmError::Timeout(timeout),
        OpenAIError::Reqwest(e) if e.is_decode() => LlmError::Malformed(redact_error(&e)),
        other => LlmError::Connect(redact_error(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(status: u16, body: &str) -> HttpFailure {
        HttpFailure::read(status, None, body)
    }

    #[test]
    fn error_bodies_yield_their_message() {
        let read = |body: &str| failure(404, body).message;
        assert_eq!(
            read(r#"{"error":{"message":"model not found","type":"invalid_request_error"}}"#),
            "model not found"
        );
        assert_eq!(
            read(r#"{"object":"error","message":"old vllm"}"#),
            "old vllm"
        );
        assert_eq!(
            read(r#"{"error":"model 'x' not found"}"#),
            "model 'x' not found"
        );
        assert_eq!(read("upstream timeout"), "upstream timeout");
        assert_eq!(read(&"x".repeat(5000)).len(), MAX_MESSAGE_CHARS);
    }

    /// Refusals as the servers lull names send them.
    #[test]
    fn context_length_refusals_are_recognised_in_every_servers_form() {
        let too_long = [
            // OpenAI
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            // vLLM, older and newer
            r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (904 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
            r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your request has 9000 input tokens.","type":"BadRequestError","param":null,"code":400}}"#,
            // llama.cpp server
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":4096}}"#,
            // llama-server b11434, as seen in the real-server tier
            r#"{"error":{"code":400,"message":"request (650 tokens) exceeds the available context size (512 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":650,"n_ctx":512}}"#,
            // llama-cpp-python
            r#"{"error":{"message":"This model's maximum context length is 512 tokens, however you requested 650 tokens (650 in your prompt; 0 for the completion). Please reduce your prompt; or completion length.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            // Ollama
            r#"{"error":{"message":"the input length exceeds the context length","type":"api_error","param":null,"code":null}}"#,
            // OpenRouter
            r#"{"error":{"message":"This endpoint's maximum context length is 8192 tokens. However, you requested about 9500 tokens (9500 of text input). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.","code":400}}"#,
            // Anthropic-compatible gateways
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        ];
        for body in too_long {
            assert!(failure(400, body).context_length, "{body}");
        }
        assert!(failure(413, "Request Entity Too Large").context_length);
        let other = [
            (
                400,
                r#"{"error":{"message":"Invalid value for 'temperature'","code":"invalid_value"}}"#,
            ),
            (
                401,
                r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#,
            ),
            (
                404,
                r#"{"error":{"message":"The model `x` does not exist","code":"model_not_found"}}"#,
            ),
            (200, r#"{"error":{"message":"maximum context length"}}"#),
        ];
        for (status, body) in other {
            assert!(!failure(status, body).context_length, "{body}");
        }
    }

    /// OpenAI's "no quota left" comes as a 429, but is no rate limit: it is refused
    /// (the batch ends with one notice), not retried for ever.
    #[test]
    fn an_exhausted_quota_is_refused_not_retried() {
        let body = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        assert!(failure(429, body).out_of_credit);
        assert!(
            !failure(
                429,
                r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#
            )
            .out_of_credit
        );
        let error = LlmError::OutOfCredit {
            status: 429,
            message: "quota".into(),
        };
        assert_eq!(error.kind(), crate::llm::FailureKind::Refused);
        assert!(error.setting().contains("OPENAI_API_KEY"));
        assert_eq!(error.outcome(), "refused");
    }

    #[test]
    fn an_echoed_key_is_redacted_before_the_message_is_cut() {
        let key = "sk-echoed-in-an-error-body-0123456789";
        lull_port::secrets::register(&SecretString::from(key));
        // The key straddles the cut: a cut before redaction would leave half of it.
        let body = format!(
            "{}Authorization: Bearer {key}",
            "x".repeat(MAX_MESSAGE_CHARS - 30)
        );
        let message = failure(401, &body).message;
        assert!(!message.contains("sk-echoe"), "{message}");
        let json = format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}"}}}}"#);
        assert_eq!(
            failure(401, &json).message,
            "Incorrect API key provided: <redacted>"
        );
    }

    #[test]
    fn only_a_refusal_about_streaming_asks_for_whole_answers() {
        let status = |status, message: &str| LlmError::Status {
            status,
            message: message.into(),
            retry_after: None,
        };
        assert!(refuses_streaming(&status(400, "stream is not supported")));
        assert!(refuses_streaming(&status(
            422,
            "Unknown field: stream_options"
        )));
        assert!(!refuses_streaming(&status(
            400,
            "Invalid value for 'temperature'"
        )));
        assert!(!refuses_streaming(&status(
            401,
            "streaming needs a paid plan"
        )));
        assert!(!refuses_streaming(&status(
            503,
            "stream backend overloaded"
        )));
    }

    #[test]
    fn an_answer_cut_at_the_token_limit_ends_with_the_note() {
        let answer = |finish: &str| {
            serde_json::from_value::<CreateChatCompletionResponse>(serde_json::json!({
                "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{ "index": 0, "finish_reason": finish,
                              "message": { "role": "assistant", "content": "Once upon" } }]
            }))
            .unwrap()
        };
        assert_eq!(
            whole_generation(answer("length")).unwrap().text,
            format!("Once upon{CUT_NOTE}")
        );
        assert_eq!(whole_generation(answer("stop")).unwrap().text, "Once upon");
    }

    /// A whole answer calling tools, with no content: the calls, not an empty reply.
    #[test]
    fn a_whole_answer_with_tool_calls_is_read_as_calls() {
        let response = serde_json::from_value::<CreateChatCompletionResponse>(serde_json::json!({
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{ "index": 0, "finish_reason": "tool_calls",
                          "message": { "role": "assistant", "content": null, "tool_calls": [
                              { "id": "call_1", "type": "function",
                                "function": { "name": "notes__append", "arguments": "{\"text\":\"milk\"}" } }] } }]
        }))
        .unwrap();
        let generation = whole_generation(response).unwrap();
        assert_eq!(generation.text, "");
        assert_eq!(
            generation.tool_calls,
            [ToolCall {
                id: "call_1".into(),
                name: "notes__append".into(),
                arguments: r#"{"text":"milk"}"#.into(),
            }]
        );
    }

    /// Streamed calls arrive in pieces by index: the id and name first, the arguments
    /// spread over later chunks; a call without an id gets one.
    #[test]
    fn streamed_tool_calls_are_put_together_by_index() {
        let chunk = |value: serde_json::Value| {
            serde_json::from_value::<ChatCompletionMessageToolCallChunk>(value).unwrap()
        };
        let mut calls = StreamedCalls::default();
        calls.add(chunk(
            serde_json::json!({ "index": 0, "id": "a", "type": "function",
            "function": { "name": "x__y", "arguments": "" } }),
        ));
        calls.add(chunk(
            serde_json::json!({ "index": 1, "function": { "name": "x__z" } }),
        ));
        calls.add(chunk(
            serde_json::json!({ "index": 0, "function": { "arguments": "{\"q\":" } }),
        ));
        calls.add(chunk(
            serde_json::json!({ "index": 0, "function": { "arguments": "1}" } }),
        ));
        let calls = calls.finish();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (
                calls[0].id.as_str(),
                calls[0].name.as_str(),
                calls[0].arguments.as_str()
            ),
            ("a", "x__y", r#"{"q":1}"#)
        );
        assert_eq!(
            (calls[1].id.as_str(), calls[1].name.as_str()),
            ("call_1", "x__z")
        );
    }

    /// `llama-cpp-python`'s list, and llama-server's (which adds `models` beside `data`).
    #[test]
    fn a_model_list_is_read_for_its_ids_only() {
        for body in [
            r#"{"object":"list","data":[{"id":"a","object":"model","owned_by":"me","permissions":[]}]}"#,
            r#"{"models":[{"name":"a"}],"object":"list","data":[{"id":"a","object":"model","created":1,"owned_by":"llamacpp","meta":{}}]}"#,
        ] {
            let list: ModelList = serde_json::from_str(body).unwrap();
            assert_eq!(
                list.data.into_iter().map(|m| m.id).collect::<Vec<_>>(),
                ["a"]
            );
        }
    }

    #[test]
    fn openais_own_api_gets_max_completion_tokens() {
        assert!(is_openai("https://api.openai.com/v1"));
        assert!(!is_openai("http://localhost:11434/v1"));
        assert!(!is_openai("https://openrouter.ai/api/v1"));
    }

    #[test]
    fn retry_after_reads_seconds() {
        let mut headers = reqwest_openai::header::HeaderMap::new();
        headers.insert(reqwest_openai::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(reqwest_openai::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }
}

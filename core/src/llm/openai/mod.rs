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
//!
//! # Layout
//!
//! This file holds the responder: its settings, the transport under async-openai,
//! and the choice between a streamed and a whole answer. Its parts:
//!
//! - `request`: the request for a prompt (messages, tools, the token cap).
//! - `response`: reading a whole or streamed answer into a [`Generation`].
//! - `errors`: a failure sorted into an [`LlmError`] ([`is_context_length`]).

mod errors;
mod request;
mod response;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use super::{Generation, HistoryBudget, LlmError, Partial, Prompt, Responder};
pub(super) use errors::HttpFailure;
pub use errors::is_context_length;
use errors::{classify, refuses_streaming, retry_after};
pub use response::CUT_NOTE;
use response::{Streamed, WholeAnswer};

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

/// An async-openai client on lull's own transport: one attempt per request (the retry
/// policy is lull's), a refusal kept as an [`HttpFailure`], and, for a client of
/// `streamed` requests, a whole JSON answer kept as a [`WholeAnswer`].
fn client(config: &OpenAIConfig, http: &reqwest::Client, streamed: bool) -> Client<OpenAIConfig> {
    let http = http.clone();
    let transport = tower::service_fn(move |factory: HttpRequestFactory| {
        let http = http.clone();
        async move {
            let request = factory.build().await?;
            // Errors carry no URL: some deployments put a key in the base URL.
            let unreadable = |e: reqwest::Error| OpenAIError::Reqwest(e.without_url());
            let response = http.execute(request).await.map_err(unreadable)?;
            if response.status().is_success() {
                let json = response
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
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

impl OpenAiResponder {
    /// A responder for `settings`. Registers the key for redaction
    /// ([`lull_port::secrets::register`]).
    pub fn new(settings: OpenAiSettings) -> Result<Self, String> {
        if let Some(key) = &settings.api_key {
            lull_port::secrets::register(key);
        }
        let http = reqwest::Client::builder()
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

    /// The server's model list (for `lull check`).
    pub async fn list_models(&self) -> Result<Vec<String>, LlmError> {
        let models = self.client.models();
        let list: ModelList = tokio::time::timeout(self.settings.timeout, models.list_byot())
            .await
            .map_err(|_| LlmError::Timeout(self.settings.timeout))?
            .map_err(|e| classify(e, self.settings.timeout))?;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    /// The settings it was built with; they do not change after [`Self::new`].
    pub fn settings(&self) -> &OpenAiSettings {
        &self.settings
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
